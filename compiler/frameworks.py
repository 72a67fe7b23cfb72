"""Which layouts each target framework can run: ONE table for the solver and the renderers.

``unsupported_reasons(problem, layout)`` maps every target of ``problem.targets``
that cannot run ``layout`` to the reason, in words that name the framework's own
mechanism. The solver rejects such a layout with the code ``framework_unsupported``
(a plan must be runnable by every target it is rendered for); renderers import the
same table so that they never emit a config the solver would have refused.

Versions are those of ``compiler.plan.FRAMEWORK_VERSIONS`` (DeepSpeed 0.19.8,
megatron-core 0.19.2, torch 2.13). SLURM has no constraints of its own. Each rule is
one small function ``(layout, precision) -> reason | None`` so a rule can be read,
tested and changed on its own. Sources: tools/validators/DEEPSPEED_KEYS.md (AutoTP is
``tensor_parallel.autotp_size``; hpZ is ``zero_hpz_partition_size``; NVMe offload needs
ZeRO-3), tools/validators/MEGATRON_FLAGS.md and megatron_check.py (``--use-megatron-fsdp``
with ``--data-parallel-sharding-strategy optim_grads|optim_grads_params``,
``--num-distributed-optimizer-instances``, ``--optimizer-cpu-offload``; no GPipe
schedule), torch ``fully_shard``/``CPUOffloadPolicy``/``torch.distributed.pipelining``.
Where a framework accepts a combination that dtc does not render (Megatron-FSDP with
pipeline parallelism: megatron-core's argument checks accept it, dtc's renderer does
not use it), the rule says so.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from compiler.layout import Layout

Rule = Callable[[Layout, str], "str | None"]

# ------------------------------------------------------------------------------ DeepSpeed 0.19.8


def _ds_cp(l: Layout, precision: str) -> str | None:
    if l.cp > 1:
        return (f"context parallel (cp={l.cp}) is not available: DeepSpeed has no ring/all-to-all "
                "context parallelism for this engine (Ulysses is a different scheme)")
    return None


def _ds_ep(l: Layout, precision: str) -> str | None:
    if l.ep > 1:
        return f"expert parallel (ep={l.ep}) is not rendered for DeepSpeed (no DeepSpeed-MoE support in dtc)"
    return None


def _ds_fp8(l: Layout, precision: str) -> str | None:
    if precision == "fp8":
        return "fp8 training needs Transformer Engine, which the DeepSpeed engine config does not drive"
    return None


def _ds_sp(l: Layout, precision: str) -> str | None:
    if l.sequence_parallel:
        return "Megatron-style sequence parallelism is not available with DeepSpeed AutoTP"
    return None


def _ds_pipeline(l: Layout, precision: str) -> str | None:
    if l.pp == 1:
        return None
    if l.zero_stage > 1:
        return (f"the DeepSpeed pipeline engine (pp={l.pp}) supports only ZeRO stage 0 or 1, "
                f"got zero_stage {l.zero_stage}")
    if l.vpp > 1 or l.schedule != "1f1b":
        return (f"the DeepSpeed pipeline engine runs only its own 1F1B schedule without virtual stages, "
                f"got schedule {l.schedule}" + (f" with vpp={l.vpp}" if l.vpp > 1 else ""))
    if l.tp > 1:
        return f"the DeepSpeed pipeline engine (pp={l.pp}) cannot be combined with AutoTP tensor parallel (tp={l.tp})"
    return None


def _ds_tp(l: Layout, precision: str) -> str | None:
    if l.tp > 1 and l.pp == 1 and l.zero_stage > 2:
        return f"AutoTP tensor parallel (tp={l.tp}) works with ZeRO stage 0-2 only, got zero_stage 3"
    return None


def _ds_hsdp(l: Layout, precision: str) -> str | None:
    if l.zero_stage in (1, 2) and l.dp_replicate > 1 and l.dp_shard > 1:
        return (f"ZeRO-{l.zero_stage} shards over all data-parallel ranks; hybrid sharding "
                f"({l.dp_replicate}x{l.dp_shard}) exists only for ZeRO-3 (ZeRO++ hpZ)")
    return None


def _ds_offload(l: Layout, precision: str) -> str | None:
    if l.offload_optimizer != "none" and l.zero_stage == 0:
        return "optimizer offload needs ZeRO stage 1 or more"
    if l.offload_optimizer == "nvme" and l.zero_stage != 3:
        return f"optimizer offload to NVMe needs ZeRO-3, got zero_stage {l.zero_stage}"
    return None


# ------------------------------------------------------------------------------ torch 2.13 FSDP2


def _fsdp_zero1(l: Layout, precision: str) -> str | None:
    if l.zero_stage == 1:
        return "FSDP2 has no optimizer-only sharding (ZeRO-1); use zero_stage 2 (reshard_after_forward=False) or 3"
    return None


def _fsdp_ep(l: Layout, precision: str) -> str | None:
    if l.ep > 1:
        return f"expert parallel (ep={l.ep}) is not rendered for FSDP2"
    return None


def _fsdp_fp8(l: Layout, precision: str) -> str | None:
    if precision == "fp8":
        return "fp8 training (torchao float8) is not rendered for FSDP2"
    return None


def _fsdp_offload(l: Layout, precision: str) -> str | None:
    if l.offload_optimizer == "none" and l.offload_params == "none":
        return None
    if "nvme" in (l.offload_optimizer, l.offload_params):
        return "FSDP2 cannot offload to NVMe (CPUOffloadPolicy offloads to host memory only)"
    if l.zero_stage == 3 and l.offload_optimizer == "cpu" and l.offload_params == "cpu":
        return None
    return ("FSDP2's CPUOffloadPolicy offloads parameters, gradients and optimizer states together: "
            "only offload_params=cpu with offload_optimizer=cpu at zero_stage 3, got "
            f"offload_optimizer={l.offload_optimizer} offload_params={l.offload_params}")


# ------------------------------------------------------------------------------ megatron-core 0.19.2


def _mg_fsdp(l: Layout, precision: str) -> str | None:
    # zero 2/3 run as Megatron-FSDP (--use-megatron-fsdp with --data-parallel-sharding-strategy
    # optim_grads / optim_grads_params; HSDP through --num-distributed-optimizer-instances).
    if l.zero_stage >= 2 and l.pp > 1:
        return (f"ZeRO-{l.zero_stage} runs as Megatron-FSDP, which dtc renders without pipeline "
                f"parallelism, got pp={l.pp}")
    return None


def _mg_gpipe(l: Layout, precision: str) -> str | None:
    if l.pp > 1 and l.schedule == "gpipe":
        return "Megatron has no GPipe schedule (it runs 1F1B or interleaved 1F1B)"
    return None


def _mg_interleaved(l: Layout, precision: str) -> str | None:
    if l.vpp > 1 and l.pp < 2:
        return "interleaved 1F1B needs pp >= 2"
    return None


def _mg_offload(l: Layout, precision: str) -> str | None:
    if l.offload_params != "none":
        return f"Megatron cannot offload parameters (offload_params={l.offload_params})"
    if l.offload_optimizer == "nvme":
        return "Megatron offloads optimizer states to CPU only (--optimizer-cpu-offload), not NVMe"
    if l.offload_optimizer == "cpu" and l.zero_stage != 1:
        return ("Megatron's optimizer CPU offload (--optimizer-cpu-offload) runs with the distributed "
                f"optimizer (zero_stage 1), got zero_stage {l.zero_stage}")
    return None


def _mg_ep_tp_sp(l: Layout, precision: str) -> str | None:
    # megatron/core/model_parallel_config.py: "When using expert parallelism and tensor
    # parallelism, sequence parallelism must be used" (checked when the model config is built).
    if l.ep > 1 and l.tp > 1 and not l.sequence_parallel:
        return f"expert parallel (ep={l.ep}) with tensor parallel (tp={l.tp}) needs sequence parallelism"
    return None


RULES: Mapping[str, tuple[Rule, ...]] = {
    "deepspeed": (_ds_cp, _ds_ep, _ds_fp8, _ds_sp, _ds_pipeline, _ds_tp, _ds_hsdp, _ds_offload),
    "fsdp": (_fsdp_zero1, _fsdp_ep, _fsdp_fp8, _fsdp_offload),
    "megatron": (_mg_fsdp, _mg_gpipe, _mg_interleaved, _mg_offload, _mg_ep_tp_sp),
    "slurm": (),
}

DISPLAY_NAMES: Mapping[str, str] = {
    "deepspeed": "DeepSpeed", "fsdp": "FSDP2", "megatron": "Megatron", "slurm": "SLURM",
}


def target_reason(target: str, layout: Layout, precision: str) -> str | None:
    """Why ``target`` cannot run ``layout`` (all failing rules joined), or None if it can."""
    reasons = [r for r in (rule(layout, precision) for rule in RULES.get(target, ())) if r]
    return "; ".join(reasons) if reasons else None


def unsupported_reasons(problem: Any, layout: Layout) -> dict[str, str]:
    """{target: reason} for every target of ``problem.targets`` that cannot run ``layout``."""
    out: dict[str, str] = {}
    for target in problem.targets:
        reason = target_reason(target, layout, problem.precision)
        if reason:
            out[target] = reason
    return out


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
