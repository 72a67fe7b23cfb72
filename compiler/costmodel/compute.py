"""FLOPs and compute time, from published kernel benchmarks (compiler/data/physics.yaml).

FLOP convention (dtc's; the Megatron-Bridge 25.09+ accounting):

    model FLOPs per token = 6 x (GEMM parameters a token passes through)
                          + 3 x (attention-core forward FLOPs per token)

* GEMM parameters: every decoder layer's attention projections (q, k, v, out; MLA's
  down/up projections), its MLP (three matrices for SwiGLU, two for GELU), for MoE
  layers the router, the shared experts and top_k routed experts (active parameters
  only), plus the output layer (logits GEMM, vocab x hidden, also when tied). Input
  embeddings (a lookup) and norms are not GEMMs and are not counted. 6 = 2 (multiply-add)
  x 3 (forward, input gradient, weight gradient).
* Attention core forward per token and layer: 2 x heads x (qk_head_dim + v_head_dim) x s/2
  (QK^T and AV; causal mask: each query sees s/2 keys on average). For MHA that is 2hs,
  i.e. 6hs per layer per token over forward and backward (the "12lhs" of torchtitan and
  llm-foundry halved for causality, as Megatron-Bridge does since 25.09).
* Hardware FLOPs add recomputation: full recompute replays every layer's forward
  (2 x layer GEMM parameters + the attention forward; not the output layer);
  selective recompute replays the attention core forward.

Time of one micro-batch on one GPU, per part (each with its source in physics.yaml):

* GEMMs: FLOPs / (dense peak[dtype] x measured large-GEMM fraction of the kernel class and
  dtype/fp8 or nvfp4 recipe x fit.compute_scale x power factor) + a fixed time per kernel, or the memory
  roofline of its operands when longer. Backward = dgrad + wgrad = 2 x forward. MoE experts run
  as one grouped GEMM per projection (physics.yaml grouped_fraction) with balanced routing.
* fp8 / nvfp4 casts: every activation (forward) and output-gradient (backward) GEMM input is quantised,
  gemm.quantize_bytes_per_element[recipe] of HBM traffic per element.
* Attention core: the kernel the framework asks for (cuDNN, FlashAttention-2/3), measured
  forward and backward rates against sequence length (per CP rank) and head dim; Megatron-LM
  before FlashAttention: two batched GEMMs over the full s x s scores + softmax traffic.
* Memory-bound work (norms, activations, rope, residuals, dropout, MoE permutes):
  fit.memory_bound_traffic x the bytes a layer saves for backward, at the framework's kernels'
  achieved HBM fraction (fused or eager).
* Launch-bound layers: a layer cannot run faster than its host launches its kernels
  (framework ops per layer x fit.cpu_op_s); dense layers overlap launches with GPU work. A MoE
  layer's forward synchronises the host with the GPU on the token counts (Megatron-Core
  token_dispatcher.py: the alltoall dispatcher's cuda_sync_point "before_ep_alltoall" for ep > 1,
  HybridEP's CPU sync on num_permuted_tokens without a static token budget), so the GPU has
  drained when the host starts launching the MoE block (router to combine: the ops a MoE layer adds
  to a dense one) and waits for those launches; the forward pays max(GPU + MoE-block launches,
  all launches), the backward (counts kept from the forward) max(GPU, launches). A framework that
  replays the whole iteration as one CUDA graph (cost profile cuda_graphs) launches nothing per
  kernel and has no such sync.
* Gradient-buffer traffic of every local parameter in backward (weight-gradient accumulation).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from compiler.costmodel.activations import attention_widths
from compiler.costmodel.context import GEMM_INPUT_BYTES, QUANTISED_GEMM_DTYPES, Setup
from compiler.costmodel.memory import activation_bytes_per_layer_kind, fused_activation_bytes_per_layer
from compiler.costmodel.stages import StageLayers, stage_params
from compiler.model import ModelShape, ParamCount

if TYPE_CHECKING:
    from compiler.catalog import GpuSpec

# --- the FLOP convention (whole model, per token) --------------------------------------------------


def gemm_params_per_token(shape: ModelShape, pc: ParamCount) -> float:
    """Parameters of the GEMMs one token passes through (active experts only, logits included)."""
    dense_layer = pc.attention_per_layer + pc.dense_mlp_per_layer
    moe_layer = (pc.attention_per_layer + pc.moe_router_per_layer + pc.shared_expert_per_layer
                 + pc.top_k * pc.expert_params_per_expert)
    logits = shape.vocab_size * shape.hidden_size
    return pc.num_dense_layers * dense_layer + pc.num_moe_layers * moe_layer + logits


def layer_gemm_params_per_token(shape: ModelShape, pc: ParamCount) -> float:
    return gemm_params_per_token(shape, pc) - shape.vocab_size * shape.hidden_size


def window_keys_per_query(window: int, seq_len: float) -> float:
    """Keys a query attends to on average in a causal sliding-window layer: itself and the ``window`` before it,
    fewer for the first ``window`` positions of a sequence; s/2 (the causal convention) once the window spans the
    sequence."""
    if window + 1 >= seq_len / 2.0:
        return min(seq_len / 2.0, window + 1.0)
    return window + 1.0 - window * (window + 1.0) / (2.0 * seq_len)


def mean_keys_per_query(shape: ModelShape, seq_len: float) -> float:
    """Keys per query averaged over the decoder layers: s/2 for causal attention, the window's for windowed layers
    (ModelShape.is_window_layer)."""
    n_window = shape.num_window_layers
    full = seq_len / 2.0
    return full + n_window * (window_keys_per_query(shape.window_size, seq_len) - full) / shape.num_layers


def attention_core_flops_per_token_forward(shape: ModelShape, seq_len: int) -> float:
    """QK^T and AV over s/2 keys on average (causal; a sliding window's keys in windowed layers), all layers,
    forward only."""
    w = attention_widths(shape)
    return shape.num_layers * 2.0 * w.heads * (w.qk_head_dim + w.v_head_dim) * mean_keys_per_query(shape, seq_len)


def model_flops_per_token(shape: ModelShape, pc: ParamCount, seq_len: int) -> float:
    """6 x GEMM params + 3 x attention-core forward (the convention above)."""
    return 6.0 * gemm_params_per_token(shape, pc) + 3.0 * attention_core_flops_per_token_forward(shape, seq_len)


def recompute_flops_per_token(shape: ModelShape, pc: ParamCount, seq_len: int, recompute: str) -> float:
    if recompute == "full":
        return 2.0 * layer_gemm_params_per_token(shape, pc) + attention_core_flops_per_token_forward(shape, seq_len)
    if recompute == "selective":
        return attention_core_flops_per_token_forward(shape, seq_len)
    return 0.0


def hardware_flops_per_token(shape: ModelShape, pc: ParamCount, seq_len: int, recompute: str) -> float:
    return model_flops_per_token(shape, pc, seq_len) + recompute_flops_per_token(shape, pc, seq_len, recompute)


# --- GEMMs of one micro-batch on one GPU ---------------------------------------------------------------


@dataclass(frozen=True)
class Gemm:
    name: str
    m: float  # rows (tokens)
    n: float  # output columns on this GPU
    k: float  # reduction dimension on this GPU
    count: float  # how many such GEMMs (e.g. local experts)
    dtype: str  # bf16 / fp16 / fp32 / fp8 / fp4
    grouped: bool = False  # one grouped kernel for all ``count`` GEMMs (MoE experts)

    @property
    def forward_flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count

    @property
    def input_elements(self) -> float:
        """Elements of the activation input (quantised per use under fp8)."""
        return self.m * self.k * self.count

    @property
    def output_elements(self) -> float:
        """Elements of the output (its gradient is quantised in backward under fp8)."""
        return self.m * self.n * self.count


def gemm_kind(setup: Setup, dtype: str) -> str:
    """The physics.yaml gemm.fraction key: the dtype, or the quantised GEMMs' recipe (its family for fp8)."""
    if dtype not in QUANTISED_GEMM_DTYPES:
        return dtype
    recipe = setup.quant_recipe
    return "fp8_tensorwise" if recipe.startswith("fp8_tensorwise") else recipe


def sustained_rate_ratio(part: GpuSpec, reference: GpuSpec, dtype: str, reference_dtype: str | None = None,
                         *, dvfs_exponent: float, headroom: float = 1.0,
                         measured: Mapping[str, float] | None = None) -> float:
    """A power-bound tensor-core kernel's sustained rate on ``part`` over its measured rate on ``reference``.

    Parts of one generation run the same tensor cores; what differs under sustained load is the clock their power and
    SMs allow. Where a kernel benchmark measured both parts' best large 16-bit GEMM (``measured``, physics.yaml
    gemm.measured_tflops), the ratio of those figures, for every dtype, unless this dtype's datasheet peak ratio
    (relative to 16-bit's, x ``headroom``) is smaller still. Otherwise the board power sets the clock (physics.yaml
    power.dvfs_exponent: rate ~ power^(1/3)), never above what their datasheet peak allows (fewer SMs, a lower boost
    clock): min(peak ratio x headroom, (TDP ratio)^exponent). ``headroom``: how far below a tensor-core-bound rate the
    reference kernel ran (the class's largest GEMM fraction over this kernel's, 1 for the kernel that sets it): a
    kernel the tensor cores do not bound (NVFP4 at 0.38 of the B300's FP4 peak) is held back by what the parts share
    (SMs, clocks, memory), not by a part's smaller FP4 peak. Across generations (a borrowed table) or without TDPs
    (custom GPUs): the peak ratio."""
    peak = part.peak_flops_for(dtype) / reference.peak_flops_for(reference_dtype or dtype)
    if part.generation != reference.generation:
        return peak
    if measured and part.name in measured and reference.name in measured:
        sixteen_bit = part.peak_flops_for("bf16") / reference.peak_flops_for("bf16")
        return measured[part.name] / measured[reference.name] * min(1.0, peak / sixteen_bit * headroom)
    if not part.tdp_w or not reference.tdp_w:
        return peak
    return min(peak * headroom, (part.tdp_w / reference.tdp_w) ** dvfs_exponent)


def _gemm_peak(setup: Setup, dtype: str, fraction: float) -> float:
    """The peak the GEMM fraction applies to: this part's, or its sustained equivalent of the reference part's."""
    physics = setup.eff.physics
    reference = physics.gemm_reference.get(setup.kernel_class)
    if reference is None:
        return setup.peak_flops_per_s(dtype)
    from compiler.catalog import load_catalog

    ref = load_catalog().gpus[reference]
    headroom = max(physics.gemm_fraction[setup.kernel_class].values()) / fraction
    return ref.peak_flops_for(dtype) * sustained_rate_ratio(setup.gpu.spec, ref, dtype,
                                                            dvfs_exponent=physics.dvfs_exponent, headroom=headroom,
                                                            measured=physics.gemm_measured_tflops)


def gemm_rate(setup: Setup, dtype: str) -> float:
    """Sustained FLOP/s of large GEMMs of this dtype on this GPU: the kernel benchmark's fraction of the dtype's peak,
    of this part's peak, or carried from the part it was measured on (physics.yaml gemm.reference)."""
    fraction = setup.eff.physics.gemm_fraction_for(setup.kernel_class, gemm_kind(setup, dtype))
    rate = setup.memo(("gemm_peak", dtype), lambda: _gemm_peak(setup, dtype, fraction)) * fraction \
        * setup.eff.fit("compute_scale") * setup.power_factor
    return rate * setup.eff.profile_scale("fp8_gemm_scale") if dtype == "fp8" else rate


def gemm_time_s(g: Gemm, setup: Setup) -> float:
    """max(compute, memory roofline) + the fixed kernel time (one per grouped kernel)."""
    rate = gemm_rate(setup, g.dtype) * (setup.eff.physics.grouped_gemm_fraction
                                        * setup.eff.profile_scale("grouped_gemm_scale") if g.grouped else 1.0)
    compute = g.forward_flops / rate
    in_bytes = GEMM_INPUT_BYTES.get(g.dtype) or (4 if g.dtype == "fp32" else 2)
    nbytes = ((g.m * g.k + g.k * g.n) * in_bytes + g.m * g.n * 2) * g.count
    memory = nbytes / setup.hbm_rate("fused")
    kernels = 1 if g.grouped else g.count
    return max(compute, memory) + kernels * setup.eff.physics.gemm_launch_s


def attention_gemms(setup: Setup, tokens: float) -> list[Gemm]:
    shape, tp, dt = setup.shape, setup.layout.tp, setup.recipe.gemm_dtype
    h = shape.hidden_size
    w = attention_widths(shape)
    if shape.mla is not None:
        m = shape.mla
        out = []
        if m.q_lora_rank:
            out += [Gemm("q_down", tokens, m.q_lora_rank, h, 1, dt),
                    Gemm("q_up", tokens, w.q_width / tp, m.q_lora_rank, 1, dt)]
        else:
            out.append(Gemm("q", tokens, w.q_width / tp, h, 1, dt))
        return out + [
            Gemm("kv_down", tokens, m.kv_lora_rank + m.qk_rope_head_dim, h, 1, dt),
            Gemm("kv_up", tokens, w.heads * (m.qk_nope_head_dim + m.v_head_dim) / tp, m.kv_lora_rank, 1, dt),
            Gemm("attention_out", tokens, h, w.out_width / tp, 1, dt),
        ]
    return [Gemm("qkv", tokens, (w.q_width + w.k_width + w.v_width) / tp, h, 1, dt),
            Gemm("attention_out", tokens, h, w.out_width / tp, 1, dt)]


def mlp_gemms(setup: Setup, tokens: float, ffn: float, count: float, name: str, grouped: bool = False,
              tp: int | None = None) -> list[Gemm]:
    """``tp``: the ranks that split ``ffn`` (default the layout's tp; the routed experts': etp)."""
    shape, dt = setup.shape, setup.recipe.gemm_dtype
    tp = setup.layout.tp if tp is None else tp
    up = 2 if shape.gated_mlp else 1
    h = shape.hidden_size
    return [Gemm(f"{name}_fc1", tokens, up * ffn / tp, h, count, dt, grouped),
            Gemm(f"{name}_fc2", tokens, h, ffn / tp, count, dt, grouped)]


def tokens_per_local_expert(setup: Setup) -> float:
    """Routed token copies each local expert receives per micro-batch, routing balanced (the
    published MoE benchmarks force-balance; Megatron-Core --moe-router-force-load-balancing). An expert
    tensor-parallel group gathers its etp ranks' sequence-parallel shards: etp / tp of a micro-batch's tokens
    (all of them with the default etp = tp)."""
    m, lay = setup.shape.moe, setup.layout
    assert m is not None
    if lay.etp is None:
        return setup.tokens_per_microbatch * m.top_k * lay.ep / m.num_experts
    return setup.tokens_per_microbatch * lay.etp / lay.tp * m.top_k * lay.ep / m.num_experts


def layer_gemms(setup: Setup, moe_layer: bool) -> list[Gemm]:
    """Forward GEMMs of one decoder layer for one micro-batch on one GPU."""
    t = float(setup.tokens_per_microbatch)
    shape, lay = setup.shape, setup.layout
    gemms = attention_gemms(setup, t)
    if not moe_layer:
        return gemms + mlp_gemms(setup, t, shape.ffn_hidden_size, 1, "mlp")
    m = shape.moe
    assert m is not None
    local_experts = m.num_experts / lay.ep
    gemms.append(Gemm("router", t, m.num_experts, shape.hidden_size, 1, "bf16"))
    gemms += mlp_gemms(setup, tokens_per_local_expert(setup), m.expert_ffn_hidden_size, local_experts, "expert",
                       grouped=True, tp=lay.expert_tp)
    if m.num_shared_experts:
        gemms += mlp_gemms(setup, t, m.shared_ffn * m.num_shared_experts, 1, "shared_expert")
    return gemms


def logits_gemm(setup: Setup) -> Gemm:
    """The output layer runs in bf16 even in fp8 recipes (Megatron keeps it outside Transformer Engine)."""
    dt = "fp32" if setup.recipe.name == "fp32" else "bf16"
    return Gemm("logits", float(setup.tokens_per_microbatch), setup.shape.vocab_size / setup.vocab_shards,
                setup.shape.hidden_size, 1, dt)


def quantize_time_s(setup: Setup, gemms: list[Gemm]) -> tuple[float, float]:
    """(forward, backward) HBM time of quantising the fp8 (or fp4) GEMMs' activation inputs and output gradients."""
    quantised = [g for g in gemms if g.dtype in QUANTISED_GEMM_DTYPES]
    if not quantised:
        return 0.0, 0.0
    per_element = setup.eff.physics.quantize_bytes_per_element[setup.quant_recipe]
    rate = setup.hbm_rate("fused")
    return (sum(g.input_elements for g in quantised) * per_element / rate,
            sum(g.output_elements for g in quantised) * per_element / rate)


# --- attention core and memory-bound work --------------------------------------------------------------


def attention_core_flops_forward_per_layer(setup: Setup, keys_per_query: float | None = None) -> float:
    """One layer, one micro-batch, one GPU: local queries x (heads / tp) x s/2 keys (causal), or
    ``keys_per_query``."""
    w = attention_widths(setup.shape)
    keys = setup.seq_len / 2.0 if keys_per_query is None else keys_per_query
    return 2.0 * setup.tokens_per_microbatch * (w.heads / setup.layout.tp) * (w.qk_head_dim + w.v_head_dim) * keys


def attention_variant(setup: Setup) -> str:
    w = attention_widths(setup.shape)
    if w.qk_head_dim >= 160:
        return "mla"
    if w.qk_head_dim <= 96:
        return "hd64"
    return "hd128"


def _unfused_attention_s(setup: Setup) -> tuple[float, float]:
    """Megatron-LM before FlashAttention: QK^T and AV as batched GEMMs over all s x s scores (the causal
    half is computed and masked) and a fused scale-mask-softmax kernel reading/writing the scores
    (fwd: scores in, probabilities (+ dropout mask and output) out; bwd: the same in reverse)."""
    w = attention_widths(setup.shape)
    lay = setup.layout
    heads = w.heads / lay.tp
    seqs = setup.tokens_per_microbatch / (setup.seq_len / lay.cp)
    s, kv = setup.seq_len / lay.cp, setup.seq_len
    dt = "fp32" if setup.recipe.name == "fp32" else "bf16"
    batch = seqs * heads
    qk = Gemm("scores", s, kv, w.qk_head_dim, batch, dt, grouped=True)
    av = Gemm("context", s, w.v_head_dim, kv, batch, dt, grouped=True)
    fwd_gemm = gemm_time_s(qk, setup) + gemm_time_s(av, setup)
    scores = batch * s * kv
    per_score = setup.recipe.activation_bytes * (2 + (1.5 if setup.shape.linear_bias else 0.0))
    softmax = scores * per_score / setup.hbm_rate("fused")
    return fwd_gemm + softmax, 2.0 * fwd_gemm + softmax


def attention_core_time_s(setup: Setup) -> tuple[float, float]:
    """(forward, backward) of the attention core of one layer and micro-batch."""
    return setup.memo("attention_core_s", lambda: _attention_core_time_s(setup))


def _attention_core_time_s(setup: Setup) -> tuple[float, float]:
    kernel = setup.framework.attention
    if kernel == "unfused":
        return _unfused_attention_s(setup)
    curve, reference = setup.eff.physics.attention_curve(setup.kernel_class, kernel, attention_variant(setup))
    from compiler.catalog import load_catalog

    ref = load_catalog().gpus.get(reference)
    dt = "fp32" if setup.recipe.name == "fp32" else "bf16"
    physics = setup.eff.physics
    scale = 1.0 / sustained_rate_ratio(setup.gpu.spec, ref, dt, "bf16", dvfs_exponent=physics.dvfs_exponent,
                                       measured=physics.gemm_measured_tflops) if ref is not None else 1.0
    scale /= setup.eff.fit("compute_scale") * setup.power_factor * setup.eff.profile_scale("attention_scale")
    seq = setup.seq_len / setup.layout.cp  # each CP rank's kernels see its chunk of queries and keys

    def timed(flops: float, seq: float) -> tuple[float, float]:
        scaled = scale / long_sequence_attention_factor(seq, setup.eff.profile_scale("long_sequence_attention_scale"))
        total = flops * curve.seconds_per_forward_flop(seq) * scaled
        if curve.fwd:
            fwd = flops / (curve._at(curve.fwd, seq) * 1e12) * scaled
            return fwd, total - fwd
        return total / 3.5, total * 2.5 / 3.5

    full = timed(attention_core_flops_forward_per_layer(setup), seq)
    shape = setup.shape
    n_window = shape.num_window_layers
    if not n_window:
        return full
    # a windowed layer's kernel (FlashAttention's window_size, cuDNN's sliding window) runs each query block over
    # the key blocks its window reaches: as much work per query, and as many partly masked blocks, as causal
    # attention over a sequence twice the window, so its rate is the curve's there; the layers' mean is costed
    keys = window_keys_per_query(shape.window_size, setup.seq_len)
    window = timed(attention_core_flops_forward_per_layer(setup, keys), min(seq, 2.0 * keys))
    share = n_window / shape.num_layers
    return full[0] + share * (window[0] - full[0]), full[1] + share * (window[1] - full[1])


def long_sequence_attention_factor(seq: float, scale_at_32k: float) -> float:
    """A cluster profile's attention-rate multiplier at ``seq`` tokens: 1 at 4k, ``scale_at_32k`` at 32k, log-linear
    in between and beyond (clamped to 512 .. 32k tokens); 1 without a profile."""
    if scale_at_32k == 1.0:
        return 1.0
    x = min(max(math.log(seq / 4096.0) / math.log(8.0), -1.0), 1.0)
    return float(scale_at_32k ** x)


def elementwise_bytes_per_token(setup: Setup, moe_layer: bool, eager: bool) -> float:
    """Forward HBM bytes per token of one layer's elementwise steps (2 norms, 2 residual adds, RoPE on q and k,
    the MLP activation), fused or eager (physics.yaml memory_bound.bytes_per_element)."""
    shape, table = setup.shape, setup.eff.physics.elementwise_bytes
    k = 1 if eager else 0
    w = attention_widths(shape)
    norm = table[shape.norm][0 if setup.framework.fused_norm else k]
    out = 2 * shape.hidden_size * (norm + table["residual"][k])
    if shape.position == "rope":
        out += (w.q_width + w.k_width) * table["rope"][k]
    act = table["swiglu" if shape.gated_mlp else "gelu"][k]
    if moe_layer and shape.moe is not None:
        m = shape.moe
        ffn = m.top_k * m.expert_ffn_hidden_size + m.num_shared_experts * m.shared_ffn
    else:
        ffn = shape.ffn_hidden_size
    return out + ffn * act


def elementwise_traffic_ratio(setup: Setup, moe_layer: bool) -> float:
    """HBM bytes of the framework's elementwise kernels per byte of a fused implementation's: 1 for fused
    kernels; for eager PyTorch, what this block's steps move eagerly over what they move fused (a Llama block
    with composite RMSNorm, RoPE and SwiGLU ~3x; an MPT block with one-kernel LayerNorm and GELU and no RoPE 1x)."""
    if setup.framework.elementwise != "eager":
        return 1.0
    return setup.memo(("elementwise_ratio", moe_layer), lambda: elementwise_bytes_per_token(setup, moe_layer, True)
                      / elementwise_bytes_per_token(setup, moe_layer, False))


def memory_bound_time_per_layer_s(setup: Setup, moe_layer: bool) -> float:
    """Elementwise work of one layer (forward + backward): fitted traffic x saved bytes x the framework's
    elementwise traffic ratio / HBM rate. For eager blocks the saved bytes are the fused block's: the extra
    tensors an eager block keeps (fp32 norm copies, silu(gate)) are its elementwise kernels' extra traffic,
    which the ratio (physics.yaml bytes_per_element, counted per kernel) already holds."""
    if setup.framework.elementwise == "eager":
        saved = fused_activation_bytes_per_layer(setup, moe_layer=moe_layer)
    else:
        saved = activation_bytes_per_layer_kind(setup, moe_layer=moe_layer, recompute="none")  # memoised
    traffic = setup.eff.fit("memory_bound_traffic") * elementwise_traffic_ratio(setup, moe_layer)
    return traffic * saved / setup.hbm_rate()


def moe_permute_time_s(setup: Setup) -> float:
    """Permute before and unpermute after the experts, forward and backward: each token copy is read
    and written once per pass (Megatron-Core moe_utils.permute/unpermute)."""
    m = setup.shape.moe
    assert m is not None
    copies = setup.tokens_per_microbatch * m.top_k / (setup.layout.tp if setup.layout.sequence_parallel else 1)
    nbytes = copies * setup.shape.hidden_size * setup.recipe.activation_bytes * 2 * 2 * 2  # r+w, 2 ops, fwd+bwd
    return nbytes / setup.hbm_rate()


def cross_entropy_time_s(setup: Setup) -> tuple[float, float]:
    """(forward, backward) HBM time of the loss over one micro-batch's logits on this GPU (tokens x vocab / tp), by
    the framework's cross-entropy implementation under the run's precision (physics.yaml
    memory_bound.cross_entropy_bytes_per_element)."""
    f, b = setup.eff.physics.cross_entropy_bytes[setup.framework.cross_entropy_for(setup.recipe.name)]
    logits = setup.tokens_per_microbatch * setup.shape.vocab_size / setup.loss_vocab_shards
    rate = setup.hbm_rate("fused")
    return logits * f / rate, logits * b / rate


# --- one stage, one micro-batch ------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerTime:
    """GPU seconds of one decoder layer for one micro-batch, and its launches."""

    gemm_f: float
    attention: tuple[float, float]
    memory_bound: float  # forward + backward
    casts: tuple[float, float]
    permute: float  # forward + backward
    launch_f: float  # host launch time of the forward (backward: 2x)
    # ... of it, what the GPU waits for in a MoE layer's forward: the MoE block's launches, issued after the host
    # synchronises on the token counts (the GPU has drained by then, so they cannot run ahead of it)
    sync_wait_f: float = 0.0

    @property
    def forward_s(self) -> float:
        return self.gemm_f + self.attention[0] + (self.memory_bound + self.permute) / 3.0 + self.casts[0]

    @property
    def backward_s(self) -> float:
        return 2.0 * self.gemm_f + self.attention[1] + 2.0 * (self.memory_bound + self.permute) / 3.0 + self.casts[1]


def layer_time(setup: Setup, moe_layer: bool) -> LayerTime:
    return setup.memo(("layer_time", moe_layer), lambda: _layer_time(setup, moe_layer))


def _layer_time(setup: Setup, moe_layer: bool) -> LayerTime:
    gemms = layer_gemms(setup, moe_layer)
    fw = setup.framework
    ops: float = fw.ops_per_dense_layer
    moe_block: float = 0.0
    if moe_layer:
        m = setup.shape.moe
        assert m is not None
        ops = fw.ops_per_moe_layer + fw.ops_per_local_expert * m.num_experts / setup.layout.ep
        moe_block = ops - fw.ops_per_dense_layer  # router, dispatch, experts, combine: a MoE layer over a dense one
    op_s = 0.0 if fw.cuda_graphs == "full_iteration" else setup.eff.fit("cpu_op_s")
    return LayerTime(
        gemm_f=sum(gemm_time_s(g, setup) for g in gemms),
        attention=attention_core_time_s(setup),
        memory_bound=memory_bound_time_per_layer_s(setup, moe_layer),
        casts=quantize_time_s(setup, gemms),
        permute=moe_permute_time_s(setup) if moe_layer else 0.0,
        launch_f=ops * op_s if setup.eff.overlapped_launches else 0.0, sync_wait_f=moe_block * op_s)


@dataclass(frozen=True)
class StageCompute:
    """Compute seconds of one micro-batch on one GPU of a stage (no communication), with the
    parts for reports: name -> (forward, backward)."""

    forward_s: float
    backward_s: float
    recompute_s: float
    parts: tuple[tuple[str, float, float], ...] = ()


def skipped_mm_share(setup: Setup, moe_layer: bool) -> float:
    """The share of a layer's forward GEMM FLOPs in the matmuls torchtitan's op-level checkpointing recomputes
    (wk, wo and w3 of wq, wk, wv, wo, w1, w3, w2; activations.every_other_mm_sac_bytes_per_token)."""
    shape = setup.shape
    w = attention_widths(shape)
    h = shape.hidden_size
    f = shape.ffn_hidden_size if not (moe_layer and shape.moe) else shape.moe.top_k * shape.moe.expert_ffn_hidden_size
    up = 2 if shape.gated_mlp else 1
    total = h * (w.q_width + w.k_width + w.v_width) + w.out_width * h + (up + 1) * h * f
    skipped = h * w.k_width + w.out_width * h + (h * f if up == 2 else 0)
    return skipped / total


def grad_accumulation_time_s(setup: Setup, local_params: float) -> float:
    """Each micro-batch's weight-gradient GEMMs read and write the gradient of every local parameter."""
    return local_params * setup.eff.physics.grad_accumulation_bytes_per_param / setup.hbm_rate("fused")


def stage_compute(setup: Setup, sl: StageLayers) -> StageCompute:
    lay = setup.layout
    fwd = bwd = rec = 0.0
    parts: dict[str, list[float]] = {}

    def add(name: str, f: float, b: float) -> None:
        p = parts.setdefault(name, [0.0, 0.0])
        p[0] += f
        p[1] += b

    launch_f = launch_b = 0.0
    for moe_layer, n in ((False, sl.dense), (True, sl.moe)):
        if not n:
            continue
        lt = layer_time(setup, moe_layer)
        f, b = lt.forward_s, lt.backward_s
        add("gemm", n * lt.gemm_f, 2 * n * lt.gemm_f)
        add("attention", n * lt.attention[0], n * lt.attention[1])
        add("memory_bound", n * (lt.memory_bound + lt.permute) / 3, 2 * n * (lt.memory_bound + lt.permute) / 3)
        if lt.casts[0] or lt.casts[1]:
            add("fp8_casts", n * lt.casts[0], n * lt.casts[1])
        if moe_layer:
            # the host waits for the token counts every MoE layer (forward): the launches after it cannot run ahead
            # of the GPU, which waits for them; the backward reuses the forward's counts and only pays
            # max(GPU, launches)
            extra_f, extra_b = max(lt.sync_wait_f, lt.launch_f - f), max(0.0, 2 * lt.launch_f - b)
            if extra_f or extra_b:
                add("launch_bound", n * extra_f, n * extra_b)
            f, b = f + extra_f, b + extra_b
        else:
            launch_f += n * lt.launch_f
            launch_b += 2 * n * lt.launch_f
        fwd += n * f
        bwd += n * b
        if lay.recompute == "full":
            rec += n * lt.forward_s
        elif lay.recompute == "selective":
            mode = setup.framework.recompute_selective
            rec += n * (lt.attention[0] if mode == "attention_core" else lt.memory_bound / 3.0)
            if mode == "per_op_every_other_mm":  # and the forward of the matmuls it does not keep
                rec += n * lt.gemm_f * skipped_mm_share(setup, moe_layer)
    if sl.last:
        logits = setup.memo("logits_s", lambda: gemm_time_s(logits_gemm(setup), setup))
        add("logits", logits, 2 * logits)
        loss_f, loss_b = cross_entropy_time_s(setup)
        add("cross_entropy", loss_f, loss_b)
        fwd += logits + loss_f
        bwd += 2 * logits + loss_b
    # dense layers: the host launches ahead of the GPU unless it is slower than the GPU overall
    if launch_f > fwd:
        add("launch_bound", launch_f - fwd, 0.0)
        fwd = launch_f
    if launch_b > bwd:
        add("launch_bound", 0.0, launch_b - bwd)
        bwd = launch_b
    local = stage_params(setup.shape, setup.params, sl, tp=lay.tp, ep=lay.ep, etp=lay.etp, pp=lay.pp,
                         vocab_tp=setup.vocab_shards).total
    acc = grad_accumulation_time_s(setup, local)
    add("grad_accumulation", 0.0, acc)
    bwd += acc
    return StageCompute(forward_s=fwd, backward_s=bwd, recompute_s=rec,
                        parts=tuple((k, v[0], v[1]) for k, v in parts.items()))
