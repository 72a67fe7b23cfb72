"""Step time as named line items, and the Estimate: the composition of compute, comm and pipeline.

One step = grad_accum micro-batches through the pipeline, then the optimizer.

1. Per stage and micro-batch: forward = GEMMs + attention forward + memory-bound forward +
   fixed per-layer costs + the exposed part of TP / CP / EP communication (+ ZeRO-3 all-gathers
   not hidden behind the forward); backward = 2x GEMMs + the rest + gradient-buffer traffic +
   recompute + exposed communication.
2. The slowest stage paces the pipeline: its forward/backward times feed the schedule
   simulation (pp_schedule.py); makespan = simulated units x forward time. The bubble and the
   p2p transfers on the critical path are what the makespan adds over m x (forward + backward).
3. Then the data-parallel gradient reduction (hidden behind the last backward except what
   does not fit and the last bucket), the parameter all-gather of ZeRO 1/2 (hidden behind the
   next forward likewise), the optimizer step (memory-bound over the local shard) and offload
   traffic.

The line items sum to the step time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.costmodel import comm, compute, pp_schedule
from compiler.costmodel.bands import band_for, unsourced_attention
from compiler.costmodel.context import QUANTISED_GEMM_DTYPES, Setup
from compiler.costmodel.efficiency import Efficiency
from compiler.costmodel.memory import candidate_stages, params_after_sharding, runs_hpz, state_sharding
from compiler.costmodel.stages import StageLayers, StageParams, stage_params
from compiler.estimate import CommVolume, Estimate, LineItem, MemoryBreakdown, TimeBreakdown
from compiler.units import format_bytes, format_seconds

ASSUMPTIONS = (
    "FLOPs: model = 6 x GEMM params per token (active experts, logits incl.) + 3 x causal attention-core "
    "forward (2 x heads x (d_qk + d_v) x s/2 per layer); hardware adds the recomputed forward.",
    "MFU and HFU are against the dense 16-bit (bf16) peak, also for fp8 and nvfp4 runs (fp32 runs: TF32 peak).",
    "ZeRO/FSDP shard over dp_shard x cp; experts over dp_shard x cp / ep; ZeRO-2/3 reduce-scatter after every "
    "micro-batch on their own streams (what exceeds the step's busy time shows), ZeRO-0/1 once per step.",
    "Rank order tp-cp-ep-dp-pp (Megatron); a group inside the NVLink domain uses NVLink, else the network.",
    "Activations: Korthikanti et al. 2022 per saved tensor, for what the target's implementation keeps (fused "
    "Megatron-Core + Transformer Engine kernels, or eager PyTorch modules; fp8 GEMM inputs kept in 1 B); "
    "expert tensor parallel = tp.",
    "MoE all-to-all: a token crosses the network once per destination node (DeepEP-style hierarchical "
    "dispatch) where the target dispatches hierarchically, dispatched and combined in bf16 (dispatched in FP8 "
    "where the framework quantises before it); on the critical path unless the target overlaps it; with "
    "tp > 1 Megatron-Core's dispatcher gathers a token's top_k routed copies over the expert TP group.",
    "Pipeline: the slowest stage's forward/backward times drive a simulation of the schedule; the layers "
    "per stage are Megatron's split (compiler/split.py).",
)


def base_assumptions(setup: Setup) -> tuple[str, ...]:
    """ASSUMPTIONS, said of the layout's expert tensor parallel degree where it is not tp."""
    lay = setup.layout
    if lay.etp is None:
        return ASSUMPTIONS
    said = {"experts over dp_shard x cp / ep;": "experts over dp_shard x cp x tp / (ep x etp);",
            "expert tensor parallel = tp.": f"expert tensor parallel = {lay.etp} (tp = {lay.tp}): the experts take "
                                            "whole sequence-parallel shards, and an MoE layer gathers and scatters "
                                            "over tp only for its attention (and shared experts)."}
    out = []
    for line in ASSUMPTIONS:
        for old, new in said.items():
            line = line.replace(old, new)
        out.append(line)
    return tuple(out)


def hybrid_shard_assumption(setup: Setup) -> tuple[str, ...]:
    """How the costed framework runs a hybrid-sharded (HSDP) layout, where it is not FSDP2's replicated shard groups."""
    if not runs_hpz(setup, setup.layout):
        return ()
    return (f"{setup.framework.display_name} runs hybrid sharding as ZeRO++ hpZ: model states partitioned over all "
            "dp x cp ranks, a secondary 16-bit weight copy over the dp_shard group for every gather after a step's "
            "first forward, gradients reduce-scattered over all dp x cp ranks every micro-batch.",)


