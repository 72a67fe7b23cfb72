"""The cost model's parts, for the solver's lower bounds: the one public door to the cost model's insides.

The solver (compiler/solver/bounds.py) bounds whole families of layouts from below with the cost
model's own quantity functions, stage by stage and piece by piece, so that a bound is never above
what ``evaluate`` returns. It goes through this module only; the cost model's modules (memory,
comm, compute, step, stages, context) may change behind it as long as these keep their meaning.

    bound_target(problem)                         the framework target the bounds cost (the slowest one)
    bound_efficiency()                            the constants with host launch time left out (see there)
    setup_for(problem, layout, gpu, *, stages)    the inputs every function below reads (a Setup)
    stages_of(problem, pp, vpp)                   Megatron's layers per pipeline stage (the pinned split)
    distinct_stages(stages)                       the stages whose maximum is the maximum over all
    unit_stage(kind)                              one dense / MoE layer, or the first / last stage's extras
    stage_params_of(problem, stage, tp, ep, pp, etp)  parameters one GPU of a stage holds before sharding
    stage_forward_backward_s(setup, stage, params) a stage's time per micro-batch, without ZeRO-2/3 traffic
    pipeline_send_s(setup)                        one activation send between pipeline stages
    zero_traffic(setup, params, units)            the ZeRO/FSDP collectives of a stage: per micro-batch and per step
    step_extras_s(setup, params)                  optimizer step + offload traffic that cannot overlap
    sync_overhead_s(world_size, busy_s)           the straggler wait and fixed time a synchronous step adds
    activations_in_flight_bytes(setup, stage)     saved activations (and logits on the last stage)
    inflight_microbatches(schedule, stage, pp, m, vpp) the micro-batches a stage holds at its peak (what the above
                                                  reads of the schedule and the micro-batch count)
    model_state_bytes(setup, params, sharding)    weights + gradients + master + optimizer states per GPU
    ShardingView(tp, cp, ep, dp_shard, ...)       the sharding fields model_state_bytes reads, without a Layout
    fixed_bytes(layout)                           the CUDA context and the communicators' buffers
    fragmentation_factor(), dp_overlap_window()   the allowances the memory and time models apply
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

from compiler.costmodel import comm, memory, pp_schedule, step
from compiler.costmodel.compute import StageCompute
from compiler.costmodel.context import Setup, make_setup
from compiler.costmodel.efficiency import Efficiency, ProfileRef, efficiency_of, load_efficiency
from compiler.costmodel.frameworks import costed_targets
from compiler.costmodel.memory import ShardingView
from compiler.costmodel.stages import StageLayers, StageParams, stage_layers, stage_params
from compiler.layout import Layout
from compiler.problem import GpuOption, Problem

__all__ = ["Setup", "StageLayers", "StageParams", "ZeroTraffic", "bound_target", "bound_efficiency", "setup_for",
           "stages_of", "distinct_stages", "unit_stage", "stage_params_of", "stage_forward_backward_s",
           "pipeline_send_s", "zero_traffic", "step_extras_s", "sync_overhead_s", "activations_in_flight_bytes",
           "inflight_microbatches",
           "model_state_bytes", "ShardingView", "fixed_bytes", "fragmentation_factor", "dp_overlap_window"]

_NEVER_S = 1e30  # a compute window no traffic fills (the offload terms that cannot overlap whatever runs)


def bound_target(problem: Problem) -> str:
    """The framework target the bounds cost: of the problem's framework targets, the slowest on a probe layout.

    A layout's estimate is its binding target's (compiler.costmodel.evaluation.evaluate_targets: the first that
    rejects it, else the slowest), so a bound on any one target's step time bounds every feasible layout's, and a
    layout any one target cannot fit is rejected: each target's bounds are valid, and the slowest target's are the
    tightest one target gives. With the Megatron target first and FSDP2's eager blocks beside it, bounding with
    Megatron's fused kernels left the bounds of a 32K-token spec ~40% below the layouts' estimates and the search
    costing ~15,000 layouts instead of ~20. The probe is the smallest layout every target can cost (no
    parallelism, one sequence), on the problem's first GPU option: its forward + backward, the quantity the bounds
    are built from. Ties go to the earlier target."""
    targets = costed_targets(problem.targets)
    if len(targets) == 1:
        return targets[0]
    gpu = problem.gpu_options[0]
    probe = Layout(gpu=gpu.name, gpus_per_node=gpu.gpus_per_node, tp=1, pp=1, cp=1, ep=1, dp_replicate=1,
                   dp_shard=1, zero_stage=0, micro_batch=1, grad_accum=1)

    def busy_s(target: str) -> float:
        result = step.step_time(make_setup(problem, probe, gpu, target=target))
        return result.forward_s + result.backward_s

    busy = {t: busy_s(t) for t in targets}
    return max(targets, key=lambda t: (busy[t], -targets.index(t)))


@functools.lru_cache(maxsize=32)
def bound_efficiency(profile: ProfileRef | None = None) -> Efficiency:
    """The shipped constants without the host launches that can overlap GPU work. A stage is launch-bound when its
    launches take longer than its GPU work (compute.stage_compute: max(GPU, launches), per stage for dense
    layers and per layer for MoE layers, whose forward also waits for the launches after its token-count sync);
    leaving the overlapped launches out only lowers a stage's time, and what remains is linear in the stage's
    pieces (``unit_stage``), as the bounds need."""
    return replace(efficiency_of(profile), overlapped_launches=False)


def setup_for(problem: Problem, layout: Layout, gpu: GpuOption, *, stages: tuple[StageLayers, ...] | None = None,
              target: str | None = None, efficiency: Efficiency | None = None) -> Setup:
    """The Setup ``evaluate`` builds for (problem, layout, gpu) and ``target`` (default: ``bound_target``);
    ``stages`` may pass the stages already known, ``efficiency`` other constants (``bound_efficiency``)."""
    return make_setup(problem, layout, gpu, target=target or bound_target(problem), eff=efficiency, stages=stages)


def stages_of(problem: Problem, pp: int, vpp: int) -> tuple[StageLayers, ...]:
    """The layers of every pipeline stage under the spec's pinned split (else Megatron's default one)."""
    return stage_layers(problem.shape, pp, vpp, problem.pins.split if pp > 1 else None)


def distinct_stages(stages: tuple[StageLayers, ...]) -> tuple[StageLayers, ...]:
    """One stage per distinct (dense, MoE, first, last), the earliest of each: any stage's time equals one of
    theirs, and memory.candidate_stages shows the earliest holds the most micro-batches in flight."""
    seen: dict[tuple, StageLayers] = {}
    for sl in stages:
        seen.setdefault((sl.dense, sl.moe, sl.first, sl.last), sl)
    return tuple(seen.values())


def unit_stage(kind: str) -> StageLayers:
    """One piece a stage is built of: "dense" / "moe" (one decoder layer), "first" (the embedding) or "last"
    (the final norm and the output layer). A stage's time without ZeRO-2/3 traffic is the sum of its pieces'."""
    assert kind in ("dense", "moe", "first", "last"), kind
    return StageLayers(0, int(kind == "dense"), int(kind == "moe"), 1, kind == "first", kind == "last")


def stage_params_of(problem: Problem, stage: StageLayers, *, tp: int, ep: int, pp: int,
                    etp: int | None = None) -> StageParams:
    return stage_params(problem.shape, problem.params, stage, tp=tp, ep=ep, pp=pp, etp=etp)


def stage_forward_backward_s(setup: Setup, stage: StageLayers, params: StageParams) -> tuple[float, float]:
    """(forward, backward) seconds of one micro-batch on ``stage``, with its tp/cp/ep communication and
    without the ZeRO-2/3 collectives."""
    st = step.stage_time(setup, stage, params, [])
    return st.forward_s, st.backward_s


def pipeline_send_s(setup: Setup) -> float:
    return comm.pp_p2p_time_s(setup)


@dataclass(frozen=True)
class ZeroTraffic:
    """A stage's ZeRO/FSDP collectives: per micro-batch (forward, backward) and per step (total, and the last
    bucket's share that cannot hide) for the gradient reduction and the parameter gather."""

    forward_s: float
    backward_s: float
    grad_total_s: float
    grad_tail_s: float
    param_total_s: float
    param_tail_s: float


