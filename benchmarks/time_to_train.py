#!/usr/bin/env python3
"""Time to train two published frontier runs from their published layouts.

    python benchmarks/time_to_train.py [--json]

* DeepSeek-V3 (DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437): 14.8T tokens on
  2048 H800 GPUs; Table 1: 2.664M GPU-hours for pre-training, 2.788M in total (with context
  extension and post-training). Layout (sec. 3.2): 16-way pipeline parallel (DualPipe), 64-way
  expert parallel across 8 nodes, ZeRO-1 data parallel, no tensor parallel; FP8 mixed precision
  (sec. 3.3); sequence 4096, batch ramped to 15360 sequences (sec. 4.2; the final value is used).
* Llama 3 405B (Meta, "The Llama 3 Herd of Models", arXiv:2407.21783): 30.84M H100-80GB GPU-hours
  (Llama 3.1 model card) for ~15.6T tokens; Table 4 layout on 16,384 GPUs: TP 8, CP 1, PP 16,
  DP 128, sequence 8192, 16M tokens per batch (16 sequences per DP rank), BF16, interleaved
  pipeline schedule; 400 TFLOP/s per GPU (41% MFU) measured.

The estimate is the ideal time (no failures or restarts): Llama 3 reports >90% effective
training time, DeepSeek reports no interruptions. Goal: within 20% of the published GPU-hours.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

from accuracy import make_problem  # noqa: E402
from compiler.catalog import load_catalog  # noqa: E402
from compiler.costmodel import evaluate  # noqa: E402
from compiler.estimate import Estimate  # noqa: E402
from compiler.layout import Layout  # noqa: E402
from compiler.problem import GpuOption  # noqa: E402


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    gpu: str
    tokens: float
    seq_len: int
    global_batch: int
    precision: str
    layout: dict
    published_gpu_hours: float
    published_note: str
    published_tflops_per_gpu: float | None = None


CASES = (
    Case("DeepSeek-V3 pre-training", "deepseek-v3", "h800", 14.8e12, 4096, 15360, "fp8",
         dict(tp=1, pp=16, cp=1, ep=64, dp_replicate=1, dp_shard=128, zero_stage=1, micro_batch=1, grad_accum=120,
              schedule="1f1b", recompute="none"),
         2.788e6, "2.788M H800 GPU-hours in total, 2.664M for pre-training (DeepSeek-V3 report, Table 1)"),
    Case("Llama 3 405B pre-training", "llama3.1-405b", "h100-sxm", 15.6e12, 8192, 2048, "bf16",
         dict(tp=8, pp=16, cp=1, ep=1, dp_replicate=1, dp_shard=128, zero_stage=1, micro_batch=1, grad_accum=16,
              vpp=4, schedule="interleaved_1f1b", recompute="none", sequence_parallel=True),
         30.84e6, "30.84M H100 GPU-hours (Llama 3.1 model card); 400 TFLOP/s per GPU on 16K GPUs (Llama 3 paper, Table 4)",
         400.0),
)


def estimate_case(case: Case) -> Estimate:
    catalog = load_catalog()
    spec = catalog.find_gpu(case.gpu)
    preset = catalog.find_model(case.model)
    assert spec is not None and preset is not None
    option = GpuOption(spec=spec, gpus_per_node=spec.default_gpus_per_node,
                       price_per_gpu_hour_usd=spec.price_per_gpu_hour_usd,
                       intra_node_bandwidth_bytes_per_s=spec.intra_node_bandwidth_bytes_per_s,
                       inter_node_bandwidth_bytes_per_s=spec.inter_node_bandwidth_bytes_per_s)
    layout = Layout(gpu=spec.name, gpus_per_node=spec.default_gpus_per_node, **case.layout)
    problem = make_problem(preset.shape, option, seq_len=case.seq_len, global_batch=case.global_batch,
                           tokens=int(case.tokens), precision=case.precision, num_gpus=layout.world_size,
                           name=case.name)
    est = evaluate(problem, layout, gpu=option, pipeline_events=False, check_memory=False)
    assert isinstance(est, Estimate), est
    return est


def run() -> list[dict]:
    out = []
    for case in CASES:
        est = estimate_case(case)
        out.append({
            "case": case.name, "gpus": est.num_gpus, "tokens": case.tokens,
            "step_time_s": est.step_time_s, "tokens_per_s_per_gpu": est.tokens_per_s_per_gpu,
            "model_tflops_per_gpu": est.model_tflops_per_gpu, "mfu": est.mfu,
            "time_to_train_days": est.time_to_train_s / 86400, "gpu_hours": est.gpu_hours,
            "cost_usd": est.cost_usd, "published_gpu_hours": case.published_gpu_hours,
            "error": est.gpu_hours / case.published_gpu_hours - 1.0, "published": case.published_note,
            "published_tflops_per_gpu": case.published_tflops_per_gpu,
            "memory_gib_per_gpu": est.memory.total_bytes_per_gpu / 2**30,
        })
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time to train DeepSeek-V3 and Llama 3 405B from their layouts")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = run()
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return 0
    for r in rows:
        print(f"{r['case']}: {r['gpus']} GPUs, {r['tokens'] / 1e12:.1f}T tokens")
        print(f"  step {r['step_time_s']:.2f} s, {r['tokens_per_s_per_gpu']:.0f} tokens/s/GPU, "
              f"{r['model_tflops_per_gpu']:.0f} model TFLOP/s/GPU"
              + (f" (published {r['published_tflops_per_gpu']:.0f})" if r["published_tflops_per_gpu"] else "")
              + f", MFU {r['mfu']:.1%}, {r['memory_gib_per_gpu']:.1f} GiB/GPU")
        print(f"  time to train {r['time_to_train_days']:.1f} days, {r['gpu_hours'] / 1e6:.3f}M GPU-hours "
              f"vs published {r['published_gpu_hours'] / 1e6:.3f}M ({r['error']:+.1%}); cost ${r['cost_usd'] / 1e6:.1f}M")
        print(f"  published: {r['published']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
