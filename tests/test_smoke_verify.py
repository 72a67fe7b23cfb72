"""`dtc smoke` runs only what dtc generated (issue #16, item 8): smoke replaces every degree with its
own for the reduced world, so an edited `"tp": 3` in fsdp_config.json or a plan.json with other degrees
used to "pass". Now the folder must match its MANIFEST.sha256 (no edits, no extra files, no links)
and the artifacts' degrees and batch must be plan.json's, or smoke refuses before launching (exit 2).
A plan.json that is not a plan (`[]`, `null`, NaN, nested 100,000 deep) is exit 2 for smoke and diff.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from helpers import refresh_manifest, run_cli
from test_smoke import make_generated


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return make_generated(tmp_path, "verify", dp_shard=2, zero_stage=2, micro_batch=2, targets="fsdp, deepspeed")


def smoke_refuses(folder: Path, *needles: str) -> str:
    t0 = time.monotonic()
    result = run_cli(["smoke", str(folder)], exit_code=2)
    assert time.monotonic() - t0 < 20, "refused only after launching"
    assert "Traceback" not in result.stderr and "INTERNAL ERROR" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    return result.stderr


def test_untouched_folder_is_verified(folder: Path) -> None:
    from compiler.smoke import load_plan, verify_generated

    verify_generated(folder, load_plan(folder)[0])


def test_edited_degree_is_refused(folder: Path) -> None:
    config = folder / "fsdp_config.json"
    data = json.loads(config.read_text())
    data["parallel"]["tp"] = 3
    config.write_text(json.dumps(data))
    smoke_refuses(folder, "was changed after dtc wrote it", "  fsdp_config.json")
    refresh_manifest(folder)  # a manifest edited to match: the degrees still have to be plan.json's
    smoke_refuses(folder, "disagree with plan.json", "fsdp_config.json: parallel.tp is 3, the plan says 1")


def test_plan_with_other_degrees_is_refused(folder: Path) -> None:
    plan = json.loads((folder / "plan.json").read_text())
    plan["layout"]["dp_shard"], plan["layout"]["dp_replicate"] = 1, 2
    (folder / "plan.json").write_text(json.dumps(plan))
    smoke_refuses(folder, "was changed after dtc wrote it", "  plan.json")
    refresh_manifest(folder)
    smoke_refuses(folder, "disagree with plan.json", "parallel.dp_shard is 2, the plan says 1")


@pytest.mark.parametrize("entry", ["extra-file", "link", "missing", "no-manifest"])
def test_folder_that_is_not_as_generated_is_refused(entry: str, folder: Path) -> None:
    if entry == "extra-file":
        (folder / "mine.py").write_text("print('mine')\n")
    elif entry == "link":
        (folder / "ds_config.json").unlink()
        (folder / "ds_config.json").symlink_to("/etc/passwd")
    elif entry == "missing":
        (folder / "ds_train.py").unlink()
    else:
        (folder / "MANIFEST.sha256").unlink()
    text = smoke_refuses(folder, "smoke runs only what dtc generated")
    assert "root:x" not in text


HOSTILE_PLANS = {"list": "[]", "null": "null", "nan": "NaN", "string": '"plan"', "empty": "",
                 "deep-list": "[" * 100_000 + "]" * 100_000, "deep-object": '{"a":' * 100_000 + "1" + "}" * 100_000}


@pytest.mark.parametrize("case", sorted(HOSTILE_PLANS) + ["nan-field", "layout-list", "wrong-types"])
def test_plan_json_that_is_not_a_plan(case: str, folder: Path) -> None:
    plan = json.loads((folder / "plan.json").read_text())
    if case == "nan-field":
        text = json.dumps(plan).replace('"seed": 1234', '"seed": NaN')
    elif case == "layout-list":
        text = json.dumps({**plan, "layout": []})
    elif case == "wrong-types":
        text = json.dumps({**plan, "estimate": {"memory": "lots"}, "alternatives": {}})
    else:
        text = HOSTILE_PLANS[case]
    (folder / "plan.json").write_text(text)
    refresh_manifest(folder)
    smoke_refuses(folder, "plan.json")
    other = make_generated(folder.parent / "other", "verify", dp_shard=2, zero_stage=2, micro_batch=2,
                           targets="fsdp, deepspeed")
    for args in ([str(other), str(folder)], [str(folder), str(other)]):
        result = run_cli(["diff", *args], exit_code=None)
        assert result.exit_code in (1, 2), (result.exit_code, result.stderr, result.exception)
        assert "Traceback" not in result.stderr and "INTERNAL ERROR" not in result.stderr


def test_allow_edited_runs_the_edit_with_a_warning_per_file(folder: Path) -> None:
    """--allow-edited (issue #16: "refusing or warning"): the preflight returns one warning per edited file and
    per disagreement with plan.json instead of refusing; without it the same folder is refused."""
    from compiler.errors import SmokeError
    from compiler.plan import Plan
    from compiler.smoke import preflight, verify_generated

    plan = Plan.from_json((folder / "plan.json").read_text())
    config = folder / "fsdp_config.json"
    data = json.loads(config.read_text())
    data["parallel"]["tp"] = 3
    config.write_text(json.dumps(data))
    with pytest.raises(SmokeError):
        verify_generated(folder, plan)
    warnings = verify_generated(folder, plan, allow_edited=True)
    assert warnings == ["edited after dtc wrote it (run anyway, --allow-edited): fsdp_config.json"], warnings
    with pytest.raises(SmokeError, match="disagree with plan.json"):
        preflight(folder, plan, ["fsdp"])
    found = preflight(folder, plan, ["fsdp"], allow_edited=True)
    assert any("fsdp_config.json: parallel.tp is 3, the plan says 1" in w for w in found), found
