"""Feasibility rules, one reason code each: ``check_*(problem, layout) -> Rejection | None``.

Codes are stable snake_case identifiers used in tallies, tests and docs; the
messages around them state the rule, the offending values and the fix, and may be
reworded freely. The structural rules (everything but the framework, budget and
deadline rules) are also built into the generators of ``candidates.py``, so the
enumerator never yields a layout these checks reject; the property tests hold the
two to each other.
"""
from __future__ import annotations

from typing import Callable

from compiler import units
from compiler.estimate import Estimate, Rejection
from compiler.frameworks import describe_unsupported, unsupported_reasons
from compiler.layout import Layout
from compiler.problem import GpuOption, Problem
from compiler.solver.arith import GpuCounts, batch_range
from compiler.split import split_problem

# Reason codes (stable). Structural codes describe the parallel shape; the rest a full layout.
TP_NOT_DIVISOR = "tp_not_divisor"
TP_CROSS_NODE = "tp_cross_node"
PP_SPLIT_INVALID = "pp_split_invalid"
CP_NOT_DIVISOR = "cp_not_divisor"
EP_INVALID = "ep_invalid"
GPU_NOT_OFFERED = "gpu_not_offered"
GPU_COUNT_NOT_ALLOWED = "gpu_count_not_allowed"
BATCH_NOT_DIVISIBLE = "batch_not_divisible"
OFFLOAD_INVALID = "offload_invalid"
PIN_MISMATCH = "pin_mismatch"
NOT_CANONICAL = "not_canonical"
FRAMEWORK_UNSUPPORTED = "framework_unsupported"
OUT_OF_MEMORY = "out_of_memory"
OVER_BUDGET = "over_budget"
OVER_DEADLINE = "over_deadline"
MICROBATCHES_NOT_DIVISIBLE = "microbatches_not_divisible"  # the cost model's code (Megatron's rule)

# Codes counted per parallel shape (tp x pp x cp x dp) rather than per layout.
SHAPE_CODES = frozenset({BATCH_NOT_DIVISIBLE})


def option_for(problem: Problem, layout: Layout) -> GpuOption | None:
    return next((o for o in problem.gpu_options if o.name == layout.gpu), None)


def gpu_counts(problem: Problem, option: GpuOption) -> GpuCounts:
    """GPU counts the search uses for ``option``; the throughput objective uses the largest only."""
    counts = GpuCounts(problem.min_gpus, problem.max_gpus, option.gpus_per_node, problem.num_gpus)
    if problem.objective == "throughput" and problem.num_gpus is None and counts.largest is not None:
        return GpuCounts(counts.largest, counts.largest, option.gpus_per_node, counts.largest)
    return counts


def check_gpu_type(problem: Problem, layout: Layout) -> Rejection | None:
    option = option_for(problem, layout)
    if option is None or option.gpus_per_node != layout.gpus_per_node:
        offered = ", ".join(f"{o.name} ({o.gpus_per_node}/node)" for o in problem.gpu_options)
        return Rejection(GPU_NOT_OFFERED, f"gpu must be one of {offered}, got {layout.gpu} "
                                          f"({layout.gpus_per_node}/node)", {"gpu": layout.gpu})
    return None


def check_gpu_count(problem: Problem, layout: Layout) -> Rejection | None:
    option = option_for(problem, layout)
    if option is None:
        return None
    counts = gpu_counts(problem, option)
    n = layout.world_size
    if n not in counts:
        return Rejection(GPU_COUNT_NOT_ALLOWED,
                         f"tp x pp x cp x dp must be an allowed GPU count ({counts.describe()}), got {n}",
                         {"world_size": n, "allowed": counts.describe()},
                         fix="change a parallel degree so the product is whole nodes within the GPU range")
    return None


def check_tp(problem: Problem, layout: Layout) -> Rejection | None:
    s = problem.shape
    for what, n in (("num_attention_heads", s.num_attention_heads), ("num_kv_heads", s.num_kv_heads)):
        if n % layout.tp:
            return Rejection(TP_NOT_DIVISOR, f"tensor_parallel must divide {what} ({n}), got {layout.tp}",
                             {"tp": layout.tp, what: n})
    return None


