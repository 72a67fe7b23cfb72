"""Collective communication: which link a group crosses, how long each collective takes.

Rank order (Megatron-Core's default "tp-cp-ep-dp-pp"): tp varies fastest, then cp, then
dp (dp_shard inside dp_replicate), then pp. The expert layers re-fold a stage's tp x cp x dp
ranks as etp x ep x expert-dp in that order (Megatron-Core's expert rank generator, order
"tp-ep-dp-pp"): an ep group is ep consecutive ranks of stride etp (tp with the default
etp = tp, when ep is carved out of cp x dp), the expert data-parallel group the rest. A group
of ``size`` ranks spaced ``stride`` apart stays on NVLink when stride x size <= the NVLink domain (the node, or
the 72-GPU rack of NVL72 systems); otherwise it crosses the network.

Time formulas (ring algorithms, Thakur et al. 2005; the nccl-tests "bus bandwidth"
convention, github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):

* all-reduce:      2 (n-1)/n x bytes / busbw + 2 (n-1) x latency
* all-gather / reduce-scatter: (n-1)/n x bytes / busbw + (n-1) x latency  (bytes = the full buffer)
* all-to-all:      (n-1)/n x bytes per GPU, the off-node share over the NIC, the rest over NVLink
* point-to-point:  bytes / link bandwidth + latency

busbw = link bandwidth x busbw_fraction. Across nodes, a group with g members in each
NVLink domain drives g NICs at once (NCCL runs one ring per NIC), so its bus bandwidth
is min(NVLink, g x per-GPU network bandwidth).
"""
from __future__ import annotations

from dataclasses import dataclass

from compiler.costmodel.activations import attention_widths
from compiler.costmodel.context import GEMM_INPUT_BYTES, Setup
from compiler.costmodel.memory import runs_hpz
from compiler.costmodel.stages import StageParams

INTRA = "intra_node"
INTER = "inter_node"
INTER_SCALE = "inter_node_bandwidth_scale"  # a cluster profile's multiplier on inter-node bandwidth (1 without one)


@dataclass(frozen=True)
class GroupLink:
    link: str  # INTRA or INTER
    busbw_bytes_per_s: float
    latency_s: float
    members_per_domain: int


