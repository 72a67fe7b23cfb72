"""Memory per GPU as named line items: model states, activations, transient buffers, allowances.

Model states follow the ZeRO paper (Rajbhandari et al. 2020, sec. 3.1 and 5): weights,
gradients, fp32 master weights and optimizer states, each divided by the ZeRO/FSDP
shard group when the stage shards it (1: master + optimizer, 2: + gradients, 3: +
weights). The shard group of dense parameters is dp_shard x cp (Megatron shards the
distributed optimizer over the data-parallel x context-parallel group; FSDP2 in
torchtitan shards over dp_shard x cp as well); routed experts, already split by ep and etp,
are sharded over dp_shard x cp x tp / (ep x etp) (Megatron's expert data-parallel group; dp_shard x cp / ep
with etp = tp). DeepSpeed's hybrid
sharding (ZeRO++ hpZ) keeps every state partitioned over all dp x cp ranks and adds a secondary
16-bit weight copy partitioned over dp_shard (state_sharding, secondary_weight_bytes).

The binding stage is reported: the first stage holds the embedding and the most
micro-batches in flight, the last stage the output layer and the logits.
"""
from __future__ import annotations

import functools

from compiler.costmodel import activations as act
from compiler.costmodel.context import GEMM_INPUT_BYTES, OPTIMIZER_SOURCE, PrecisionRecipe, Setup
from compiler.costmodel.pp_schedule import inflight_microbatches
from compiler.costmodel.stages import StageLayers, StageParams, stage_params
from compiler.estimate import LineItem, MemoryBreakdown
from compiler.layout import Layout
from compiler.model import ModelShape
from compiler.units import format_bytes, format_count

# --- sharding -------------------------------------------------------------------------------------


def dense_shard_degree(layout: Layout) -> int:
    """ZeRO/FSDP shard group of dense parameters: dp_shard x cp (1 without ZeRO)."""
    return layout.dp_shard * layout.cp if layout.zero_stage > 0 else 1


def expert_shard_degree(layout: Layout) -> float:
    """Routed experts are sharded over the expert data-parallel group: dp_shard x cp x tp / (ep x etp), which is
    dp_shard x cp / ep with Megatron's default etp = tp (core/parallel_state.py expert rank generator)."""
    return max(1.0, dense_shard_degree(layout) * layout.tp / (layout.ep * layout.expert_tp))


def params_after_sharding(sp: StageParams, layout: Layout, sharded: bool) -> float:
    if not sharded:
        return sp.total
    return sp.dense / dense_shard_degree(layout) + sp.expert / expert_shard_degree(layout)


class ShardingView:
    """The sharding fields of a layout, what the model-state functions read, without building a Layout (the
    solver's memory bounds ask for every sharding choice of a group; ZeRO++ hpZ's states use another one)."""

    __slots__ = ("tp", "cp", "ep", "dp_shard", "dp_replicate", "zero_stage", "offload_optimizer", "offload_params",
                 "expert_tp")

    def __init__(self, tp: int, cp: int, ep: int, dp_shard: int, dp_replicate: int, zero_stage: int,
                 offload_optimizer: str, offload_params: str, expert_tp: int | None = None):
        self.tp, self.cp, self.ep = tp, cp, ep
        self.expert_tp = tp if expert_tp is None else expert_tp
        self.dp_shard, self.dp_replicate = dp_shard, dp_replicate
        self.zero_stage = zero_stage
        self.offload_optimizer, self.offload_params = offload_optimizer, offload_params


def runs_hpz(setup: Setup, sharding: Layout) -> bool:
    """Whether ``setup``'s target runs this sharding as ZeRO++ hpZ: a hybrid ZeRO-3 layout (dp_shard ranks, replicated
    dp_replicate times) under a cost profile whose hybrid_shard is "hpz" (targets.cost.CostProfile.hybrid_shard)."""
    return (setup.framework.hybrid_shard == "hpz" and sharding.zero_stage >= 3 and sharding.dp_replicate > 1
            and sharding.dp_shard > 1)


def state_sharding(setup: Setup, sharding: Layout) -> Layout:
    """The sharding ``setup``'s target partitions the model states by: the layout's, except under ZeRO++ hpZ,
    which keeps them partitioned over all data-parallel ranks (one shard group, dp_shard = dp)."""
    if runs_hpz(setup, sharding):
        s = sharding
        return ShardingView(s.tp, s.cp, s.ep, s.dp_shard * s.dp_replicate, 1, s.zero_stage,  # type: ignore[return-value]
                            s.offload_optimizer, s.offload_params, s.expert_tp)
    return sharding


