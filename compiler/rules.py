"""What a legal layout is: every layout rule once, each with one stable reason code.

A rule reads the problem's ``Facts`` (model shape, sequence length, precision, targets, the
GPU options and the batch) and a layout's ``Knobs``, any of which may still be unknown (None):
a rule whose knobs are unknown says nothing, so the same rules judge a spec's partial pins
(``compiler.problem``: each violation is reported at the pinned field's line), the solver's
per-axis generators and its candidates (``compiler.solver``), the cost model
(``compiler.costmodel.evaluation.check_layout``), ``dtc estimate``, the renderers and ``dtc smoke``
(``check_plan``). So validate, plan, estimate, compile and smoke give the same verdict on a
layout, with the same code and message.

    violations(facts, knobs) -> [Rejection, ...]     every rule that fails, in RULES order
    first_violation(facts, knobs) -> Rejection | None
    check_layout(facts, layout) -> Rejection | None   a complete layout
    check_plan(plan) -> Rejection | None              a plan read back from plan.json

A Rejection's ``details["field"]`` names the knob the violation is reported at. The target
frameworks' own support rules (``framework_unsupported``) are rules of the same kind, kept
with their targets (compiler.targets) and evaluated here for every target of the problem.
Codes that are not layout rules -- the search's own (pin_mismatch, not_canonical), the cost
model's (out_of_memory) and the objective's (over_budget, over_deadline) -- are listed in
``CODES`` too, so that every code dtc reports is described in one place.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from compiler.arith import GpuCounts, batch_range, divisors
from compiler.model import ModelShape
from compiler.split import PipelineSplit, split_problem

if TYPE_CHECKING:
    from compiler.estimate import Rejection
    from compiler.layout import Layout
    from compiler.plan import Plan
    from compiler.problem import Problem

# ------------------------------------------------------------------------------ reason codes
GPU_NOT_OFFERED = "gpu_not_offered"
PRECISION_UNSUPPORTED = "precision_unsupported"
GPU_COUNT_NOT_ALLOWED = "gpu_count_not_allowed"
TP_NOT_DIVISOR = "tp_not_divisor"
TP_CROSS_NODE = "tp_cross_node"
PP_SPLIT_INVALID = "pp_split_invalid"
SCHEDULE_INVALID = "schedule_invalid"
MICROBATCHES_NOT_DIVISIBLE = "microbatches_not_divisible"
CP_NOT_DIVISOR = "cp_not_divisor"
CP_UNSUPPORTED = "cp_unsupported"
EP_INVALID = "ep_invalid"
SP_INVALID = "sp_invalid"
DP_SHARD_INVALID = "dp_shard_invalid"
OFFLOAD_INVALID = "offload_invalid"
BATCH_NOT_DIVISIBLE = "batch_not_divisible"
FRAMEWORK_UNSUPPORTED = "framework_unsupported"
PIN_MISMATCH = "pin_mismatch"
NOT_CANONICAL = "not_canonical"
OUT_OF_MEMORY = "out_of_memory"
HOST_OUT_OF_MEMORY = "host_out_of_memory"
OVER_BUDGET = "over_budget"
OVER_DEADLINE = "over_deadline"

CODES: Mapping[str, str] = {
    GPU_NOT_OFFERED: "the layout's GPU type (and GPUs per node) is not one of the spec's GPU options",
    PRECISION_UNSUPPORTED: "the GPU has no tensor cores for the training precision (fp8 before Hopper/Ada, nvfp4 "
                           "before Blackwell)",
    GPU_COUNT_NOT_ALLOWED: "tp x pp x cp x dp is not a GPU count the spec allows (whole nodes in range, or num_gpus)",
    TP_NOT_DIVISOR: "tp must divide the attention heads and the KV heads",
    TP_CROSS_NODE: "tp must not exceed the GPUs per node (unless search.allow_cross_node_tp)",
    PP_SPLIT_INVALID: "Megatron cannot split the layers over pp x vpp chunks with the layout's split mechanism",
    SCHEDULE_INVALID: "virtual stages need pp > 1 and the interleaved 1F1B schedule, which needs them",
    MICROBATCHES_NOT_DIVISIBLE: "interleaved 1F1B needs the micro-batch count to be a multiple of pp",
    CP_NOT_DIVISOR: "2 x cp must divide the sequence length (causal load balancing)",
    CP_UNSUPPORTED: "context parallelism cannot run the model's attention (learnable softmax sinks)",
    EP_INVALID: "ep needs an MoE model and must divide the experts; ep x etp must divide tp x dp x cp (the expert "
                "layers re-fold a stage's ranks; with etp = tp: ep divides dp x cp); etp must divide the expert width",
    SP_INVALID: "sequence parallel needs tp > 1 and tp x cp dividing the sequence length",
    DP_SHARD_INVALID: "dp_shard must divide dp, and ZeRO stage 0 does not shard",
    OFFLOAD_INVALID: "optimizer offload needs ZeRO >= 1 (NVMe: ZeRO-3); parameter offload needs ZeRO-3",
    BATCH_NOT_DIVISIBLE: "micro_batch x grad_accum x dp must be the global batch (within its tolerance)",
    FRAMEWORK_UNSUPPORTED: "a target framework cannot run the layout (its own support rules)",
    PIN_MISMATCH: "the search: the layout differs from a pin of the spec",
    NOT_CANONICAL: "the search: the layout only renames another layout of the space",
    OUT_OF_MEMORY: "the cost model: the per-GPU memory exceeds usable HBM",
    HOST_OUT_OF_MEMORY: "the cost model: the states offloaded to the CPU exceed a node's usable host memory",
    OVER_BUDGET: "the objective: the run costs more than budget.max_cost",
    OVER_DEADLINE: "the objective: the run takes longer than budget.deadline",
}

# the spec's name of each knob (where a violated pin is reported)
SPEC_KEYS: Mapping[str, str] = {
    "tp": "tensor_parallel", "pp": "pipeline_parallel", "vpp": "virtual_pipeline_stages",
    "schedule": "pipeline_schedule", "cp": "context_parallel", "ep": "expert_parallel",
    "etp": "expert_tensor_parallel", "dp": "data_parallel",
    "dp_shard": "data_parallel_shard", "zero_stage": "zero_stage", "micro_batch": "micro_batch_size",
    "recompute": "recompute", "sequence_parallel": "sequence_parallel", "offload_optimizer": "offload_optimizer",
    "offload_params": "offload_params", "split": "pipeline_split",
}


# ------------------------------------------------------------------------------ facts and knobs
@dataclass(frozen=True)
class GpuFacts:
    """What the rules know about one GPU option."""

    gpus_per_node: int
    counts: GpuCounts | None = None  # the GPU counts the spec allows (None: not judged, e.g. a plan)
    precision_problem: str | None = None  # why the GPU cannot train in the problem's precision


@dataclass(frozen=True)
class Facts:
    """Everything a rule may read besides the layout."""

    shape: ModelShape
    seq_len: int
    precision: str
    targets: tuple[str, ...]
    gpus: Mapping[str, GpuFacts]
    allow_cross_node_tp: bool = False
    batch: tuple[int, int] | None = None  # the global batch range in sequences (None: not judged)

    @classmethod
    def of(cls, problem: "Problem") -> "Facts":
        gpus = {}
        for option in problem.gpu_options:
            counts = GpuCounts(problem.min_gpus, problem.max_gpus, option.gpus_per_node, problem.num_gpus)
            if problem.objective == "throughput" and problem.num_gpus is None and counts.largest is not None:
                counts = GpuCounts(counts.largest, counts.largest, option.gpus_per_node, counts.largest)
            gpus[option.name] = gpu_facts(option, problem.precision, counts)
        return cls(shape=problem.shape, seq_len=problem.seq_len, precision=problem.precision,
                   targets=tuple(problem.targets), gpus=gpus, allow_cross_node_tp=problem.allow_cross_node_tp,
                   batch=batch_range(problem.global_batch, problem.global_batch_tolerance))

    @classmethod
    def of_plan(cls, plan: "Plan") -> "Facts":
        """A plan's facts: its own model, sequence, precision, targets, GPU and realised batch (the spec's GPU
        range and search.allow_cross_node_tp are not in the plan: not judged)."""
        shape = plan.model.shape
        gpu = GpuFacts(int(plan.cluster.gpus_per_node))
        batch = int(plan.training.global_batch)
        return cls(shape=shape, seq_len=int(plan.training.seq_len), precision=str(plan.training.precision),
                   targets=tuple(plan.targets), gpus={str(plan.cluster.gpu): gpu},
                   allow_cross_node_tp=True, batch=(batch, batch))


def gpu_facts(option: Any, precision: str, counts: GpuCounts | None = None) -> GpuFacts:
    """The rules' view of a GpuOption (compiler.problem) training in ``precision``."""
    return GpuFacts(option.gpus_per_node, counts, _precision_problem(option.spec, precision))