def group_link(setup: Setup, stride: int, size: int) -> GroupLink:
    """The link a group of ``size`` ranks spaced ``stride`` apart uses, and its bus bandwidth."""
    eff = setup.eff
    domain = setup.nvlink_domain_gpus
    intra_bw = setup.gpu.intra_node_bandwidth_bytes_per_s * eff.busbw_fraction[INTRA]
    if stride * size <= domain:
        return GroupLink(INTRA, intra_bw, eff.latency_s[INTRA], size)
    per_domain = max(1, min(size, domain // stride)) if stride < domain else 1
    inter_bw = setup.gpu.inter_node_bandwidth_bytes_per_s * eff.busbw_fraction[INTER] * eff.profile_scale(INTER_SCALE)
    return GroupLink(INTER, min(intra_bw, per_domain * inter_bw), eff.latency_s[INTER], per_domain)


def all_reduce_time_s(nbytes: float, n: int, link: GroupLink) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / link.busbw_bytes_per_s + 2 * (n - 1) * link.latency_s


def all_gather_time_s(nbytes: float, n: int, link: GroupLink) -> float:
    """``nbytes``: the gathered (full) buffer."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) / n * nbytes / link.busbw_bytes_per_s + (n - 1) * link.latency_s


def reduce_scatter_time_s(nbytes: float, n: int, link: GroupLink) -> float:
    """``nbytes``: the full (unreduced) buffer each rank contributes."""
    return all_gather_time_s(nbytes, n, link)


def p2p_time_s(nbytes: float, link: GroupLink, setup: Setup) -> float:
    """One GPU to one GPU: NVLink inside the domain, that GPU's NIC across it."""
    if nbytes <= 0:
        return 0.0
    if link.link == INTRA:
        bw = link.busbw_bytes_per_s
    else:
        bw = (setup.gpu.inter_node_bandwidth_bytes_per_s * setup.eff.busbw_fraction[INTER]
              * setup.eff.profile_scale(INTER_SCALE))
    return nbytes / bw + link.latency_s


# --- the groups of a layout ----------------------------------------------------------------------------


def tp_link(setup: Setup) -> GroupLink:
    return group_link(setup, 1, setup.layout.tp)


def cp_link(setup: Setup) -> GroupLink:
    lay = setup.layout
    return group_link(setup, lay.tp, lay.cp)


def ep_link(setup: Setup) -> GroupLink:
    lay = setup.layout
    return group_link(setup, lay.expert_tp, lay.ep)


def expert_tp_link(setup: Setup) -> GroupLink:
    return group_link(setup, 1, setup.layout.expert_tp)


def expert_dp_group(setup: Setup, ranks: int) -> tuple[int, GroupLink]:
    """The expert data-parallel group over ``ranks`` of a stage's tp-major ranks (tp x cp x the dp ranks a
    collective spans): its size, ranks / (etp x ep) at least 1, and its link (stride etp x ep)."""
    lay = setup.layout
    n = max(1, ranks // (lay.ep * lay.expert_tp))
    return n, group_link(setup, lay.expert_tp * lay.ep, n)


def dp_cp_link(setup: Setup) -> GroupLink:
    """Dense gradients are reduced over dp x cp (contiguous after tp)."""
    lay = setup.layout
    return group_link(setup, lay.tp, lay.dp * lay.cp)


def shard_link(setup: Setup) -> GroupLink:
    lay = setup.layout
    return group_link(setup, lay.tp, lay.dp_shard * lay.cp)


def replicate_link(setup: Setup) -> GroupLink:
    lay = setup.layout
    return group_link(setup, lay.tp * lay.cp * lay.dp_shard, lay.dp_replicate)


def pp_link(setup: Setup) -> GroupLink:
    lay = setup.layout
    return group_link(setup, lay.tp * lay.cp * lay.dp, lay.pp)


# --- per micro-batch volumes ----------------------------------------------------------------------------


def activation_message_bytes(setup: Setup) -> float:
    """One micro-batch's hidden states on one GPU: tokens x hidden x activation bytes."""
    return setup.tokens_per_microbatch * setup.shape.hidden_size * setup.recipe.activation_bytes


def tp_comm_time_per_layer_s(setup: Setup) -> tuple[float, float]:
    """(forward, backward): 2 all-reduces each way per layer (attention and MLP), or with sequence
    parallelism 2 all-gathers + 2 reduce-scatters of the same volume (Korthikanti et al. 2022, sec. 4.2.2)."""
    return setup.memo("tp_comm_time_per_layer_s", lambda: _tp_comm_time_per_layer_s(setup))


def _tp_comm_time_per_layer_s(setup: Setup) -> tuple[float, float]:
    tp = setup.layout.tp
    if tp == 1:
        return 0.0, 0.0
    t = 2 * all_reduce_time_s(activation_message_bytes(setup), tp, tp_link(setup))
    return t, t


def tp_comm_time_per_moe_layer_s(setup: Setup) -> tuple[float, float]:
    """(forward, backward) tensor-parallel collectives of an MoE layer. The attention's pair stays over tp, and the
    shared experts' (moe/shared_experts.py gathers and reduce-scatters the sequence-parallel input over tp). The
    routed experts' depend on the framework (CostProfile.moe_tp_gathers_copies): Megatron-Core's dispatcher
    all-gathers the tokens the all-to-all brought over the expert tensor-parallel group and reduce-scatters them
    after the experts (token_dispatcher.py dispatch_postprocess: gather_from_sequence_parallel_region over
    expt_tp), every routed copy of a token, top_k per token, in the etp/tp share of a hidden-state message each
    (none with etp = 1: the experts take each rank's sequence-parallel shard whole). A framework that runs the
    expert path as a dense MLP (etp = tp) moves one hidden-state message over tp, as tp_comm_time_per_layer_s."""
    return setup.memo("tp_comm_time_per_moe_layer_s", lambda: _tp_comm_time_per_moe_layer_s(setup))


def moe_tp_differs(setup: Setup) -> bool:
    """Whether an MoE layer's tensor-parallel traffic differs from a dense layer's (tp_comm_time_per_moe_layer_s)."""
    return setup.shape.moe is not None and (setup.layout.etp is not None or setup.framework.moe_tp_gathers_copies)


def _tp_comm_time_per_moe_layer_s(setup: Setup) -> tuple[float, float]:
    lay = setup.layout
    if not moe_tp_differs(setup):
        return tp_comm_time_per_layer_s(setup)
    msg = activation_message_bytes(setup)
    over_tp, over_etp = moe_layer_tp_messages(setup)
    t = over_tp * all_reduce_time_s(msg, lay.tp, tp_link(setup)) \
        + all_reduce_time_s(msg * over_etp, lay.expert_tp, expert_tp_link(setup))
    return t, t


def moe_layer_tp_messages(setup: Setup) -> tuple[float, float]:
    """Hidden-state messages an MoE layer all-reduces (or gathers and scatters) each way: (over tp, over the etp
    group); see tp_comm_time_per_moe_layer_s."""
    lay, m = setup.layout, setup.shape.moe
    if not moe_tp_differs(setup):
        return 2.0, 0.0
    assert m is not None
    shared = 1.0 if m.num_shared_experts else 0.0
    copies = m.top_k if setup.framework.moe_tp_gathers_copies else 1
    return 1.0 + shared, (copies * lay.expert_tp / lay.tp if lay.expert_tp > 1 else 0.0)


def cp_kv_chunk_bytes(setup: Setup) -> float:
    """One rank's K and V for its s/cp tokens (heads split by tp): what each ring step passes on."""
    w = attention_widths(setup.shape)
    return setup.tokens_per_microbatch * (w.k_width + w.v_width) / setup.layout.tp * setup.recipe.activation_bytes


def cp_comm_time_per_layer_s(setup: Setup) -> tuple[float, float]:
    """Ring attention (Liu et al. 2023; TE context parallel p2p): forward passes the local K,V chunk
    around the ring (cp-1 sends); backward passes K,V and their gradients (2 (cp-1) sends)."""
    return setup.memo("cp_comm_time_per_layer_s", lambda: _cp_comm_time_per_layer_s(setup))


def _cp_comm_time_per_layer_s(setup: Setup) -> tuple[float, float]:
    cp = setup.layout.cp
    if cp == 1:
        return 0.0, 0.0
    kv = cp_kv_chunk_bytes(setup)
    link = cp_link(setup)
    fwd = (cp - 1) * p2p_time_s(kv, link, setup)
    return fwd, 2 * fwd


def expected_remote_domains_per_token(top_k: int, ep: int, members_per_domain: int) -> float:
    """Distinct other NVLink domains a token's top_k experts land in, for uniform routing over
    ep / members_per_domain domains: (d - 1) x (1 - (1 - 1/d)^k)."""
    domains = max(1, ep // max(1, members_per_domain))
    if domains == 1:
        return 0.0
    return (domains - 1) * (1.0 - (1.0 - 1.0 / domains) ** top_k)


def moe_all_to_all_time_s(tokens: float, bytes_per_copy: float, top_k: int, setup: Setup) -> float:
    """One dispatch (or combine) of ``tokens`` local tokens, each to top_k experts over the ep group.
    Inside the NVLink domain each copy moves over NVLink. Across domains, frameworks with a
    hierarchical dispatcher send a token over the network once per destination domain and forward it
    over NVLink there (DeepSeek-V3 report sec. 3.2.2; DeepEP; Megatron-Core flex dispatcher); plain
    NCCL all-to-all dispatchers send every copy. Link rates at the achieved all-to-all fraction
    (physics.yaml comm.all_to_all_fraction, DeepEP's measured bandwidths)."""
    ep = setup.layout.ep
    link = ep_link(setup)
    a2a = setup.eff.physics.all_to_all_fraction
    dispatch = setup.eff.profile_scale("all_to_all_scale")
    intra_bw = setup.gpu.intra_node_bandwidth_bytes_per_s * a2a[INTRA] * dispatch
    g = link.members_per_domain if link.link == INTER else ep
    local_copies = top_k * (g - 1) / ep  # copies to other GPUs of the own domain
    remote_copies = top_k * (ep - g) / ep if link.link == INTER else 0.0
    on = tokens * bytes_per_copy * (local_copies + remote_copies) / intra_bw
    if link.link == INTRA:
        return on + link.latency_s
    if setup.framework.hierarchical_all_to_all:
        remote = expected_remote_domains_per_token(top_k, ep, g)
    else:
        on = tokens * bytes_per_copy * local_copies / intra_bw
        remote = remote_copies
    nic = setup.gpu.inter_node_bandwidth_bytes_per_s * a2a[INTER] * setup.eff.profile_scale(INTER_SCALE) * dispatch
    return max(on, tokens * bytes_per_copy * remote / nic) + link.latency_s


def ep_comm_time_per_moe_layer_s(setup: Setup) -> tuple[float, float]:
    """Forward: dispatch (bf16 hidden states, or FP8 under an fp8 recipe where the framework quantises before the
    dispatch, CostProfile.moe_dispatch_fp8; no FP4 dispatch is modelled) + combine (bf16);
    backward: the two transposed all-to-alls of bf16 gradients (Megatron-Core MoE token dispatcher;
    Lepikhin et al. 2020, GShard)."""
    return setup.memo("ep_comm_time_per_moe_layer_s", lambda: _ep_comm_time_per_moe_layer_s(setup))


def _ep_comm_time_per_moe_layer_s(setup: Setup) -> tuple[float, float]:
    lay, m = setup.layout, setup.shape.moe
    if lay.ep == 1 or m is None:
        return 0.0, 0.0
    tokens = setup.tokens_per_microbatch / (lay.tp if lay.sequence_parallel else 1)
    h, r = setup.shape.hidden_size, setup.recipe
    dispatch_bytes = h * (1 if r.gemm_dtype == "fp8" and setup.framework.moe_dispatch_fp8 else r.activation_bytes)
    combine_bytes = h * r.activation_bytes
    fwd = (moe_all_to_all_time_s(tokens, dispatch_bytes, m.top_k, setup)
           + moe_all_to_all_time_s(tokens, combine_bytes, m.top_k, setup))
    bwd = 2 * moe_all_to_all_time_s(tokens, combine_bytes, m.top_k, setup)
    return fwd, bwd


def pp_p2p_time_s(setup: Setup) -> float:
    """Activations (forward) or their gradients (backward) between neighbouring stages; Megatron sends
    1/tp of them and all-gathers inside the next stage (scatter-gather optimisation, Narayanan 2021 sec. 4.1)."""
    lay = setup.layout
    if lay.pp == 1:
        return 0.0
    return p2p_time_s(activation_message_bytes(setup) / lay.tp, pp_link(setup), setup)


# --- data parallel / ZeRO / FSDP ---------------------------------------------------------------------


@dataclass(frozen=True)
class Collective:
    """One data-parallel collective of a step on one GPU."""

    name: str
    group: str
    group_size: int
    link: str
    bytes_per_call: float
    time_per_call_s: float
    calls_per_step: int
    phase: str  # "forward"/"backward": per micro-batch, hidden behind that pass; "step_grad"/"step_param": once


def _collective(name: str, group: str, kind: str, nbytes: float, n: int, link: GroupLink, calls: int,
                phase: str) -> Collective | None:
    if n <= 1 or nbytes <= 0:
        return None
    fn = {"all_reduce": all_reduce_time_s, "all_gather": all_gather_time_s,
          "reduce_scatter": reduce_scatter_time_s}[kind]
    return Collective(name, group, n, link.link, nbytes, fn(nbytes, n, link), calls, phase)


def _per_unit(c: Collective | None, units: int, link: GroupLink) -> Collective | None:
    """The same bytes moved as ``units`` collectives: (units - 1) more ring latencies."""
    if c is None or units <= 1:
        return c
    extra = (units - 1) * (c.group_size - 1) * link.latency_s
    return Collective(c.name, c.group, c.group_size, c.link, c.bytes_per_call, c.time_per_call_s + extra,
                      c.calls_per_step, c.phase)


def dp_collectives(setup: Setup, sp: StageParams, units: int = 1) -> list[Collective]:
    """Gradient reduction and parameter gathering of one step, by ZeRO stage.

    * ZeRO 0 (DDP): all-reduce the gradients over dp x cp once per step (accumulated locally).
    * ZeRO 1 (Megatron distributed optimizer): reduce-scatter the gradients once per step, all-gather
      the updated bf16 parameters once per step.
    * ZeRO 2 (FSDP SHARD_GRAD_OP / DeepSpeed stage 2): the gradient shard is kept, so the reduce-scatter
      runs after every micro-batch's backward; one parameter all-gather per step.
    * ZeRO 3 (FSDP FULL_SHARD): per micro-batch, all-gather parameters for forward and again for
      backward (reshard after forward) and reduce-scatter the gradients (Zhao et al. 2023, sec. 3).
    * HSDP (dp_replicate > 1): the sharded gradient is also all-reduced across replicas once per step.
    * ZeRO++ hpZ (a cost profile's hybrid_shard "hpz", DeepSpeed's HSDP): the gradients are reduce-scattered
      over all dp x cp ranks and nothing is all-reduced across replicas; the first micro-batch's forward
      gathers from the primary partition over all of them (once per step, costed beside ZeRO-1/2's parameter
      gather), every other gather from the secondary copy inside the dp_shard group (the per-micro-batch
      forward gathers count that first micro-batch's too: one intra-group gather per step more than run).
    Experts use their own group: tp x dp x cp / (etp x ep) ranks at stride etp x ep (expert_dp_group).
    ZeRO-3 gathers and reduces one unit (a decoder layer, or the embedding) at a time: ``units``
    collectives per pass, each paying the ring's latency (NCCL all-gather / reduce-scatter are rings); a
    framework that gathers per weight matrix (its cost profile's zero3_gathers_per_layer) pays that many per
    unit.
    """
    lay, r, m = setup.layout, setup.recipe, setup.num_microbatches
    units *= setup.framework.zero3_gathers_per_layer
    out: list[Collective | None] = []
    parts = [("dense", sp.dense, lay.dp_shard * lay.cp if lay.zero_stage else lay.dp * lay.cp,
              shard_link(setup) if lay.zero_stage else dp_cp_link(setup))]
    if sp.expert:
        shard = lay.dp_shard if lay.zero_stage else lay.dp
        parts.append(("expert", sp.expert, *expert_dp_group(setup, lay.tp * shard * lay.cp)))
    hpz = runs_hpz(setup, lay)
    for part, params, n, link in parts:
        # --fp4-param-gather all-gathers the NVFP4 weights ("perform the param all-gather in fp4"): one copy, the
        # transpose is made after the gather (the kept weights hold both)
        gathered = GEMM_INPUT_BYTES[r.gemm_dtype] if r.quantised_weights else r.weight_bytes
        grads, weights = params * setup.grad_reduce_bytes, params * gathered
        z = lay.zero_stage
        if z == 0:
            out.append(_collective(f"{part}_grad_all_reduce", "dp", "all_reduce", grads, n, link, 1, "step_grad"))
            continue
        if z == 1:
            out.append(_collective(f"{part}_grad_reduce_scatter", "dp", "reduce_scatter", grads, n, link, 1, "step_grad"))
        elif hpz:  # over every dp x cp rank (the expert part: its expert data-parallel group), not the hpZ group
            n_all, link_all = ((lay.dp * lay.cp, dp_cp_link(setup)) if part == "dense"
                               else expert_dp_group(setup, lay.tp * lay.dp * lay.cp))
            c = _collective(f"{part}_grad_reduce_scatter", "dp", "reduce_scatter", grads, n_all, link_all, m,
                            "backward")
            out.append(_per_unit(c, units, link_all))
            c = _collective(f"{part}_param_all_gather_fwd_primary", "dp", "all_gather", weights, n_all, link_all, 1,
                            "step_param")
            out.append(_per_unit(c, units, link_all))
        else:
            c = _collective(f"{part}_grad_reduce_scatter", "dp", "reduce_scatter", grads, n, link, m, "backward")
            out.append(_per_unit(c, units, link) if z == 3 else c)
        if z in (1, 2):
            out.append(_collective(f"{part}_param_all_gather", "dp", "all_gather", weights, n, link, 1, "step_param"))
        else:
            gathers = [("fwd", "forward"), ("bwd", "backward")]
            if setup.framework.zero3_blocking and lay.recompute == "full":
                # the recomputed forward runs each submodule's forward hooks again: fetched again, released again
                gathers.append(("recompute", "backward"))
            for name, phase in gathers:
                c = _collective(f"{part}_param_all_gather_{name}", "dp", "all_gather", weights, n, link, m, phase)
                out.append(_per_unit(c, units, link))
        if lay.dp_replicate > 1 and not hpz:
            out.append(_collective(f"{part}_grad_all_reduce_replicas", "dp", "all_reduce", grads / n,
                                   lay.dp_replicate, replicate_link(setup), 1, "step_grad"))
    return [c for c in out if c is not None]