def zero_traffic(setup: Setup, params: StageParams, units: int = 1) -> ZeroTraffic:
    """``units``: the pieces ZeRO-3 gathers one at a time on the stage (its layers, + 1 for the embedding or
    the output layer): each collective pays the ring latency (comm.dp_collectives)."""
    coll = comm.dp_collectives(setup, params, units=units)
    last = setup.eff.last_bucket_bytes
    pieces: list[float] = []
    for phase in ("step_grad", "step_param"):
        total = sum(x.time_per_call_s * x.calls_per_step for x in coll if x.phase == phase)
        nbytes = sum(x.bytes_per_call for x in coll if x.phase == phase)
        pieces += [total, total * min(1.0, last / nbytes) if nbytes else 0.0]
    return ZeroTraffic(sum(x.time_per_call_s for x in coll if x.phase == "forward"),
                       sum(x.time_per_call_s for x in coll if x.phase == "backward"), *pieces)


def step_extras_s(setup: Setup, params: StageParams, stage: int = 0) -> float:
    """The optimizer step and the offload traffic that cannot overlap any compute."""
    never = step.StageTime(stage, StageCompute(forward_s=_NEVER_S, backward_s=_NEVER_S, recompute_s=0.0),
                           (0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0))
    return (step.optimizer_step_time_s(setup, params) + step.weight_quantize_time_s(setup, params)
            + step.offload_time_s(setup, params, never)[0])


