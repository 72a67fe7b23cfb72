"""The cost model's entry points: per-GPU memory and step time of a layout, as named line items.

    evaluate(problem, layout, *, gpu=None, target=None) -> Estimate | Rejection
    evaluate_targets(problem, layout) -> TargetEstimates (one Estimate per framework target, the binding one)

Structural problems come back as ``Rejection`` with a stable code (compiler.rules, via ``check_layout``);
a layout that does not fit comes back as ``Rejection("out_of_memory")`` with the
breakdown and what would make it fit.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from compiler import rules
from compiler.catalog import normalize_name
from compiler.costmodel.activations import ActivationImpl
from compiler.costmodel.context import Setup, make_setup
from compiler.costmodel.efficiency import Efficiency
from compiler.costmodel.frameworks import costed_targets, profile_of
from compiler.costmodel.memory import (candidate_stages, inflight_for_stage, memory_breakdown,
                                      stage_activation_bytes_per_microbatch, stage_memory_items)
from compiler.costmodel.step import make_estimate, step_time
from compiler.estimate import Estimate, LineItem, MemoryBreakdown, Rejection
from compiler.layout import Layout
from compiler.plan import TargetEstimate
from compiler.problem import GpuOption, Problem
from compiler.targets.cost import CostProfile
from compiler.units import format_bytes

__all__ = ["evaluate", "evaluate_targets", "evaluate_targets_unless", "TargetEstimates", "check_layout",
           "find_gpu_option", "default_target"]


def find_gpu_option(problem: Problem, name: str) -> GpuOption | None:
    key = normalize_name(name)
    for option in problem.gpu_options:
        spec = option.spec
        if key == normalize_name(spec.name) or key in {normalize_name(a) for a in spec.aliases}:
            return option
    return None


def check_layout(problem: Problem, layout: Layout, gpu: GpuOption) -> Rejection | None:
    """The layout rules (compiler.rules) the cost model needs before it can cost ``layout`` on ``gpu``."""
    facts = problem.facts
    if gpu.name not in facts.gpus:  # an explicit GpuOption outside the spec's (benchmarks)
        facts = dataclasses.replace(facts, gpus={**facts.gpus, gpu.name: rules.gpu_facts(gpu, problem.precision)})
    return rules.first_violation(facts, rules.Knobs.of(layout).with_(gpu=gpu.name), codes=rules.COSTED_CODES)


def out_of_memory_fix(setup: Setup, memory: MemoryBreakdown) -> str:
    """What would make it fit, with the saving of each option on the binding stage."""
    lay = setup.layout
    need = memory.total_bytes_per_gpu - memory.usable_bytes_per_gpu
    items = {i.name: i.value for i in memory.items}
    options = []
    if lay.recompute != "full":
        sl = setup.stages[memory.stage]
        inflight = inflight_for_stage(setup, sl.stage)
        now = items.get("activations", 0.0)
        full = stage_activation_bytes_per_microbatch(setup, sl, "full") * inflight
        options.append((now - full, "full recompute"))
    shards = lay.dp_shard * lay.cp if lay.zero_stage else lay.dp * lay.cp
    if lay.zero_stage < 3 and shards > 1:
        states = items.get("weights", 0.0) * (lay.zero_stage < 3) + items.get("gradients", 0.0) * (lay.zero_stage < 2) \
            + (items.get("master_weights", 0.0) + items.get("optimizer_states", 0.0)) * (lay.zero_stage < 1)
        options.append((states * (1 - 1 / shards), "ZeRO-3 / FSDP full shard"))
    if lay.offload_optimizer == "none":
        options.append((items.get("master_weights", 0.0) + items.get("optimizer_states", 0.0), "offload the optimizer"))
    if lay.micro_batch > 1:
        per_microbatch = sum(items.get(name, 0.0) for name in ("activations", "logits_loss", "loss_transient"))
        options.append((per_microbatch / 2, "halve the micro-batch"))
    options.sort(reverse=True)
    text = ", ".join(f"{name} (-{format_bytes(saving)})" for saving, name in options if saving > 0)
    return (f"needs {format_bytes(need)} more per GPU ({format_bytes(memory.total_bytes_per_gpu)} of "
            f"{format_bytes(memory.usable_bytes_per_gpu)} usable): "
            + (text + ", or " if text else "") + "more tensor/pipeline parallel stages")


def check_host_memory(setup: Setup, memory: MemoryBreakdown) -> Rejection | None:
    """States offloaded to the CPU must fit in the node's host memory less the headroom (when it is known)."""
    if memory.cpu_fits is not False:
        return None
    lay, usable = setup.layout, memory.usable_cpu_bytes_per_node
    assert usable is not None  # (cpu_fits is False only against a known limit)
    need = memory.cpu_bytes_per_node - usable
    fixes = ["offload to NVMe instead"]
    if lay.offload_params == "cpu":
        fixes.insert(0, "keep the parameters on the GPUs")
    return Rejection(
        rules.HOST_OUT_OF_MEMORY,
        f"{format_bytes(memory.cpu_bytes_per_node)} of offloaded states per node exceeds {format_bytes(usable)} "
        f"usable host memory ({format_bytes(setup.gpu.host_memory_bytes_per_node)} less "
        f"{setup.problem.memory_headroom:.0%} headroom) on {lay.gpus_per_node} x {setup.gpu.name}",
        {"needed_bytes": memory.cpu_bytes_per_node, "usable_bytes": usable, "target": setup.framework.name},
        f"needs {format_bytes(need)} more host memory per node: " + ", ".join(fixes)
        + ", more GPUs to shard the states over, or give cluster.host_memory if the nodes have more")