def _precision_problem(spec: Any, precision: str) -> str | None:
    try:
        spec.peak_flops_for(precision)
    except KeyError as exc:
        return str(exc).strip("'\"")
    return None


@dataclass(frozen=True)
class Knobs:
    """A layout's knobs, any of them unknown (None): a spec's pins, a solver's partial choice, a Layout."""

    gpu: str | None = None
    gpus_per_node: int | None = None
    tp: int | None = None
    pp: int | None = None
    vpp: int | None = None
    schedule: str | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None  # the expert tensor-parallel degree (a Layout's expert_tp); None: not chosen yet
    dp: int | None = None
    dp_shard: int | None = None
    zero_stage: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    recompute: str | None = None
    sequence_parallel: bool | None = None
    offload_optimizer: str | None = None
    offload_params: str | None = None
    split: PipelineSplit | None = None

    @classmethod
    def of(cls, layout: "Layout") -> "Knobs":
        return cls(gpu=layout.gpu, gpus_per_node=layout.gpus_per_node, tp=layout.tp, pp=layout.pp, vpp=layout.vpp,
                   schedule=layout.schedule, cp=layout.cp, ep=layout.ep, etp=layout.expert_tp, dp=layout.dp,
                   dp_shard=layout.dp_shard, zero_stage=layout.zero_stage, micro_batch=layout.micro_batch,
                   grad_accum=layout.grad_accum,
                   recompute=layout.recompute, sequence_parallel=layout.sequence_parallel,
                   offload_optimizer=layout.offload_optimizer, offload_params=layout.offload_params,
                   split=layout.split)

    def with_(self, **changes: Any) -> "Knobs":
        return dataclasses.replace(self, **changes)

    @classmethod
    def partial(cls, **knobs: Any) -> "Knobs":
        """``Knobs(**knobs)`` without the frozen dataclass's per-field __init__ (about 3 us; the solver's
        generators ask millions of partial questions). Unknown names raise TypeError as the constructor does."""
        if not _KNOB_NAMES.issuperset(knobs):
            raise TypeError(f"unknown knobs: {sorted(knobs.keys() - _KNOB_NAMES)}")
        out = object.__new__(cls)
        out.__dict__.update(_KNOB_DEFAULTS)
        out.__dict__.update(knobs)
        return out