def secondary_weight_bytes(setup: Setup, sp: StageParams, sharding: Layout, *, on_host: bool = False) -> float:
    """ZeRO++ hpZ's secondary 16-bit copy of the weights, partitioned over the dp_shard ranks
    (partition_parameters.py _partition_param_sec: tensor size / zero_hpz_partition_size), on the parameters'
    device: the GPU's bytes, or with ``on_host`` the host's (where offloaded parameters keep it)."""
    if not runs_hpz(setup, sharding):
        return 0.0
    if (sharding.offload_params != "none") != on_host:
        return 0.0
    return setup.recipe.weight_bytes * params_after_sharding(sp, sharding, True)


# --- model states (bytes per GPU) ---------------------------------------------------------------------


def zero_model_state_bytes_per_gpu(num_params: float, *, zero_stage: int, num_shards: int, weight_bytes: float = 2,
                                   grad_bytes: int = 2, optimizer_bytes: int = 12) -> float:
    """The ZeRO paper's per-device model states (sec. 3.1 / Fig. 1): 2P + 2P + KP, K = 12, divided by
    Nd for what the stage partitions (P_os: optimizer states, P_g: + gradients, P_p: + parameters)."""
    nd = num_shards
    w = weight_bytes * num_params / (nd if zero_stage >= 3 else 1)
    g = grad_bytes * num_params / (nd if zero_stage >= 2 else 1)
    o = optimizer_bytes * num_params / (nd if zero_stage >= 1 else 1)
    return w + g + o


def weight_bytes_per_gpu(sp: StageParams, layout: Layout, weight_bytes: float) -> float:
    if layout.offload_params != "none":
        return 0.0
    return weight_bytes * params_after_sharding(sp, layout, layout.zero_stage >= 3)


def gradient_bytes_per_gpu(sp: StageParams, layout: Layout, grad_bytes: int, *, on_host: bool = False,
                           partition: bool = False) -> float:
    """The accumulated gradients a GPU keeps (``on_host``: the target keeps them with its offloaded optimizer
    instead; ``partition``: it keeps only this rank's partition, whatever the ZeRO stage)."""
    if on_host:
        return 0.0
    return grad_bytes * params_after_sharding(sp, layout, layout.zero_stage >= 2 or partition)


def gradients_on_host(setup: Setup, layout: Layout) -> bool:
    """Whether the host keeps the accumulated gradient shard with the offloaded optimizer."""
    return layout.offload_optimizer != "none" and setup.framework.offload_moves_gradients


def gradient_partition_stays(setup: Setup, layout: Layout) -> bool:
    """Whether the GPU keeps the gradient partition as well, where the host keeps its copy (CostProfile
    offload_keeps_gradient_partition: DeepSpeed ZeRO-1/2 accumulate it on the GPU and copy it at the boundary)."""
    return (gradients_on_host(setup, layout) and setup.framework.offload_keeps_gradient_partition
            and layout.zero_stage < 3)


def offload_grad_buffer_bytes(setup: Setup, sl: StageLayers) -> float:
    """The gradient staging buffer of the largest parameter that ZeRO-1/2 with an offloaded optimizer keeps on the GPU,
    and its pinned twin on the host (DeepSpeed 0.19.8 stage_1_and_2.py temp_grad_buffer_for_gpu_offload and
    temp_grad_buffer_for_cpu_offload: largest_param_numel elements in the parameter dtype); 0 elsewhere."""
    lay = setup.layout
    if not gradient_partition_stays(setup, lay):
        return 0.0
    shape = setup.shape
    largest = max(shape.ffn_hidden_size, shape.moe.expert_ffn_hidden_size if shape.moe else 0) * shape.hidden_size / lay.tp
    if sl.first or sl.last:
        largest = max(largest, shape.vocab_size * shape.hidden_size / setup.vocab_shards)
    return setup.recipe.weight_bytes * largest


def gpu_gradient_bytes(setup: Setup, sp: StageParams, states: Layout) -> float:
    """The gradients line of one GPU as ``setup``'s target keeps them (see gradient_partition_stays)."""
    if gradient_partition_stays(setup, states):
        return gradient_bytes_per_gpu(sp, states, setup.grad_bytes, partition=True)
    return gradient_bytes_per_gpu(sp, states, setup.grad_bytes, on_host=gradients_on_host(setup, states))