def sync_overhead_s(world_size: int, busy_s: float, efficiency: Efficiency | None = None) -> tuple[float, float]:
    """(straggler wait, fixed time) a synchronous step of ``world_size`` ranks adds to ``busy_s``
    (step.sync_overhead_for): the wait grows with the busy time, the fixed time does not."""
    return step.sync_overhead_for(world_size, efficiency or load_efficiency(), busy_s)


def activations_in_flight_bytes(setup: Setup, stage: StageLayers, per_microbatch: float | None = None) -> float:
    """The activations ``stage`` keeps for the micro-batches in flight under the schedule, with the logits
    (saved and transient) on the last stage. ``per_microbatch``: stage_activation_bytes(setup, stage) when the
    caller has it (it does not depend on the schedule, the pipeline degree or the micro-batch count)."""
    inflight = memory.inflight_for_stage(setup, stage.stage)
    if per_microbatch is None:
        per_microbatch = memory.stage_activation_bytes_per_microbatch(setup, stage)
    out = per_microbatch * inflight
    if stage.last:
        saved, transient = memory.logits_bytes(setup, inflight)
        out += saved + transient
    return out


def inflight_microbatches(schedule: str, stage: int, pp: int, m: int, vpp: int) -> float:
    """The peak in-flight micro-batches of pipeline stage ``stage`` (memory.inflight_for_stage of a layout with
    this schedule, pp, grad_accum ``m`` and vpp): with one micro-batch's activations and the schedule's kind
    (GPipe or not), all that ``activations_in_flight_bytes`` reads of the schedule and the micro-batch count."""
    return pp_schedule.inflight_microbatches(schedule, stage, pp, m, vpp)


def stage_activation_bytes(setup: Setup, stage: StageLayers) -> float:
    """One micro-batch's saved activations on ``stage`` (its layers, and the embedding / output-layer inputs)."""
    return memory.stage_activation_bytes_per_microbatch(setup, stage)


def model_state_bytes(setup: Setup, params: StageParams, sharding: Any) -> float:
    """Weights + gradients + fp32 master + optimizer states per GPU as ``setup``'s target keeps them;
    ``sharding`` has the layout's tp, cp, ep, dp_shard, dp_replicate, zero_stage, offload_optimizer and
    offload_params (a Layout will do)."""
    return memory.model_state_bytes_per_gpu(setup, params, sharding)


def fixed_bytes(layout: Layout) -> float:
    eff = load_efficiency()
    return eff.cuda_context_bytes + memory.num_process_groups(layout) * eff.nccl_bytes_per_group


def fragmentation_factor() -> float:
    return 1.0 + load_efficiency().fragmentation_fraction


def dp_overlap_window() -> float:
    return load_efficiency().dp_overlap_window_fraction