_KNOB_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Knobs)}
_KNOB_NAMES = frozenset(_KNOB_DEFAULTS)


# ------------------------------------------------------------------------------ the rules
Check = Callable[[Facts, Knobs], "Rejection | None"]


@dataclass(frozen=True)
class Rule:
    code: str
    knobs: tuple[str, ...]  # what it reads; a violation's details["field"] is one of them
    check: Check = field(repr=False)


def describe(rejections: Iterable["Rejection"]) -> str:
    """'[code] message; [code] message' (a renderer's refusal)."""
    return "; ".join(f"[{r.code}] {r.message}" for r in rejections)


def reject(code: str, field_name: str, message: str, fix: str = "", **details: Any) -> "Rejection":
    from compiler.estimate import Rejection

    return Rejection(code, message, {"field": field_name, **details}, fix)


def some(values: Iterable[int], limit: int = 12) -> str:
    """'1, 2, 4, 8' -- or the first ``limit`` and a count of the rest, for hints."""
    values = list(values)
    shown = ", ".join(map(str, values[:limit]))
    return shown if len(values) <= limit else f"{shown}, ... ({len(values)} in all)"


def _gpu(f: Facts, k: Knobs) -> "Rejection | None":
    if k.gpu is None:
        return None
    got = f.gpus.get(k.gpu)
    if got is not None and k.gpus_per_node in (None, got.gpus_per_node):
        return None
    offered = ", ".join(f"{name} ({g.gpus_per_node}/node)" for name, g in f.gpus.items())
    per_node = f" ({k.gpus_per_node}/node)" if k.gpus_per_node is not None else ""
    return reject(GPU_NOT_OFFERED, "gpu", f"gpu must be one of {offered}, got {k.gpu}{per_node}",
                  f"use one of {', '.join(f.gpus)}", gpu=k.gpu)


