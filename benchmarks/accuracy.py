#!/usr/bin/env python3
"""Accuracy of the cost model against published training runs.

    python benchmarks/accuracy.py CSV [--json]

For every row of CSV (the columns of shared/calibration/published_runs_dev.csv) that has a
model shape, a layout and a measured throughput, build the Problem and the Layout of the
published run, evaluate it with compiler.costmodel, and compare the predicted tokens/s per
GPU with the measured one. Where a row gives only TFLOP/s per GPU (or MFU), the measured
tokens/s is that rate divided by the row's own FLOPs per token (its ``flop_convention``:
Narayanan 2021, Korthikanti 2022, NeMo, Megatron-Bridge, torchtitan, llm-foundry), i.e. the
prediction is compared in the row's convention. Rows it cannot model are skipped and the
reasons counted. Prints a table per source and overall, ending with

    overall: N rows, median |error| X%, p90 |error| Y%

``--json`` prints the same summary with every row's prediction. The efficiency constants
are global per GPU generation (compiler/data/efficiency.yaml); nothing is fitted per row.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from compiler.catalog import Catalog, GpuSpec, load_catalog, normalize_name  # noqa: E402
from compiler.costmodel import evaluate  # noqa: E402
from compiler.estimate import Estimate, Rejection  # noqa: E402
from compiler.layout import Layout  # noqa: E402
from compiler.model import ModelShape, MoEShape, count_params  # noqa: E402
from compiler.problem import GpuOption, Hyper, Pins, Problem  # noqa: E402

# GPUs the catalog does not list can be modelled with the nearest entry (--proxy-gpus). Off by
# default: GB300/B300 run hotter (1.4 kW) than GB200/B200 and the proxy is 20-30% slow on them.
GPU_PROXIES = {"gb300": "gb200", "b300": "b200"}


# Architectures ModelShape cannot express, so their FLOPs and kernels would be wrong: matched on the
# model name (case-insensitive substring) and skipped with the reason (reported in the summary).
UNMODELLED_ARCHITECTURES = {
    "gpt-oss": "architecture not modelled (alternating sliding-window attention with attention sinks)",
    "nemotron-h": "architecture not modelled (hybrid Mamba-Transformer)",
    "nemotron 3": "architecture not modelled (hybrid Mamba-Transformer)",
}


class Skip(Exception):
    """A row the cost model cannot evaluate; the message is the counted reason."""


# --- building the problem ------------------------------------------------------------------------------


def _num(row: dict, key: str) -> float | None:
    text = (row.get(key) or "").strip().replace(",", "")
    m = re.match(r"^-?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?", text)
    return float(m.group(0)) if m else None


def _int(row: dict, key: str) -> int | None:
    x = _num(row, key)
    return None if x is None else int(round(x))


def find_gpu(catalog: Catalog, name: str, *, proxies: bool = False) -> tuple[GpuSpec, bool]:
    """(spec, proxied) for a CSV gpu_type such as 'H100-SXM-80GB' or 'GB200 (NVL72)'."""
    base = normalize_name(re.sub(r"\(.*?\)", "", name))
    parts = [p for p in base.split("-") if p]
    tries = [base, f"{parts[0]}-{parts[-1]}" if len(parts) > 1 else base]
    tries += ["-".join(parts[:i]) for i in range(len(parts), 0, -1)]
    for key in tries:
        spec = catalog.find_gpu(key)
        if spec is not None:
            return spec, False
    proxy = GPU_PROXIES.get(parts[0]) if parts and proxies else None
    if proxy and catalog.find_gpu(proxy) is not None:
        return catalog.find_gpu(proxy), True  # type: ignore[return-value]
    raise Skip("gpu not in catalog")


def precision_of(row: dict) -> str:
    text = row.get("precision", "").lower()
    if "fp4" in text:
        raise Skip("precision not modelled (fp4)")
    if "fp8" in text:
        return "fp8"
    if "fp32" in text and "bf16" not in text:
        return "fp32"
    return "bf16"


def _is_gpt_style(row: dict) -> bool:
    model = row.get("model", "")
    return bool(re.search(r"\bGPT(?!-OSS)|MPT", model, flags=re.IGNORECASE))


def shape_of(row: dict, catalog: Catalog) -> ModelShape:
    layers, hidden, heads = _int(row, "num_layers"), _int(row, "hidden_size"), _int(row, "num_attention_heads")
    vocab = _int(row, "vocab_size")
    if not (layers and hidden and heads and vocab):
        raise Skip("architecture not given")
    preset = catalog.find_model(row.get("model", ""))
    if preset is not None and (preset.shape.num_layers, preset.shape.hidden_size) == (layers, hidden):
        return preset.shape  # the catalog knows details the CSV lacks (MLA, dense first layers)
    gpt = _is_gpt_style(row)
    ffn = _int(row, "ffn_hidden_size") or 4 * hidden
    kv = _int(row, "num_kv_heads") or heads
    experts = _int(row, "moe_experts")
    moe = None
    if experts and experts > 1:
        shared = _int(row, "moe_shared_experts") or 0
        moe = MoEShape(num_experts=experts, top_k=_int(row, "moe_topk") or 1, expert_ffn_hidden_size=ffn,
                       num_shared_experts=shared)
    megatron_gpt = gpt and row.get("source_id", "").startswith(("narayanan", "korthikanti"))
    return ModelShape(
        num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads, num_kv_heads=kv,
        vocab_size=vocab, mlp="gelu" if gpt else "swiglu", norm="layernorm" if gpt else "rmsnorm",
        position="learned" if megatron_gpt else "rope",
        max_position_embeddings=_int(row, "seq_len") or 2048 if megatron_gpt else 0,
        tied_embeddings="MPT" in row.get("model", ""), linear_bias=megatron_gpt, moe=moe)


def make_problem(shape: ModelShape, gpu: GpuOption, *, seq_len: int, global_batch: int, tokens: int,
                 precision: str, num_gpus: int, name: str = "benchmark") -> Problem:
    return Problem(
        name=name, description="", spec_path="", spec_sha256="", model_name=name, shape=shape,
        params=count_params(shape), tokens=tokens, seq_len=seq_len, global_batch=global_batch,
        global_batch_tolerance=0.0, batch_note="", precision=precision, optimizer="adamw",
        hyper=Hyper(3e-4, 3e-5, 0, 0.1, 1.0, 0.9, 0.95, 1234), gpu_options=(gpu,), num_gpus=num_gpus,
        min_gpus=num_gpus, max_gpus=num_gpus, max_cost_usd=None, deadline_s=None, objective="fastest", pins=Pins(),
        memory_headroom=0.0, allow_cross_node_tp=True, top_k=1, targets=())


def zero_of(row: dict, dp: int) -> tuple[int, int]:
    """(zero_stage, dp_shard) from the row's zero_fsdp text."""
    text = row.get("zero_fsdp", "").lower()
    if re.search(r"zero-3|fsdp|full_shard|full shard", text) and "fsdp=0" not in text:
        m = re.search(r"sharding group (\d+)", text)
        shard = int(m.group(1)) if m and dp % int(m.group(1)) == 0 else dp
        return 3, shard
    if "distributed optimizer" in text or (not text.strip() and not row.get("source_id", "").startswith(
            ("narayanan", "korthikanti", "mosaic", "torchtitan"))):
        return (1, dp) if dp > 1 else (0, 1)
    return 0, 1