def default_target(problem: Problem) -> str:
    """The framework a problem is costed for when none is asked: its first framework target."""
    return costed_targets(problem.targets)[0]


def evaluate(problem: Problem, layout: Layout, *, gpu: GpuOption | None = None,
             target: str | CostProfile | None = None, pipeline_events: bool = True, check_memory: bool = True,
             efficiency: Efficiency | None = None, impl: ActivationImpl | None = None) -> Estimate | Rejection:
    """Memory and step time of ``layout`` for ``problem`` run by ``target``; a Rejection when it cannot run or fit.

    ``gpu``: the GpuOption to use; default: the one of ``problem.gpu_options`` named by layout.gpu.
    ``target``: the framework that runs it: a dtc target (megatron, fsdp, deepspeed: its cost profile in the
    target registry) or a CostProfile (the frameworks of published runs, compiler/calibration/frameworks.py);
    default: the problem's first framework target (megatron when it names none).
    ``pipeline_events``: include the simulated schedule in the Estimate (the solver may skip it: it is the
    costly part of a call, ~1 us per event).
    ``check_memory``: False returns the Estimate even when it does not fit (what-if reports, benchmarks).
    ``efficiency``: other constants than the shipped ones (calibration, leave-one-source-out).
    ``impl``: which tensors the training code saves for backward, instead of the target's own (its cost
    profile's activations); ``dtc smoke`` costs its reduced runs with what they really run on CPU.
    """
    if gpu is None:
        gpu = find_gpu_option(problem, layout.gpu)
        if gpu is None:
            names = ", ".join(o.name for o in problem.gpu_options)
            return Rejection(rules.GPU_NOT_OFFERED, f"gpu must be one of {names}, got {layout.gpu}",
                             {"gpu": layout.gpu, "field": "gpu"}, f"use one of {names}")
    bad = check_layout(problem, layout, gpu)
    if bad is not None:
        return bad
    setup = _setup(problem, layout, gpu, target, efficiency, impl)
    memory = memory_breakdown(setup)
    if check_memory and memory.total_bytes_per_gpu > memory.usable_bytes_per_gpu:
        return Rejection(
            "out_of_memory",
            f"{format_bytes(memory.total_bytes_per_gpu)} per GPU exceeds {format_bytes(memory.usable_bytes_per_gpu)} "
            f"usable on {gpu.name} (stage {memory.stage}, costed for {setup.framework.display_name})",
            {"needed_bytes": memory.total_bytes_per_gpu, "usable_bytes": memory.usable_bytes_per_gpu,
             "stage": memory.stage, "target": setup.framework.name, "items": {i.name: int(i.value) for i in memory.items}},
            out_of_memory_fix(setup, memory))
    if check_memory:
        host = check_host_memory(setup, memory)
        if host is not None:
            return host
    return make_estimate(setup, memory, step_time(setup), with_events=pipeline_events)