def attention_kind_assumption(setup: Setup) -> tuple[str, ...]:
    """How sliding-window layers and attention sinks are costed, and that no kernel benchmark backs it."""
    shape = setup.shape
    if not unsourced_attention(shape):
        return ()
    what = []
    if shape.window_size:
        what.append(f"{shape.num_window_layers} of {shape.num_layers} layers attend through a {shape.window_size}-token "
                    "window, costed at the attention curve's rate for causal attention over twice the window and "
                    "counted in the model FLOPs with the window's keys")
    if shape.attention_sinks:
        what.append("the learnable sink per head is costed as plain attention")
    return ("Attention: " + "; ".join(what) + ". No kernel benchmark of windowed or sink attention backs this; "
            "Megatron-Bridge's published gpt-oss-120b runs, kept out of the fit, measure well below such predictions, "
            "and the 80% band comes from their errors (README, known limits; benchmarks/accuracy.py --unsourced).",)


def host_memory_assumption(setup: Setup, memory: MemoryBreakdown) -> tuple[str, ...]:
    """What the host-memory check of CPU offload covers, or that it was not made."""
    if not memory.cpu_bytes_per_node:
        return ()
    states = format_bytes(memory.cpu_bytes_per_node)
    if memory.usable_cpu_bytes_per_node is None:
        return (f"Host memory: the host memory of {setup.gpu.name}'s nodes is not known, so the {states} of offloaded "
                "states per node are not checked against it (give cluster.host_memory).",)
    return (f"Host memory: the {states} of offloaded states per node must fit in "
            f"{format_bytes(setup.gpu.host_memory_bytes_per_node)} less the {setup.problem.memory_headroom:.0%} "
            "headroom, which also holds the rank processes, data-loader workers and page cache (not modelled).",)


def precision_assumption(setup: Setup) -> str:
    """What the memory breakdown assumes of the weights, gradients and master copy, for the costed framework: the
    gradient dtypes and whether the master is the parameter come from its profile (compiler/targets/<name>/cost.py),
    so that the sentence cannot drift from the items."""
    fw, r = setup.framework, setup.recipe
    if r.name == "fp32":  # (make_setup gives the recipe the master bytes of a ZeRO optimizer's fp32 partition)
        return ("fp32 training keeps 4 B weights and gradients, no master copy"
                + (" but the ZeRO optimizer's fp32 partition" if r.master_bytes else "")
                + ", and the optimizer states per parameter.")
    master = ("the sharded fp32 parameter as the master (no 16-bit copy at rest under ZeRO-3)"
              if fw.master_is_param else f"a {r.master_bytes} B fp32 master")
    weights = (f"{r.weight_bytes:g} B NVFP4 weights (row- and column-wise, --fp4-param-gather)" if r.quantised_weights
               else "16-bit weights")
    return (f"Mixed precision keeps {weights}, {master} and the optimizer states per parameter (ZeRO paper); "
            f"{fw.display_name} keeps {fw.grad_dtype} gradients and reduces them in {fw.grad_reduce_dtype}.")


@dataclass(frozen=True)
class StageTime:
    """Seconds of one micro-batch on one GPU of a stage, by part."""

    stage: int
    compute: compute.StageCompute
    tp_s: tuple[float, float]  # exposed (forward, backward)
    cp_s: tuple[float, float]
    ep_s: tuple[float, float]
    # ZeRO-2/3 collectives of one micro-batch (forward gathers; backward gathers and reduce-scatters): they run
    # on the network beside everything the stage computes in the step (step_time costs what they leave exposed)
    dp_s: tuple[float, float]

    @property
    def forward_s(self) -> float:
        return self.compute.forward_s + self.tp_s[0] + self.cp_s[0] + self.ep_s[0]

    @property
    def backward_s(self) -> float:
        return self.compute.backward_s + self.compute.recompute_s + self.tp_s[1] + self.cp_s[1] + self.ep_s[1]


def _exposed(total_s: float, window_s: float, tail_s: float, setup: Setup) -> float:
    """Communication hidden behind ``window_s`` of compute, except a tail that cannot overlap."""
    if total_s <= 0:
        return 0.0
    return max(total_s - setup.eff.dp_overlap_window_fraction * window_s, min(total_s, tail_s))


