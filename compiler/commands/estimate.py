"""`dtc estimate SPEC`: cost one fully pinned layout and explain it line by line.

The layout comes from the spec's ``layout:`` pins, overridden by the command-line
options and completed with the obvious defaults (compiler/pinned.py ``build_layout``, judged by
the layout rules exactly as `dtc validate` and `dtc plan` judge it). Prints the memory per GPU and the
step time as line items (formula and source of each), then the outputs; ``--json``
gives the same data.
"""
from __future__ import annotations

from typing import Any

import click

from compiler import uncertainty, units
from compiler.costmodel.evaluation import evaluate_targets
from compiler.errors import Diagnostic, DtcError, ExitCode
from compiler.estimate import Estimate, LineItem, Rejection
from compiler.layout import Layout
from compiler.pinned import build_layout
from compiler.plan import TargetEstimate, plan_data
from compiler.problem import Problem, lower
from compiler.output import to_json
from compiler.spec.load import load_spec

def estimate_layout(problem: Problem, layout: Layout) -> Estimate | Rejection:
    """The cost model on one layout (the GPU is the spec's option named by layout.gpu), for each framework
    target of the spec: the binding target's estimate (the first that rejects it, else the slowest at the spec's
    confidence)."""
    return evaluate_targets(problem, layout).result


def format_targets_text(per_target: tuple[TargetEstimate, ...]) -> list[str]:
    """The layout costed for each framework target (shown when the spec names several)."""
    if len(per_target) < 2:
        return []
    lines = ["", "per target (the figures above are the binding target's: it must fit under each and runs as fast "
                 "as the slowest at the spec's confidence, its step time x its band's factor)"]
    width = max(len(e.target) for e in per_target)
    for e in per_target:
        lines.append(f"  {e.target:<{width}}  step {units.format_seconds(e.step_time_s):>9}  "
                     f"{e.tokens_per_s_per_gpu:>10,.0f} tokens/s/GPU  MFU {e.mfu:6.1%}  "
                     f"{units.format_seconds(e.time_to_train_s):>8}  {units.format_money(e.cost_usd):>9}  "
                     f"memory {units.format_bytes(e.memory_bytes_per_gpu)} of {units.format_bytes(e.usable_bytes_per_gpu)}"
                     + ("  (binding)" if e.binding else ""))
    return lines


# --- text -------------------------------------------------------------------------------------------------


def _item_rows(items: tuple[LineItem, ...], fmt) -> list[str]:
    width = max((len(i.name) for i in items), default=4)
    lines = []
    for i in items:
        lines.append(f"  {i.name:<{width}}  {fmt(i.value):>10}  {i.formula}")
        if i.source:
            lines.append(f"  {'':<{width}}  {'':>10}  source: {i.source}")
    return lines


def format_estimate_text(problem: Problem, layout: Layout, estimate: Estimate,
                         per_target: tuple[TargetEstimate, ...] = ()) -> str:
    """Both breakdowns and the outputs, as plain text."""
    e, m = estimate, estimate.memory
    head = (f"{problem.name}: {problem.model_name} ({units.format_count(problem.num_params)} params), "
            f"{e.num_gpus} x {layout.gpu}, {problem.precision}")
    lines = [head, f"layout  {layout.describe()}", "",
             f"memory per GPU (stage {m.stage} of {layout.pp}, the largest)"]
    lines += _item_rows(m.items, units.format_bytes)
    fits = "fits" if m.total_bytes_per_gpu <= m.usable_bytes_per_gpu else "DOES NOT FIT"
    lines.append(f"  total {units.format_bytes(m.total_bytes_per_gpu)} of {units.format_bytes(m.usable_bytes_per_gpu)} "
                 f"usable ({units.format_bytes(m.hbm_bytes_per_gpu)} HBM): {fits}")
    if e.band is not None:
        lines.append(f"  {uncertainty.memory_text(e)}")
    lines += [f"  {line}" for line in m.host_lines()]
    lines += ["", "step time (critical path; items sum to the step)"]
    lines += _item_rows(e.time.items, units.format_seconds)
    lines.append(f"  {uncertainty.step_text(e)}")
    lines += [
        "", "outputs",
        f"  tokens/s              {e.tokens_per_s:,.0f} total, {uncertainty.tokens_text(e)} "
        f"({e.tokens_per_step:,} tokens per step)",
        f"  model TFLOP/s per GPU {e.model_tflops_per_gpu:.1f}   MFU {e.mfu:.1%}   HFU {e.hfu:.1%}",
        f"  pipeline bubble       {e.pipeline_bubble_fraction:.1%}",
        f"  time to train         {uncertainty.time_to_train_text(e)} ({e.num_steps:,} steps of "
        f"{units.format_count(problem.tokens)} tokens)",
        f"  GPU-hours / cost      {e.gpu_hours:,.0f} GPU-hours, {uncertainty.cost_text(e)}",
    ]
    lines += format_targets_text(per_target)
    lines += ["", "assumptions"]
    lines += [f"  - {a}" for a in e.assumptions]
    lines.append("")
    lines.append(f"Estimate: {units.format_bytes(m.total_bytes_per_gpu)} per GPU, {uncertainty.step_text(e)}; "
                 f"MFU {e.mfu:.1%}, "
                 f"{units.format_seconds(e.time_to_train_s)} to train, {units.format_money(e.cost_usd)}.")
    return "\n".join(lines)


