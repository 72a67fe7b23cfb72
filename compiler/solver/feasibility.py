"""The search's feasibility checks: the layout rules (compiler.rules), the search's own, the objective's.

The layout rules and their reason codes live in ``compiler.rules`` (one home, shared with the
spec's pins, the cost model, ``dtc estimate`` and the renderers); this module adds the rules
that only shape the search space (``pin_mismatch``: a layout other than the spec pinned;
``not_canonical``: a layout that only renames another) and the objective's limits
(``over_budget``, ``over_deadline``). The structural rules are also built into the generators
of ``candidates.py`` (which ask compiler.rules per axis), so the enumerator never yields a
layout these checks reject; the property tests hold the two to each other.
"""
from __future__ import annotations

from compiler import rules, units
from compiler.arith import GpuCounts
from compiler.estimate import Estimate, Rejection
from compiler.layout import Layout
from compiler.problem import GpuOption, Problem
from compiler.rules import (BATCH_NOT_DIVISIBLE, CP_NOT_DIVISOR, DP_SHARD_INVALID, EP_INVALID,  # noqa: F401
                            FRAMEWORK_UNSUPPORTED, GPU_COUNT_NOT_ALLOWED, GPU_NOT_OFFERED, HOST_OUT_OF_MEMORY,
                            MICROBATCHES_NOT_DIVISIBLE, NOT_CANONICAL, OFFLOAD_INVALID, OUT_OF_MEMORY, OVER_BUDGET,
                            OVER_DEADLINE, PIN_MISMATCH, PP_SPLIT_INVALID, PRECISION_UNSUPPORTED, SCHEDULE_INVALID,
                            SP_INVALID, TP_CROSS_NODE, TP_NOT_DIVISOR)

# Codes counted per parallel shape (tp x pp x cp x dp) rather than per layout.
SHAPE_CODES = frozenset({BATCH_NOT_DIVISIBLE})

# The layout rules a candidate must pass to be in the search space; the interleaved micro-batch rule, the
# frameworks' support and the GPU's precision are tallied by the search and the cost model instead.
STRUCTURAL_CODES = tuple(r.code for r in rules.RULES
                         if r.code not in (MICROBATCHES_NOT_DIVISIBLE, FRAMEWORK_UNSUPPORTED, PRECISION_UNSUPPORTED))


def gpu_counts(problem: Problem, option: GpuOption) -> GpuCounts:
    """GPU counts the search uses for ``option``; the throughput objective uses the largest only."""
    counts = problem.facts.gpus[option.name].counts
    assert counts is not None
    return counts


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


_PIN_FIELDS = ("tp", "pp", "vpp", "schedule", "cp", "ep", "etp", "dp", "dp_shard", "zero_stage", "micro_batch", "recompute",
               "sequence_parallel", "offload_optimizer", "offload_params", "split")


def check_pins(problem: Problem, layout: Layout) -> Rejection | None:
    for pin in _PIN_FIELDS:
        want = getattr(problem.pins, pin)
        got = layout.expert_tp if pin == "etp" else getattr(layout, pin)
        if want is not None and got != want:
            return Rejection(PIN_MISMATCH, f"layout.{pin} is pinned to {want}, got {got}", {"pin": pin})
    return None


def check_framework(problem: Problem, layout: Layout) -> Rejection | None:
    return rules.first_violation(problem.facts, rules.Knobs.of(layout), codes=(FRAMEWORK_UNSUPPORTED,))


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


def check_structure(problem: Problem, layout: Layout) -> Rejection | None:
    """The first structural rule ``layout`` breaks, or None (the layout is in the search space)."""
    return (rules.first_violation(problem.facts, rules.Knobs.of(layout), codes=STRUCTURAL_CODES)
            or check_canonical(problem, layout) or check_pins(problem, layout))


def check_memory_band(problem: Problem, estimate: Estimate) -> Rejection | None:
    """The upper end of the estimate's memory band (compiler/costmodel/bands.py MEMORY_MARGIN) must fit usable
    HBM: the cost model checked the point estimate."""
    high, usable = estimate.memory_high_bytes_per_gpu, estimate.memory.usable_bytes_per_gpu
    if high <= usable:
        return None
    margin = estimate.band.memory_high - 1 if estimate.band is not None else 0.0
    need = high - usable
    return Rejection(OUT_OF_MEMORY,
                     f"{units.format_bytes(estimate.memory.total_bytes_per_gpu)} per GPU, "
                     f"{units.format_bytes(high)} at the upper end of its memory band (+{margin:.0%}), exceeds "
                     f"{units.format_bytes(usable)} usable",
                     {"needed_bytes": high, "usable_bytes": usable,
                      "predicted_bytes": estimate.memory.total_bytes_per_gpu, "stage": estimate.memory.stage},
                     fix=f"needs {units.format_bytes(need)} more per GPU at the band's upper end: more recompute, "
                         "ZeRO-3 / FSDP full shard, a smaller micro-batch or more tensor/pipeline parallel stages")


def check_estimate(problem: Problem, estimate: Estimate) -> Rejection | None:
    """The memory band's upper end, budget and deadline, after the cost model accepted the layout."""
    return check_memory_band(problem, estimate) or check_budget(problem, estimate) or check_deadline(problem, estimate)
