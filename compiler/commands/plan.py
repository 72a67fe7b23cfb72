"""`dtc plan SPEC [--top N] [--json]`: solve one spec and show the ranked layouts, without writing files.

Prints a header (model, GPUs, the batch arithmetic), the ranked table (the plan and its
runners-up with why each lost), the tally of rejected layouts by reason code, the plan's
notes, and a one-line summary. ``--json`` prints the same as data. An infeasible spec
exits 2 with the closest misses (rendered by the CLI from the InfeasibleError).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from compiler import units
from compiler.output import table, to_json

if TYPE_CHECKING:  # the spec stack is imported when the command runs, not when `dtc --help` lists it
    from compiler.plan import Plan
    from compiler.problem import Problem

HEADERS = ("rank", "layout", "GPUs", "memory/GPU", "step", "MFU", "time", "80% band (runs)", "cost", "why lost")


def candidate_rows(plan: Plan) -> list[dict[str, Any]]:
    """The ranked table as data: the plan first, then the alternatives."""
    from compiler import uncertainty  # here, not at import: `dtc --help` lists this command

    rows = []
    entries = [(1, plan.layout, plan.estimate, "")] + [(c.rank, c.layout, c.estimate, c.why_lost)
                                                        for c in plan.alternatives]
    for rank, layout, est, why in entries:
        rows.append({
            "rank": rank, "layout": layout.tag, "description": layout.describe(), "gpu": layout.gpu,
            "num_gpus": est.num_gpus,
            "memory_bytes_per_gpu": est.memory.total_bytes_per_gpu,
            "usable_bytes_per_gpu": est.memory.usable_bytes_per_gpu, "step_time_s": est.step_time_s,
            "mfu": est.mfu, "time_to_train_s": est.time_to_train_s, "cost_usd": est.cost_usd, "why_lost": why,
            "band": uncertainty.band_data(est),
        })
    return rows


def _table_text(rows: list[dict[str, Any]], several_gpu_types: bool) -> str:
    cells = [(r["rank"], r["layout"], f"{r['num_gpus']} x {r['gpu']}" if several_gpu_types else r["num_gpus"],
              f"{r['memory_bytes_per_gpu'] / 2**30:.1f}/{r['usable_bytes_per_gpu'] / 2**30:.1f} GiB",
              units.format_seconds(r["step_time_s"]), f"{r['mfu']:.1%}", units.format_seconds(r["time_to_train_s"]),
              _band_cell(r["band"]), units.format_money(r["cost_usd"]), r["why_lost"] or "(chosen)") for r in rows]
    return table(HEADERS, cells, align="lllrrrrrrl")


def _band_cell(band: dict[str, Any] | None) -> str:
    """'117.5-158.0 d (21)': the time to train's 80% band and the published runs behind it."""
    if band is None:
        return "-"
    runs = str(band["runs"]) if band["calibrated"] else "uncalibrated"
    return f"{units.format_seconds_range(*band['time_to_train_s'])} ({runs})"


def batch_line(plan: Plan) -> str:
    lay = plan.layout
    t = plan.training
    line = (f"global batch {lay.global_batch} = micro {lay.micro_batch} x accumulation {lay.grad_accum} "
            f"x dp {lay.dp} ({units.format_count(t.tokens_per_step)} tokens per step, {t.num_steps:,} steps)")
    if lay.global_batch != t.requested_global_batch:
        line += f"; requested {t.requested_global_batch}"
    if " tokens / " in t.batch_note:  # a token batch: how its sequence count was chosen
        line += f"\n  {t.batch_note}"
    return line


