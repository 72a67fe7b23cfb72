"""The Megatron cost profile's MoE host-operator count is what megatron-core's own MoE layer issues.

benchmarks/moe_host_ops.py builds megatron-core 0.19.2's MoELayer (alltoall dispatcher, fp32 router, aux loss,
EP 2 on two gloo CPU ranks) and counts the kernel-launching ATen operators of one forward by part; the
profile's MOE_ROUTER_AND_DISPATCHER_OPS (compiler/targets/megatron/cost.py) must equal that count, so an
upgrade of megatron-core that changes the router or the dispatcher shows here. Slow: it starts two processes.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_moe_router_and_dispatcher_ops_match_megatron_core() -> None:
    from compiler.targets.megatron.cost import COST, MOE_ROUTER_AND_DISPATCHER_OPS, OPS_PER_MOE_LAYER

    got = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "moe_host_ops.py"), "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-2000:]
    counts = json.loads(got.stdout)
    by_part = counts["kernels_by_part"]
    # the parts a GPU run has: the router's GEMM and top-k, the dispatcher's all-gather, host copies and all-to-alls
    assert by_part["router"] > 0 and by_part["token_dispatch"] == 2 and by_part["token_combine"] == 1, by_part
    assert any("device-to-host" in name for name in counts["kernel_names"]["dispatch_preprocess"])
    assert counts["moe_specific_forward_ops"] == MOE_ROUTER_AND_DISPATCHER_OPS, counts
    assert COST.ops_per_moe_layer == OPS_PER_MOE_LAYER