def master_weight_bytes_per_gpu(sp: StageParams, layout: Layout, master_bytes: int) -> float:
    if layout.offload_optimizer != "none":
        return 0.0
    return master_bytes * params_after_sharding(sp, layout, layout.zero_stage >= 1)


def optimizer_state_bytes_per_gpu(sp: StageParams, layout: Layout, state_bytes: int) -> float:
    if layout.offload_optimizer != "none":
        return 0.0
    return state_bytes * params_after_sharding(sp, layout, layout.zero_stage >= 1)


def persistent_weight_bytes(setup: Setup, sharding: Layout) -> float:
    """Bytes per parameter of the 16-bit weight copy a GPU keeps between uses: none when the framework's fp32
    master is the sharded parameter itself and ZeRO-3 shards it (FSDP: the 16-bit weights exist only while a
    unit is gathered, zero3_gathered_params), else the precision's weight bytes."""
    r = setup.recipe
    if setup.framework.master_is_param and r.master_bytes and sharding.zero_stage >= 3:
        return 0
    return r.weight_bytes


def model_state_bytes_per_gpu(setup: Setup, sp: StageParams, sharding: Layout) -> float:
    """Weights + gradients + fp32 master + optimizer states of one GPU as ``setup``'s target keeps them
    (``sharding``: the layout, or any object with its tp, cp, ep, dp_shard, zero_stage and offload fields)."""
    r, states = setup.recipe, state_sharding(setup, sharding)
    return (weight_bytes_per_gpu(sp, states, persistent_weight_bytes(setup, states))
            + secondary_weight_bytes(setup, sp, sharding)
            + gpu_gradient_bytes(setup, sp, states)
            + master_weight_bytes_per_gpu(sp, states, r.master_bytes)
            + optimizer_state_bytes_per_gpu(sp, states, setup.optimizer_state_bytes))


def offloaded_bytes_per_gpu(setup: Setup, sl: StageLayers, sp: StageParams, layout: Layout) -> dict[str, float]:
    """Host bytes of one GPU's offloaded shard by where they go (``"cpu"``, ``"nvme"``): the optimizer side
    (fp32 master, optimizer states, and the accumulated gradients when the target keeps them with its offloaded
    optimizer) on layout.offload_optimizer's device, the 16-bit parameters (and hpZ's secondary copy of them)
    on layout.offload_params' (none where the sharded parameter is the fp32 master: FSDP2's CPUOffloadPolicy
    keeps that one copy, counted with the optimizer side)."""
    states = state_sharding(setup, layout)
    out = {"cpu": 0.0, "nvme": 0.0}
    if layout.offload_optimizer != "none":
        grads = setup.grad_bytes if gradients_on_host(setup, layout) else 0
        out[layout.offload_optimizer] += offload_grad_buffer_bytes(setup, sl)
        # (the host's gradient shard is the optimizer's partition, at ZeRO-1 too: single_partition_of_fp32_groups)
        out[layout.offload_optimizer] += (
            (grads + setup.recipe.master_bytes + setup.optimizer_state_bytes)
            * params_after_sharding(sp, states, states.zero_stage >= 1))
    if layout.offload_params != "none":
        out[layout.offload_params] += (persistent_weight_bytes(setup, states) * params_after_sharding(sp, states, True)
                                       + secondary_weight_bytes(setup, sp, layout, on_host=True))
    return out


def usable_host_bytes_per_node(setup: Setup) -> int:
    """The node's host memory (GpuOption.host_memory_bytes_per_node) less the spec's headroom, as for HBM;
    0 when it is not known."""
    return int(setup.gpu.host_memory_bytes_per_node * (1.0 - setup.problem.memory_headroom))


# --- activations --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def layer_terms_cached(shape: ModelShape, moe_layer: bool, seq_kv: int, act_bytes: int,
                       impl: act.ActivationImpl, gemm_bytes: float, dropout: bool | None) -> tuple[act.Term, ...]:
    return act.layer_terms(shape, moe_layer=moe_layer, seq_kv=seq_kv, act_bytes=act_bytes, impl=impl,
                           gemm_bytes=gemm_bytes, dropout=dropout)


def setup_layer_terms(setup: Setup, moe_layer: bool, impl: act.ActivationImpl | None = None) -> tuple[act.Term, ...]:
    """One layer's saved tensors as the layout keeps them: under sequence parallel an MoE layer's expert inputs are
    the expert tensor-parallel group's gather (activations.with_expert_tp_gather)."""
    r, lay = setup.recipe, setup.layout
    gemm_bytes = GEMM_INPUT_BYTES.get(r.gemm_dtype, r.activation_bytes)
    terms = layer_terms_cached(setup.shape, moe_layer, setup.seq_len // lay.cp, r.activation_bytes,
                               impl or setup.impl, gemm_bytes, setup.framework.dropout)
    if moe_layer and lay.sequence_parallel:
        return act.with_expert_tp_gather(terms, lay.expert_tp)
    return terms