def estimate_to_json(layout: Layout, e: Estimate, per_target: tuple[TargetEstimate, ...] = ()) -> dict[str, Any]:
    m = e.memory
    return {
        "targets": [plan_data(t) for t in per_target],
        "layout": layout.to_dict(),
        "step_time_s": e.step_time_s, "tokens_per_step": e.tokens_per_step, "tokens_per_s": e.tokens_per_s,
        "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu, "model_flops_per_token": e.model_flops_per_token,
        "model_tflops_per_gpu": e.model_tflops_per_gpu, "mfu": e.mfu, "hfu": e.hfu,
        "pipeline_bubble_fraction": e.pipeline_bubble_fraction, "num_steps": e.num_steps,
        "time_to_train_s": e.time_to_train_s, "gpu_hours": e.gpu_hours, "cost_usd": e.cost_usd, "num_gpus": e.num_gpus,
        "memory": {
            "items": [{"name": i.name, "bytes": int(i.value), "formula": i.formula, "source": i.source} for i in m.items],
            "total_bytes_per_gpu": m.total_bytes_per_gpu, "usable_bytes_per_gpu": m.usable_bytes_per_gpu,
            "hbm_bytes_per_gpu": m.hbm_bytes_per_gpu, "stage": m.stage, "cpu_bytes_per_node": m.cpu_bytes_per_node,
            "nvme_bytes_per_node": m.nvme_bytes_per_node, "usable_cpu_bytes_per_node": m.usable_cpu_bytes_per_node,
        },
        "time": {"items": [{"name": i.name, "seconds": i.value, "formula": i.formula, "source": i.source}
                           for i in e.time.items], "step_time_s": e.time.step_time_s},
        "comm": [c.__dict__ for c in e.comm],
        "assumptions": list(e.assumptions),
        "band": uncertainty.band_data(e),
    }


@click.command("estimate")
@click.argument("spec", required=False, type=click.Path(dir_okay=False, path_type=str))
@click.option("--plan", "plan_path", type=click.Path(dir_okay=False, path_type=str),
              help="Re-cost a compiled plan (generated/<name>/plan.json) from the plan alone, instead of a SPEC; "
                   "says whether it reproduces the plan's estimate.")
@click.option("--json", "as_json", is_flag=True, help="Print the estimate as JSON.")
@click.option("--tp", type=click.IntRange(min=1), help="Tensor-parallel degree.")
@click.option("--pp", type=click.IntRange(min=1), help="Pipeline-parallel degree.")
@click.option("--vpp", type=click.IntRange(min=1), help="Virtual pipeline stages per rank (interleaved 1F1B).")
@click.option("--cp", type=click.IntRange(min=1), help="Context-parallel degree.")
@click.option("--ep", type=click.IntRange(min=1), help="Expert-parallel degree (carved out of dp x cp).")
@click.option("--etp", type=click.IntRange(min=1),
              help="Expert tensor-parallel degree (Megatron; default tp; ep x etp divides tp x dp x cp).")