def tp_exposed_fractions(setup: Setup) -> tuple[float, float]:
    """(forward, backward) shares of the TP collectives on the critical path: where the framework's artifacts
    overlap them with GEMMs (its cost profile's tp_overlap) the fitted share stays exposed; vanilla torch TP
    and Megatron-LM before its async TP leave all of it on the critical path."""
    mode = setup.framework.tp_overlap
    x = setup.eff.fit("tp_exposed_fraction")
    return (x if mode == "full" else 1.0, x if mode in ("full", "backward") else 1.0)


def stage_time(setup: Setup, sl: StageLayers, sp: StageParams, collectives: list[comm.Collective]) -> StageTime:
    eff = setup.eff
    c = compute.stage_compute(setup, sl)
    tp_f, tp_b = comm.tp_comm_time_per_layer_s(setup)
    tp_moe_f, tp_moe_b = comm.tp_comm_time_per_moe_layer_s(setup) if sl.moe else (0.0, 0.0)
    cp_f, cp_b = comm.cp_comm_time_per_layer_s(setup)
    ep_f, ep_b = comm.ep_comm_time_per_moe_layer_s(setup)
    attn_f, attn_b = compute.attention_core_time_s(setup)
    cp_exp = (max(eff.cp_exposed_fraction * cp_f, cp_f - attn_f),
              max(eff.cp_exposed_fraction * cp_b, cp_b - attn_b))
    dp = (sum(x.time_per_call_s for x in collectives if x.phase == "forward"),
          sum(x.time_per_call_s for x in collectives if x.phase == "backward"))
    (tp_xf, tp_xb), ep_x = tp_exposed_fractions(setup), eff.ep_exposed_fraction
    if setup.framework.ep_overlap and sl.moe:
        # DualPipe: a chunk's dispatch/combine runs under another chunk's compute; only the excess shows, and
        # the computation under it runs on the SMs the communication kernels leave (physics.yaml comm_sm_fraction)
        per_f, per_b = c.forward_s / max(1, sl.layers), c.backward_s / max(1, sl.layers)
        slow = eff.physics.comm_sm_fraction / (1.0 - eff.physics.comm_sm_fraction)
        ep_pair = (max(0.0, ep_f - per_f) + slow * min(ep_f, per_f), max(0.0, ep_b - per_b) + slow * min(ep_b, per_b))
    else:
        ep_pair = (ep_x * ep_f, ep_x * ep_b)
    return StageTime(
        stage=sl.stage, compute=c,
        tp_s=((tp_xf * tp_f * sl.layers, tp_xb * tp_b * sl.layers) if not comm.moe_tp_differs(setup) else
              (tp_xf * (tp_f * sl.dense + tp_moe_f * sl.moe), tp_xb * (tp_b * sl.dense + tp_moe_b * sl.moe))),
        cp_s=(cp_exp[0] * sl.layers, cp_exp[1] * sl.layers),
        ep_s=(ep_pair[0] * sl.moe, ep_pair[1] * sl.moe),
        dp_s=dp,
    )


def optimizer_bytes_touched_per_param(setup: Setup) -> float:
    """Adam reads and writes the fp32 master and both moments, reads the gradient and writes the
    16-bit weights (fused multi-tensor Adam: one pass over the shard)."""
    r = setup.recipe
    master = r.master_bytes or r.weight_bytes
    return 2.0 * (setup.optimizer_state_bytes + master) + r.grad_bytes + (r.weight_bytes if r.master_bytes else 0)


def optimizer_step_time_s(setup: Setup, sp: StageParams) -> float:
    if setup.layout.offload_optimizer != "none":
        return 0.0
    local = params_after_sharding(sp, state_sharding(setup, setup.layout), setup.layout.zero_stage >= 1)
    return local * optimizer_bytes_touched_per_param(setup) / setup.hbm_rate("fused")


def weight_quantize_time_s(setup: Setup, sp: StageParams) -> float:
    """fp8 and nvfp4 recipes quantise each layer weight once per step (Transformer Engine caches the quantised weight
    and its transpose across micro-batches, is_first_microbatch)."""
    if setup.recipe.gemm_dtype not in QUANTISED_GEMM_DTYPES:
        return 0.0
    per_element = setup.eff.physics.quantize_bytes_per_element[setup.quant_recipe]
    return (sp.total - sp.embedding) * per_element / setup.hbm_rate("fused")