def fused_activation_bytes_per_layer(setup: Setup, *, moe_layer: bool) -> float:
    """One layer's saved activations (no recompute) as a fused implementation of the same block keeps them
    (activations.fused_counterpart): the tensors its elementwise steps read and write."""
    lay = setup.layout
    return setup.memo(("fused_activation_bytes", moe_layer), lambda: act.activation_bytes_per_layer(
        setup_layer_terms(setup, moe_layer, act.fused_counterpart(setup.impl)), tokens=setup.tokens_per_microbatch,
        tp=lay.tp, sequence_parallel=lay.sequence_parallel, recompute="none", hidden=setup.shape.hidden_size,
        act_bytes=setup.recipe.activation_bytes, micro_batch=lay.micro_batch))


def recompute_mode(setup: Setup, recompute: str) -> str:
    """'selective' means the attention core in Megatron, per-op SAC in PyTorch frameworks."""
    if recompute == "selective" and setup.framework.recompute_selective == "per_op":
        return "selective_per_op"
    if recompute == "selective" and setup.framework.recompute_selective == "per_op_every_other_mm":
        return "selective_per_op_every_other_mm"
    return recompute


def op_level_selective(setup: Setup) -> bool:
    """The layout's selective recompute is PyTorch's op-level SAC (either policy), not Megatron's attention core."""
    return recompute_mode(setup, setup.layout.recompute).startswith("selective_per_op")


def activation_bytes_per_layer_kind(setup: Setup, *, moe_layer: bool, recompute: str | None = None) -> float:
    """One decoder layer's saved activations for one micro-batch on one GPU."""
    lay = setup.layout
    mode = recompute_mode(setup, recompute or lay.recompute)
    if mode == "selective_per_op_every_other_mm":
        return setup.memo(("activation_bytes", moe_layer, mode), lambda: setup.tokens_per_microbatch
                          * act.every_other_mm_sac_bytes_per_token(setup.shape, moe_layer=moe_layer, tp=lay.tp,
                                                                   sequence_parallel=lay.sequence_parallel,
                                                                   act_bytes=setup.recipe.activation_bytes))
    return setup.memo(("activation_bytes", moe_layer, mode), lambda: act.activation_bytes_per_layer(
        setup_layer_terms(setup, moe_layer), tokens=setup.tokens_per_microbatch, tp=lay.tp,
        sequence_parallel=lay.sequence_parallel, recompute=mode, hidden=setup.shape.hidden_size,
        act_bytes=setup.recipe.activation_bytes, full_input_split=setup.framework.full_recompute_inputs_split_over_tp,
        micro_batch=lay.micro_batch))


def stage_activation_bytes_per_microbatch(setup: Setup, sl: StageLayers, recompute: str | None = None) -> float:
    """All decoder layers of a stage, one micro-batch, plus the embedding/output-layer inputs."""
    lay, t = setup.layout, setup.tokens_per_microbatch
    total = sum(n * activation_bytes_per_layer_kind(setup, moe_layer=moe_layer, recompute=recompute)
                for moe_layer, n in ((False, sl.dense), (True, sl.moe)) if n)
    shard = lay.tp if lay.sequence_parallel else 1
    if sl.first:
        total += t * act.embedding_activation_bytes_per_token(setup.shape, setup.framework.dropout) / shard
    if sl.last:
        total += output_layer_activation_bytes(setup)
    return total


def output_layer_activation_bytes(setup: Setup) -> float:
    """One micro-batch's saved inputs of the final norm and the output layer (the last stage's)."""
    lay = setup.layout
    return setup.tokens_per_microbatch * act.output_layer_activation_bytes_per_token(
        setup.shape, setup.recipe.activation_bytes, setup.impl) / (lay.tp if lay.sequence_parallel else 1)


def inflight_for_stage(setup: Setup, stage: int) -> float:
    lay = setup.layout
    return inflight_microbatches(lay.schedule, stage, lay.pp, setup.num_microbatches, lay.vpp)


