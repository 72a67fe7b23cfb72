"""Tests for the private SLURM test cluster (tests/slurm_cluster.py).

These need Debian's slurm-wlm + munge and root.  When they are missing the
tests FAIL (they do not skip): run `.ci/install-system-deps.sh`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import slurm_test_cluster  # noqa: E402
from slurm_cluster import INSTALL_HINT, missing_slurm_tools  # noqa: E402

pytestmark = pytest.mark.slow

FAKE_GPU_NODES = 128


def _script(path: Path, directives: list[str], body: str) -> Path:
    lines = ["#!/bin/bash"] + [f"#SBATCH {d}" for d in directives] + [body, ""]
    path.write_text("\n".join(lines))
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    t0 = time.monotonic()
    for c in slurm_test_cluster(tmp_path_factory.mktemp("slurm"), fake_gpu_nodes=FAKE_GPU_NODES, gpus_per_node=8):
        print(f"slurm cluster up in {time.monotonic() - t0:.1f}s (ports {c.ctld_port}/{c.slurmd_port})")
        yield c


def test_system_deps_installed():
    missing = missing_slurm_tools()
    assert not missing, f"{INSTALL_HINT} (missing: {', '.join(missing)})"


def test_real_two_task_srun_job(cluster, tmp_path):
    out = tmp_path / "job.out"
    script = _script(
        tmp_path / "two_tasks.sh",
        ["--job-name=two-tasks", "--ntasks=2", "--time=00:02:00", f"--output={out}"],
        "srun python3 -c 'import os; print(os.environ[\"SLURM_PROCID\"])'",
    )
    job_id = cluster.submit(script)
    result = cluster.wait(job_id, timeout_s=30)
    assert result["state"] == "COMPLETED", (result, out.read_text() if out.exists() else "")
    assert result["exit_code"] == 0
    assert Path(result["stdout_path"]) == out
    assert sorted(out.read_text().split()) == ["0", "1"]


def test_real_job_exit_code_is_reported(cluster, tmp_path):
    script = _script(tmp_path / "fail.sh", [f"--output={tmp_path}/fail.out"], "exit 3")
    result = cluster.wait(cluster.submit(script), timeout_s=30)
    assert result["state"] == "FAILED"
    assert result["exit_code"] == 3


@pytest.mark.parametrize("nodes", [16, FAKE_GPU_NODES])
def test_test_only_accepts_multi_node_gpu_request(cluster, tmp_path, nodes):
    script = _script(
        tmp_path / f"gpu{nodes}.sh",
        [f"--nodes={nodes}", "--gpus-per-node=8", "--ntasks-per-node=8",
         "--cpus-per-task=8", "--exclusive", "--partition=gpu",
         "--account=llm-pretrain", "--qos=high", "--time=2-00:00:00"],
        "srun true",
    )
    r = cluster.test_only(script)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "to start at" in r.stderr
    assert "in partition gpu" in r.stderr
    last = f"{nodes:03d}"
    assert f"gpu[001-{last}]" in r.stderr, r.stderr


def test_test_only_without_account_or_qos(cluster, tmp_path):
    script = _script(tmp_path / "plain.sh",
                     ["--nodes=2", "--gres=gpu:8", "--ntasks-per-node=8", "--partition=gpu"],
                     "srun true")
    r = cluster.test_only(script)
    assert r.returncode == 0, r.stdout + r.stderr


def test_test_only_refuses_impossible_request(cluster, tmp_path):
    script = _script(tmp_path / "huge.sh",
                     ["--nodes=100000", "--gpus-per-node=8", "--partition=gpu"], "srun true")
    r = cluster.test_only(script)
    assert r.returncode != 0
    assert "not available" in r.stdout + r.stderr


def test_test_only_refuses_gpus_on_real_node(cluster, tmp_path):
    # The real node has no GPUs: real jobs must not ask for any.
    script = _script(tmp_path / "gpu_debug.sh",
                     ["--nodes=1", "--gpus-per-node=1", "--partition=debug"], "srun true")
    r = cluster.test_only(script)
    assert r.returncode != 0
    assert "not available" in r.stdout + r.stderr