def check_tp_node(problem: Problem, layout: Layout) -> Rejection | None:
    if not problem.allow_cross_node_tp and layout.tp > layout.gpus_per_node:
        return Rejection(TP_CROSS_NODE,
                         f"tensor_parallel must not exceed gpus_per_node ({layout.gpus_per_node}), got {layout.tp}",
                         {"tp": layout.tp}, fix="set search.allow_cross_node_tp: true to allow it")
    return None


def check_pp(problem: Problem, layout: Layout) -> Rejection | None:
    n = problem.shape.num_layers
    why = split_problem(n, layout.pp, layout.vpp, layout.split)
    if why is not None:
        return Rejection(PP_SPLIT_INVALID, f"{n} layers have no pipeline split over pp={layout.pp} x vpp={layout.vpp}: "
                                           f"{why}", {"pp": layout.pp, "vpp": layout.vpp, "num_layers": n})
    return None


def check_cp(problem: Problem, layout: Layout) -> Rejection | None:
    if layout.cp > 1 and problem.seq_len % (2 * layout.cp):
        return Rejection(CP_NOT_DIVISOR,
                         f"2 x context_parallel must divide sequence_length ({problem.seq_len}), got cp={layout.cp}",
                         {"cp": layout.cp, "seq_len": problem.seq_len})
    return None


def check_ep(problem: Problem, layout: Layout) -> Rejection | None:
    if layout.ep == 1:
        return None
    moe = problem.shape.moe
    if moe is None:
        return Rejection(EP_INVALID, f"expert_parallel needs an MoE model, got ep={layout.ep}", {"ep": layout.ep})
    if moe.num_experts % layout.ep or (layout.dp * layout.cp) % layout.ep:
        return Rejection(EP_INVALID, f"expert_parallel must divide num_experts ({moe.num_experts}) and "
                                     f"dp x cp ({layout.dp * layout.cp}), got {layout.ep}", {"ep": layout.ep})
    return None


def check_batch(problem: Problem, layout: Layout) -> Rejection | None:
    lo, hi = batch_range(problem.global_batch, problem.global_batch_tolerance)
    b = layout.global_batch
    if lo <= b <= hi:
        return None
    want = str(problem.global_batch) if lo == hi else f"{lo}-{hi}"
    return Rejection(BATCH_NOT_DIVISIBLE,
                     f"micro_batch x grad_accum x dp must equal the global batch ({want}), got "
                     f"{layout.micro_batch} x {layout.grad_accum} x {layout.dp} = {b}",
                     {"realised": b, "global_batch": problem.global_batch},
                     fix="choose dp and micro_batch that divide the global batch, or allow "
                         "training.global_batch_tolerance")
    return None


def check_offload(problem: Problem, layout: Layout) -> Rejection | None:
    if layout.offload_optimizer != "none" and layout.zero_stage == 0:
        return Rejection(OFFLOAD_INVALID, "optimizer offload needs zero_stage >= 1, got 0", {})
    if layout.offload_optimizer == "nvme" and layout.zero_stage != 3:
        return Rejection(OFFLOAD_INVALID, f"optimizer offload to NVMe needs zero_stage 3, got {layout.zero_stage}", {})
    return None


def check_canonical(problem: Problem, layout: Layout) -> Rejection | None:
    """Layouts that only rename another layout of the space are left out of it."""
    offload = layout.offload_optimizer != "none" or layout.offload_params != "none"
    if layout.zero_stage > 0 and layout.dp_shard == 1 and not (layout.dp == 1 and offload):
        return Rejection(NOT_CANONICAL, f"zero_stage {layout.zero_stage} over a shard group of one GPU replicates "
                                        "like zero_stage 0", {"zero_stage": layout.zero_stage})
    want = problem.pins.schedule if problem.pins.schedule in ("gpipe", "1f1b") else "1f1b"
    if layout.pp == 1 and layout.schedule != want:
        return Rejection(NOT_CANONICAL, f"pp=1 has no pipeline schedule; use {want}, got {layout.schedule}", {})
    return None