def recompute_working_set_bytes(setup: Setup, sl: StageLayers) -> float:
    lay = setup.layout

    per_op = op_level_selective(setup)

    def one(moe_layer: bool) -> float:
        if per_op:  # op-level SAC rematerialises every op its policy does not keep: the rest of the layer
            return setup.memo(("working_set", moe_layer), lambda: max(0.0, (
                activation_bytes_per_layer_kind(setup, moe_layer=moe_layer, recompute="none")
                - activation_bytes_per_layer_kind(setup, moe_layer=moe_layer))))
        return setup.memo(("working_set", moe_layer), lambda: act.recompute_working_set_bytes(
            setup_layer_terms(setup, moe_layer), tokens=setup.tokens_per_microbatch, tp=lay.tp,
            sequence_parallel=lay.sequence_parallel, recompute=lay.recompute, hidden=setup.shape.hidden_size,
            act_bytes=setup.recipe.activation_bytes, micro_batch=lay.micro_batch))

    return max((one(k) for k, n in ((False, sl.dense), (True, sl.moe)) if n), default=0.0)


def logits_bytes(setup: Setup, inflight: float) -> tuple[float, float]:
    """(kept, transient) bytes of the loss on the last stage (loss_memory: by cross-entropy implementation). The
    loss belongs to the last virtual stage, which runs each micro-batch's backward right after its forward in every
    schedule (1F1B's steady state; GPipe keeps them all): one micro-batch's kept bytes count, not the stage's
    in-flight count."""
    t, per_token = setup.tokens_per_microbatch, setup.shape.vocab_size / setup.loss_vocab_shards
    kept_b, transient_b = loss_memory(setup).per_logit(setup.recipe.activation_bytes)
    return t * loss_kept_microbatches(setup, inflight) * (per_token * kept_b), t * (per_token * transient_b)


def loss_kept_microbatches(setup: Setup, inflight: float) -> float:
    """How many micro-batches' kept loss bytes the last stage holds (logits_bytes)."""
    return inflight if setup.layout.schedule == "gpipe" else min(1.0, inflight)


def backward_peaks(working: float, freed: float, transient: float) -> tuple[float, float]:
    """(recompute working set, loss transient) as line items that add up to the stage's peak.

    A stage's backward never holds the layer it rematerialises together with the loss's transient buffers, nor
    with what its own micro-batch's backward has already consumed (``freed``: on the last stage the loss's kept
    bytes and the saved inputs of the final norm and the output layer): the backward reaches a layer only after
    those. On the last stage the peak beyond the kept activations and kept loss bytes is therefore
    max(transient, working - freed), not their sum: the working set counts above what its micro-batch has freed,
    and the transient above what the working set already counts. The first three of (activations, logits_loss,
    recompute_working_set) then add up to what autograd saves at its peak, and with loss_transient to what the
    allocator holds (measured by dtc smoke with saved_tensors_hooks)."""
    remat = max(0.0, working - freed)
    return remat, max(0.0, transient - remat)


def loss_memory(setup: Setup) -> act.LossMemory:
    """The loss's bytes per logit under the cross-entropy implementation the framework runs at this precision."""
    return act.LOSS_MEMORY[setup.framework.cross_entropy_for(setup.recipe.name)]


# --- transient buffers and allowances ---------------------------------------------------------------


def zero3_gathered_bytes(setup: Setup, sp: StageParams) -> float:
    """FSDP/ZeRO-3 all-gathers one unit (a decoder layer, or the embedding) at a time and prefetches
    the next: 2 units of weights + 1 unit of unsharded gradients before its reduce-scatter
    (Zhao et al. 2023, PyTorch FSDP, sec. 3.3 and 4.2). DeepSpeed gathers parameter by parameter and
    keeps at most stage3_max_live_parameters gathered, its unsharded gradients in reduce buckets
    (the target's cost profile: zero3_live_params; physics.yaml deepspeed_bucket_elements)."""
    if setup.layout.zero_stage < 3:
        return 0.0
    unit = max(sp.layer_dense, sp.embedding)
    r = setup.recipe
    cap = setup.framework.zero3_live_params
    if cap:
        return min(2 * unit, cap) * r.weight_bytes + min(unit, setup.eff.deepspeed_bucket_elements) * setup.grad_bytes
    return unit * (2 * r.weight_bytes + setup.grad_bytes)


