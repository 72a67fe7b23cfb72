"""`dtc compile`: writes atomically, --check tells changed from failed, hand edits are protected,
and the cross-artifact invariants catch disagreeing files."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from compiler.errors import RenderError
from compiler.render.invariants import check_invariants
from compiler.targets.megatron.render import megatron_flags
from helpers import REPO, run_cli

SPEC = "specs/7b.yaml"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object, dict]:
    from compiler.pipeline import compile_spec

    out = tmp_path_factory.mktemp("gen")
    plan, artifacts = compile_spec(REPO / SPEC)
    return out, plan, dict(artifacts.files)


def test_compile_check_then_write_then_check(tmp_path: Path) -> None:
    out = str(tmp_path)
    first = run_cli(["compile", SPEC, "--out", out, "--check"], exit_code=1)
    assert "to add" in first.stdout and not any(tmp_path.iterdir())  # --check writes nothing
    run_cli(["compile", SPEC, "--out", out])
    folder = tmp_path / "llama2-7b-8xh100"
    for name in ("plan.json", "PLAN.md", "ds_config.json", "fsdp_config.json", "dtc_runtime/model.py", "megatron_args.sh",
                 "train.sbatch", "MANIFEST.sha256"):
        assert (folder / name).exists(), name
    again = run_cli(["compile", SPEC, "--out", out, "--check"], exit_code=0)
    assert again.stdout.rstrip().endswith("0 to add, 0 to change, 0 to remove, 13 unchanged.") or \
        "0 to add, 0 to change, 0 to remove" in again.stdout


def test_hand_edits_are_refused_without_force(tmp_path: Path) -> None:
    out = str(tmp_path)
    run_cli(["compile", SPEC, "--out", out])
    edited = tmp_path / "llama2-7b-8xh100" / "ds_config.json"
    original = edited.read_text()
    hand = re.sub(r'"stage": (\d)', lambda m: f'"stage": {(int(m.group(1)) + 1) % 4}', original, count=1)
    assert hand != original
    edited.write_text(hand)
    result = run_cli(["compile", SPEC, "--out", out], exit_code=2)
    assert "edited by hand" in result.stderr and "ds_config.json" in result.stderr
    assert edited.read_text() == hand  # nothing was overwritten
    run_cli(["compile", SPEC, "--out", out, "--force"])
    assert edited.read_text() == original


def test_json_output_and_target_subset(tmp_path: Path) -> None:
    result = run_cli(["compile", SPEC, "--out", str(tmp_path), "--target", "megatron,slurm", "--json"])
    data = json.loads(result.stdout)
    files = data["results"][0]["files"]
    assert "megatron_args.sh" in files and "ds_config.json" not in files
    assert data["summary"]["failed"] == 0


def test_bad_target_and_bad_spec_exit_2(tmp_path: Path) -> None:
    run_cli(["compile", SPEC, "--out", str(tmp_path), "--target", "tensorflow"], exit_code=2)
    result = run_cli(["compile", "tests/cases/errors/unknown_gpu/spec.yaml", "--out", str(tmp_path)], exit_code=2)
    assert "unknown GPU type" in result.stderr and not any(tmp_path.iterdir())


def test_invariants_hold_and_catch_disagreement(compiled) -> None:
    _, plan, files = compiled
    check_invariants(plan, files)
    broken = dict(files)
    cfg = json.loads(files["ds_config.json"])
    cfg["train_batch_size"] += 1
    broken["ds_config.json"] = json.dumps(cfg)
    broken["megatron_args.sh"] = files["megatron_args.sh"].replace("--micro-batch-size", "--micro-batch-size 7 --x")
    broken["train_fsdp.sbatch"] = files["train_fsdp.sbatch"].replace("#SBATCH --nodes=1", "#SBATCH --nodes=2")
    with pytest.raises(RenderError) as exc:
        check_invariants(plan, broken)
    text = exc.value.render()
    assert "train_batch_size" in text and "--micro-batch-size" in text and "--nodes" in text


def test_megatron_flag_parser(compiled) -> None:
    _, plan, files = compiled
    flags = megatron_flags(files["megatron_args.sh"])
    assert flags["--global-batch-size"] == str(plan.training.global_batch)
    assert flags["--bf16"] is True


def test_internal_errors_exit_3_without_traceback(monkeypatch) -> None:
    import compiler.problem as v  # `dtc validate` imports lower when it runs

    def boom(*a, **k):
        raise ZeroDivisionError("synthetic bug")

    monkeypatch.setattr(v, "lower", boom)
    result = run_cli(["validate", SPEC], exit_code=3)
    assert "INTERNAL ERROR" in result.stderr and "please report" in result.stderr
    assert "Traceback" not in result.stderr


def test_smoke_report_survives_recompile_and_is_not_a_hand_edit(tmp_path: Path) -> None:
    out = str(tmp_path)
    run_cli(["compile", SPEC, "--out", out])
    report = tmp_path / "llama2-7b-8xh100" / "smoke.json"
    report.write_text('{"targets": []}\n')
    run_cli(["compile", SPEC, "--out", out, "--check"], exit_code=0)
    run_cli(["compile", "specs/7b.yaml", "--out", out, "--force"])
    (tmp_path / "llama2-7b-8xh100" / "PLAN.md").write_text("edited\n")
    run_cli(["compile", SPEC, "--out", out, "--force"])
    assert report.read_text() == '{"targets": []}\n'
    run_cli(["check", SPEC, "--generated", out], exit_code=0)