def _precision(f: Facts, k: Knobs) -> "Rejection | None":
    g = f.gpus.get(k.gpu) if k.gpu is not None else None
    if g is None or g.precision_problem is None:
        return None
    hint = f"train in bf16, or choose a GPU with {f.precision} tensor cores"
    if f.precision == "nvfp4":
        from compiler.catalog import load_catalog

        fp4 = [name for name, spec in load_catalog().gpus.items() if "fp4" in spec.peak_flops]
        hint = f"train in bf16 or fp8, or choose a GPU with fp4 tensor cores ({', '.join(fp4)})"
    return reject(PRECISION_UNSUPPORTED, "gpu", g.precision_problem, hint, gpu=k.gpu, precision=f.precision)


def _gpu_count(f: Facts, k: Knobs) -> "Rejection | None":
    g = f.gpus.get(k.gpu) if k.gpu is not None else None
    if g is None or g.counts is None or k.tp is None or k.pp is None or k.cp is None or k.dp is None:
        return None
    n = k.tp * k.pp * k.cp * k.dp
    if n in g.counts:
        return None
    return reject(GPU_COUNT_NOT_ALLOWED, "dp", f"tp x pp x cp x dp must be an allowed GPU count "
                  f"({g.counts.describe()}), got {k.tp} x {k.pp} x {k.cp} x {k.dp} = {n}",
                  "change one degree so the product is whole nodes within the GPU range (or leave dp out so it is "
                  "derived)", world_size=n, allowed=g.counts.describe())


def _tp(f: Facts, k: Knobs) -> "Rejection | None":
    if k.tp is None:
        return None
    s = f.shape
    counts = [("num_attention_heads", s.num_attention_heads)]
    if s.mla is None:
        counts.append(("num_kv_heads", s.num_kv_heads))
    for what, n in counts:
        if n % k.tp:
            ok = divisors(math.gcd(*(c for _, c in counts)))
            return reject(TP_NOT_DIVISOR, "tp", f"tensor_parallel must divide {what} ({n}), got tp={k.tp}",
                          f"use one of {some(ok)}", tp=k.tp, **{what: n})
    return None


def _tp_node(f: Facts, k: Knobs) -> "Rejection | None":
    if k.tp is None or f.allow_cross_node_tp:
        return None
    gpn = k.gpus_per_node if k.gpus_per_node is not None else max((g.gpus_per_node for g in f.gpus.values()),
                                                                  default=None)
    if gpn is None or k.tp <= gpn:
        return None
    return reject(TP_CROSS_NODE, "tp", f"tensor_parallel must not exceed gpus_per_node ({gpn}), got tp={k.tp}",
                  "tensor parallel groups stay inside a node; set search.allow_cross_node_tp: true to allow it",
                  tp=k.tp)


def _split(f: Facts, k: Knobs) -> "Rejection | None":
    if k.pp is None or (k.pp == 1 and (k.vpp or 1) > 1):  # virtual stages without a pipeline: _schedule's
        return None
    vpp = k.vpp or 1
    n = f.shape.num_layers
    why = split_problem(n, k.pp, vpp, k.split)
    if why is None:
        return None
    fix = "lower pipeline_parallel or virtual_pipeline_stages" + (", or choose another split" if k.split else "")
    return reject(PP_SPLIT_INVALID, "pp" if k.split is None else "split",
                  f"pipeline_parallel x virtual_pipeline_stages have no Megatron split of the {n} layers, got "
                  f"pp={k.pp} x vpp={vpp}: {why}", fix, pp=k.pp, vpp=vpp, num_layers=n)