def recompute_of(row: dict) -> str:
    text = row.get("activation_recompute", "").lower()
    if text.startswith("full"):
        return "full"
    if text.startswith("selective"):
        return "selective"
    return "none"


def layout_of(row: dict, gpu: GpuSpec, problem: Problem) -> Layout:
    n = _int(row, "num_gpus")
    tp, pp = _int(row, "tp"), _int(row, "pp")
    if not n or tp is None or pp is None:
        raise Skip("layout not given")
    cp, ep, vp = _int(row, "cp") or 1, _int(row, "ep") or 1, _int(row, "vp") or 1
    dp = n // (tp * pp * cp)
    if tp * pp * cp * dp != n:
        raise Skip("layout does not multiply to num_gpus")
    mbs = _int(row, "micro_batch_size") or 1
    gbs = _int(row, "global_batch_size")
    if not gbs:
        raise Skip("global batch not given")
    ga = _int(row, "grad_accum") or max(1, round(gbs / (mbs * dp)))
    if mbs * ga * dp != gbs:
        ga = max(1, round(gbs / (mbs * dp)))
    zero, shard = zero_of(row, dp)
    sp_text = row.get("sequence_parallel", "").strip().lower()
    sp = tp > 1 and (sp_text == "yes" or (sp_text == "" and not row.get("source_id", "").startswith("narayanan")))
    if vp > 1 and ga % pp:
        raise Skip("interleaved schedule with micro-batches not a multiple of pp")
    if ep > 1 and (dp * cp) % ep:
        raise Skip("ep does not divide dp x cp")
    gpn = _int(row, "gpus_per_node") or gpu.default_gpus_per_node
    return Layout(gpu=gpu.name, gpus_per_node=gpn, tp=tp, pp=pp, cp=cp, ep=ep, dp_replicate=dp // shard,
                  dp_shard=shard, zero_stage=zero, micro_batch=mbs, grad_accum=ga, vpp=vp,
                  schedule="interleaved_1f1b" if vp > 1 else "1f1b", recompute=recompute_of(row),
                  sequence_parallel=sp)