def sync_overhead_s(setup: Setup, busy_s: float) -> tuple[float, float]:
    return sync_overhead_for(setup.layout.world_size, setup.eff, busy_s)


def sync_overhead_for(world_size: int, eff: Efficiency, busy_s: float) -> tuple[float, float]:
    """(straggler wait, fixed per-step time): a synchronous step waits for the slowest of N ranks, whose
    step time varies with coefficient of variation cv: E[max] ~ mean x (1 + cv sqrt(2 ln N)) (expected
    maximum of N normal variables); plus the fitted fixed time per step."""
    n = max(1, world_size)
    cv = eff.fit("straggler_cv")
    straggler = busy_s * cv * math.sqrt(2.0 * math.log(n)) if n > 1 else 0.0
    return straggler, eff.fit("step_overhead_s")


def offload_time_s(setup: Setup, sp: StageParams, st: StageTime) -> tuple[float, str]:
    """Exposed host traffic and CPU optimizer time per step (ZeRO-Offload / ZeRO-Infinity)."""
    lay, r, eff = setup.layout, setup.recipe, setup.eff
    pcie = setup.gpu.spec.pcie_bandwidth_bytes_per_s * eff.pcie_fraction
    total, parts = 0.0, []
    if lay.offload_optimizer != "none":
        local = params_after_sharding(sp, state_sharding(setup, lay), lay.zero_stage >= 1)
        d2h = local * r.grad_bytes / pcie
        h2d = local * r.weight_bytes / pcie
        adam = local * lay.gpus_per_node / eff.cpu_adam_params_per_s_per_node
        total += max(0.0, d2h - eff.dp_overlap_window_fraction * st.backward_s) + h2d + adam
        parts.append(f"grads D2H + params H2D over PCIe, CPU Adam {format_seconds(adam)}")
        if lay.offload_optimizer == "nvme":
            nvme = 2 * local * (r.master_bytes + setup.optimizer_state_bytes) * lay.gpus_per_node
            total += nvme / eff.nvme_bandwidth_bytes_per_s_per_node
            parts.append("optimizer states read+written on NVMe")
    if lay.offload_params != "none":
        shard = params_after_sharding(sp, lay, True)
        fetch = 2 * setup.num_microbatches * shard * r.weight_bytes / pcie
        if lay.offload_params == "nvme":
            fetch += 2 * setup.num_microbatches * shard * r.weight_bytes * lay.gpus_per_node / \
                eff.nvme_bandwidth_bytes_per_s_per_node
        busy = setup.num_microbatches * (st.forward_s + st.backward_s)
        total += max(0.0, fetch - eff.dp_overlap_window_fraction * busy)
        parts.append("parameter shards fetched from host every micro-batch")
    return total, "; ".join(parts)


@dataclass(frozen=True)
class StepResult:
    time: TimeBreakdown
    comm: tuple[CommVolume, ...]
    bubble_fraction: float
    forward_s: float
    backward_s: float
    p2p_s: float
    bottleneck_stage: int


def _pipeline_makespan_s(setup: Setup, fwd: float, bwd: float, p2p: float) -> tuple[float, float]:
    """(makespan with p2p, makespan without p2p), from the cached schedule simulation."""
    lay, m = setup.layout, setup.num_microbatches
    if lay.pp == 1:
        return m * (fwd + bwd), m * (fwd + bwd)
    r = pp_schedule.round_ratio(bwd / fwd)
    x = pp_schedule.round_ratio(p2p / fwd)
    with_p2p = pp_schedule.makespan_units(lay.schedule, lay.pp, m, lay.vpp, r, x) * fwd
    # without p2p the simulation equals the textbook closed form (tests/unit/costmodel/test_cm_pp_schedule.py)
    without = pp_schedule.textbook_makespan_units(lay.schedule, lay.pp, m, lay.vpp, r) * fwd
    return with_p2p, without