def _schedule(f: Facts, k: Knobs) -> "Rejection | None":
    if k.vpp is not None and k.vpp > 1:
        if k.pp == 1:
            return reject(SCHEDULE_INVALID, "vpp", f"virtual_pipeline_stages needs pipeline_parallel > 1, got pp=1 x "
                          f"vpp={k.vpp}", "remove virtual_pipeline_stages or raise pipeline_parallel")
        if k.schedule is not None and k.schedule != "interleaved_1f1b":
            return reject(SCHEDULE_INVALID, "schedule", f"virtual stages run only with the interleaved_1f1b schedule, "
                          f"got vpp={k.vpp} with {k.schedule}", "set pipeline_schedule: interleaved_1f1b")
    if k.schedule == "interleaved_1f1b":
        if k.pp == 1:
            return reject(SCHEDULE_INVALID, "schedule", "the interleaved_1f1b schedule needs pipeline_parallel > 1, got "
                          "pp=1", "use 1f1b, or raise pipeline_parallel")
        if k.vpp == 1:
            return reject(SCHEDULE_INVALID, "schedule", "the interleaved_1f1b schedule needs virtual_pipeline_stages > 1, "
                          "got vpp=1", "set virtual_pipeline_stages: 2 (or more), or use 1f1b")
    return None


def _microbatches(f: Facts, k: Knobs) -> "Rejection | None":
    if k.schedule != "interleaved_1f1b" or k.grad_accum is None or k.pp is None or k.grad_accum % k.pp == 0:
        return None
    return reject(MICROBATCHES_NOT_DIVISIBLE, "schedule", f"interleaved 1F1B runs micro-batches in groups of pp={k.pp} "
                  f"(Megatron-LM), got grad_accum {k.grad_accum}", "make grad_accum a multiple of pp, or use the 1f1b "
                  "schedule", grad_accum=k.grad_accum, pp=k.pp)


def _cp(f: Facts, k: Knobs) -> "Rejection | None":
    if k.cp is None or k.cp == 1 or f.seq_len % (2 * k.cp) == 0:
        return None
    return reject(CP_NOT_DIVISOR, "cp", f"2 x context_parallel must divide sequence_length ({f.seq_len}), got "
                  f"cp={k.cp}", "causal load balancing splits each sequence into 2 x cp chunks; choose cp so that "
                  "2 x cp divides the sequence length", cp=k.cp, seq_len=f.seq_len)


def _cp_attention(f: Facts, k: Knobs) -> "Rejection | None":
    if k.cp is None or k.cp == 1 or not f.shape.attention_sinks:
        return None
    # Transformer Engine's p2p context parallelism (Megatron's default --cp-comm-type) rejects softmax_type
    # learnable, and its helpers dropped the offset (NVIDIA/TransformerEngine issue 2541, fix open in pull 3551)
    return reject(CP_UNSUPPORTED, "cp", f"context_parallel cannot run attention with learnable sinks, got cp={k.cp}",
                  "use context_parallel: 1: Transformer Engine's ring (p2p) context parallelism does not run "
                  "learnable softmax sinks (TransformerEngine issue 2541)", cp=k.cp)


def _ep(f: Facts, k: Knobs) -> "Rejection | None":
    moe = f.shape.moe
    if k.etp is not None and k.tp is not None and k.etp != k.tp:
        if moe is None:
            return reject(EP_INVALID, "etp", f"expert_tensor_parallel needs an MoE model, got etp={k.etp}",
                          "remove expert_tensor_parallel, or add model.moe", etp=k.etp)
        if moe.expert_ffn_hidden_size % k.etp:
            return reject(EP_INVALID, "etp", f"expert_tensor_parallel must divide the expert ffn_hidden_size "
                          f"({moe.expert_ffn_hidden_size}), got etp={k.etp}",
                          f"use one of {some(divisors(moe.expert_ffn_hidden_size))}", etp=k.etp)
    if k.ep is None or k.ep == 1:
        return _expert_grid(k, 1)
    if moe is None:
        return reject(EP_INVALID, "ep", f"expert_parallel needs an MoE model, got ep={k.ep}",
                      "remove expert_parallel, or add model.moe", ep=k.ep)
    if moe.num_experts % k.ep:
        return reject(EP_INVALID, "ep", f"expert_parallel must divide num_experts ({moe.num_experts}), got ep={k.ep}",
                      f"use one of {some(divisors(moe.num_experts))}", ep=k.ep, num_experts=moe.num_experts)
    return _expert_grid(k, k.ep)


