"""`dtc sweep --local-cpu --submit` then `dtc calibrate --sweep` on a real one-node SLURM cluster (issue #12).

The candidates of a tiny spec are compiled, scaled down to CPU as dtc smoke scales them, and run
as ONE real job array through their generated train_fsdp.sbatch (torchrun on gloo), or through
their generated train_megatron.sbatch (srun, one task per rank; DTC_BENCH_STEPS set, MEGATRON_DIR
pointed at dtc smoke's worker running megatron.training.pretrain on gloo); their logs are parsed,
a profile is fitted, the spec is re-solved with it and PLAN.md shows measured vs predicted.
Needs slurm-wlm, munge and root: without them this FAILS (it does not skip).
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import slurm_test_cluster

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

SPEC = """\
name: sweep-tiny
model:
  num_layers: 4
  hidden_size: 256
  ffn_hidden_size: 512
  num_attention_heads: 4
  num_kv_heads: 2
  vocab_size: 1024
training:
  tokens: 1B
  sequence_length: 1024
  global_batch: 32
  precision: bf16
cluster:
  gpu: a100-80gb
  num_gpus: 8
targets: [fsdp, slurm]
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from slurm_test_cluster(tmp_path_factory.mktemp("slurm"), fake_gpu_nodes=4, gpus_per_node=8)


