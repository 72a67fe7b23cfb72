#!/usr/bin/env python3
"""Published production layouts: representable, fit in memory (checked, not bypassed), time to train.

    python benchmarks/time_to_train.py [--json]

* DeepSeek-V3 (DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437): 14.8T tokens on
  2048 H800 GPUs. Table 1: 2.664M H800 GPU-hours for pre-training (2.788M with the 119K of context
  extension and 5K of post-training). Layout (sec. 3.2): 16-way pipeline parallel (DualPipe),
  64-way expert parallel across 8 nodes, ZeRO-1 data parallel, no tensor parallel; fine-grained
  FP8 (1x128 activation / 128x128 weight scales, sec. 3.3) with DeepEP-style dispatch; sequence
  4096, batch ramped to 15360 sequences (sec. 4.2; the final value is used).
* Llama 3 405B (Meta, "The Llama 3 Herd of Models", arXiv:2407.21783). Published: 30.84M H100-80GB
  GPU-hours (Llama 3.1 model card) for the whole pre-training of the 405B, which is three parts, each
  costed here with its own Table 4 layout on 16,384 H100s and the memory check on:
  (1) the main stage at 8K context (sec. 3.4.1): TP 8, CP 1, PP 16 interleaved, DP 128, 16M tokens per
  batch (2048 sequences, 16 micro-batches per data-parallel rank), BF16, 400 TFLOP/s per GPU measured;
  the first and the last stage give up one layer each (sec. 3.3.2: 126 + 2 = 128 = 16 stages x 8
  virtual stages of one unit, Megatron's --account-for-embedding/loss split); 15.6T - 0.8T tokens;
  (2) the long-context stage (sec. 3.4.2): ~800B tokens in six stages from 8K to 128K context, costed at
  128K with Table 4's third row (TP 8, CP 16, PP 16, DP 8, 380 TFLOP/s measured), so an upper bound on
  its cost (the earlier stages are shorter); the 40M annealing tokens are in (1);
  (3) interruptions: sec. 3.3.4 reports higher than 90% effective training time over a 54-day snapshot
  with 466 interruptions; the GPU-hours of (1) + (2) are divided by 0.9.
  The stack is costed with the "llama3_meta" profile (compiler/calibration/frameworks.py): sec. 3.3.2's
  FSDP "shards the optimizer states and gradients" and does not reshard the model after the forward
  (zero_stage 2: the bf16 weights stay gathered), with FP32 gradient accumulation over the micro-batches
  and FP32 reduce-scatters; the reduce-scatter of each micro-batch's gradients runs on the network while
  the pipeline computes the next ones (compiler/costmodel/step.py zero_exposed_s). The other reading,
  gradients accumulated unsharded in fp32 with one reduce-scatter per step, does not fit the memory model
  (16 micro-batches x 8 layers of activations without checkpointing, 68 GB, plus 12.75 GB of fp32
  gradients): it is reported with what it would cost if it fitted.
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
from compiler.costmodel.evaluation import evaluate  # noqa: E402
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
    # more parts of the published figure, each (name, tokens, seq_len, global_batch, layout); `tokens` is the
    # first part's
    phases: tuple = ()
    effective_time_fraction: float = 1.0  # training time / wall time (interruptions), from the source


LLAMA3_NOTE = ("30.84M H100 GPU-hours (Llama 3.1 model card): the whole 405B pre-training incl. the long-context "
               "stage, annealing and interruptions; 400 TFLOP/s per GPU on 16K GPUs (Llama 3 paper, Table 4)")

CASES = (
    Case("DeepSeek-V3 pre-training", "deepseek-v3", "h800", 14.8e12, 4096, 15360, "fp8",
         dict(tp=1, pp=16, cp=1, ep=64, dp_replicate=1, dp_shard=128, zero_stage=1, micro_batch=1, grad_accum=120,
              schedule="1f1b", recompute="none"),
         "deepseek_v3", 2.664e6,
         "2.664M H800 GPU-hours for pre-training, 2.788M in total with context extension and post-training "
         "(DeepSeek-V3 report, Table 1)", fp8_recipe="fp8_blockwise", mtp_layers=1),
    Case("Llama 3 405B pre-training", "llama3.1-405b", "h100-sxm", 14.8e12, 8192, 2048, "bf16",
         dict(tp=8, pp=16, cp=1, ep=1, dp_replicate=1, dp_shard=128, zero_stage=2, micro_batch=1, grad_accum=16,
              vpp=8, schedule="interleaved_1f1b", recompute="none", sequence_parallel=True),
         "llama3_meta", 30.84e6, LLAMA3_NOTE, published_tflops_per_gpu=400.0,
         phases=(("long-context stage at 128K (upper bound), 380 TFLOP/s published", 0.8e12, 131072, 128,
                  dict(tp=8, pp=16, cp=16, ep=1, dp_replicate=1, dp_shard=8, zero_stage=2, micro_batch=1,
                       grad_accum=16, vpp=8, schedule="interleaved_1f1b", recompute="none",
                       sequence_parallel=True)),),
         effective_time_fraction=0.9),
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


def estimate_case(case: Case, *, check_memory: bool = True, phase: tuple | None = None) -> Estimate | Rejection:
    """The case's first part, or ``phase`` (one of case.phases) on the same model, GPU and framework."""
    catalog = load_catalog()
    spec = catalog.find_gpu(case.gpu)
    preset = catalog.find_model(case.model)
    assert spec is not None and preset is not None
    option = gpu_option(spec, spec.default_gpus_per_node)
    tokens, seq_len, global_batch, lay = (case.tokens, case.seq_len, case.global_batch, case.layout) \
        if phase is None else phase[1:]
    layout = Layout(gpu=spec.name, gpus_per_node=spec.default_gpus_per_node, **lay)
    shape = replace(preset.shape, num_layers=preset.shape.num_layers + case.mtp_layers)
    problem = make_problem(shape, option, seq_len=seq_len, global_batch=global_batch,
                           tokens=int(tokens), precision=case.precision, num_gpus=layout.world_size,
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
        phases = []
        for ph in case.phases:
            pe = estimate_case(case, phase=ph)
            fits = not isinstance(pe, Rejection)
            if not fits:
                row.update(fits=False, rejection=f"{ph[0]}: {pe.code}: {pe.message}")
                pe = estimate_case(case, phase=ph, check_memory=False)
            assert isinstance(pe, Estimate), pe
            phases.append({"phase": ph[0], "fits": fits, "tokens": ph[1], "gpu_hours": pe.gpu_hours,
                           "model_tflops_per_gpu": pe.model_tflops_per_gpu, "step_time_s": pe.step_time_s,
                           "memory_gib_per_gpu": pe.memory.total_bytes_per_gpu / 2**30})
        total_gpu_hours = (est.gpu_hours + sum(p["gpu_hours"] for p in phases)) / case.effective_time_fraction
        value = total_gpu_hours if case.kind == "gpu_hours" else est.tokens_per_s_per_gpu
        row.setdefault("fits", True)
        row.update(phases=phases, effective_time_fraction=case.effective_time_fraction,
                   main_gpu_hours=est.gpu_hours)
        row.update(gpus=est.num_gpus, tokens=case.tokens, step_time_s=est.step_time_s,
                   tokens_per_s_per_gpu=est.tokens_per_s_per_gpu, model_tflops_per_gpu=est.model_tflops_per_gpu,
                   mfu=est.mfu, time_to_train_days=est.time_to_train_s / 86400, gpu_hours=total_gpu_hours,
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
            if r["phases"] or r["effective_time_fraction"] != 1.0:
                parts = [f"{r['main_gpu_hours'] / 1e6:.3f}M ({r['tokens'] / 1e12:.1f}T tokens)"]
                for p in r["phases"]:
                    parts.append(f"{p['gpu_hours'] / 1e6:.3f}M {p['phase']} ({p['tokens'] / 1e12:.1f}T tokens, "
                                 f"{p['model_tflops_per_gpu']:.0f} TFLOP/s/GPU, memory {p['memory_gib_per_gpu']:.1f}"
                                 f" GiB{'' if p['fits'] else ', DOES NOT FIT'})")
                print("  GPU-hours: " + " + ".join(parts)
                      + (f", / {r['effective_time_fraction']:g} effective training time"
                         if r["effective_time_fraction"] != 1.0 else ""))
            print(f"  time to train {r['time_to_train_days']:.1f} days (first part), {r['gpu_hours'] / 1e6:.3f}M "
                  f"GPU-hours vs published {r['published'] / 1e6:.3f}M ({r['error']:+.1%})")
        else:
            print(f"  {r['tokens_per_s_per_gpu']:.0f} tokens/s/GPU vs published {r['published']:.0f} "
                  f"({r['error']:+.1%})")
        print(f"  published: {r['published_note']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