def _expert_grid(k: Knobs, ep: int) -> "Rejection | None":
    """Megatron-Core folds a stage's tp x cp x dp ranks into etp x ep x expert-dp for the expert layers
    (core/parallel_state.py: world_size % (etp x ep x pp) == 0); with etp = tp that is ep dividing dp x cp. While
    etp is not chosen, only what no etp could fold is a violation."""
    if k.dp is None or k.cp is None:
        return None
    if k.tp is not None and k.etp is not None and k.etp != k.tp:
        ranks = k.tp * k.dp * k.cp
        if ranks % (ep * k.etp) == 0:
            return None
        return reject(EP_INVALID, "ep" if ep > 1 else "etp", f"expert_parallel x expert_tensor_parallel must divide "
                      f"tensor_parallel x data_parallel x context_parallel ({ranks}), got {ep} x {k.etp} = "
                      f"{ep * k.etp}", "the expert layers re-fold a pipeline stage's tp x dp x cp ranks as etp x ep x "
                      "expert data parallel", ep=ep, etp=k.etp)
    if (k.dp * k.cp) % ep == 0:
        return None
    if k.etp is None and (k.tp is None or (k.tp * k.dp * k.cp) % ep == 0):  # an expert tp below tp folds it
        return None
    return reject(EP_INVALID, "ep", f"expert_parallel must divide data_parallel x context_parallel "
                  f"({k.dp * k.cp}), got ep={ep}", "expert parallelism is carved out of dp x cp", ep=ep)


def _sp(f: Facts, k: Knobs) -> "Rejection | None":
    if not k.sequence_parallel or k.tp is None:
        return None
    if k.tp == 1:
        return reject(SP_INVALID, "sequence_parallel", "sequence_parallel needs tensor_parallel > 1, got tp=1",
                      "remove sequence_parallel or raise tensor_parallel")
    cp = k.cp or 1
    if f.seq_len % (k.tp * cp):
        return reject(SP_INVALID, "sequence_parallel", f"sequence_parallel needs tensor_parallel x context_parallel "
                      f"to divide sequence_length ({f.seq_len}), got tp x cp = {k.tp * cp}",
                      "choose tp and cp dividing the sequence length, or turn sequence parallel off")
    return None


def _dp_shard(f: Facts, k: Knobs) -> "Rejection | None":
    if k.dp_shard is None:
        return None
    if k.zero_stage == 0 and k.dp_shard > 1:
        return reject(DP_SHARD_INVALID, "dp_shard", f"zero_stage 0 does not shard, got dp_shard={k.dp_shard}",
                      "remove data_parallel_shard or raise zero_stage")
    if k.dp is not None and k.dp % k.dp_shard:
        return reject(DP_SHARD_INVALID, "dp_shard", f"data_parallel_shard must divide data_parallel ({k.dp}), got "
                      f"dp_shard={k.dp_shard}", "the replicate degree is data_parallel / data_parallel_shard")
    return None


def _offload(f: Facts, k: Knobs) -> "Rejection | None":
    if k.zero_stage is None:
        return None
    if k.offload_params not in (None, "none") and k.zero_stage != 3:
        return reject(OFFLOAD_INVALID, "offload_params", f"offload_params needs zero_stage 3, got zero_stage "
                      f"{k.zero_stage}", "set zero_stage: 3")
    if k.offload_optimizer not in (None, "none") and k.zero_stage == 0:
        return reject(OFFLOAD_INVALID, "offload_optimizer", "offload_optimizer needs zero_stage >= 1, got zero_stage 0",
                      "raise zero_stage")
    if k.offload_optimizer == "nvme" and k.zero_stage != 3:
        return reject(OFFLOAD_INVALID, "offload_optimizer", f"offload_optimizer nvme needs zero_stage 3, got zero_stage "
                      f"{k.zero_stage}", "set zero_stage: 3, or offload to cpu")
    return None


