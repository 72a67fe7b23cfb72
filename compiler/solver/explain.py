"""Words for the search's results: why an alternative lost, notes on the plan, the infeasible report."""
from __future__ import annotations

from typing import Mapping, Sequence

from compiler import units
from compiler.errors import Diagnostic, Location, InfeasibleError
from compiler.estimate import Estimate
from compiler.layout import Layout
from compiler.plan import ClosestMiss, SearchSummary
from compiler.problem import Problem
from compiler.solver import feasibility as F
from compiler.solver.objective import objective_key, round_key

_DIFF_FIELDS = ("gpu", "tp", "pp", "vpp", "cp", "ep", "dp", "dp_shard", "zero_stage", "micro_batch", "grad_accum",
                "recompute", "sequence_parallel", "schedule", "offload_optimizer", "offload_params")
_SHORT = {"zero_stage": "zero", "micro_batch": "mbs", "grad_accum": "ga", "sequence_parallel": "sp",
          "offload_optimizer": "offload_opt", "offload_params": "offload_params", "dp_shard": "dp_shard"}


def layout_diff(alt: Layout, best: Layout, limit: int = 2) -> str:
    """'pp=8 vs 4, recompute=full vs none' (the fields where alt differs from best)."""
    out = []
    for name in _DIFF_FIELDS:
        a = getattr(alt, name)
        b = getattr(best, name)
        if a != b:
            label = _SHORT.get(name, name)
            if isinstance(a, bool):
                a, b = ("on" if a else "off"), ("on" if b else "off")
            out.append(f"{label}={a} vs {b}")
    if len(out) > limit:
        out = out[:limit] + ["..."]
    return ", ".join(out)


def _pct(x: float) -> str:
    if abs(x) < 0.00095:
        return f"{x:.2%}"
    return f"{x:.1%}" if abs(x) < 0.095 else f"{x:.0%}"


def _main_time_difference(alt: Estimate, best: Estimate) -> str:
    prefix = f"{alt.num_gpus} GPUs vs {best.num_gpus}; " if alt.num_gpus != best.num_gpus else ""
    a_items = {i.name: i.value for i in alt.time.items}
    b_items = {i.name: i.value for i in best.time.items}
    names = sorted(set(a_items) | set(b_items))
    if not names:
        return prefix + f"step {units.format_seconds(alt.step_time_s)} vs {units.format_seconds(best.step_time_s)}"
    name = max(names, key=lambda n: (a_items.get(n, 0.0) - b_items.get(n, 0.0), n))
    a, b = a_items.get(name, 0.0), b_items.get(name, 0.0)
    if a <= b:  # nothing per step is worse: fewer steps' worth of GPUs or cost
        return prefix + f"step {units.format_seconds(alt.step_time_s)} vs {units.format_seconds(best.step_time_s)}"
    if name in ("pp_bubble", "pp_p2p"):
        return prefix + f"pipeline bubble {alt.pipeline_bubble_fraction:.0%} vs {best.pipeline_bubble_fraction:.0%}"
    return prefix + f"{name.replace('_', ' ')} {units.format_seconds(a)} vs {units.format_seconds(b)}"


def why_lost(problem: Problem, alt: Layout, alt_est: Estimate, best: Layout, best_est: Estimate) -> str:
    ka, kb = objective_key(problem, alt_est), objective_key(problem, best_est)
    diff = layout_diff(alt, best)
    if round_key(ka) == round_key(kb):
        if alt.num_parallel_dims != best.num_parallel_dims:
            why = f"{alt.num_parallel_dims} parallel dims vs {best.num_parallel_dims}"
        else:
            from compiler.solver.objective import communication_bytes
            ca, cb = communication_bytes(alt_est), communication_bytes(best_est)
            why = (f"more communication ({units.format_bytes(ca)} vs {units.format_bytes(cb)} per GPU per step)"
                   if round_key(ca) != round_key(cb) else "layout name order")
        return f"ties on the objective ({diff}); loses the tie-break: {why}"
    rel = ka / kb - 1 if kb > 0 else 0.0
    if problem.objective == "cheapest":
        head = f"{_pct(rel)} more expensive"
    elif problem.objective == "throughput":
        head = f"{_pct(1 - kb / ka)} fewer tokens/s per GPU"
    else:
        head = f"{_pct(rel)} slower"
    return f"{head} ({diff}): {_main_time_difference(alt_est, best_est)}"


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def gpus_phrase(problem: Problem) -> str:
    names = "/".join(o.name for o in problem.gpu_options)
    if problem.num_gpus is not None:
        return f"{problem.num_gpus} x {names}"
    return f"{problem.min_gpus}-{problem.max_gpus} x {names}"