def step_time(setup: Setup) -> StepResult:
    lay, m, eff = setup.layout, setup.num_microbatches, setup.eff
    best: tuple[StageTime, StageParams, list[comm.Collective]] | None = None
    for sl in candidate_stages(setup):
        sp = stage_params(setup.shape, setup.params, sl, tp=lay.tp, ep=lay.ep, etp=lay.etp, pp=lay.pp,
                          vocab_tp=setup.vocab_shards)
        coll = comm.dp_collectives(setup, sp, units=sl.layers + int(sl.first or sl.last))
        st = stage_time(setup, sl, sp, coll)
        if best is None or st.forward_s + st.backward_s > best[0].forward_s + best[0].backward_s:
            best = (st, sp, coll)
    assert best is not None
    st, sp, coll = best
    fwd, bwd = st.forward_s, st.backward_s
    p2p = comm.pp_p2p_time_s(setup)
    makespan, makespan_no_p2p = _pipeline_makespan_s(setup, fwd, bwd, p2p)
    c = st.compute
    grad_total = sum(x.time_per_call_s * x.calls_per_step for x in coll if x.phase == "step_grad")
    grad_bytes = sum(x.bytes_per_call for x in coll if x.phase == "step_grad")
    grad_tail = grad_total * min(1.0, eff.last_bucket_bytes / grad_bytes) if grad_bytes else 0.0
    param_total = sum(x.time_per_call_s for x in coll if x.phase == "step_param")
    param_bytes = sum(x.bytes_per_call for x in coll if x.phase == "step_param")
    param_tail = param_total * min(1.0, eff.last_bucket_bytes / param_bytes) if param_bytes else 0.0
    dp_exposed = (_exposed(grad_total, c.backward_s + c.recompute_s, grad_tail, setup)
                  + _exposed(param_total, c.forward_s, param_tail, setup))
    zero_exposed = zero_exposed_s(setup, st, makespan)
    opt = optimizer_step_time_s(setup, sp) + weight_quantize_time_s(setup, sp)
    offload, offload_txt = offload_time_s(setup, sp, st)
    straggler, fixed = sync_overhead_s(setup, makespan + zero_exposed + dp_exposed + opt)
    items = _time_items(setup, st, makespan, makespan_no_p2p, zero_exposed, dp_exposed, opt, offload, offload_txt,
                        p2p)
    items.append(LineItem("sync_and_fixed", straggler + fixed,
                          f"waiting for the slowest of {setup.layout.world_size} ranks "
                          f"({format_seconds(straggler)}) + fixed per-step time ({format_seconds(fixed)})",
                          "compiler/data/efficiency.yaml (straggler_cv, step_overhead_s; fitted)"))
    total = sum(i.value for i in items)
    volumes = _comm_volumes(setup, st, coll, p2p, makespan - makespan_no_p2p, zero_exposed, dp_exposed)
    bubble = (makespan_no_p2p - m * (fwd + bwd)) / makespan if lay.pp > 1 and makespan > 0 else 0.0
    return StepResult(TimeBreakdown(items=tuple(items), step_time_s=total), volumes, max(0.0, bubble),
                      fwd, bwd, p2p, st.stage)


def zero_exposed_s(setup: Setup, st: StageTime, makespan_s: float) -> float:
    """The ZeRO-2/3 traffic of a step (every micro-batch's gathers and reduce-scatters) not hidden behind it.
    FSDP and DeepSpeed run it on their own streams while the GPU computes: a unit's all-gather is prefetched
    under the previous unit's compute, its reduce-scatter runs under the next units' backward and, with several
    micro-batches, under the next micro-batches' work (Zhao et al. 2023, PyTorch FSDP, sec. 3.3-3.4). What
    shows is what exceeds the overlap window of the step's busy time, and at least the first unit's gather and
    the last unit's reduce-scatter, which nothing runs beside."""
    fwd, bwd = st.dp_s
    if fwd + bwd <= 0:
        return 0.0
    if setup.framework.zero3_blocking:  # every fetch waits for its all-gather (the target's cost profile)
        return setup.num_microbatches * (fwd + bwd)
    units = max(1, setup.stages[st.stage].layers)
    return _exposed(setup.num_microbatches * (fwd + bwd), makespan_s, (fwd + bwd) / units, setup)