def _batch(f: Facts, k: Knobs) -> "Rejection | None":
    if f.batch is None or k.micro_batch is None or k.dp is None:
        return None
    lo, hi = f.batch
    per_step = k.micro_batch * k.dp
    if k.grad_accum is not None:
        b = per_step * k.grad_accum
        if lo <= b <= hi:
            return None
        got = f"{k.micro_batch} x {k.grad_accum} x {k.dp} = {b}"
    else:
        if -(-lo // per_step) * per_step <= hi:  # some grad_accum reaches the range
            return None
        got = f"{k.micro_batch} x {k.dp} = {per_step} per accumulation step"
    want = str(lo) if lo == hi else f"{lo}-{hi}"
    return reject(BATCH_NOT_DIVISIBLE, "micro_batch", f"micro_batch x grad_accum x dp must be the global batch "
                  f"({want} sequences), got {got}", "choose dp and micro_batch that divide the global batch, or allow "
                  "training.global_batch_tolerance", global_batch=want)


def _frameworks(f: Facts, k: Knobs) -> "Rejection | None":
    from compiler.targets.support import describe_unsupported, unsupported_reasons

    reasons, field_name = unsupported_reasons(f.targets, f.precision, k, f.shape)
    if not reasons:
        return None
    return reject(FRAMEWORK_UNSUPPORTED, field_name, describe_unsupported(reasons),
                  "drop the target from `targets`, or change the layout", targets=dict(reasons))


RULES: tuple[Rule, ...] = (
    Rule(GPU_NOT_OFFERED, ("gpu", "gpus_per_node"), _gpu),
    Rule(PRECISION_UNSUPPORTED, ("gpu",), _precision),
    Rule(GPU_COUNT_NOT_ALLOWED, ("gpu", "tp", "pp", "cp", "dp"), _gpu_count),
    Rule(TP_NOT_DIVISOR, ("tp",), _tp),
    Rule(TP_CROSS_NODE, ("tp", "gpus_per_node"), _tp_node),
    Rule(PP_SPLIT_INVALID, ("pp", "vpp", "split"), _split),
    Rule(SCHEDULE_INVALID, ("vpp", "schedule", "pp"), _schedule),
    Rule(MICROBATCHES_NOT_DIVISIBLE, ("schedule", "pp", "grad_accum"), _microbatches),
    Rule(CP_NOT_DIVISOR, ("cp",), _cp),
    Rule(CP_UNSUPPORTED, ("cp",), _cp_attention),
    Rule(EP_INVALID, ("ep", "etp", "tp", "dp", "cp"), _ep),
    Rule(SP_INVALID, ("sequence_parallel", "tp", "cp"), _sp),
    Rule(DP_SHARD_INVALID, ("dp_shard", "zero_stage", "dp"), _dp_shard),
    Rule(OFFLOAD_INVALID, ("offload_params", "offload_optimizer", "zero_stage"), _offload),
    Rule(BATCH_NOT_DIVISIBLE, ("micro_batch", "grad_accum", "dp"), _batch),
    Rule(FRAMEWORK_UNSUPPORTED, ("tp", "pp", "vpp", "schedule", "cp", "ep", "etp", "dp", "dp_shard", "zero_stage",
                                 "sequence_parallel", "offload_optimizer", "offload_params"), _frameworks),
)

# What the cost model needs of a layout before it can cost it (compiler.costmodel.evaluation.check_layout); the
# GPU count, the batch, tensor parallel across nodes and the frameworks' support are the search's and
# the commands' business (benchmarks cost published layouts outside any spec's range).
COSTED_CODES: tuple[str, ...] = (PRECISION_UNSUPPORTED, TP_NOT_DIVISOR, PP_SPLIT_INVALID, SCHEDULE_INVALID,
                                 MICROBATCHES_NOT_DIVISIBLE, CP_NOT_DIVISOR, CP_UNSUPPORTED, EP_INVALID, SP_INVALID, DP_SHARD_INVALID,
                                 OFFLOAD_INVALID)


def violations(facts: Facts, knobs: Knobs, *, codes: Iterable[str] | None = None) -> list["Rejection"]:
    """Every rule ``knobs`` break (only ``codes`` when given), in RULES order; unknown knobs break nothing."""
    wanted = None if codes is None else set(codes)
    out = []
    for rule in RULES:
        if wanted is not None and rule.code not in wanted:
            continue
        r = rule.check(facts, knobs)
        if r is not None:
            out.append(r)
    return out


def first_violation(facts: Facts, knobs: Knobs, *, codes: Iterable[str] | None = None) -> "Rejection | None":
    wanted = None if codes is None else set(codes)
    for rule in RULES:
        if wanted is None or rule.code in wanted:
            r = rule.check(facts, knobs)
            if r is not None:
                return r
    return None


@functools.lru_cache(maxsize=None)
def rules_reading(names: frozenset[str], codes: tuple[str, ...] | None = None) -> tuple[Rule, ...]:
    """The rules (of ``codes``, in RULES order) that read at least one of the knobs ``names``: a rule whose
    knobs are all unknown breaks nothing, so checking knobs with only ``names`` set needs only these (the
    solver's generators ask millions of such partial questions)."""
    return tuple(r for r in RULES if (codes is None or r.code in codes) and not names.isdisjoint(r.knobs))


def first_violation_of(facts: Facts, rules: Iterable[Rule], knobs: Knobs) -> "Rejection | None":
    """``first_violation`` over ``rules`` only (see ``rules_reading``)."""
    for rule in rules:
        r = rule.check(facts, knobs)
        if r is not None:
            return r
    return None


def legal_rows(facts: Facts, codes: tuple[str, ...] | None, fixed: dict[str, Any], names: tuple[str, ...],
               rows: Iterable[tuple]) -> list[tuple]:
    """The ``rows`` (values of the knobs ``names``) that, with the knobs ``fixed`` and the rest unknown, break no
    rule of ``codes``: what ``first_violation_of(facts, rules_reading(...), Knobs.partial(**fixed, **row))`` says
    row by row, with each rule that reads none of ``names`` asked once (its verdict is the same for every row)
    and the others per row (the solver asks this for hundreds of thousands of (micro_batch, grad_accum) rows)."""
    if not _KNOB_NAMES.issuperset(names) or not _KNOB_NAMES.issuperset(fixed):
        raise TypeError(f"unknown knobs: {sorted((set(names) | fixed.keys()) - _KNOB_NAMES)}")
    varying = frozenset(names)
    asked = rules_reading(varying | frozenset(fixed), codes)
    # one Knobs whose varying values are overwritten row by row: a check is a pure function of its arguments and
    # keeps no reference to them
    probe = Knobs.partial(**fixed)
    if first_violation_of(facts, tuple(r for r in asked if varying.isdisjoint(r.knobs)), probe) is not None:
        return []
    per_row = tuple(r.check for r in asked if not varying.isdisjoint(r.knobs))
    values = probe.__dict__
    pair = len(names) == 2  # the solver's rows: (micro_batch, grad_accum) and (dp_shard, zero_stage)
    first, second = names[0], names[-1]
    out = []
    for row in rows:
        if pair:
            values[first], values[second] = row  # (a dict update from zip() costs twice as much)
        else:
            values.update(zip(names, row))
        for check in per_row:
            if check(facts, probe) is not None:
                break
        else:
            out.append(row)
    return out


def check_layout(facts: Facts, layout: "Layout") -> "Rejection | None":
    """The first rule a complete ``layout`` breaks, or None."""
    return first_violation(facts, Knobs.of(layout))


def plan_violations(plan: "Plan", targets: Iterable[str] | None = None) -> list["Rejection"]:
    """Every rule a plan's layout breaks against its own model, sequence, batch and ``targets`` (default: the
    plan's); what a renderer checks before it writes anything."""
    facts = Facts.of_plan(plan)
    if targets is not None:
        facts = dataclasses.replace(facts, targets=tuple(targets))
    return violations(facts, Knobs.of(plan.layout))


def check_plan(plan: "Plan") -> "Rejection | None":
    """The first rule a plan's layout breaks (plan.json may be edited by hand); the world size must also be
    the plan's GPU count."""
    lay = plan.layout
    bad = next(iter(plan_violations(plan)), None)
    if bad is None and lay.world_size != int(plan.cluster.num_gpus):
        bad = reject(GPU_COUNT_NOT_ALLOWED, "dp", f"tp x pp x cp x dp must be the plan's GPU count "
                     f"({plan.cluster.num_gpus}), got {lay.world_size}", "recompile the spec")
    return bad
