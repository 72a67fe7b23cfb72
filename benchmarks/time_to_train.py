#!/usr/bin/env python3
"""Published production layouts: representable, fit in memory (checked, not bypassed), time to train.

    python benchmarks/time_to_train.py [--json]

* DeepSeek-V3 (DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437): 14.8T tokens on
  2048 H800 GPUs. Table 1: 2.664M H800 GPU-hours for pre-training (2.788M with the 119K of context
  extension and 5K of post-training). Layout (sec. 3.2): 16-way pipeline parallel (DualPipe),
  64-way expert parallel across 8 nodes, ZeRO-1 data parallel, no tensor parallel; fine-grained
  FP8 (1x128 activation / 128x128 weight scales, sec. 3.3) with DeepEP-style dispatch; sequence
  4096, batch ramped to 15360 sequences (sec. 4.2; the final value is used).
* Llama 3 405B (Meta, "The Llama 3 Herd of Models", arXiv:2407.21783): Table 4 layout on 16,384
  H100 GPUs: TP 8, CP 1, PP 16 with the interleaved schedule, DP 128, sequence 8192, 16M tokens per
  batch (2048 sequences); BF16; 400 TFLOP/s per GPU measured. Sec. 3.3.2: the first and the last
  stage give up one layer each, so the first chunk holds only the embedding and the last only the
  output layer and loss: 126 + 2 = 128 = 16 stages x 8 virtual stages of one layer. Published: 30.84M H100-80GB GPU-hours
  (Llama 3.1 model card) for the whole pre-training of 405B: the ~15.6T-token main stage plus the
  long-context stage (~800B tokens up to 128K context, Table 4's third row: CP 16, 380 TFLOP/s) and
  annealing, and the time lost to the 466 interruptions of the 54-day snapshot (>90% effective
  training time, sec. 3.3.4). The estimate here is the main stage at 8K context with no failures, so
  it is expected below the published figure by roughly those shares. Costed for the "llama3_meta"
  framework profile (compiler/calibration/frameworks.py) in two readings of sec. 3.3.2, which says FSDP
  "shards the optimizer states and gradients" and that gradients are accumulated in FP32 over the
  micro-batches and reduce-scattered in FP32: (a) ZeRO-2, gradients reduce-scattered after every
  micro-batch (fits; 16 fp32 reduce-scatters of the stage's gradients per step make it slow), (b)
  gradients accumulated unsharded in fp32 with one reduce-scatter per step (FSDP2's behaviour under a
  pipeline schedule): the memory model puts it at 87.5 GiB (16 micro-batches x 8 layers of activations
  without checkpointing, 68 GB, plus 12.75 GB of fp32 gradients), so it is reported as not fitting,
  with what it would cost if it fitted. Meta's schedule (its "flexible N") or saved-tensor set must keep
  less than this model assumes; the paper does not say how much.
* NeMo's Llama 3.1 405B layout (NeMo / Megatron-Bridge performance recipe, 1024 H100): TP 8, PP 8
  with 8 virtual stages (126 layers in 64 chunks), CP 2, sequence 8192, global batch 512; compared
  with the tokens/s per GPU the Megatron-Bridge performance summary measured for that layout
  (benchmarks/data/published_runs_dev.csv row 575, NeMo 25.09: 302 tokens/s/GPU).

Each layout is evaluated with the memory check ON: a layout the memory model says does not fit is
reported as such. Goal: within 15% of the published figure.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from compiler.calibration.frameworks import published_profile  # noqa: E402
from compiler.calibration.runs import gpu_option, make_problem  # noqa: E402
from compiler.catalog import load_catalog  # noqa: E402
from compiler.costmodel import evaluate  # noqa: E402
from compiler.estimate import Estimate, Rejection  # noqa: E402
from compiler.layout import Layout  # noqa: E402


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
    framework: str
    published: float  # GPU-hours, or tokens/s per GPU when kind == "throughput"
    published_note: str
    kind: str = "gpu_hours"
    fp8_recipe: str = ""
    published_tflops_per_gpu: float | None = None
    mtp_layers: int = 0  # multi-token-prediction modules, costed as that many more decoder layers
    fits_in_model: bool = True  # False: the memory model rejects the published layout (documented disagreement)
    extra: dict = field(default_factory=dict)


LLAMA3_NOTE = ("30.84M H100 GPU-hours (Llama 3.1 model card): the whole 405B pre-training incl. the long-context "
               "stage, annealing and interruptions; 400 TFLOP/s per GPU on 16K GPUs (Llama 3 paper, Table 4)")

CASES = (
    Case("DeepSeek-V3 pre-training", "deepseek-v3", "h800", 14.8e12, 4096, 15360, "fp8",
         dict(tp=1, pp=16, cp=1, ep=64, dp_replicate=1, dp_shard=128, zero_stage=1, micro_batch=1, grad_accum=120,
              schedule="1f1b", recompute="none"),
         "deepseek_v3", 2.664e6,
         "2.664M H800 GPU-hours for pre-training, 2.788M in total with context extension and post-training "
         "(DeepSeek-V3 report, Table 1)", fp8_recipe="fp8_blockwise", mtp_layers=1),
    Case("Llama 3 405B pre-training, ZeRO-2 reading", "llama3.1-405b", "h100-sxm", 15.6e12, 8192, 2048, "bf16",
         dict(tp=8, pp=16, cp=1, ep=1, dp_replicate=1, dp_shard=128, zero_stage=2, micro_batch=1, grad_accum=16,
              vpp=8, schedule="interleaved_1f1b", recompute="none", sequence_parallel=True),
         "llama3_meta", 30.84e6, LLAMA3_NOTE, published_tflops_per_gpu=400.0),
    Case("Llama 3 405B pre-training, fp32 accumulation reading", "llama3.1-405b", "h100-sxm", 15.6e12, 8192, 2048,
         "bf16",
         dict(tp=8, pp=16, cp=1, ep=1, dp_replicate=1, dp_shard=128, zero_stage=1, micro_batch=1, grad_accum=16,
              vpp=8, schedule="interleaved_1f1b", recompute="none", sequence_parallel=True),
         "llama3_meta", 30.84e6, LLAMA3_NOTE, published_tflops_per_gpu=400.0, fits_in_model=False),
    Case("NeMo Llama 3.1 405B (pp8 x vpp8)", "llama3.1-405b", "h100-sxm", 1e12, 8192, 512, "fp8",
         dict(tp=8, pp=8, cp=2, ep=1, dp_replicate=1, dp_shard=8, zero_stage=1, micro_batch=1, grad_accum=64,
              vpp=8, schedule="interleaved_1f1b", recompute="none", sequence_parallel=True),
         "megatron_bridge", 302.0,
         "Megatron-Bridge performance summary, NeMo 25.09, 1024 H100, FP8: 302 tokens/s per GPU "
         "(benchmarks/data/published_runs_dev.csv row 575)", kind="throughput", fp8_recipe="fp8_tensorwise_current"),
)


def estimate_case(case: Case, *, check_memory: bool = True) -> Estimate | Rejection:
    catalog = load_catalog()
    spec = catalog.find_gpu(case.gpu)
    preset = catalog.find_model(case.model)
    assert spec is not None and preset is not None
    option = gpu_option(spec, spec.default_gpus_per_node)
    layout = Layout(gpu=spec.name, gpus_per_node=spec.default_gpus_per_node, **case.layout)
    shape = replace(preset.shape, num_layers=preset.shape.num_layers + case.mtp_layers)
    problem = make_problem(shape, option, seq_len=case.seq_len, global_batch=case.global_batch,
                           tokens=int(case.tokens), precision=case.precision, num_gpus=layout.world_size,
                           name=case.name, fp8_recipe=case.fp8_recipe)
    return evaluate(problem, layout, gpu=option, target=published_profile(case.framework),
                    pipeline_events=False, check_memory=check_memory)


def run() -> list[dict]:
    out = []
    for case in CASES:
        est = estimate_case(case)
        row: dict = {"case": case.name, "published": case.published, "kind": case.kind,
                     "published_note": case.published_note, "framework": case.framework}
        if isinstance(est, Rejection):
            row.update(fits=False, rejection=f"{est.code}: {est.message}", error=None)
            est = estimate_case(case, check_memory=False)  # what it would cost if it fitted (diagnostic)
            if isinstance(est, Rejection):
                out.append(row)
                continue
        value = est.gpu_hours if case.kind == "gpu_hours" else est.tokens_per_s_per_gpu
        row.setdefault("fits", True)
        row.update(gpus=est.num_gpus, tokens=case.tokens, step_time_s=est.step_time_s,
                   tokens_per_s_per_gpu=est.tokens_per_s_per_gpu, model_tflops_per_gpu=est.model_tflops_per_gpu,
                   mfu=est.mfu, time_to_train_days=est.time_to_train_s / 86400, gpu_hours=est.gpu_hours,
                   cost_usd=est.cost_usd, predicted=value, error=value / case.published - 1.0,
                   published_tflops_per_gpu=case.published_tflops_per_gpu,
                   memory_gib_per_gpu=est.memory.total_bytes_per_gpu / 2**30,
                   hbm_gib=est.memory.hbm_bytes_per_gpu / 2**30)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Published production layouts: fit and time to train")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = run()
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return 0
    for r in rows:
        print(f"{r['case']} ({r['framework']})")
        if not r["fits"]:
            print(f"  DOES NOT FIT: {r['rejection']}")
            if "predicted" not in r:
                continue
            print("  if it fitted:")
        print(f"  {r['gpus']} GPUs, memory {r['memory_gib_per_gpu']:.1f} of {r['hbm_gib']:.0f} GiB per GPU; step "
              f"{r['step_time_s']:.2f} s, {r['tokens_per_s_per_gpu']:.0f} tokens/s/GPU, "
              f"{r['model_tflops_per_gpu']:.0f} model TFLOP/s/GPU"
              + (f" (published {r['published_tflops_per_gpu']:.0f})" if r["published_tflops_per_gpu"] else "")
              + f", MFU {r['mfu']:.1%}")
        if r["kind"] == "gpu_hours":
            print(f"  time to train {r['time_to_train_days']:.1f} days, {r['gpu_hours'] / 1e6:.3f}M GPU-hours vs "
                  f"published {r['published'] / 1e6:.3f}M ({r['error']:+.1%})")
        else:
            print(f"  {r['tokens_per_s_per_gpu']:.0f} tokens/s/GPU vs published {r['published']:.0f} "
                  f"({r['error']:+.1%})")
        print(f"  published: {r['published_note']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