def _time_items(setup: Setup, st: StageTime, makespan: float, makespan_no_p2p: float, zero_exposed: float,
                dp_exposed: float, opt: float, offload: float, offload_txt: str, p2p: float) -> list[LineItem]:
    lay, m, c, eff = setup.layout, setup.num_microbatches, st.compute, setup.eff
    busy = m * (st.forward_s + st.backward_s)
    src = f"compiler/data/physics.yaml ({setup.kernel_class} kernels, {setup.framework.display_name})"
    parts = ", ".join(f"{k} {format_seconds(f)}/{format_seconds(b)}" for k, f, b in c.parts)
    items = [
        LineItem("forward_compute", m * c.forward_s,
                 f"{m} micro-batches x {format_seconds(c.forward_s)} (stage {st.stage}; forward/backward by part: "
                 f"{parts})", src),
        LineItem("backward_compute", m * c.backward_s, f"{m} x {format_seconds(c.backward_s)} (dgrad + wgrad GEMMs, "
                                                         "attention backward, gradient accumulation)", src),
    ]
    if c.recompute_s:
        items.append(LineItem("recompute", m * c.recompute_s,
                              f"{m} x {format_seconds(c.recompute_s)} ({lay.recompute} recompute forward)", src))
    overlap = eff.physics.sources["overlap"]
    for name, pair, why in (("tp_comm", st.tp_s, "compiler/data/efficiency.yaml tp_exposed_fraction (fitted)"
                             if setup.framework.tp_overlap != "none" else setup.framework.tp_fact),
                            ("cp_comm", st.cp_s, overlap["cp_exposed_fraction"]),
                            ("ep_comm", st.ep_s, overlap["ep_exposed_fraction"])):
        if sum(pair):
            items.append(LineItem(name, m * sum(pair), f"{m} x ({format_seconds(pair[0])} fwd + "
                                                       f"{format_seconds(pair[1])} bwd) exposed", why))
    if lay.pp > 1:
        items.append(LineItem("pp_bubble", makespan_no_p2p - busy,
                              f"simulated {lay.schedule} makespan {format_seconds(makespan_no_p2p)} - {m} x "
                              f"{format_seconds(st.forward_s + st.backward_s)} busy (pp={lay.pp}, vpp={lay.vpp})",
                              "discrete-event simulation of the schedule (compiler/costmodel/pp_schedule.py)"))
        items.append(LineItem("pp_p2p", makespan - makespan_no_p2p,
                              f"p2p {format_seconds(p2p)} per transfer on the critical path",
                              "Narayanan et al. 2021, sec. 4.1 (scatter/gather p2p)"))
    if zero_exposed:
        items.append(LineItem("zero_per_microbatch_comm", zero_exposed,
                              f"{m} x ({format_seconds(st.dp_s[0])} forward gathers + {format_seconds(st.dp_s[1])} "
                              f"backward gathers / reduce-scatters) not hidden behind the step's busy time",
                              overlap["dp_overlap_window_fraction"]))
    if dp_exposed:
        items.append(LineItem("dp_comm", dp_exposed, "gradient reduce / parameter gather not hidden behind the "
                                                      "last backward / first forward",
                              overlap["dp_overlap_window_fraction"]))
    if opt:
        items.append(LineItem("optimizer_step", opt, f"{optimizer_bytes_touched_per_param(setup):g} B per local "
                                                     "parameter / (HBM bandwidth x fraction)"
                              + (f" + {dt} weight casts" if (dt := setup.recipe.gemm_dtype) in QUANTISED_GEMM_DTYPES
                                 else ""),
                              "compiler/data/physics.yaml memory_bound.fraction.fused"))
    if offload:
        items.append(LineItem("offload", offload, offload_txt,
                              eff.physics.sources["host"]["cpu_adam_params_per_s_per_node"]))
    return items