def dp_bucket_bytes(setup: Setup, sp: StageParams) -> float:
    """Gradient communication buckets outside the gradient buffer: torch DDP copies gradients into
    25 MB buckets (ZeRO 0); DeepSpeed ZeRO-1/2 fill a reduce bucket of up to 5e8 elements. Megatron's
    gradients are views into its contiguous grad buffer, reduced in place (megatron/core/distributed/
    param_and_grad_buffer.py): no extra bucket."""
    lay, eff = setup.layout, setup.eff
    if lay.dp * lay.cp == 1 or lay.zero_stage == 3 or setup.impl.name.startswith(("megatron", "deepseek")):
        return 0.0
    if lay.zero_stage == 0:
        return min(eff.torch_ddp_bucket_bytes, sp.total * setup.grad_bytes)
    return min(eff.deepspeed_bucket_elements, sp.total) * setup.grad_bytes


# the cached quantised weight and its transpose: two copies
WEIGHT_CACHE_BYTES = {dt: 2 * b for dt, b in GEMM_INPUT_BYTES.items()}


def weight_cache_per_param(recipe: PrecisionRecipe) -> float | None:
    """Bytes per layer parameter of Transformer Engine's cached quantised weights, None when there is no such cache
    (16/32-bit GEMMs, or weights kept quantised already)."""
    return None if recipe.quantised_weights else WEIGHT_CACHE_BYTES.get(recipe.gemm_dtype)


def weight_cache_bytes(setup: Setup, sp: StageParams) -> float:
    """Transformer Engine caches the quantised copy and its transpose of each layer weight across the
    micro-batches of a step (TE docs: is_first_microbatch): 2 bytes per local layer parameter under fp8,
    2 x 0.5625 under nvfp4 (E2M1 packed two per byte + an E4M3 scale per 16 elements)."""
    per_param = weight_cache_per_param(setup.recipe)
    if per_param is None:
        return 0.0
    return per_param * (sp.total - sp.embedding) / (dense_shard_degree(setup.layout) if setup.layout.zero_stage >= 3 else 1)


def num_process_groups(layout: Layout) -> int:
    groups = sum(x > 1 for x in (layout.tp, layout.pp, layout.cp, layout.ep, layout.dp))
    if layout.cp > 1 and layout.dp > 1:
        groups += 1  # the dp x cp gradient group
    if layout.ep > 1:
        groups += 1  # the expert data-parallel group
    if layout.etp is not None and layout.etp > 1:
        groups += 1  # the expert tensor-parallel group (etp = tp shares the tp group)
    return groups


# --- assembling the breakdown ---------------------------------------------------------------------------


def _gb(x: float) -> str:
    return format_bytes(x)