@click.option("--dp", type=click.IntRange(min=1), help="Data-parallel degree (default: num_gpus / (tp x pp x cp)).")
@click.option("--dp-shard", "dp_shard", type=click.IntRange(min=1), help="ZeRO/FSDP shard group (< dp: HSDP).")
@click.option("--zero", "zero_stage", type=click.IntRange(0, 3), help="ZeRO stage 0-3.")
@click.option("--micro-batch", "micro_batch", type=click.IntRange(min=1), help="Sequences per GPU per micro-step.")
@click.option("--recompute", type=click.Choice(["none", "selective", "full"]), help="Activation recomputation.")
@click.option("--schedule", type=click.Choice(["gpipe", "1f1b", "interleaved_1f1b"]), help="Pipeline schedule.")
@click.option("--sequence-parallel/--no-sequence-parallel", "sequence_parallel", default=None,
              help="Megatron sequence parallelism (tp > 1).")
@click.option("--offload-optimizer", "offload_optimizer", type=click.Choice(["none", "cpu", "nvme"]),
              help="Where optimizer states live.")
@click.option("--offload-params", "offload_params", type=click.Choice(["none", "cpu", "nvme"]),
              help="Where parameters live (ZeRO-3).")
@click.option("--gpu", help="Which of the spec's GPU types to use.")
def estimate_command(spec: str | None, plan_path: str | None, as_json: bool, **overrides: Any) -> None:
    """Estimate memory per GPU and step time of the layout pinned in SPEC (options override pins), or of a
    compiled plan (--plan generated/<name>/plan.json).

    Prints every memory and time line item with its formula and source, then tokens/s,
    MFU, time to train, GPU-hours and cost. The layout is judged by the same rules as
    `dtc validate` and `dtc plan`. With --plan, also whether the plan's own estimate is
    reproduced. Exit 0 on success; 2 when the spec or plan is invalid, the layout is
    incomplete, or the layout cannot run (e.g. out of memory).
    """
    if (spec is None) == (plan_path is None):
        raise click.UsageError("give a SPEC or --plan PLAN_JSON (one of them)")
    if plan_path is not None:
        if any(v is not None for v in overrides.values()):
            raise click.UsageError("--plan re-costs the plan's own layout: layout options do not apply")
        _estimate_plan(plan_path, as_json)
        return
    assert spec is not None  # exactly one of SPEC and --plan (checked above)
    problem = lower(load_spec(spec))
    layout = build_layout(problem, overrides)
    targets = evaluate_targets(problem, layout)
    _show(problem, layout, targets.result, as_json, per_target=targets.summaries())


def _show(problem: Problem, layout: Layout, result: Estimate | Rejection, as_json: bool,
          extra: dict[str, Any] | None = None, per_target: tuple[TargetEstimate, ...] = ()) -> None:
    if isinstance(result, Rejection):
        if as_json:
            click.echo(to_json({"layout": layout.to_dict(), "rejection": result.to_dict(), **(extra or {})}), nl=False)
            raise SystemExit(int(ExitCode.USER_ERROR))
        detail = ""
        if result.code == "out_of_memory":
            items = result.details.get("items", {})
            detail = "\n".join(f"{name:<24} {units.format_bytes(v):>10}" for name, v in items.items())
        raise DtcError(Diagnostic(summary=f"{result.message} ({layout.describe()})", detail=detail,
                                  hint=result.fix, code=result.code))
    if as_json:
        click.echo(to_json({**estimate_to_json(layout, result, per_target), **(extra or {})}), nl=False)
    else:
        click.echo(format_estimate_text(problem, layout, result, per_target))


def _estimate_plan(path: str, as_json: bool) -> None:
    from compiler.recost import load_plan_file, recost_as_in_plan

    plan = load_plan_file(path)
    problem, result, per_target, same = recost_as_in_plan(plan)
    _show(problem, plan.layout, result, as_json, {"plan": path, "reproduces_plan": same}, per_target=per_target)
    if not as_json:
        click.echo("plan.json's estimate: " + ("reproduced exactly." if same else
                   "NOT reproduced: the cost model or the catalog changed since the plan was compiled "
                   f"(step {units.format_seconds(plan.estimate.step_time_s)} in the plan); recompile the spec."))
