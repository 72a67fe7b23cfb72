"""`dtc smoke --slurm` against a real one-node SLURM cluster (tests/slurm_cluster.py).

The generated train_fsdp.sbatch and train_deepspeed.sbatch of tiny plans (their #SBATCH lines
rewritten for the local node, their `module load` line neutralised, the smoke options in the
environment) are submitted, waited for and reported like a local launch. Needs slurm-wlm,
munge and root: without them this FAILS (it does not skip).
"""
from __future__ import annotations

import os
import time

import pytest

from helpers import refresh_manifest
from slurm_cluster import INSTALL_HINT, SlurmCluster, missing_slurm_tools
from test_smoke import assert_no_leftovers, make_generated

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = missing_slurm_tools()
    if missing:
        pytest.fail(f"{INSTALL_HINT} (missing: {', '.join(missing)})", pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("the SLURM test cluster needs root (slurmd runs as root)", pytrace=False)
    c = SlurmCluster.start(tmp_path_factory.mktemp("slurm"), fake_gpu_nodes=0)
    try:
        yield c
    finally:
        c.stop()


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
