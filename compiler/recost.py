"""Re-cost a plan from plan.json alone: the Problem a plan was solved for, and its layout costed again.

``problem_of_plan(plan)`` rebuilds the Problem from the plan's own sections (the model shape, the
training run, the GPU of the catalog with the plan's node size, price and bandwidths, the memory
headroom, the budget, the targets, the layout's split as a pin); ``recost(plan)`` runs the layout
rules (compiler.rules) and the cost model on the plan's layout, for each of its framework targets (the
binding one's estimate, as the solver keeps it). For a plan compiled by this dtc the
result equals the plan's estimate section exactly (``plan_data(recost(plan)) ==
plan.to_dict()["estimate"]``; tests/test_estimate_plan.py holds every committed plan to it); a
difference means the cost model or the catalog changed since the plan was written.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from compiler import rules
from compiler.catalog import Catalog, load_catalog
from compiler.errors import Diagnostic, DtcError, Location
from compiler.estimate import Estimate, Rejection
from compiler.model import count_params
from compiler.plan import Plan, TargetEstimate, as_in_plan, plan_data
from compiler.problem import GpuOption, Hyper, Pins, Problem

if TYPE_CHECKING:
    from compiler.costmodel.evaluation import TargetEstimates


def problem_of_plan(plan: Plan, *, catalog: Catalog | None = None) -> Problem:
    catalog = catalog or load_catalog()
    c, t = plan.cluster, plan.training
    spec = catalog.find_gpu(c.gpu)
    if spec is None:
        raise DtcError(Diagnostic(summary=f"the plan's GPU {c.gpu!r} is not in dtc's catalog (a custom GPU)",
                                  hint="re-cost it from its spec: dtc estimate SPEC"))
    option = GpuOption(spec=spec, gpus_per_node=c.gpus_per_node, price_per_gpu_hour_usd=c.price_per_gpu_hour_usd,
                       intra_node_bandwidth_bytes_per_s=c.intra_node_bandwidth_bytes_per_s,
                       inter_node_bandwidth_bytes_per_s=c.inter_node_bandwidth_bytes_per_s,
                       host_memory_bytes_per_node=c.host_memory_bytes_per_node or 0)
    shape = plan.model.shape
    return Problem(
        name=plan.name, description=plan.description, spec_path=plan.provenance.spec_path,
        spec_sha256=plan.provenance.spec_sha256, model_name=plan.model.name, shape=shape,
        params=count_params(shape), tokens=t.tokens, seq_len=t.seq_len, global_batch=t.global_batch,
        global_batch_tolerance=0.0, batch_note=t.batch_note, precision=t.precision, optimizer=t.optimizer,
        hyper=Hyper(t.learning_rate, t.min_learning_rate, t.warmup_tokens, t.weight_decay, t.grad_clip, t.adam_beta1,
                    t.adam_beta2, t.seed),
        gpu_options=(option,), num_gpus=c.num_gpus, min_gpus=c.num_gpus, max_gpus=c.num_gpus,
        max_cost_usd=plan.budget.max_cost_usd, deadline_s=plan.budget.deadline_s, objective=plan.budget.objective,
        pins=Pins(split=plan.layout.split), memory_headroom=c.memory_headroom,
        allow_cross_node_tp=True,  # the plan's tp passed its spec's node rule when it was solved
        top_k=0, targets=plan.targets, slurm=plan.slurm, profile=plan.cluster.profile)


def recost_targets(plan: Plan, *, catalog: Catalog | None = None) -> tuple[Problem, "TargetEstimates | Rejection"]:
    """The plan's Problem and its layout costed again for each of its framework targets (a Rejection when a
    layout rule refuses it)."""
    problem = problem_of_plan(plan, catalog=catalog)
    bad = rules.check_plan(plan)
    if bad is not None:
        return problem, bad
    from compiler.costmodel.evaluation import evaluate_targets

    return problem, evaluate_targets(problem, plan.layout)


def recost(plan: Plan, *, catalog: Catalog | None = None) -> tuple[Problem, Estimate | Rejection]:
    """The plan's Problem and its layout costed again: the binding target's estimate (a Rejection when a layout
    rule or memory refuses it)."""
    problem, result = recost_targets(plan, catalog=catalog)
    return problem, result if isinstance(result, Rejection) else result.result


def recost_as_in_plan(plan: Plan) -> tuple[Problem, Estimate | Rejection, tuple[TargetEstimate, ...], bool]:
    """``recost_targets`` rounded as plan.json rounds it: (problem, the binding target's result, each target's
    estimate, whether that reproduces the plan's estimate sections exactly)."""
    problem, targets = recost_targets(plan)
    result: Estimate | Rejection = targets if isinstance(targets, Rejection) else targets.result
    per_target = () if isinstance(targets, Rejection) else tuple(as_in_plan(t) for t in targets.summaries())
    if isinstance(result, Estimate):
        result = as_in_plan(result)  # rounded as plan.json rounds it
    same = (isinstance(result, Estimate) and plan_data(result) == plan_data(plan.estimate)
            and per_target == plan.target_estimates)
    return problem, result, per_target, same


def load_plan_file(path: str) -> Plan:
    """A plan.json, or a DtcError at its path saying what is wrong."""
    where = Location(path)
    try:
        return Plan.from_json(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise DtcError(Diagnostic(summary=f"cannot read {path}: {exc.strerror}", location=where,
                                  hint="pass the plan.json of a compiled folder, e.g. generated/<name>/plan.json"))
    except ValueError as exc:
        raise DtcError(Diagnostic(summary=f"not a dtc plan: {exc}", location=where,
                                  hint="recompile the spec (dtc compile SPEC)")) from None
