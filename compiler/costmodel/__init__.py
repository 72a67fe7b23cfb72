"""The cost model: per-GPU memory and step time of a layout, as named line items.

    evaluate(problem, layout, *, gpu=None, target=None) -> Estimate | Rejection
    evaluate_targets(problem, layout) -> TargetEstimates (one Estimate per framework target, the binding one)

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
* ``frameworks``   what each target framework saves, launches and overlaps (ONE table)
* ``efficiency``   compiler/data/physics.yaml (sourced) + compiler/data/efficiency.yaml (fitted), typed

Structural problems come back as ``Rejection`` with a stable code (see ``check_layout``);
a layout that does not fit comes back as ``Rejection("out_of_memory")`` with the
breakdown and what would make it fit.
"""
from __future__ import annotations

from dataclasses import dataclass

from compiler.catalog import normalize_name
from compiler.costmodel.bounds import memory_lower_bound_bytes, step_time_lower_bound_s
from compiler.costmodel.context import RECIPES, Setup, make_setup
from compiler.costmodel.efficiency import Efficiency
from compiler.costmodel.frameworks import FRAMEWORKS, FrameworkProfile, costed_targets
from compiler.costmodel.memory import inflight_for_stage, memory_breakdown, stage_activation_bytes_per_microbatch
from compiler.costmodel.step import make_estimate, step_time
from compiler.estimate import Estimate, MemoryBreakdown, Rejection
from compiler.layout import Layout
from compiler.problem import GpuOption, Problem
from compiler.units import format_bytes

__all__ = ["evaluate", "evaluate_targets", "TargetEstimates", "check_layout", "find_gpu_option",
           "memory_lower_bound_bytes", "step_time_lower_bound_s", "REJECTION_CODES", "default_target"]

REJECTION_CODES = {
    "unknown_gpu": "layout.gpu is not one of the spec's GPU options",
    "precision_unsupported": "the GPU has no tensor cores for the training precision (fp8 on Ampere)",
    "tp_not_divisor": "tp must divide the attention heads and the KV heads",
    "ep_not_divisor": "ep needs an MoE model and must divide the number of experts",
    "cp_not_divisor": "2 x cp must divide the sequence length (causal load balancing)",
    "too_many_stages": "pp x vpp must not exceed the number of layers (+2 with uneven stages: embedding, loss)",
    "layers_not_divisible": "pp x vpp must divide the number of layers (unless uneven stages are allowed)",
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


def check_layout(problem: Problem, layout: Layout, gpu: GpuOption, *, allow_uneven_stages: bool = False
                 ) -> Rejection | None:
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
    chunks = layout.pp * layout.vpp
    if chunks > s.num_layers + (2 if allow_uneven_stages else 0):
        return Rejection("too_many_stages", f"pp x vpp = {chunks} exceeds num_layers ({s.num_layers})",
                         {"pp": layout.pp, "vpp": layout.vpp}, "lower pp or vpp")
    if s.num_layers % chunks and not allow_uneven_stages:
        return Rejection("layers_not_divisible", f"pp x vpp = {chunks} does not divide num_layers ({s.num_layers})",
                         {"pp": layout.pp, "vpp": layout.vpp, "num_layers": s.num_layers},
                         "choose pp x vpp dividing the layer count")
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


def default_target(problem: Problem) -> str:
    """The framework a problem is costed for when none is asked: its first framework target."""
    return costed_targets(problem.targets)[0]


def evaluate(problem: Problem, layout: Layout, *, gpu: GpuOption | None = None,
             target: str | FrameworkProfile | None = None,
             allow_uneven_stages: bool = False, pipeline_events: bool = True, check_memory: bool = True,
             efficiency: Efficiency | None = None) -> Estimate | Rejection:
    """Memory and step time of ``layout`` for ``problem`` run by ``target``; a Rejection when it cannot run or fit.

    ``gpu``: the GpuOption to use; default: the one of ``problem.gpu_options`` named by layout.gpu.
    ``target``: the framework that runs it (a key of compiler.costmodel.frameworks.FRAMEWORKS: megatron,
    fsdp, deepspeed, ...); default: the problem's first framework target (megatron when it names none).
    ``allow_uneven_stages``: model pp x vpp that do not divide the layers (first/last stages get fewer).
    ``pipeline_events``: include the simulated schedule in the Estimate (the solver may skip it: it is the
    costly part of a call, ~1 us per event).
    ``check_memory``: False returns the Estimate even when it does not fit (what-if reports, benchmarks).
    ``efficiency``: other constants than the shipped ones (calibration, leave-one-source-out).
    """
    if gpu is None:
        gpu = find_gpu_option(problem, layout.gpu)
        if gpu is None:
            names = ", ".join(o.name for o in problem.gpu_options)
            return Rejection("unknown_gpu", f"layout.gpu {layout.gpu!r} is not among the spec's GPUs ({names})",
                             {"gpu": layout.gpu}, f"use one of {names}")
    target = target or default_target(problem)
    if isinstance(target, str) and target not in FRAMEWORKS:
        raise ValueError(f"no framework profile {target!r}; known: {', '.join(FRAMEWORKS)}")
    bad = check_layout(problem, layout, gpu, allow_uneven_stages=allow_uneven_stages)
    if bad is not None:
        return bad
    setup = make_setup(problem, layout, gpu, target=target, eff=efficiency)
    memory = memory_breakdown(setup)
    if check_memory and memory.total_bytes_per_gpu > memory.usable_bytes_per_gpu:
        return Rejection(
            "out_of_memory",
            f"{format_bytes(memory.total_bytes_per_gpu)} per GPU exceeds {format_bytes(memory.usable_bytes_per_gpu)} "
            f"usable on {gpu.name} (stage {memory.stage}, costed for {setup.framework.display_name})",
            {"needed_bytes": memory.total_bytes_per_gpu, "usable_bytes": memory.usable_bytes_per_gpu,
             "stage": memory.stage, "target": setup.framework.name, "items": {i.name: int(i.value) for i in memory.items}},
            out_of_memory_fix(setup, memory))
    return make_estimate(setup, memory, step_time(setup), with_events=pipeline_events)


@dataclass(frozen=True)
class TargetEstimates:
    """One estimate per framework target of a problem, and which one binds (slowest; any rejection binds)."""

    by_target: tuple[tuple[str, Estimate | Rejection], ...]
    binding: str

    @property
    def result(self) -> Estimate | Rejection:
        return dict(self.by_target)[self.binding]


def evaluate_targets(problem: Problem, layout: Layout, **kwargs) -> TargetEstimates:
    """``evaluate`` for each framework target of ``problem``: a plan rendered for several targets must fit
    and is as fast as the slowest of them. The binding target is the first that rejects the layout, else
    the one with the longest step."""
    results = tuple((t, evaluate(problem, layout, target=t, **kwargs)) for t in costed_targets(problem.targets))
    rejected = [t for t, r in results if isinstance(r, Rejection)]
    if rejected:
        return TargetEstimates(results, rejected[0])
    slowest = max(results, key=lambda tr: (tr[1].step_time_s, tr[1].memory.total_bytes_per_gpu))  # type: ignore
    return TargetEstimates(results, slowest[0])
