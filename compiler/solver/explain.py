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
from compiler.solver.objective import (CHEAPEST_TIE, in_tie_band, objective_key, ranked_cost_usd, ranked_time_s,
                                       round_key)

_DIFF_FIELDS = ("gpu", "tp", "pp", "vpp", "cp", "ep", "etp", "dp", "dp_shard", "zero_stage", "micro_batch", "grad_accum",
                "recompute", "sequence_parallel", "schedule", "offload_optimizer", "offload_params")
_SHORT = {"zero_stage": "zero", "micro_batch": "mbs", "grad_accum": "ga", "sequence_parallel": "sp",
          "offload_optimizer": "offload_opt", "offload_params": "offload_params", "dp_shard": "dp_shard"}


def layout_diff(alt: Layout, best: Layout, limit: int = 2) -> str:
    """'pp=8 vs 4, recompute=full vs none' (the fields where alt differs from best)."""
    out = []
    for name in _DIFF_FIELDS:
        a = getattr(alt, name)
        b = getattr(best, name)
        if name == "etp" and alt.expert_tp == best.expert_tp:  # (tp=2 etp=1 against tp=1: the experts alike)
            continue
        if a != b:
            label = _SHORT.get(name, name)
            if isinstance(a, bool):
                a, b = ("on" if a else "off"), ("on" if b else "off")
            if name == "etp":  # None: the expert layers split like the rest (etp = tp)
                a, b = ("tp" if a is None else a), ("tp" if b is None else b)
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


def why_lost(problem: Problem, alt: Layout, alt_est: Estimate, best: Layout, best_est: Estimate, *,
             cheapest_usd: float | None = None) -> str:
    ka, kb = objective_key(problem, alt_est), objective_key(problem, best_est)
    diff = layout_diff(alt, best)
    if problem.objective == "cheapest" and cheapest_usd is not None and in_tie_band(
            ranked_cost_usd(problem, alt_est), cheapest_usd):
        # both within the tie band of the cheapest: the faster won
        ta, tb = ranked_time_s(problem, alt_est), ranked_time_s(problem, best_est)
        cost = (f"{'+' if ka >= kb else ''}{_pct(ka / kb - 1)}" if kb > 0 and round_key(ka) != round_key(kb)
                else "same cost")
        if round_key(ta) != round_key(tb):
            return (f"ties on cost ({cost}, within {CHEAPEST_TIE:.0%} of the cheapest); {_pct(ta / tb - 1)} slower "
                    f"({diff}): {_main_time_difference(alt_est, best_est)}")
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
    c = problem.confidence
    # ranked at a quantile: say so where the two bands differ (the point estimates may order them otherwise)
    at = f" at {c}" if alt_est.time_factor(c) != best_est.time_factor(c) else ""
    if problem.objective == "cheapest":
        head = f"{_pct(rel)} more expensive{at}"
    elif problem.objective == "throughput":
        head = f"{_pct(1 - kb / ka)} fewer tokens/s per GPU{at}"
    else:
        head = f"{_pct(rel)} slower{at}"
    return f"{head} ({diff}): {_main_time_difference(alt_est, best_est)}"


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def gpus_phrase(problem: Problem) -> str:
    names = "/".join(o.name for o in problem.gpu_options)
    if problem.num_gpus is not None:
        return f"{problem.num_gpus} x {names}"
    return f"{problem.min_gpus}-{problem.max_gpus} x {names}"


def _more_gpus(problem: Problem) -> str:
    if problem.num_gpus is not None:
        return f"use more GPUs than cluster.num_gpus ({problem.num_gpus:,})"
    return f"allow more GPUs (cluster.max_gpus is {problem.max_gpus:,})"


def _pinned_memory_knobs(problem: Problem) -> list[str]:
    """The pins that keep the search from the layouts that need less memory."""
    p = problem.pins
    out = []
    if p.zero_stage is not None and p.zero_stage < 3:
        out.append(f"zero_stage ({p.zero_stage})")
    if p.recompute not in (None, "full"):
        out.append(f"recompute ({p.recompute})")
    if p.micro_batch not in (None, 1):
        out.append(f"micro_batch_size ({p.micro_batch})")
    if p.offload_optimizer == "none":
        out.append("offload_optimizer (none)")
    for name, value in (("tensor_parallel", p.tp), ("pipeline_parallel", p.pp), ("context_parallel", p.cp),
                        ("data_parallel_shard", p.dp_shard)):
        if value is not None:
            out.append(f"{name} ({value})")
    return out


