"""The cost model: per-GPU memory and step time of a layout, as named line items.

    evaluate(problem, layout, *, gpu=None) -> Estimate | Rejection

Modules (each small, each quantity a named function with its unit in the name):

* ``activations``  saved-tensor terms per layer (Korthikanti et al. 2022, generalised)
* ``memory``       model states under ZeRO/FSDP, activations in flight, buffers, allowances
* ``compute``      the FLOP convention and compute time at size-dependent efficiency
* ``comm``         collectives, groups and the links they cross
* ``pipeline``     schedule simulation (GPipe, 1F1B, interleaved 1F1B), bubble, in-flight
* ``stages``       which layers and parameters each pipeline stage holds
* ``step``         composition into the time breakdown and the Estimate
* ``context``      the per-(problem, layout, GPU) inputs, precision recipes, memoised per-layer costs
* ``parts``        the public door for the solver's lower bounds (compiler/solver/bounds.py)
* ``efficiency``   compiler/data/efficiency.yaml, typed

Structural problems come back as ``Rejection`` with a stable code (compiler.rules, via ``check_layout``);
a layout that does not fit comes back as ``Rejection("out_of_memory")`` with the
breakdown and what would make it fit.
"""
from __future__ import annotations

import dataclasses

from compiler import rules
from compiler.catalog import normalize_name
from compiler.costmodel.activations import ActivationImpl
from compiler.costmodel.context import Setup, make_setup
from compiler.costmodel.memory import inflight_for_stage, memory_breakdown, stage_activation_bytes_per_microbatch
from compiler.costmodel.step import make_estimate, step_time
from compiler.estimate import Estimate, MemoryBreakdown, Rejection
from compiler.layout import Layout
from compiler.problem import GpuOption, Problem
from compiler.units import format_bytes

__all__ = ["evaluate", "check_layout", "find_gpu_option"]


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
        options.append((items.get("activations", 0.0) / 2 + items.get("logits_loss", 0.0) / 2, "halve the micro-batch"))
    options.sort(reverse=True)
    text = ", ".join(f"{name} (-{format_bytes(saving)})" for saving, name in options if saving > 0)
    return (f"needs {format_bytes(need)} more per GPU ({format_bytes(memory.total_bytes_per_gpu)} of "
            f"{format_bytes(memory.usable_bytes_per_gpu)} usable): "
            + (text + ", or " if text else "") + "more tensor/pipeline parallel stages")


def evaluate(problem: Problem, layout: Layout, *, gpu: GpuOption | None = None, pipeline_events: bool = True,
             check_memory: bool = True, impl: "ActivationImpl | None" = None) -> Estimate | Rejection:
    """Memory and step time of ``layout`` for ``problem``; a Rejection when it cannot run or fit.

    ``gpu``: the GpuOption to use; default: the one of ``problem.gpu_options`` named by layout.gpu.
    ``pipeline_events``: include the simulated schedule in the Estimate (the solver may skip it: it is the
    costly part of a call, ~1 us per event).
    ``check_memory``: False returns the Estimate even when it does not fit (what-if reports, benchmarks).
    ``impl``: which tensors the training code saves for backward (default: Megatron-Core + Transformer Engine);
    ``dtc smoke`` costs its reduced runs with the implementation they really run (plain PyTorch modules).
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
    setup = make_setup(problem, layout, gpu) if impl is None else make_setup(problem, layout, gpu, impl=impl)
    memory = memory_breakdown(setup)
    if check_memory and memory.total_bytes_per_gpu > memory.usable_bytes_per_gpu:
        return Rejection(
            "out_of_memory",
            f"{format_bytes(memory.total_bytes_per_gpu)} per GPU exceeds {format_bytes(memory.usable_bytes_per_gpu)} "
            f"usable on {gpu.name} (stage {memory.stage})",
            {"needed_bytes": memory.total_bytes_per_gpu, "usable_bytes": memory.usable_bytes_per_gpu,
             "stage": memory.stage, "items": {i.name: int(i.value) for i in memory.items}},
            out_of_memory_fix(setup, memory))
    return make_estimate(setup, memory, step_time(setup), with_events=pipeline_events)