def stage_memory_items(setup: Setup, sl: StageLayers) -> list[LineItem]:
    lay, r, eff = setup.layout, setup.recipe, setup.eff
    sp = stage_params(setup.shape, setup.params, sl, tp=lay.tp, ep=lay.ep, etp=lay.etp, pp=lay.pp,
                      vocab_tp=setup.vocab_shards)
    states = state_sharding(setup, lay)
    nd, ne = dense_shard_degree(states), expert_shard_degree(states)
    params_txt = f"{format_count(sp.dense)} dense + {format_count(sp.expert)} expert params on this GPU"

    def shard_txt(on: bool) -> str:
        return f" / shard ({nd} dense, {ne:g} expert)" if on and lay.zero_stage > 0 else ""

    weight_b = persistent_weight_bytes(setup, states)
    on_host = gradients_on_host(setup, states)
    stays = gradient_partition_stays(setup, states)
    items = [
        LineItem("weights", weight_bytes_per_gpu(sp, states, weight_b),
                 f"{weight_b} B x {params_txt}{shard_txt(lay.zero_stage >= 3)}"
                 + (" (offloaded to host)" if lay.offload_params != "none" else ""), r.source),
        LineItem("gradients", gpu_gradient_bytes(setup, sp, states),
                 f"{setup.grad_bytes} B x {params_txt}{shard_txt(lay.zero_stage >= 2 or stays)}"
                 + (" (the partition accumulated here, copied to the offloaded optimizer's at the boundary)" if stays
                    else " (offloaded with the optimizer)" if on_host else ""),
                 r.source if setup.grad_bytes == r.grad_bytes else setup.framework.grad_fact),
        LineItem("master_weights", master_weight_bytes_per_gpu(sp, states, r.master_bytes),
                 f"{r.master_bytes} B x {params_txt}{shard_txt(lay.zero_stage >= 1)}"
                 + (" (offloaded)" if lay.offload_optimizer != "none" else ""), r.source),
        LineItem("optimizer_states", optimizer_state_bytes_per_gpu(sp, states, setup.optimizer_state_bytes),
                 f"{setup.optimizer_state_bytes} B ({setup.problem.optimizer}) x {params_txt}"
                 f"{shard_txt(lay.zero_stage >= 1)}" + (" (offloaded)" if lay.offload_optimizer != "none" else ""),
                 OPTIMIZER_SOURCE),
    ]
    secondary = secondary_weight_bytes(setup, sp, lay)
    if secondary:
        items.insert(1, LineItem(
            "secondary_weights", secondary,
            f"{r.weight_bytes} B x {params_txt} / hpZ group ({dense_shard_degree(lay)} dense, "
            f"{expert_shard_degree(lay):g} expert): ZeRO++ hpZ's copy for the gathers after each step's first forward",
            "DeepSpeed 0.19.8 runtime/zero/partition_parameters.py _partition_param_sec (zero_hpz_partition_size)"))
    cache = weight_cache_per_param(r)
    if cache is not None:
        dt = r.gemm_dtype
        items.append(LineItem(f"{dt}_weight_cache", weight_cache_bytes(setup, sp),
                              f"{cache:g} B ({dt} weight + transpose) x local layer params", r.source))
    inflight = inflight_for_stage(setup, sl.stage)
    per_mb = stage_activation_bytes_per_microbatch(setup, sl)
    items.append(LineItem(
        "activations", per_mb * inflight,
        f"{_gb(per_mb)} per micro-batch ({sl.dense} dense + {sl.moe} MoE layers, {setup.tokens_per_microbatch} "
        f"tokens, tp={lay.tp}{' sp' if lay.sequence_parallel else ''}, recompute={lay.recompute}) x {inflight:g} "
        f"in flight ({lay.schedule if lay.pp > 1 else 'no pipeline'}, stage {sl.stage})",
        f"{act.PAPER_SOURCE}, generalised per saved tensor ({setup.impl.name}); in-flight count from the simulated "
        "schedule (Narayanan et al. 2021)"))
    working = recompute_working_set_bytes(setup, sl) if lay.recompute != "none" else 0.0
    kept_loss, transient = logits_bytes(setup, inflight) if sl.last else (0.0, 0.0)
    held = loss_kept_microbatches(setup, inflight) if sl.last else 0.0
    # what a micro-batch's backward has freed before it reaches the last layer: its loss's kept bytes and the saved
    # inputs of the final norm and the output layer
    freed = (kept_loss / held if held else 0.0) + (output_layer_activation_bytes(setup) if sl.last else 0.0)
    remat, transient_left = backward_peaks(working, freed, transient)
    if lay.recompute != "none":
        per_op = op_level_selective(setup)
        what = ("one layer's ops that op-level selective checkpointing does not keep, rematerialised during backward"
                if per_op else f"one layer rematerialised during backward ({lay.recompute} recompute)")
        if freed:
            what += (f": {_gb(working)} less the {_gb(min(working, freed))} its micro-batch's loss and output layer "
                     "backward have freed by then")
        items.append(LineItem(
            "recompute_working_set", remat, what,
            "torch.utils.checkpoint (non-reentrant): a checkpointed block's recomputed tensors live until backward "
            "consumes them; measured by dtc smoke (compiler/runtime/measure.py count_recomputation)"
            if per_op else act.PAPER_SOURCE))
    if sl.last:
        loss = loss_memory(setup)
        kept_b, transient_b = loss.per_logit(setup.recipe.activation_bytes)
        logits = f"{setup.tokens_per_microbatch} tokens x {setup.shape.vocab_size}/{setup.loss_vocab_shards} vocab"
        kept = f" x {held:g} micro-batches" if held != 1 else ""
        items.append(LineItem("logits_loss", kept_loss, f"{logits} x {kept_b:g} B ({loss.kept_what}){kept}",
                              loss.source))
        if transient:
            less = (f", less the {_gb(transient - transient_left)} the rematerialised layer holds at another moment "
                    "(never live together)" if transient_left < transient else "")
            items.append(LineItem("loss_transient", transient_left,
                                  f"{logits} x {transient_b:g} B ({loss.transient_what}) while the loss runs{less}",
                                  loss.source))
    if lay.zero_stage == 3:
        items.append(LineItem("zero3_gathered_params", zero3_gathered_bytes(setup, sp),
                              f"largest unit {format_count(max(sp.layer_dense, sp.embedding))} params x "
                              f"(2 x {r.weight_bytes} B gathered + prefetch, {setup.grad_bytes} B unsharded grad)"
                              + (f", at most {format_count(setup.framework.zero3_live_params)} live"
                                 if setup.framework.zero3_live_params else ""),
                              "Zhao et al. 2023, PyTorch FSDP, sec. 3.3 (prefetch) / DeepSpeed ZeRO-3 prefetch"))
    staging = offload_grad_buffer_bytes(setup, sl)
    if staging:
        items.append(LineItem("offload_grad_buffer", staging,
                              f"largest parameter ({format_count(staging / r.weight_bytes)}) x {r.weight_bytes} B: "
                              "the staging buffer of gradients copied to the offloaded optimizer",
                              "DeepSpeed 0.19.8 runtime/zero/stage_1_and_2.py temp_grad_buffer_for_gpu_offload"))
    buckets = dp_bucket_bytes(setup, sp)
    if buckets:
        items.append(LineItem("dp_comm_buckets", buckets,
                              "torch DDP 25 MB bucket" if lay.zero_stage == 0 else
                              f"min(5e8, local params) x {setup.grad_bytes} B reduce bucket",
                              eff.physics.sources["allowances"]["torch_ddp_bucket_bytes" if lay.zero_stage == 0
                                                    else "deepspeed_bucket_elements"]))
    items.append(LineItem("cuda_context", eff.cuda_context_bytes, f"{_gb(eff.cuda_context_bytes)} allowance",
                          eff.physics.sources["allowances"]["cuda_context_bytes"]))
    groups = num_process_groups(lay)
    items.append(LineItem("nccl_buffers", groups * eff.nccl_bytes_per_group,
                          f"{groups} communicators x {_gb(eff.nccl_bytes_per_group)}",
                          eff.physics.sources["allowances"]["nccl_bytes_per_group"]))
    allocated = sum(i.value for i in items if i.name not in ("cuda_context", "nccl_buffers"))
    items.append(LineItem("fragmentation", eff.fragmentation_fraction * allocated,
                          f"{eff.fragmentation_fraction:.0%} x {_gb(allocated)} allocated",
                          eff.physics.sources["allowances"]["fragmentation_fraction"]))
    return items