_HINTS = {
    F.OUT_OF_MEMORY: "enable ZeRO-3 or full recompute (unpin them), allow more GPUs, or use GPUs with more memory",
    F.OVER_BUDGET: "raise budget.max_cost, relax budget.deadline, or choose cheaper GPUs",
    F.OVER_DEADLINE: "extend budget.deadline, raise budget.max_cost, or allow more GPUs (cluster.max_gpus)",
    F.FRAMEWORK_UNSUPPORTED: ("drop the target that cannot run these layouts from `targets`, or unpin the layout "
                              "knobs it rejects"),
    F.BATCH_NOT_DIVISIBLE: "choose a global batch with more divisors, or allow training.global_batch_tolerance",
}


# The filter that decided: a budget or deadline is checked last, memory before it, the framework table first.
_HINT_ORDER = (F.OVER_BUDGET, F.OVER_DEADLINE, F.OUT_OF_MEMORY, F.FRAMEWORK_UNSUPPORTED, F.BATCH_NOT_DIVISIBLE)


def infeasible_error(problem: Problem, summary: SearchSummary, examples: Mapping[str, str],
                     misses: Sequence[ClosestMiss]) -> InfeasibleError:
    seq, batch = problem.seq_len, problem.global_batch
    head = f"no layout fits {problem.model_name} on {gpus_phrase(problem)} (seq {seq}, global batch {batch})"
    lines = [f"searched {summary.num_considered:,} layouts, {summary.num_feasible} feasible "
             f"({summary.num_evaluated:,} costed by the model, {summary.num_pruned_by_bound:,} pruned by bound)"]
    layout_codes = {c: n for c, n in summary.rejections_by_code.items() if c not in F.SHAPE_CODES}
    shape_codes = {c: n for c, n in summary.rejections_by_code.items() if c in F.SHAPE_CODES}
    width = max([len(f"{n:,}") for n in summary.rejections_by_code.values()] + [1])
    for code, n in sorted(layout_codes.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"{n:>{width},}  {code:<26} {_short(examples.get(code, ''))}")
    for code, n in sorted(shape_codes.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"{n:>{width},}  {code:<26} (parallel shapes) {_short(examples.get(code, ''))}")
    if misses:
        lines.append("closest misses:")
        for m in misses:
            fix = f"\n      fix: {m.fix}" if m.fix else ""
            lines.append(f"  {m.layout}: {m.message}{fix}")
    if summary.num_considered == 0:
        lines.append(_empty_space_reason(problem))
    hint = next((_HINTS[c] for c in _HINT_ORDER if summary.rejections_by_code.get(c)),
                "unpin layout knobs or change the GPU count")
    return InfeasibleError([Diagnostic(summary=head, detail="\n".join(lines), hint=hint,
                                       location=Location(problem.source_path or problem.spec_path))],
                           summary=summary, closest=tuple(misses))


def _empty_space_reason(problem: Problem) -> str:
    pins = problem.pins
    pinned = [(name, v) for name, v in (("tp", pins.tp), ("pp", pins.pp), ("cp", pins.cp), ("dp", pins.dp)) if v]
    allowed = gpus_phrase(problem).split(" x ")[0]
    if pinned:
        product = 1
        for _, v in pinned:
            product *= v
        text = " x ".join(f"{n}={v}" for n, v in pinned)
        return (f"the pinned degrees ({text} = {product}) leave no tp x pp x cp x dp equal to an allowed GPU count "
                f"({allowed}, whole nodes) that also fits the model's heads, layers and sequence and the global batch")
    return (f"no tp x pp x cp x dp equals an allowed GPU count ({allowed}, whole nodes) with tp dividing the heads, "
            "pp splitting the layers, 2 x cp dividing the sequence and dp dividing the global batch")


def plan_notes(problem: Problem, layout: Layout, *, largest_gpus: int) -> tuple[str, ...]:
    notes: list[str] = []
    if layout.global_batch != problem.global_batch:
        notes.append(f"global batch realised as {layout.global_batch} sequences (requested {problem.global_batch}, "
                     f"tolerance {problem.global_batch_tolerance:.0%})")
    if problem.objective == "fastest" and problem.max_cost_usd is None and problem.deadline_s is None \
            and problem.num_gpus is None:
        notes.append(f"objective 'fastest' with no budget: more GPUs train faster, so the count is capped by "
                     f"cluster.max_gpus ({largest_gpus}) and by the batch (dp x micro_batch <= global batch "
                     f"{problem.global_batch}); set budget.max_cost to trade speed for money")
    if problem.objective == "cheapest" and problem.deadline_s is None and problem.num_gpus is None:
        notes.append("objective 'cheapest' with no deadline: the cheapest run may use few GPUs for a long time; "
                     "set budget.deadline to bound the wall-clock time")
    if problem.objective == "throughput" and problem.num_gpus is None:
        notes.append(f"objective 'throughput' maximises tokens/s per GPU on the largest allowed GPU count "
                     f"({largest_gpus})")
    return tuple(notes)