def _larger_gpus(problem: Problem) -> list[str]:
    from compiler.catalog import load_catalog

    most = max(o.spec.hbm_bytes for o in problem.gpu_options)
    catalog = load_catalog()
    found = [g for g in (catalog.find_gpu(n) for n in catalog.gpu_names()) if g is not None and g.hbm_bytes > most]
    return [f"{g.name} ({units.format_bytes(g.hbm_bytes)})" for g in sorted(found, key=lambda g: -g.hbm_bytes)]


def _framework_note(problem: Problem, summary: SearchSummary) -> str:
    frameworks = [t for t in problem.targets if t != "slurm"]
    if summary.rejections_by_code.get(F.FRAMEWORK_UNSUPPORTED) and len(frameworks) > 1:
        return (f"fewer targets (a layout must run under each of {', '.join(frameworks)}; "
                f"{summary.rejections_by_code[F.FRAMEWORK_UNSUPPORTED]:,} layouts were framework_unsupported)")
    return ""


def _hint(code: str, problem: Problem, summary: SearchSummary, fastest_gpus: int | None = None) -> str:
    """What would help, as true of this spec as the search can tell: only knobs the spec pins are 'unpinned',
    only limits the spec sets are 'raised', only larger GPUs that exist are named."""
    out: list[str] = []
    if code == F.OUT_OF_MEMORY:
        pinned = _pinned_memory_knobs(problem)
        if pinned:
            out.append("unpin layout." + ", layout.".join(pinned) + " (the search tries ZeRO-3, full recompute, "
                       "offload and every tp/pp itself)")
        out.append(_more_gpus(problem))
        larger = _larger_gpus(problem)
        if larger:
            out.append(f"use GPUs with more memory ({', '.join(larger[:3])})")
        out.append(_framework_note(problem, summary))
        out.append(f"shorten training.sequence_length ({problem.seq_len})" if problem.seq_len > 2048 else "")
    elif code == F.HOST_OUT_OF_MEMORY:
        out.append("give cluster.host_memory if the nodes have more than the catalog's reference system")
        if "cpu" in (problem.pins.offload_optimizer, problem.pins.offload_params):
            out.append("unpin layout.offload_optimizer / layout.offload_params (NVMe offload needs little host memory)")
        out.append(_more_gpus(problem))
    elif code == F.OVER_BUDGET:
        out.append("raise budget.max_cost")
        if problem.deadline_s is not None:
            out.append("relax budget.deadline")
        out.append("choose cheaper GPUs (cluster.gpu; see dtc catalog gpus)")
    elif code == F.OVER_DEADLINE:
        out.append("extend budget.deadline")
        if problem.max_cost_usd is not None and summary.rejections_by_code.get(F.OVER_BUDGET):
            out.append("raise budget.max_cost")
        if fastest_gpus is None or fastest_gpus >= problem.max_gpus:  # more GPUs would be used
            out.append(_more_gpus(problem))
        else:  # the fastest layout leaves GPUs unused: what caps its size
            p = problem.pins
            degrees = [f"layout.{name}" for name, v in (("tensor_parallel", p.tp), ("pipeline_parallel", p.pp),
                                                       ("context_parallel", p.cp), ("data_parallel", p.dp)) if v]
            if degrees:
                out.append(f"unpin {', '.join(degrees)} (the fastest layout uses {fastest_gpus:,} of "
                           f"{problem.max_gpus:,} GPUs)")
            out.append(f"a larger training.global_batch (data parallelism is at most {problem.global_batch} "
                       "sequences wide)")
        out.append("train on fewer tokens")
    elif code == F.FRAMEWORK_UNSUPPORTED:
        frameworks = [t for t in problem.targets if t != "slurm"]
        if len(frameworks) > 1:
            out.append(f"drop the target that cannot run these layouts from `targets` ({', '.join(frameworks)})")
        else:
            out.append(f"render for another framework than {', '.join(frameworks) or 'none'} (`targets`)")
        if _pinned_memory_knobs(problem) or problem.pins.schedule or problem.pins.vpp:
            out.append("unpin the layout knobs it rejects")
    elif code == F.BATCH_NOT_DIVISIBLE:
        out.append("choose a global batch with more factors of two, or allow training.global_batch_tolerance")
    out = [o for o in out if o]
    if not out:
        return "unpin layout knobs or change the GPU count"
    return ", ".join(out[:-1]) + (", or " if len(out) > 1 else "") + out[-1]


