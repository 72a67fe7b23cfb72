"""`dtc smoke --slurm` against a real one-node SLURM cluster (tests/slurm_cluster.py).

The generated train_fsdp.sbatch and train_deepspeed.sbatch of tiny plans (their #SBATCH lines
rewritten for the local node, their `module load` line neutralised, the smoke options in the
environment) are submitted, waited for and reported like a local launch. Needs slurm-wlm,
munge and root: without them this FAILS (it does not skip).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from helpers import refresh_manifest, slurm_test_cluster
from test_smoke import assert_no_leftovers, make_generated

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from slurm_test_cluster(tmp_path_factory.mktemp("slurm"), fake_gpu_nodes=0)


@pytest.fixture(autouse=True)
def _cluster_env(cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf_path))
    monkeypatch.setenv("PATH", cluster.env["PATH"])
    monkeypatch.delenv("SLURM_SMOKE_PARTITION", raising=False)


def test_smoke_slurm_fsdp(cluster, tmp_path):
    from compiler.smoke import run_smoke
    from compiler.smoke.report import format_report

    folder = make_generated(tmp_path, "slurm-tiny", precision="fp32", dp_shard=2, zero_stage=3, micro_batch=1,
                            grad_accum=2, targets="fsdp, slurm")
    t0 = time.monotonic()
    report = run_smoke(folder, target="fsdp", slurm=True, timeout_s=240)
    print(f"slurm smoke: {time.monotonic() - t0:.1f}s\n{format_report(report)}")
    t = report.targets[0]
    assert report.ok, f"{t.reason}\n{(t.slurm or {}).get('log_tail')}"
    assert t.slurm["state"] == "COMPLETED" and t.slurm["exit_code"] == 0
    assert t.steps_done == 4 and t.last_loss < t.first_loss
    assert len(t.ranks) == 2 and all(r.param_bytes for r in t.ranks)
    assert "skipped: module load" in t.slurm["log_tail"]  # the spec's `module load` was neutralised
    assert not cluster.run(["squeue", "-h"]).stdout.strip()
    assert_no_leftovers(allow={p.pid for p in cluster._procs.values()})


def test_smoke_slurm_deepspeed(cluster, tmp_path):
    """train_deepspeed.sbatch passes only --config: ds_train.py takes the smoke's options from DTC_SMOKE_*."""
    from compiler.smoke import run_smoke
    from compiler.smoke.report import format_report

    folder = make_generated(tmp_path, "slurm-ds", dp_shard=4, zero_stage=2, micro_batch=1, grad_accum=2,
                            targets="deepspeed, slurm")
    t0 = time.monotonic()
    report = run_smoke(folder, target="deepspeed", slurm=True, timeout_s=240)
    print(f"slurm deepspeed smoke: {time.monotonic() - t0:.1f}s\n{format_report(report)}")
    t = report.targets[0]
    assert report.ok, f"{t.reason}\n{(t.slurm or {}).get('log_tail')}"
    assert t.slurm["state"] == "COMPLETED" and t.steps_done == 4 and t.last_loss < t.first_loss
    assert len(t.ranks) == 2 and all(r.param_bytes and r.grad_bytes and r.activation_bytes for r in t.ranks)
    changes = {c["what"]: c["smoke"] for c in t.changes}
    assert changes["ds_config.train_batch_size"] == 1 * 2 * 2  # the plan's 8, resized for 2 ranks by the env
    assert_no_leftovers(allow={p.pid for p in cluster._procs.values()})


def test_smoke_slurm_failed_job_reports_state_and_log(cluster, tmp_path):
    """A job whose training script fails is reported with its SLURM state, exit code and log."""
    from compiler.smoke import run_smoke

    folder = make_generated(tmp_path, "slurm-broken", precision="fp32", dp_shard=2, zero_stage=3, micro_batch=1,
                            grad_accum=2, targets="fsdp, slurm")
    # a broken entry point (hand-edited): every rank exits 3 before any collective
    (folder / "fsdp_train.py").write_text("import sys\nprint('boom: broken entry point', file=sys.stderr)\n"
                                          "sys.exit(3)\n")
    refresh_manifest(folder)  # edited on purpose (smoke refuses a folder that no longer matches its manifest)
    t0 = time.monotonic()
    report = run_smoke(folder, target="fsdp", slurm=True, timeout_s=120, write_json=False)
    assert time.monotonic() - t0 < 90
    t = report.targets[0]
    assert not report.ok and t.status == "failed"
    assert t.slurm["state"] == "FAILED" and t.slurm["exit_code"] != 0
    assert "boom: broken entry point" in t.slurm["log_tail"]
    assert "FAILED" in t.reason
    assert_no_leftovers(allow={p.pid for p in cluster._procs.values()})