def _dtc(cluster):
    env = {**cluster.env, "PYTHONPATH": str(ROOT)}
    env.pop("SLURM_SMOKE_PARTITION", None)

    def dtc(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "compiler", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
    return dtc


def test_sweep_array_then_calibrate(cluster, tmp_path):
    dtc = _dtc(cluster)
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "sw"

    r = dtc("sweep", str(spec), "--top", "2", "-o", str(out), "--local-cpu", "--steps", "3", "--submit")
    assert r.returncode == 0, r.stderr
    assert "submitted job array" in r.stdout
    r = dtc("calibrate", "--sweep", str(out))
    assert r.returncode == 2 and "has not finished" in r.stderr  # the array is still running
    deadline = time.monotonic() + 480
    while time.monotonic() < deadline and not all((out / "logs" / f"{i:02d}.status").is_file() for i in range(2)):
        time.sleep(3)
    statuses = [(out / "logs" / f"{i:02d}.status").read_text().strip() for i in range(2)]
    logs = "\n".join((out / "logs" / f"{i:02d}.log").read_text()[-3000:] for i in range(2))
    assert statuses == ["0", "0"], logs
    assert not cluster.run(["squeue", "-h"]).stdout.strip()
    r = dtc("calibrate", "--sweep", str(out))
    assert r.returncode == 0, r.stderr
    assert "Re-solved with the profile" in r.stdout
    from compiler.calibration.profile import load_profile

    profile, _ = load_profile(out / "profile.yaml")
    assert len(profile.runs) == 2 and all(run.source == "sweep" for run in profile.runs)
    assert any("CPU" in n for n in profile.notes)
    plan_md = (out / "PLAN.md").read_text()
    assert "## Sweep: measured vs predicted" in plan_md and "Measured best: candidate" in plan_md
    assert "Costed with the cluster profile" in plan_md  # the re-solved plan used the fitted constants
    for i in range(2):
        assert f"| {i:02d} |" in plan_md


def test_gpu_sweep_array_is_accepted_by_sbatch(cluster, tmp_path):
    """The GPU array (no --local-cpu): the pick's allocation shape, checked by sbatch --test-only on the test
    cluster's (cloud) GPU nodes."""
    from compiler.sweep import ARRAY_SCRIPT, render_sweep

    spec = tmp_path / "gpu.yaml"
    spec.write_text(SPEC.replace("num_gpus: 8", "num_gpus: 16"))
    m = render_sweep(spec, tmp_path / "sw", top=3, steps=5)
    assert len(m["candidates"]) == 3 and not m["local_cpu"]
    script = tmp_path / "sw" / ARRAY_SCRIPT
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --gpus-per-node=8" in text and "--array=0-2\n" in text
    r = cluster.test_only(script, extra_args=["--partition=gpu"])
    assert r.returncode == 0 and "to start at" in r.stderr, r.stderr
    env = (tmp_path / "sw" / "tasks" / "00.env").read_text()
    assert "DTC_SMOKE_DEVICE" not in env and "DTC_SMOKE_STEPS=6" in env  # the plan's own model and GPUs


def test_megatron_sweep_array_then_calibrate(cluster, tmp_path):
    """Megatron candidates: each task runs its generated train_megatron.sbatch unchanged, with DTC_BENCH_STEPS (the
    launcher's own benchmark override: iterations, mock data, no checkpoint loaded or saved) and dtc smoke's job
    files (compiler/targets/megatron/smoke.py local_job_env); Megatron's log lines are parsed and fitted."""
    dtc = _dtc(cluster)
    spec = tmp_path / "mg.yaml"
    spec.write_text(SPEC.replace("targets: [fsdp, slurm]", "targets: [megatron, slurm]"))
    out = tmp_path / "sw"
    t0 = time.monotonic()
    r = dtc("sweep", str(spec), "--top", "2", "-o", str(out), "--local-cpu", "--steps", "2", "--submit")
    assert r.returncode == 0, r.stderr
    assert "submitted job array" in r.stdout
    for i in range(2):
        env = (out / "tasks" / f"{i:02d}.env").read_text()
        assert "DTC_BENCH_STEPS=3\n" in env and f"MEGATRON_DIR={out / 'scratch' / f'{i:02d}' / 'megatron-lm'}" in env
        assert (out / "candidates" / f"{i:02d}" / "train_megatron.sbatch").is_file()
    deadline = time.monotonic() + 540
    while time.monotonic() < deadline and not all((out / "logs" / f"{i:02d}.status").is_file() for i in range(2)):
        time.sleep(3)
    statuses = [(out / "logs" / f"{i:02d}.status").read_text().strip() for i in range(2)]
    logs = [(out / "logs" / f"{i:02d}.log").read_text() for i in range(2)]
    print(f"megatron sweep array: {time.monotonic() - t0:.1f}s")
    assert statuses == ["0", "0"], "\n".join(x[-4000:] for x in logs)
    assert not cluster.run(["squeue", "-h"]).stdout.strip()
    for i, log in enumerate(logs):
        # Megatron's own per-iteration lines: exactly DTC_BENCH_STEPS iterations, each logged (--log-interval 1)
        assert re.findall(r"\] iteration\s+(\d+)/\s*(\d+) \|", log) == [(str(n), "3") for n in (1, 2, 3)], log[-3000:]
        # the scaled megatron_args.sh still says --save/--load: the launcher removed them, nothing was saved
        args = (out / "scratch" / f"{i:02d}" / "artifacts" / "megatron_args.sh").read_text()
        assert "--save" in args and "--load" in args
        saved = out / "scratch" / f"{i:02d}" / "megatron-checkpoints"
        assert not any(saved.iterdir()), sorted(p.name for p in saved.iterdir())
    r = dtc("calibrate", "--sweep", str(out))
    assert r.returncode == 0, r.stderr
    assert "Re-solved with the profile" in r.stdout
    from compiler.calibration.profile import load_profile

    profile, _ = load_profile(out / "profile.yaml")
    assert len(profile.runs) == 2 and all(run.source == "sweep" for run in profile.runs)
    plan_md = (out / "PLAN.md").read_text()
    assert "## Sweep: measured vs predicted" in plan_md and "(megatron," in plan_md
    assert "Measured best: candidate" in plan_md and "Costed with the cluster profile" in plan_md
    for i in range(2):
        assert f"| {i:02d} |" in plan_md


def test_gpu_megatron_sweep_array_is_accepted_by_sbatch(cluster, tmp_path):
    """A Megatron sweep for GPUs: each task sets only DTC_BENCH_STEPS and the candidate's folder (its
    train_megatron.sbatch runs the real pretrain_gpt.py); the array is the pick's allocation shape."""
    from compiler.sweep import ARRAY_SCRIPT, render_sweep

    spec = tmp_path / "gpu.yaml"
    spec.write_text(SPEC.replace("num_gpus: 8", "num_gpus: 16").replace("[fsdp, slurm]", "[megatron, slurm]"))
    m = render_sweep(spec, tmp_path / "sw", top=2, steps=5)
    assert m["target"] == "megatron" and len(m["candidates"]) == 2
    text = (tmp_path / "sw" / ARRAY_SCRIPT).read_text()
    assert 'candidates/$id/train_megatron.sbatch' in text and "#SBATCH --gpus-per-node=8" in text
    assert "#SBATCH --ntasks-per-node=8" in text  # one task per GPU, as train_megatron.sbatch's srun starts them
    r = cluster.test_only(tmp_path / "sw" / ARRAY_SCRIPT, extra_args=["--partition=gpu"])
    assert r.returncode == 0 and "to start at" in r.stderr, r.stderr
    env = (tmp_path / "sw" / "tasks" / "00.env").read_text()
    assert env == f"DTC_ARTIFACT_DIR={(tmp_path / 'sw' / 'candidates' / '00').resolve()}\nDTC_BENCH_STEPS=6\n"