# The filter that decided: a budget or deadline is checked last, memory before it, the framework table first.
_HINT_ORDER = (F.OVER_BUDGET, F.OVER_DEADLINE, F.OUT_OF_MEMORY, F.HOST_OUT_OF_MEMORY, F.FRAMEWORK_UNSUPPORTED,
               F.BATCH_NOT_DIVISIBLE)


def infeasible_error(problem: Problem, summary: SearchSummary, examples: Mapping[str, str],
                     misses: Sequence[ClosestMiss], *, batch_fix: str = "",
                     fastest_gpus: int | None = None) -> InfeasibleError:
    """The 'no layout fits' report; ``batch_fix``: the global batch is what blocks the spec (a batch that splits
    better fits), so its fix is the hint and its miss comes first."""
    seq, batch = problem.seq_len, problem.global_batch
    head = f"no layout fits {problem.model_name} on {gpus_phrase(problem)} (seq {seq}, global batch {batch})"
    lines = [search_line(summary)]
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
            on = f" ({m.gpus})" if m.gpus else ""
            lines.append(f"  {m.layout}{on}: {m.message}{fix}")
    if summary.num_considered == 0:
        lines.append(_empty_space_reason(problem))
    hint = batch_fix or next((_hint(c, problem, summary, fastest_gpus) for c in _HINT_ORDER
                              if summary.rejections_by_code.get(c)),
                             "unpin layout knobs or change the GPU count")
    return InfeasibleError([Diagnostic(summary=head, detail="\n".join(lines), hint=hint,
                                       location=Location(problem.source_path or problem.spec_path))],
                           summary=summary, closest=tuple(misses))


def search_line(summary: SearchSummary) -> str:
    """How many layouts the search saw and what became of them. 'feasible' counts only the layouts the cost
    model costed: the ones a bound proved could not beat the kept top k were never costed (so a larger --top
    costs, and may find feasible, more)."""
    return (f"searched {summary.num_considered:,} layouts: {summary.num_evaluated:,} costed by the model "
            f"({summary.num_feasible:,} of them feasible), {summary.num_pruned_by_bound:,} pruned by bound (could "
            f"not beat the plans kept), the rest rejected")


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


def cheapest_tie_note(problem: Problem, best: Layout, best_est: Estimate, cheapest: Layout,
                      cheapest_est: Estimate) -> str:
    """Why 'cheapest' did not choose the cheapest layout: it tied on cost and was slower."""
    return (f"objective 'cheapest': costs within {CHEAPEST_TIE:.0%} of the cheapest count as ties and the fastest of "
            f"them is chosen: {best_est.num_gpus} GPUs for {units.format_seconds(best_est.time_to_train_s)} "
            f"({units.format_money(best_est.cost_usd)}) instead of the cheapest, {cheapest_est.num_gpus} GPUs for "
            f"{units.format_seconds(cheapest_est.time_to_train_s)} ({units.format_money(cheapest_est.cost_usd)}, "
            f"{_pct(1 - cheapest_est.cost_usd / best_est.cost_usd)} less)")


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
        notes.append("objective 'cheapest' with no deadline: set budget.deadline to bound the wall-clock time")
    if problem.num_gpus is None and problem.max_gpus_default:
        notes.append(f"no cluster.max_gpus: the search went up to {problem.max_gpus:,} GPUs (dtc's default); set "
                     "cluster.max_gpus to the most GPUs you can use")
    if problem.objective == "throughput" and problem.num_gpus is None:
        notes.append(f"objective 'throughput' maximises tokens/s per GPU on the largest allowed GPU count "
                     f"({largest_gpus})")
    return tuple(notes)