def test_smoke_slurm_refused_job_says_why(cluster, tmp_path, monkeypatch):
    """A job sbatch refuses (here: a partition the cluster lacks) is reported with sbatch's own message and the
    script it was given, and nothing runs."""
    from compiler.smoke import run_smoke

    folder = make_generated(tmp_path, "slurm-refused", precision="fp32", dp_shard=2, zero_stage=3, micro_batch=1,
                            grad_accum=2, targets="fsdp, slurm")
    monkeypatch.setenv("SLURM_SMOKE_PARTITION", "no-such-partition")
    report = run_smoke(folder, target="fsdp", slurm=True, timeout_s=60, write_json=False)
    t = report.targets[0]
    assert not report.ok and t.status == "failed" and t.steps_done == 0
    assert t.reason.startswith("sbatch refused the job: ") and "partition" in t.reason.lower(), t.reason
    assert t.slurm["state"] == "NOT_SUBMITTED" and "--partition=no-such-partition" in t.slurm["script"]
    assert not cluster.run(["squeue", "-h"]).stdout.strip()


def test_smoke_slurm_megatron(cluster, tmp_path):
    """train_megatron.sbatch (srun, one task per rank) runs the smoke worker through Megatron's training loop."""
    from compiler.smoke import run_smoke
    from compiler.smoke.report import format_report

    folder = make_generated(tmp_path, "slurm-mg", gbs=4, pp=2, micro_batch=1, targets="megatron, slurm")
    t0 = time.monotonic()
    report = run_smoke(folder, target="megatron", slurm=True, timeout_s=300)
    print(f"slurm megatron smoke: {time.monotonic() - t0:.1f}s\n{format_report(report)}")
    t = report.targets[0]
    assert report.ok, f"{t.reason}\n{t.error}\n{(t.slurm or {}).get('log_tail')}"
    assert t.slurm["state"] == "COMPLETED" and t.steps_done == 4 and t.last_loss < t.first_loss
    assert len(t.ranks) == 2 and all(r.param_bytes and r.optimizer_bytes for r in t.ranks)
    assert any("MEGATRON_DIR" in n for n in t.notes)
    assert_no_leftovers(allow={p.pid for p in cluster._procs.values()})