def _comm_volumes(setup: Setup, st: StageTime, coll: list[comm.Collective], p2p: float, p2p_exposed: float,
                  zero_exposed: float, dp_exposed: float) -> tuple[CommVolume, ...]:
    lay, m, l = setup.layout, setup.num_microbatches, setup.stages[st.stage]
    msg = comm.activation_message_bytes(setup)
    out = []
    if lay.tp > 1:
        f, b = comm.tp_comm_time_per_layer_s(setup)
        nbytes, seconds = 4 * msg * l.layers * m, (f + b) * l.layers * m
        if comm.moe_tp_differs(setup):  # MoE layers move other messages (tp_comm_time_per_moe_layer_s)
            mf, mb = comm.tp_comm_time_per_moe_layer_s(setup)
            nbytes = 2 * (2 * l.dense + sum(comm.moe_layer_tp_messages(setup)) * l.moe) * msg * m
            seconds = ((f + b) * l.dense + (mf + mb) * l.moe) * m
        out.append(CommVolume("tp_all_reduce" if not lay.sequence_parallel else "tp_all_gather_reduce_scatter",
                              "tp", lay.tp, comm.tp_link(setup).link, nbytes, seconds, m * sum(st.tp_s)))
    if lay.cp > 1:
        f, b = comm.cp_comm_time_per_layer_s(setup)
        ring_bytes = 3 * (lay.cp - 1) * comm.cp_kv_chunk_bytes(setup)  # forward K,V; backward K,V and dK,dV
        out.append(CommVolume("cp_kv_ring", "cp", lay.cp, comm.cp_link(setup).link, ring_bytes * l.layers * m,
                              (f + b) * l.layers * m, m * sum(st.cp_s)))
    if lay.ep > 1 and l.moe:
        f, b = comm.ep_comm_time_per_moe_layer_s(setup)
        m_k = setup.shape.moe.top_k if setup.shape.moe else 1
        out.append(CommVolume("ep_all_to_all", "ep", lay.ep, comm.ep_link(setup).link, 4 * msg * m_k * l.moe * m,
                              (f + b) * l.moe * m, m * sum(st.ep_s)))
    if lay.pp > 1:
        out.append(CommVolume("pp_send_recv", "pp", lay.pp, comm.pp_link(setup).link, 2 * msg / lay.tp * m,
                              2 * p2p * m, p2p_exposed))
    total_dp = sum(x.time_per_call_s * x.calls_per_step for x in coll) or 1.0
    for x in coll:
        t = x.time_per_call_s * x.calls_per_step
        share = dp_exposed if x.phase.startswith("step") else zero_exposed
        out.append(CommVolume(x.name, x.group, x.group_size, x.link, x.bytes_per_call * x.calls_per_step, t,
                              share * t / total_dp))
    return tuple(out)


def peak_flops_for_utilisation(setup: Setup) -> float:
    """MFU/HFU denominator: the dense 16-bit peak (TF32 for fp32 training)."""
    return setup.peak_flops_per_s("fp32" if setup.recipe.name == "fp32" else "bf16")


def make_estimate(setup: Setup, memory: MemoryBreakdown, step: StepResult, *, with_events: bool = True) -> Estimate:
    problem, lay = setup.problem, setup.layout
    n = lay.world_size
    tokens_per_step = lay.global_batch * problem.seq_len
    t = step.time.step_time_s
    model_per_token = compute.model_flops_per_token(problem.shape, problem.params, problem.seq_len)
    hw_per_token = compute.hardware_flops_per_token(problem.shape, problem.params, problem.seq_len, lay.recompute)
    peak = peak_flops_for_utilisation(setup)
    num_steps = math.ceil(problem.tokens / tokens_per_step)
    time_to_train = num_steps * t
    gpu_hours = n * time_to_train / 3600.0
    events = pp_schedule.pipeline_events(lay.schedule, lay.pp, lay.grad_accum, lay.vpp, step.forward_s,
                                      step.backward_s, step.p2p_s) if with_events else ()
    return Estimate(
        memory=memory, time=step.time, comm=step.comm, pipeline=events, step_time_s=t,
        tokens_per_step=tokens_per_step, tokens_per_s=tokens_per_step / t, tokens_per_s_per_gpu=tokens_per_step / t / n,
        model_flops_per_token=model_per_token, model_flops_per_step=model_per_token * tokens_per_step,
        hardware_flops_per_step=hw_per_token * tokens_per_step,
        model_tflops_per_gpu=model_per_token * tokens_per_step / t / n / 1e12,
        mfu=model_per_token * tokens_per_step / (t * n * peak), hfu=hw_per_token * tokens_per_step / (t * n * peak),
        pipeline_bubble_fraction=step.bubble_fraction, num_steps=num_steps, time_to_train_s=time_to_train,
        gpu_hours=gpu_hours, cost_usd=gpu_hours * setup.gpu.price_per_gpu_hour_usd, num_gpus=n,
        assumptions=base_assumptions(setup) + hybrid_shard_assumption(setup) + attention_kind_assumption(setup)
        + host_memory_assumption(setup, memory)
        + (precision_assumption(setup),
           f"Costed for {setup.framework.display_name} (activations: {setup.impl.name}, attention kernel: "
           f"{setup.framework.attention}); GPU {setup.gpu.name} ({setup.kernel_class} kernels); bottleneck stage "
           f"{step.bottleneck_stage}.",),
        band=band_for(framework=setup.framework.name, gpu_generation=setup.gpu.spec.kernel_family,
                      precision=problem.precision, fp8_recipe=setup.quant_recipe, layout=lay, shape=problem.shape,
                      profile=problem.profile),
    )
