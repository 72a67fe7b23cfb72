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
* ``bounds``       lower bounds on memory and step time for the solver's pruning
* ``efficiency``   compiler/data/efficiency.yaml, typed

Structural problems come back as ``Rejection`` with a stable code (see ``check_layout``);
a layout that does not fit comes back as ``Rejection("out_of_memory")`` with the
breakdown and what would make it fit.
"""
from __future__ import annotations

from compiler.catalog import normalize_name
from compiler.costmodel.bounds import memory_lower_bound_bytes, step_time_lower_bound_s
from compiler.costmodel.context import RECIPES, Setup, make_setup
from compiler.costmodel.memory import inflight_for_stage, memory_breakdown, stage_activation_bytes_per_microbatch
from compiler.costmodel.step import make_estimate, step_time
from compiler.estimate import Estimate, MemoryBreakdown, Rejection
from compiler.layout import Layout
from compiler.problem import GpuOption, Problem
from compiler.split import split_problem
from compiler.units import format_bytes

__all__ = ["evaluate", "check_layout", "find_gpu_option", "memory_lower_bound_bytes", "step_time_lower_bound_s",
           "REJECTION_CODES"]

REJECTION_CODES = {
    "unknown_gpu": "layout.gpu is not one of the spec's GPU options",
    "precision_unsupported": "the GPU has no tensor cores for the training precision (fp8 on Ampere)",
    "tp_not_divisor": "tp must divide the attention heads and the KV heads",
    "ep_not_divisor": "ep needs an MoE model and must divide the number of experts",
    "cp_not_divisor": "2 x cp must divide the sequence length (causal load balancing)",
    "pp_split_invalid": "Megatron cannot split the layers over pp x vpp chunks with the layout's split mechanism",
    "microbatches_not_divisible": "interleaved 1F1B needs the micro-batch count to be a multiple of pp",
    "out_of_memory": "the per-GPU memory exceeds usable HBM",
}


def find_gpu_option(problem: Problem, name: str) -> GpuOption | None:
    key = normalize_name(name)
    for option in problem.gpu_options:
        spec = option.spec
        if key == normalize_name(spec.name) or key in {normalize_name(a) for a in spec.aliases}:
            return option
    return None


def check_layout(problem: Problem, layout: Layout, gpu: GpuOption) -> Rejection | None:
    """Structural checks the cost model needs before it can evaluate; one reason code each."""
    s = problem.shape
    if problem.precision not in RECIPES:
        return Rejection("precision_unsupported", f"unknown precision {problem.precision}")
    try:
        gpu.spec.peak_flops_for(RECIPES[problem.precision].gemm_dtype)
    except KeyError as exc:
        return Rejection("precision_unsupported", str(exc).strip("'\""), {"gpu": gpu.name, "precision": problem.precision},
                         "train in bf16, or choose a GPU with fp8 tensor cores")
    if s.num_attention_heads % layout.tp or s.num_kv_heads % layout.tp:
        return Rejection("tp_not_divisor",
                         f"tp={layout.tp} must divide num_attention_heads ({s.num_attention_heads}) and num_kv_heads "
                         f"({s.num_kv_heads})", {"tp": layout.tp}, "choose tp among the common divisors")
    if layout.ep > 1 and (s.moe is None or s.moe.num_experts % layout.ep):
        n = s.moe.num_experts if s.moe else 0
        return Rejection("ep_not_divisor", f"ep={layout.ep} needs an MoE model whose {n} experts it divides",
                         {"ep": layout.ep, "num_experts": n}, "use ep=1 or a divisor of the expert count")
    if layout.cp > 1 and problem.seq_len % (2 * layout.cp):
        return Rejection("cp_not_divisor", f"2 x cp = {2 * layout.cp} must divide the sequence length {problem.seq_len}",
                         {"cp": layout.cp}, "choose cp so that 2 x cp divides the sequence length")
    why = split_problem(s.num_layers, layout.pp, layout.vpp, layout.split)
    if why is not None:
        return Rejection("pp_split_invalid", f"{s.num_layers} layers have no pipeline split over pp={layout.pp} x "
                         f"vpp={layout.vpp}: {why}", {"pp": layout.pp, "vpp": layout.vpp, "num_layers": s.num_layers},
                         "lower pp or vpp, or choose another split")
    if layout.schedule == "interleaved_1f1b" and layout.grad_accum % layout.pp:
        return Rejection("microbatches_not_divisible",
                         f"interleaved 1F1B runs micro-batches in groups of pp={layout.pp}; got {layout.grad_accum}",
                         {"grad_accum": layout.grad_accum, "pp": layout.pp},
                         "make grad_accum a multiple of pp (Megatron-LM requirement)")
    return None


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
            + (text + ", " if text else "") + "or more tensor/pipeline parallel stages")


def evaluate(problem: Problem, layout: Layout, *, gpu: GpuOption | None = None, pipeline_events: bool = True,
             check_memory: bool = True) -> Estimate | Rejection:
    """Memory and step time of ``layout`` for ``problem``; a Rejection when it cannot run or fit.

    ``gpu``: the GpuOption to use; default: the one of ``problem.gpu_options`` named by layout.gpu.
    ``pipeline_events``: include the simulated schedule in the Estimate (the solver may skip it: it is the
    costly part of a call, ~1 us per event).
    ``check_memory``: False returns the Estimate even when it does not fit (what-if reports, benchmarks).
    """
    if gpu is None:
        gpu = find_gpu_option(problem, layout.gpu)
        if gpu is None:
            names = ", ".join(o.name for o in problem.gpu_options)
            return Rejection("unknown_gpu", f"layout.gpu {layout.gpu!r} is not among the spec's GPUs ({names})",
                             {"gpu": layout.gpu}, f"use one of {names}")
    bad = check_layout(problem, layout, gpu)
    if bad is not None:
        return bad
    setup = make_setup(problem, layout, gpu)
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