def _setup(problem: Problem, layout: Layout, gpu: GpuOption, target: str | CostProfile | None,
           efficiency: Efficiency | None, impl: ActivationImpl | None) -> Setup:
    setup = make_setup(problem, layout, gpu, target=profile_of(target or default_target(problem)), eff=efficiency)
    return setup if impl is None else dataclasses.replace(setup, impl=impl)


def memory_by_stage(problem: Problem, layout: Layout, *, target: str | CostProfile | None = None,
                    impl: ActivationImpl | None = None) -> tuple[tuple[LineItem, ...], ...]:
    """The memory line items of each distinct pipeline stage of a layout ``evaluate`` accepts (its Estimate's
    breakdown keeps the largest stage's): what each stage keeps differs (the first holds the most micro-batches,
    the last the loss), and a measurement per rank is compared with its own stage's."""
    gpu = find_gpu_option(problem, layout.gpu)
    assert gpu is not None, layout.gpu
    setup = _setup(problem, layout, gpu, target, None, impl)
    return tuple(tuple(stage_memory_items(setup, sl)) for sl in candidate_stages(setup))


@dataclass(frozen=True)
class TargetEstimates:
    """One estimate per framework target of a problem, and which one binds (slowest; any rejection binds)."""

    by_target: tuple[tuple[str, Estimate | Rejection], ...]
    binding: str

    @property
    def result(self) -> Estimate | Rejection:
        return dict(self.by_target)[self.binding]

    def summaries(self) -> tuple[TargetEstimate, ...]:
        """One plan.json record per target (all of them costed: the layout fits under each)."""
        return tuple(TargetEstimate.of(t, e, binding=t == self.binding) for t, e in self.by_target
                     if isinstance(e, Estimate))


def evaluate_targets(problem: Problem, layout: Layout, **kwargs) -> TargetEstimates:
    """``evaluate`` for each framework target of ``problem``: a plan rendered for several targets must fit
    and is as fast as the slowest of them. The binding target is the first that rejects the layout (the
    targets after it are not costed), else the one with the longest step at the spec's confidence
    (budget.confidence: the step time times its band's factor, what the objective ranks by), so that a layout
    is ranked by its worst target, not by whichever target is a hair slower on the point estimate."""
    out = evaluate_targets_unless(problem, layout, None, **kwargs)
    assert out is not None
    return out


def evaluate_targets_unless(problem: Problem, layout: Layout, hopeless: Callable[[Estimate], bool] | None,
                            **kwargs) -> TargetEstimates | None:
    """``evaluate_targets``, or None as soon as one target's estimate is ``hopeless`` while more targets are
    left: the binding estimate is at least as slow as any target's (the solver skips a layout that cannot
    enter its top list without costing the other targets)."""
    results: list[tuple[str, Estimate | Rejection]] = []
    costed: list[tuple[str, Estimate]] = []  # the same, once none is a Rejection
    targets = costed_targets(problem.targets)
    for i, t in enumerate(targets):
        r = evaluate(problem, layout, target=t, **kwargs)
        results.append((t, r))
        if isinstance(r, Rejection):
            return TargetEstimates(tuple(results), t)
        costed.append((t, r))
        if hopeless is not None and i < len(targets) - 1 and hopeless(r):
            return None
    slowest = max(costed, key=lambda tr: (tr[1].step_time_s * tr[1].time_factor(problem.confidence),
                                          tr[1].step_time_s, tr[1].memory.total_bytes_per_gpu))
    return TargetEstimates(tuple(results), slowest[0])