def usable_bytes_per_gpu(setup: Setup) -> int:
    """HBM minus the spec's headroom; allowances are line items, not subtracted here."""
    return int(setup.gpu.spec.hbm_bytes * (1.0 - setup.problem.memory_headroom))


def candidate_stages(setup: Setup) -> list[StageLayers]:
    """One stage per distinct (dense layers, MoE layers, first, last): the earliest of each, since
    stages that hold the same layers hold the same states and earlier stages keep at least as
    many micro-batches in flight. The maximum over these is the maximum over all stages."""
    seen, out = set(), []
    for sl in setup.stages:
        key = (sl.dense, sl.moe, sl.first, sl.last)
        if key not in seen:
            seen.add(key)
            out.append(sl)
    return out


def memory_breakdown(setup: Setup) -> MemoryBreakdown:
    best: list[LineItem] | None = None
    best_total, best_stage = -1.0, 0
    for sl in candidate_stages(setup):
        items = stage_memory_items(setup, sl)
        total = sum(i.value for i in items)
        if total > best_total:
            best, best_total, best_stage = items, total, sl.stage
    assert best is not None
    lay = setup.layout
    host = {"cpu": 0.0, "nvme": 0.0}
    if lay.offload_optimizer != "none" or lay.offload_params != "none":
        # every GPU of a node taken as the stage that offloads the most (the stages differ by their embedding
        # and output layers): an upper bound of any node's sum
        for sl in candidate_stages(setup):
            sp = stage_params(setup.shape, setup.params, sl, tp=lay.tp, ep=lay.ep, etp=lay.etp, pp=lay.pp,
                              vocab_tp=setup.vocab_shards)
            for device, n in offloaded_bytes_per_gpu(setup, sl, sp, lay).items():
                host[device] = max(host[device], n)
    cpu = int(host["cpu"] * lay.gpus_on_a_node)
    return MemoryBreakdown(
        items=tuple(best),
        total_bytes_per_gpu=int(best_total),
        hbm_bytes_per_gpu=int(setup.gpu.spec.hbm_bytes),
        usable_bytes_per_gpu=usable_bytes_per_gpu(setup),
        cpu_bytes_per_node=cpu,
        nvme_bytes_per_node=int(host["nvme"] * lay.gpus_on_a_node),
        usable_cpu_bytes_per_node=(usable_host_bytes_per_node(setup) or None) if cpu else None,
        stage=best_stage,
    )
