"""Data-parallel and tensor-parallel equivalence of the generated fsdp_config.py, for real.

One 4-rank torchrun of tests/smoke_equivalence.py on an fp32 plan (tp2 x dp_shard2, ZeRO-3):
the same global batch gives the same loss and the same gradients (to fp tolerance) on one
rank, unsharded, as sharded by FSDP2 over 4 ranks, by HSDP 2x2, and by TP2 x FSDP2; the TP
model's output equals the unsharded model's output. Needs torch (FAILS without it).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from test_smoke import assert_no_leftovers, make_generated

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("smoke_equivalence.py")


def test_dp_and_tp_equivalence(tmp_path):
    from compiler.smoke import launch as L
    from compiler.smoke.targets import torchrun_argv

    folder = make_generated(tmp_path, "equiv", precision="fp32", tp=2, dp_shard=2, zero_stage=3, micro_batch=2,
                            grad_accum=2, targets="fsdp, slurm")
    out = tmp_path / "equiv.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    spec = L.LaunchSpec(argv=torchrun_argv(4, tmp_path / "logs") + [str(WORKER), str(folder), str(out)],
                        env=env, cwd=tmp_path, log_dir=tmp_path / "logs", timeout_s=240, setup_timeout_s=240)
    t0 = time.monotonic()
    result = L.run_launch(spec)
    print(f"equivalence launch: {time.monotonic() - t0:.1f}s")
    assert result.returncode == 0, f"rank {result.failing_rank}: {result.error}\n{result.error_tail}"
    data = json.loads(out.read_text())
    assert data["param_dtype"] == "float32"
    assert set(data["meshes"]) == {"fsdp_full_shard_4", "hsdp_2x2", "tp2_x_fsdp2"}
    for name, m in data["meshes"].items():
        assert abs(m["loss"] - data["ref_loss"]) < 1e-5, (name, m)
        assert m["num_grads"] == m["ref_grad_count"] > 0, (name, m)
        assert m["grad_max_rel_diff"] < 1e-3, (name, m)
    tp = data["meshes"]["tp2_x_fsdp2"]
    assert tp["tp_output_max_abs_diff"] < 1e-5 * max(1.0, tp["tp_output_max_abs"]), tp
    assert_no_leftovers()
