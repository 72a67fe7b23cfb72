"""What DeepSpeed 0.19.8 can run, as dtc renders it (ds_config.json + ds_train.py).

Each rule is ``(knobs, precision) -> (field, reason) | None`` over a layout's knobs
(compiler.rules.Knobs, any of them unknown: None); compiler.rules evaluates them under the code
framework_unsupported. Sources: tools/validators/DEEPSPEED_KEYS.md (AutoTP is
``tensor_parallel.autotp_size``; hpZ is ``zero_hpz_partition_size``; NVMe offload needs ZeRO-3).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from compiler.targets.base import TE_PRECISIONS, expert_tp_differs, gt1 as _gt1

if TYPE_CHECKING:
    from compiler.layout import Layout
    from compiler.rules import Knobs


def _ds_cp(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if _gt1(k.cp):
        return "cp", (f"context parallel (cp={k.cp}) is not available: DeepSpeed has no ring/all-to-all "
                      "context parallelism for this engine (Ulysses is a different scheme)")
    return None


def _ds_ep(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if _gt1(k.ep):
        return "ep", f"expert parallel (ep={k.ep}) is not rendered for DeepSpeed (no DeepSpeed-MoE support in dtc)"
    if expert_tp_differs(k):
        return "etp", f"an expert tensor parallel degree (etp={k.etp}) other than tp ({k.tp}) is Megatron's; AutoTP " \
                      "splits the experts by tp"
    return None


def _ds_fp8(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if precision in TE_PRECISIONS:
        return "precision", (f"{precision} training needs Transformer Engine, which the DeepSpeed engine config does "
                             "not drive")
    return None


def _ds_sp(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if k.sequence_parallel:
        return "sequence_parallel", "Megatron-style sequence parallelism is not available with DeepSpeed AutoTP"
    return None


def _ds_pipeline(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if not _gt1(k.pp):
        return None
    if k.zero_stage is not None and k.zero_stage > 1:
        return "zero_stage", (f"the DeepSpeed pipeline engine (pp={k.pp}) supports only ZeRO stage 0 or 1, "
                              f"got zero_stage {k.zero_stage}")
    if _gt1(k.vpp) or k.schedule not in (None, "1f1b"):
        schedule = k.schedule or "interleaved_1f1b"
        return "schedule", (f"the DeepSpeed pipeline engine runs only its own 1F1B schedule without virtual stages, "
                            f"got schedule {schedule}" + (f" with vpp={k.vpp}" if _gt1(k.vpp) else ""))
    if _gt1(k.tp):
        return "tp", (f"the DeepSpeed pipeline engine (pp={k.pp}) cannot be combined with AutoTP tensor parallel "
                      f"(tp={k.tp})")
    return None


def _ds_tp(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if _gt1(k.tp) and k.pp == 1 and k.zero_stage is not None and k.zero_stage > 2:
        return "tp", f"AutoTP tensor parallel (tp={k.tp}) works with ZeRO stage 0-2 only, got zero_stage 3"
    return None


def _ds_hsdp(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if k.zero_stage in (1, 2) and k.dp is not None and _gt1(k.dp_shard) and k.dp // k.dp_shard > 1:
        return "dp_shard", (f"ZeRO-{k.zero_stage} shards over all data-parallel ranks; hybrid sharding "
                            f"({k.dp // k.dp_shard}x{k.dp_shard}) exists only for ZeRO-3 (ZeRO++ hpZ)")
    return None


def _ds_zero0(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if k.zero_stage == 0 and precision != "fp32":
        return "zero_stage", (f"ZeRO stage 0 cannot accumulate the fp32 gradients dtc renders for {precision} "
                              "parameters (DeepSpeed 0.19.8 engine.py _do_optimizer_sanity_check: 'unsupported mix of "
                              "model_dtype and grad_accum_dtype'); ZeRO-1 keeps the same weights and gradients and "
                              "shards the optimizer states")
    return None


def _ds_offload(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if k.offload_optimizer not in (None, "none") and k.zero_stage == 0:
        return "offload_optimizer", "optimizer offload needs ZeRO stage 1 or more"
    if k.offload_optimizer == "nvme" and k.zero_stage is not None and k.zero_stage != 3:
        return "offload_optimizer", f"optimizer offload to NVMe needs ZeRO-3, got zero_stage {k.zero_stage}"
    return None


def notes(layout: "Layout") -> tuple[str, ...]:
    """How DeepSpeed runs ``layout`` (for PLAN.md and the plan's notes)."""
    out = []
    if layout.pp > 1:
        out.append(f"DeepSpeed: pp={layout.pp} runs in the pipeline engine (deepspeed.pipe.PipelineModule, 1F1B)")
    if layout.tp > 1:
        out.append(f"DeepSpeed: tp={layout.tp} runs as AutoTP (tensor_parallel.autotp_size={layout.tp})")
    if layout.zero_stage == 3 and layout.dp_replicate > 1:
        out.append(f"DeepSpeed: hybrid sharding as ZeRO++ hpZ (zero_hpz_partition_size={layout.dp_shard})")
    return tuple(out)


RULES = (_ds_cp, _ds_ep, _ds_fp8, _ds_sp, _ds_pipeline, _ds_tp, _ds_hsdp, _ds_zero0, _ds_offload)