_PIN_FIELDS = (("tp", "tp"), ("pp", "pp"), ("vpp", "vpp"), ("schedule", "schedule"), ("cp", "cp"), ("ep", "ep"),
               ("dp", "dp"), ("dp_shard", "dp_shard"), ("zero_stage", "zero_stage"), ("micro_batch", "micro_batch"),
               ("recompute", "recompute"), ("sequence_parallel", "sequence_parallel"),
               ("offload_optimizer", "offload_optimizer"), ("offload_params", "offload_params"))


def check_pins(problem: Problem, layout: Layout) -> Rejection | None:
    for pin, attr in _PIN_FIELDS:
        want = getattr(problem.pins, pin)
        if want is not None and getattr(layout, attr) != want:
            return Rejection(PIN_MISMATCH, f"layout.{pin} is pinned to {want}, got {getattr(layout, attr)}",
                             {"pin": pin})
    return None


def check_schedule(problem: Problem, layout: Layout) -> Rejection | None:
    """Interleaved 1F1B runs micro-batches in groups of pp (Megatron-LM); the cost model rejects the rest."""
    if layout.schedule == "interleaved_1f1b" and layout.grad_accum % layout.pp:
        return Rejection(MICROBATCHES_NOT_DIVISIBLE,
                         f"interleaved 1F1B runs micro-batches in groups of pp={layout.pp}; got grad_accum "
                         f"{layout.grad_accum}", {"grad_accum": layout.grad_accum, "pp": layout.pp},
                         fix="make grad_accum a multiple of pp, or use the 1f1b schedule")
    return None


def check_framework(problem: Problem, layout: Layout) -> Rejection | None:
    reasons = unsupported_reasons(problem, layout)
    if not reasons:
        return None
    return Rejection(FRAMEWORK_UNSUPPORTED, describe_unsupported(reasons), {"targets": dict(reasons)},
                     fix="drop the target from `targets`, or change the layout")


def check_budget(problem: Problem, estimate: Estimate) -> Rejection | None:
    if problem.max_cost_usd is None or estimate.cost_usd <= problem.max_cost_usd:
        return None
    over = estimate.cost_usd - problem.max_cost_usd
    return Rejection(OVER_BUDGET,
                     f"costs {units.format_money(estimate.cost_usd)}, {units.format_money(over)} "
                     f"({over / problem.max_cost_usd:.0%}) over the budget of "
                     f"{units.format_money(problem.max_cost_usd)}",
                     {"cost_usd": estimate.cost_usd, "max_cost_usd": problem.max_cost_usd, "over_by_usd": over},
                     fix=f"raise budget.max_cost by {units.format_money(over)} or use fewer/cheaper GPUs")


def check_deadline(problem: Problem, estimate: Estimate) -> Rejection | None:
    if problem.deadline_s is None or estimate.time_to_train_s <= problem.deadline_s:
        return None
    over = estimate.time_to_train_s - problem.deadline_s
    return Rejection(OVER_DEADLINE,
                     f"takes {units.format_seconds(estimate.time_to_train_s)}, {units.format_seconds(over)} "
                     f"({over / problem.deadline_s:.0%}) past the deadline of "
                     f"{units.format_seconds(problem.deadline_s)}",
                     {"time_to_train_s": estimate.time_to_train_s, "deadline_s": problem.deadline_s,
                      "over_by_s": over},
                     fix=f"extend budget.deadline by {units.format_seconds(over)} or add GPUs")


STRUCTURAL_CHECKS: tuple[Callable[[Problem, Layout], Rejection | None], ...] = (
    check_gpu_type, check_gpu_count, check_tp, check_tp_node, check_pp, check_cp, check_ep, check_batch,
    check_offload, check_canonical, check_pins,
)


def check_structure(problem: Problem, layout: Layout) -> Rejection | None:
    """The first structural rule ``layout`` breaks, or None (the layout is in the search space)."""
    for check in STRUCTURAL_CHECKS:
        r = check(problem, layout)
        if r is not None:
            return r
    return None


def check_estimate(problem: Problem, estimate: Estimate) -> Rejection | None:
    """Budget and deadline, after the cost model accepted the layout."""
    return check_budget(problem, estimate) or check_deadline(problem, estimate)