# --- what the row measured ------------------------------------------------------------------------------


def convention_flops_per_token(row: dict, shape: ModelShape) -> float | None:
    """FLOPs per token as the row's source counts them (see calibration/README.md)."""
    conv = row.get("flop_convention", "").lower()
    s, l, h, v = _int(row, "seq_len") or 0, shape.num_layers, shape.hidden_size, shape.vocab_size
    pc = count_params(shape)
    if conv.startswith("narayanan"):
        return 96 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    if conv.startswith("korthikanti"):
        return 72 * l * h * h * (1 + s / (6 * h) + v / (12 * h * l))
    if conv.startswith("mosaicml"):
        return 6 * pc.total + 12 * l * h * s
    if conv.startswith("torchtitan"):
        return 6 * pc.non_embedding + 12 * l * h * s
    from compiler.costmodel.compute import model_flops_per_token

    causal = model_flops_per_token(shape, pc, s)
    if "causal" in conv or "megatron-bridge" in conv:
        return causal
    if conv.startswith(("nemo", "nemo 2.0")) or "non-causal" in conv:
        from compiler.costmodel.compute import attention_core_flops_per_token_forward

        return causal + 3 * attention_core_flops_per_token_forward(shape, s)
    return None


def measured_tokens_per_s_per_gpu(row: dict, shape: ModelShape) -> tuple[float, str]:
    n = _int(row, "num_gpus") or 1
    x = _num(row, "tokens_per_sec_per_gpu")
    if x:
        return x, "tokens_per_sec_per_gpu"
    x = _num(row, "tokens_per_sec_total")
    if x:
        return x / n, "tokens_per_sec_total"
    step, gbs, s = _num(row, "step_time_s"), _int(row, "global_batch_size"), _int(row, "seq_len")
    if step and gbs and s:
        return gbs * s / step / n, "step_time_s"
    fpt = convention_flops_per_token(row, shape)
    tflops = _num(row, "tflops_per_gpu")
    if tflops and fpt:
        return tflops * 1e12 / fpt, "tflops_per_gpu / convention"
    mfu, peak = _num(row, "mfu_pct"), _num(row, "peak_tflops_used_by_source")
    if mfu and peak and fpt:
        return mfu / 100 * peak * 1e12 / fpt, "mfu_pct / convention"
    raise Skip("no measured throughput")


# --- running ---------------------------------------------------------------------------------------------


@dataclass
class RowResult:
    row_id: str
    source_id: str
    model: str
    gpu: str
    proxied_gpu: bool
    layout: str
    measured_tokens_per_s_per_gpu: float
    predicted_tokens_per_s_per_gpu: float
    measured_from: str
    error: float  # predicted / measured - 1
    predicted_tflops_row_convention: float | None
    memory_fits: bool
    memory_total_gib: float
    extras: dict[str, Any] = field(default_factory=dict)


