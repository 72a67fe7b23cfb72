#!/usr/bin/env python3
"""Measure the memory of the loss kernels that run on CPU against the cost model's LOSS_MEMORY.

For each cross-entropy implementation a dtc stack runs that also runs here (PyTorch's
F.cross_entropy(logits.float()) of dtc's trainers and torchtitan, Megatron-Core's unfused
vocab_parallel_cross_entropy and its jit-fused one), one forward + backward of the loss over
bf16 and fp32 logits (T tokens x V vocab, from a tiny projection) is profiled with
torch.profiler's allocation events (profile_memory=True). Printed per kernel and dtype, in bytes
per logit: what is left allocated between the forward and the backward (kept), the peak of the
whole call, and the model's kept and kept + transient (compiler/costmodel/activations.py). The
projection's own tensors are a few hundredths of a byte per logit (its width is 16).

Megatron-Core's jit-fused functions run compiled by torch.compile (megatron/core/jit.py jit_fuser), as they do on
GPUs: compiled, they allocate a new softmax and a new gradient where the eager code works in place (dtc's CPU
smoke runs them eagerly, compiler/targets/megatron/cpu.py). Transformer Engine's fused cross entropy needs a GPU
and is not measured here.

    python benchmarks/loss_memory.py [--json]

Exit status 1 when a measured figure differs from the model's by more than 5%.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

T, V, H = 512, 32000, 16  # tokens, vocabulary, projection width
TOLERANCE = 0.05


def _allocations(fn) -> tuple[float, float]:
    """(bytes left allocated after ``fn``'s forward, peak bytes of the forward + backward), per logit."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = fn()
        with torch.profiler.record_function("dtc_backward"):
            loss.backward()
    events = prof.profiler.kineto_results.events()
    start = min(e.start_ns() for e in events if e.name() == "dtc_backward")
    allocations = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    live = peak = kept = 0
    for t, n in allocations:
        if t < start:
            kept = live + n
        live += n
        peak = max(peak, live)
    return kept / (T * V), peak / (T * V)


def _kernels():
    """(implementation, loss of (logits [T, 1, V], targets [T, 1])) for each kernel that runs here."""
    import torch.distributed as dist

    from compiler.runtime.model import cross_entropy

    yield "torch_fp32", lambda logits, y: cross_entropy(logits, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy
        from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1)
    group = dist.new_group([0])
    yield "megatron_fp32", lambda logits, y: vocab_parallel_cross_entropy(logits, y, tp_group=group).sum()
    yield "megatron_native", lambda logits, y: fused_vocab_parallel_cross_entropy(logits, y, group).sum()


def measure() -> list[dict]:
    import torch

    from compiler.costmodel.activations import LOSS_MEMORY

    torch.manual_seed(0)
    rows = []
    for name, loss_fn in _kernels():
        for dtype, b in ((torch.bfloat16, 2), (torch.float32, 4)):
            w = torch.randn(V, H, dtype=dtype, requires_grad=True)
            h = torch.randn(T, 1, H, dtype=dtype, requires_grad=True)
            y = torch.randint(0, V, (T, 1))

            def step():
                return loss_fn(h @ w.t(), y)

            step().backward()  # a first call compiles what the fused kernels jit
            kept, peak = _allocations(step)
            model_kept, model_transient = LOSS_MEMORY[name].per_logit(b)
            rows.append({"kernel": name, "logits": str(dtype).removeprefix("torch."), "kept": kept, "peak": peak,
                         "model_kept": model_kept, "model_peak": model_kept + model_transient})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = measure()
    off = [r for r in rows if abs(r["kept"] - r["model_kept"]) > TOLERANCE * r["model_kept"]
           or abs(r["peak"] - r["model_peak"]) > TOLERANCE * r["model_peak"]]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"loss memory per logit ({T} tokens x {V} vocab), measured / modelled:")
        for r in rows:
            print(f"  {r['kernel']:<16} {r['logits']:<9} kept {r['kept']:5.2f} / {r['model_kept']:4.1f} B   "
                  f"peak {r['peak']:5.2f} / {r['model_peak']:4.1f} B")
        print(f"{len(rows) - len(off)} of {len(rows)} within {TOLERANCE:.0%}")
    return 1 if off else 0


if __name__ == "__main__":
    sys.exit(main())
