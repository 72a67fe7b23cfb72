"""Which layouts each target framework can run: ONE table for the solver and the renderers.

Each rule is one small function ``(knobs, precision) -> (field, reason) | None`` over a
layout's knobs (compiler.rules.Knobs), any of which may be unknown (None): a rule that
needs an unknown knob says nothing, so the same table judges a spec's pins, the solver's
candidates and a finished plan. ``compiler.rules`` evaluates it for every target of the
problem under the code ``framework_unsupported`` (a plan must be runnable by every target
it is rendered for); renderers check the same table so that they never emit a config the
solver would have refused.

Versions are those of ``compiler.plan.FRAMEWORK_VERSIONS`` (DeepSpeed 0.19.8,
megatron-core 0.19.2, torch 2.13). SLURM has no constraints of its own. Sources:
tools/validators/DEEPSPEED_KEYS.md (AutoTP is ``tensor_parallel.autotp_size``; hpZ is
``zero_hpz_partition_size``; NVMe offload needs ZeRO-3), tools/validators/MEGATRON_FLAGS.md
and megatron_check.py (``--use-megatron-fsdp`` with ``--data-parallel-sharding-strategy
optim_grads|optim_grads_params``, ``--num-distributed-optimizer-instances``,
``--optimizer-cpu-offload``; no GPipe schedule), torch ``fully_shard``/``CPUOffloadPolicy``/
``torch.distributed.pipelining``. Where a framework accepts a combination that dtc does not
render (Megatron-FSDP with pipeline parallelism: megatron-core's argument checks accept it,
dtc's renderer does not use it), the rule says so.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from compiler.layout import Layout

if TYPE_CHECKING:
    from compiler.rules import Knobs

Rule = Callable[["Knobs", str], "tuple[str, str] | None"]


def _gt1(value: int | None) -> bool:
    return value is not None and value > 1


# ------------------------------------------------------------------------------ DeepSpeed 0.19.8


def _ds_cp(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if _gt1(k.cp):
        return "cp", (f"context parallel (cp={k.cp}) is not available: DeepSpeed has no ring/all-to-all "
                      "context parallelism for this engine (Ulysses is a different scheme)")
    return None


def _ds_ep(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if _gt1(k.ep):
        return "ep", f"expert parallel (ep={k.ep}) is not rendered for DeepSpeed (no DeepSpeed-MoE support in dtc)"
    return None


def _ds_fp8(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if precision == "fp8":
        return "precision", "fp8 training needs Transformer Engine, which the DeepSpeed engine config does not drive"
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


def _ds_offload(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if k.offload_optimizer not in (None, "none") and k.zero_stage == 0:
        return "offload_optimizer", "optimizer offload needs ZeRO stage 1 or more"
    if k.offload_optimizer == "nvme" and k.zero_stage is not None and k.zero_stage != 3:
        return "offload_optimizer", f"optimizer offload to NVMe needs ZeRO-3, got zero_stage {k.zero_stage}"
    return None


# ------------------------------------------------------------------------------ torch 2.13 FSDP2


def _fsdp_zero1(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if k.zero_stage == 1:
        return "zero_stage", ("FSDP2 has no optimizer-only sharding (ZeRO-1); use zero_stage 2 "
                              "(reshard_after_forward=False) or 3")
    return None


def _fsdp_ep(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if _gt1(k.ep):
        return "ep", f"expert parallel (ep={k.ep}) is not rendered for FSDP2"
    return None


def _fsdp_fp8(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if precision == "fp8":
        return "precision", "fp8 training (torchao float8) is not rendered for FSDP2"
    return None


def _fsdp_offload(k: "Knobs", precision: str) -> tuple[str, str] | None:
    oo, op = k.offload_optimizer, k.offload_params
    if oo in (None, "none") and op in (None, "none"):
        return None
    where = "offload_params" if op not in (None, "none") else "offload_optimizer"
    if "nvme" in (oo, op):
        return where, "FSDP2 cannot offload to NVMe (CPUOffloadPolicy offloads to host memory only)"
    if None in (oo, op, k.zero_stage):
        return None  # the rest of the combination is still open
    if k.zero_stage == 3 and oo == "cpu" and op == "cpu":
        return None
    return where, ("FSDP2's CPUOffloadPolicy offloads parameters, gradients and optimizer states together: "
                   "only offload_params=cpu with offload_optimizer=cpu at zero_stage 3, got "
                   f"offload_optimizer={oo} offload_params={op}")


# ------------------------------------------------------------------------------ megatron-core 0.19.2


def _mg_fsdp(k: "Knobs", precision: str) -> tuple[str, str] | None:
    # zero 2/3 run as Megatron-FSDP (--use-megatron-fsdp with --data-parallel-sharding-strategy
    # optim_grads / optim_grads_params; HSDP through --num-distributed-optimizer-instances).
    if k.zero_stage is not None and k.zero_stage >= 2 and _gt1(k.pp):
        return "zero_stage", (f"ZeRO-{k.zero_stage} runs as Megatron-FSDP, which dtc renders without pipeline "
                              f"parallelism, got pp={k.pp}")
    return None


def _mg_gpipe(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if _gt1(k.pp) and k.schedule == "gpipe":
        return "schedule", "Megatron has no GPipe schedule (it runs 1F1B or interleaved 1F1B)"
    return None


def _mg_offload(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if k.offload_params not in (None, "none"):
        return "offload_params", f"Megatron cannot offload parameters (offload_params={k.offload_params})"
    if k.offload_optimizer == "nvme":
        return "offload_optimizer", "Megatron offloads optimizer states to CPU only (--optimizer-cpu-offload), not NVMe"
    if k.offload_optimizer == "cpu" and k.zero_stage is not None and k.zero_stage != 1:
        return "offload_optimizer", ("Megatron's optimizer CPU offload (--optimizer-cpu-offload) runs with the "
                                     f"distributed optimizer (zero_stage 1), got zero_stage {k.zero_stage}")
    return None


def _mg_ep_tp_sp(k: "Knobs", precision: str) -> tuple[str, str] | None:
    # megatron/core/model_parallel_config.py: "When using expert parallelism and tensor
    # parallelism, sequence parallelism must be used" (checked when the model config is built).
    if _gt1(k.ep) and _gt1(k.tp) and k.sequence_parallel is False:
        return "sequence_parallel", (f"expert parallel (ep={k.ep}) with tensor parallel (tp={k.tp}) needs sequence "
                                     "parallelism")
    return None


RULES: Mapping[str, tuple[Rule, ...]] = {
    "deepspeed": (_ds_cp, _ds_ep, _ds_fp8, _ds_sp, _ds_pipeline, _ds_tp, _ds_hsdp, _ds_offload),
    "fsdp": (_fsdp_zero1, _fsdp_ep, _fsdp_fp8, _fsdp_offload),
    "megatron": (_mg_fsdp, _mg_gpipe, _mg_offload, _mg_ep_tp_sp),
    "slurm": (),
}

DISPLAY_NAMES: Mapping[str, str] = {
    "deepspeed": "DeepSpeed", "fsdp": "FSDP2", "megatron": "Megatron", "slurm": "SLURM",
}


def target_reason(target: str, knobs: "Knobs", precision: str) -> tuple[str, str] | None:
    """(field, why) ``target`` cannot run ``knobs`` (all failing rules joined), or None if it can (so far)."""
    hits = [r for r in (rule(knobs, precision) for rule in RULES.get(target, ())) if r]
    if not hits:
        return None
    return hits[0][0], "; ".join(reason for _, reason in hits)


def unsupported_reasons(targets: Iterable[str], precision: str, knobs: "Knobs") -> tuple[dict[str, str], str]:
    """({target: reason} for every target that cannot run ``knobs``, the field of the first)."""
    out: dict[str, str] = {}
    first = ""
    for target in targets:
        hit = target_reason(target, knobs, precision)
        if hit:
            first = first or hit[0]
            out[target] = hit[1]
    return out, first


def describe_unsupported(reasons: Mapping[str, str]) -> str:
    """One line for a Rejection message: 'DeepSpeed: ...; Megatron: ...'."""
    return "; ".join(f"{DISPLAY_NAMES.get(t, t)}: {r}" for t, r in sorted(reasons.items()))


def support_key(layout: Layout) -> tuple:
    """Everything the rules above read, coarsened to what they compare: two layouts with the
    same key are supported by the same targets (the solver caches on it; a test holds it)."""
    return (layout.tp > 1, layout.pp > 1, layout.cp > 1, layout.ep > 1, layout.sequence_parallel, layout.zero_stage,
            layout.vpp > 1, layout.schedule, layout.dp_replicate > 1, layout.dp_shard > 1, layout.offload_optimizer,
            layout.offload_params)


def framework_notes(problem: Any, layout: Layout) -> tuple[str, ...]:
    """How each target runs ``layout`` (for PLAN.md and the plan's notes)."""
    notes: list[str] = []
    targets = set(problem.targets)
    if "deepspeed" in targets:
        if layout.pp > 1:
            notes.append(f"DeepSpeed: pp={layout.pp} runs in the pipeline engine (deepspeed.pipe.PipelineModule, 1F1B)")
        if layout.tp > 1:
            notes.append(f"DeepSpeed: tp={layout.tp} runs as AutoTP (tensor_parallel.autotp_size={layout.tp})")
        if layout.zero_stage == 3 and layout.dp_replicate > 1:
            notes.append(f"DeepSpeed: hybrid sharding as ZeRO++ hpZ (zero_hpz_partition_size={layout.dp_shard})")
    if "fsdp" in targets:
        if layout.zero_stage == 2:
            notes.append("FSDP2: zero_stage 2 is fully_shard(reshard_after_forward=False)")
        if layout.zero_stage in (2, 3) and layout.dp_replicate > 1:
            notes.append(f"FSDP2: hybrid sharding on a 2-D mesh ({layout.dp_replicate} replicate x "
                         f"{layout.dp_shard} shard)")
    if "megatron" in targets:
        if layout.zero_stage == 1 and layout.dp_replicate > 1:
            notes.append(f"Megatron: --use-distributed-optimizer with --num-distributed-optimizer-instances "
                         f"{layout.dp_replicate}")
        if layout.zero_stage in (2, 3):
            strategy = "optim_grads" if layout.zero_stage == 2 else "optim_grads_params"
            notes.append(f"Megatron: zero_stage {layout.zero_stage} runs as Megatron-FSDP (--use-megatron-fsdp "
                         f"--data-parallel-sharding-strategy {strategy})")
    return tuple(notes)