def evaluate_row(row: dict, catalog: Catalog, *, proxies: bool = False) -> RowResult:
    if not row.get("workload", "").lower().startswith("pretrain"):
        raise Skip("not a pretraining run (SFT/LoRA)")
    if row.get("value_kind", "measured").strip() not in ("measured", ""):
        raise Skip("not a measurement")
    for marker, reason in UNMODELLED_ARCHITECTURES.items():
        if marker in row.get("model", "").lower():
            raise Skip(reason)
    gpu_spec, proxied = find_gpu(catalog, row.get("gpu_type", ""), proxies=proxies)
    shape = shape_of(row, catalog)
    measured, how = measured_tokens_per_s_per_gpu(row, shape)
    precision = precision_of(row)
    n = _int(row, "num_gpus") or 1
    gpn = _int(row, "gpus_per_node") or gpu_spec.default_gpus_per_node
    option = GpuOption(spec=gpu_spec, gpus_per_node=gpn, price_per_gpu_hour_usd=gpu_spec.price_per_gpu_hour_usd,
                       intra_node_bandwidth_bytes_per_s=gpu_spec.intra_node_bandwidth_bytes_per_s,
                       inter_node_bandwidth_bytes_per_s=gpu_spec.inter_node_bandwidth_bytes_per_s)
    seq = _int(row, "seq_len") or 2048
    problem = make_problem(shape, option, seq_len=seq, global_batch=_int(row, "global_batch_size") or 1,
                           tokens=10**12, precision=precision, num_gpus=n)
    layout = layout_of(row, gpu_spec, problem)
    problem = replace(problem, global_batch=layout.global_batch)
    est = evaluate(problem, layout, gpu=option, pipeline_events=False, check_memory=False)
    if isinstance(est, Rejection):
        raise Skip(f"rejected: {est.code}")
    assert isinstance(est, Estimate)
    fpt = convention_flops_per_token(row, shape)
    pred = est.tokens_per_s_per_gpu
    return RowResult(
        row_id=row.get("row_id", ""), source_id=row.get("source_id", ""), model=row.get("model", ""),
        gpu=gpu_spec.name + (" (proxy)" if proxied else ""), proxied_gpu=proxied, layout=layout.describe(),
        measured_tokens_per_s_per_gpu=measured, predicted_tokens_per_s_per_gpu=pred, measured_from=how,
        error=pred / measured - 1.0, predicted_tflops_row_convention=(pred * fpt / 1e12) if fpt else None,
        memory_fits=est.memory.total_bytes_per_gpu <= est.memory.usable_bytes_per_gpu,
        memory_total_gib=est.memory.total_bytes_per_gpu / 2**30,
        extras={"precision": precision, "generation": gpu_spec.generation, "step_time_s": est.step_time_s,
                "seq": seq,
                "mfu": est.mfu, "bubble": est.pipeline_bubble_fraction})


@dataclass
class Report:
    results: list[RowResult]
    skipped: Counter

    def summary(self, key: str = "source_id") -> dict[str, dict[str, float]]:
        groups: dict[str, list[float]] = defaultdict(list)
        for r in self.results:
            groups[getattr(r, key) if key != "generation" else r.extras["generation"]].append(r.error)
        return {k: stats(v) for k, v in sorted(groups.items())}

    def overall(self) -> dict[str, float]:
        return stats([r.error for r in self.results])


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stats(errors: list[float]) -> dict[str, float]:
    absolute = [abs(e) for e in errors]
    return {"rows": len(errors), "median_abs_error": _percentile(absolute, 0.5),
            "p90_abs_error": _percentile(absolute, 0.9), "median_error": _percentile(errors, 0.5)}


def run(csv_path: str | Path, *, proxies: bool = False) -> Report:
    catalog = load_catalog()
    results, skipped = [], Counter()
    with open(csv_path, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            try:
                results.append(evaluate_row(row, catalog, proxies=proxies))
            except Skip as exc:
                skipped[str(exc)] += 1
    return Report(results, skipped)


def format_report(report: Report) -> str:
    lines = []
    for key, title in (("source_id", "source"), ("generation", "GPU generation")):
        lines.append(f"{title:<28} {'rows':>5} {'median|err|':>12} {'p90|err|':>9} {'median err':>11}")
        for name, s in report.summary(key).items():
            lines.append(f"{name:<28} {s['rows']:>5} {s['median_abs_error']:>11.1%} {s['p90_abs_error']:>9.1%} "
                         f"{s['median_error']:>+11.1%}")
        lines.append("")
    misfit = sum(not r.memory_fits for r in report.results)
    lines.append(f"published runs the memory model says do not fit in HBM: {misfit} of {len(report.results)}")
    lines.append("skipped: " + (", ".join(f"{v} {k}" for k, v in report.skipped.most_common()) or "none"))
    o = report.overall()
    lines.append(f"overall: {o['rows']} rows, median |error| {o['median_abs_error']:.1%}, "
                 f"p90 |error| {o['p90_abs_error']:.1%}")
    return "\n".join(lines)


def to_json(report: Report) -> dict[str, Any]:
    return {"overall": report.overall(), "by_source": report.summary("source_id"),
            "by_generation": report.summary("generation"), "skipped": dict(report.skipped),
            "rows": [r.__dict__ for r in report.results]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", help="published runs CSV (columns of published_runs_dev.csv)")
    parser.add_argument("--json", action="store_true", help="machine-readable output with per-row predictions")
    parser.add_argument("--proxy-gpus", action="store_true",
                        help="model GPUs missing from the catalog with the nearest entry (GB300 as GB200, B300 as B200)")
    args = parser.parse_args(argv)
    report = run(args.csv, proxies=args.proxy_gpus)
    if args.json:
        print(json.dumps(to_json(report), indent=2, sort_keys=True))
    else:
        print(format_report(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