def header_lines(problem: Problem, plan: Plan) -> list[str]:
    c = plan.cluster
    budget = []
    if problem.max_cost_usd is not None:
        budget.append(f"budget {units.format_money(problem.max_cost_usd)}")
    if problem.deadline_s is not None:
        budget.append(f"deadline {units.format_seconds(problem.deadline_s)}")
    return [
        f"{problem.name}: {problem.model_name} ({units.format_count(problem.num_params)} params), "
        f"{units.format_count(problem.tokens)} tokens, seq {problem.seq_len}",
        f"GPUs: {c.num_gpus} x {c.gpu} ({c.num_nodes} nodes; allowed "
        + (str(problem.num_gpus) if problem.num_gpus else f"{problem.min_gpus}-{problem.max_gpus}") + ")",
        batch_line(plan),
        f"objective: {problem.objective}" + (f" ({', '.join(budget)})" if budget else "")
        + (f", ranked at {problem.confidence} (budget.confidence): the step time 8 runs in 10 beat, from each "
           "layout's 80% band" if problem.confidence == "p80" else
           f", ranked at {problem.confidence} (budget.confidence): the upper end of each layout's 80% band"
           if problem.confidence == "p90" else ", ranked by the point estimates (budget.confidence: expected)"),
        f"targets: {', '.join(plan.targets)}",
    ]


def tally_lines(plan: Plan, examples: dict[str, str] | None = None) -> list[str]:
    from compiler.solver.feasibility import SHAPE_CODES

    rej = plan.search.rejections_by_code
    if not rej:
        return []
    examples = examples or {}
    width = max(len(f"{n:,}") for n in rej.values())
    code_width = max(len(c) for c in rej)
    lines = ["rejected (layouts; batch_not_divisible counts parallel shapes):" if set(rej) & SHAPE_CODES
             else "rejected layouts:"]
    for code, n in sorted(rej.items(), key=lambda kv: (-kv[1], kv[0])):
        example = examples.get(code, "")
        if len(example) > 160:
            example = example[:157] + "..."
        lines.append(f"  {n:>{width},}  {code:<{code_width}}  {example}".rstrip())
    return lines


def summary_line(plan: Plan) -> str:
    from compiler import uncertainty

    e, s = plan.estimate, plan.search
    return (f"Plan: {plan.layout.describe()} on {e.num_gpus} x {plan.cluster.gpu}, "
            f"{uncertainty.time_to_train_text(e)}, {units.format_money(e.cost_usd)}, "
            f"{uncertainty.step_text(e)} "
            f"(searched {s.num_considered:,} layouts: {s.num_evaluated:,} costed, {s.num_feasible:,} of them feasible; "
            f"{s.num_pruned_by_bound:,} pruned by bound)")


@click.command("plan")
@click.argument("spec", type=click.Path(dir_okay=False, path_type=str))
@click.option("--top", "top", type=click.IntRange(0, 50), default=None,
              help="Alternatives to show (default: the spec's search.top_k). More alternatives means fewer layouts "
                   "pruned by bound, so more are costed (and found feasible); the plan is the same.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan, the table and the summary as JSON.")
def plan_command(spec: str, top: int | None, as_json: bool) -> None:
    """Solve SPEC and print the ranked layouts, why each alternative lost, and the rejections.

    Nothing is written. Exit 0 with a plan; 2 if the spec is invalid or nothing fits
    (then the closest misses and what would make them fit are shown).
    """
    from compiler.problem import lower
    from compiler.render.report_layout import run_vs_time_limit
    from compiler.solver.search import search, target_costs
    from compiler.spec.load import load_spec

    problem = lower(load_spec(spec))
    result = search(problem, top_k=top)
    plan = result.plan
    rows = candidate_rows(plan)
    costs = [c.describe(problem, plan) for c in target_costs(problem, plan)]
    if as_json:
        click.echo(to_json({"plan": plan.to_dict(), "table": rows, "summary": summary_line(plan),
                            "batch": batch_line(plan), "rejection_examples": result.examples,
                            "targets_ruled_out": costs, "jobs": run_vs_time_limit(plan)}), nl=False)
        return
    out = header_lines(problem, plan) + ["", _table_text(rows, len(problem.gpu_options) > 1), ""]
    out += tally_lines(plan, result.examples)
    jobs = run_vs_time_limit(plan)
    if plan.notes or costs or jobs:
        out += ["notes:"] + [f"  - {n}" for n in ([jobs] if jobs else []) + costs + list(plan.notes)]
    out += ["", summary_line(plan)]
    click.echo("\n".join(out))
