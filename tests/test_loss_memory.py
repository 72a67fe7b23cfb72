"""The loss's memory (compiler/costmodel/activations.py LOSS_MEMORY) against the kernels themselves: PyTorch's
F.cross_entropy(logits.float()) and Megatron-Core's unfused and jit-fused vocab-parallel cross entropy, profiled on
CPU by benchmarks/loss_memory.py (what stays allocated between forward and backward, and the peak)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # imports megatron-core and profiles six forward + backward passes (~10 s)
def test_the_loss_memory_is_what_the_kernels_allocate():
    got = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "loss_memory.py"), "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    rows = json.loads(got.stdout[got.stdout.index("["):])
    assert {(r["kernel"], r["logits"]) for r in rows} == {
        (k, d) for k in ("torch_fp32", "megatron_fp32", "megatron_native") for d in ("bfloat16", "float32")}
    for r in rows:
        assert r["kept"] == pytest.approx(r["model_kept"], rel=0.05), r
        assert r["peak"] == pytest.approx(r["model_peak"], rel=0.05), r
    # PyTorch's loss peaks at three fp32 copies of the logits: the log-softmax it keeps and two gradients
    torch_bf16 = next(r for r in rows if r["kernel"] == "torch_fp32" and r["logits"] == "bfloat16")
    assert torch_bf16["peak"] == pytest.approx(12.0, rel=0.05)