def test_requeue_on_sigusr1_resumes_from_the_checkpoint(cluster, tmp_path):
    """A run longer than its job, chained by requeue, through the real SLURM: train_fsdp.sbatch (its #SBATCH
    lines fitted to the local node, --requeue kept) is submitted from another folder with no DTC_ARTIFACT_DIR
    (the script finds its folder from `scontrol show job`); SIGUSR1 to the batch shell (what
    --signal=B:USR1@lead does before the time limit) is forwarded through srun and torchrun to the trainers,
    which finish the step, save a checkpoint and exit 0; the script requeues its own job, and the requeued job
    (same id, Restarts=1) resumes from that checkpoint and finishes the run."""
    import json
    import re
    import subprocess

    from compiler.smoke.slurm import rewrite_sbatch

    folder = make_generated(tmp_path, "slurm-requeue", precision="fp32", dp_shard=2, zero_stage=3, micro_batch=1,
                            grad_accum=2, targets="fsdp, slurm")
    text = (folder / "train_fsdp.sbatch").read_text()
    assert "#SBATCH --requeue" in text and re.search(r"^#SBATCH --signal=B:USR1@\d+$", text, re.M)
    logs, submit_dir = tmp_path / "logs", tmp_path / "elsewhere"
    logs.mkdir()
    submit_dir.mkdir()
    job_text = rewrite_sbatch(text, partition="debug", cpus_per_task=2, time_limit_s=600, output_dir=logs)
    job_text = job_text.replace("#SBATCH --no-requeue", "#SBATCH --requeue")  # the smoke turns requeue off
    job_script = folder / "job_fsdp.sbatch"  # beside the generated files, like train_fsdp.sbatch
    job_script.write_text(job_text)
    steps = 120
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "DTC_"))}
    env.update(SLURM_CONF=str(cluster.conf_path), PYTHONUNBUFFERED="1",
               PATH=f"{Path(sys.executable).parent}:{cluster.env['PATH']}",  # torchrun of this venv
               OMP_NUM_THREADS="1", DTC_NPROC_PER_NODE="2", DTC_SMOKE_STEPS=str(steps), DTC_SMOKE_LAYERS="2",
               DTC_SMOKE_HIDDEN="64", DTC_SMOKE_HEADS="4", DTC_SMOKE_KV_HEADS="4", DTC_SMOKE_FFN="128",
               DTC_SMOKE_VOCAB="128", DTC_SMOKE_SEQ="32", DTC_SMOKE_SYNTHETIC="1", DTC_SMOKE_SAVE_INTERVAL="0",
               DTC_SMOKE_CHECKPOINT_DIR=str(tmp_path / "ckpt"))
    env["BASH_FUNC_module%%"] = "() {  echo \"no modules here: module $*\" >&2\n}"
    t0 = time.monotonic()
    r = subprocess.run(["sbatch", "--parsable", str(job_script)], env=env, cwd=submit_dir, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    job = int(r.stdout.split(";")[0])
    out, err = logs / f"slurm-requeue-smoke-{job}.out", logs / f"slurm-requeue-smoke-{job}.err"

    def steps_in() -> list[int]:
        try:
            return [int(m.group(1)) for m in re.finditer(r"^(?:\[\w*\d+\]:)?step (\d+)/", out.read_text(), re.M)]
        except OSError:
            return []

    deadline = time.monotonic() + 180
    while not steps_in() or max(steps_in()) < 3:
        state = (cluster.job_info(job) or {}).get("JobState", "?")
        assert time.monotonic() < deadline and not state.startswith(("COMPLETED", "FAILED", "CANCELLED")), (
            f"no step 3 in {out} (job {state}):\n{err.read_text()[-3000:] if err.exists() else ''}")
        time.sleep(0.2)
    signalled_after = max(steps_in())
    sig = cluster.run(["scancel", "--signal=USR1", "--batch", str(job)])
    assert sig.returncode == 0, sig.stderr

    def wait_for(done, what: str, timeout_s: float) -> dict:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            info = cluster.job_info(job) or {}
            if done(info):
                return info
            time.sleep(0.3)
        pytest.fail(f"job {job} never {what}: {cluster.job_info(job)}\n{err.read_text()[-3000:] if err.exists() else ''}"
                    f"\n{cluster.logs_tail()}")

    # the first job saves, exits and requeues itself: PENDING again, Restarts=1
    wait_for(lambda i: i.get("JobState", "").startswith("PENDING") and i.get("Restarts") == "1", "requeued", 120)
    first_log, first_err = out.read_text(), err.read_text()  # the requeued job's start truncates them
    # SLURM holds a requeued batch job for two minutes (EligibleTime = requeue + 121 s on 22.05, which the
    # RESTART_S allowance of compiler/checkpointing.py covers); the test starts it now
    # ... once the first run's step is gone from the node, and not within the second its credential was revoked:
    # slurmd compares credential times at one-second resolution, and a relaunch 0.2 s after the requeue was
    # killed by slurmctld ("Killing non-startable batch JobId=5: Job credential revoked", exit 1, no output)
    requeued_at = time.monotonic()
    end = time.monotonic() + 60
    while time.monotonic() < end:
        node = cluster.run(["scontrol", "show", "node", (cluster.job_info(job) or {}).get("BatchHost")
                            or "localhost"]).stdout
        if re.search(r"\bCPUAlloc=0\b", node) and not re.search(r"State=\S*(COMPLETING|ALLOCATED|MIXED)", node):
            break
        time.sleep(0.3)
    time.sleep(max(0.0, requeued_at + 2.5 - time.monotonic()))
    cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
    info = wait_for(lambda i: i.get("JobState", "").split()[0] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"),
                    "finished", 180)
    wall = time.monotonic() - t0
    log = out.read_text()
    detail = (f"{info}\n--- first err\n{first_err[-3000:]}\n--- first out\n{first_log[-1500:]}\n"
              f"--- second err\n{err.read_text()[-2000:]}\n--- second out\n{log[-1500:]}")
    print(f"requeue test: job {job} signalled after step {signalled_after}, wall {wall:.1f}s")
    assert info.get("JobState", "").startswith("COMPLETED") and info.get("Restarts") == "1", (
        detail + "\n--- slurm logs\n" + cluster.logs_tail())
    assert "forwarding it to the job step" in first_err and "requeueing job" in first_err, detail
    first = [int(m.group(1)) for m in re.finditer(r"^step (\d+)/", first_log, re.M)]
    second = [int(m.group(1)) for m in re.finditer(r"^step (\d+)/", log, re.M)]
    stopped_at = first[-1]
    assert first == list(range(1, stopped_at + 1)) and signalled_after <= stopped_at < steps, detail
    assert f"stopped after step {stopped_at} (checkpoint saved; requeue to resume)" in first_log, detail
    assert f"resumed from step {stopped_at}" in log and second == list(range(stopped_at + 1, steps + 1)), detail
    summary = json.loads(next(line for line in log.splitlines() if "dtc_fsdp_summary" in line))
    assert summary["resumed_from_step"] == stopped_at and not summary["stopped_by_signal"], detail
    assert summary["losses"][-1] < json.loads(next(line for line in first_log.splitlines()
                                                   if "dtc_fsdp_summary" in line))["losses"][0], detail
    assert not cluster.run(["squeue", "-h"]).stdout.strip()
