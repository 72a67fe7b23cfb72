"""FLOPs and compute time.

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

Compute time of one micro-batch on one GPU = sum over its GEMMs of
FLOPs / (peak[dtype] x gemm efficiency(M, N, K)) + the attention core at the generation's
flash-attention efficiency + memory-bound work at a fraction of HBM bandwidth (all from
compiler/data/efficiency.yaml), plus a fixed time per layer (kernel launches, MoE host syncs)
and, in backward, the read + write of the gradient buffer of every local parameter.
Backward = 2x forward for GEMMs (input and weight gradient).
"""
from __future__ import annotations

from dataclasses import dataclass

from compiler.costmodel.activations import attention_widths
from compiler.costmodel.context import Setup
from compiler.costmodel.efficiency import GenerationEfficiency
from compiler.costmodel.memory import activation_bytes_per_layer_kind
from compiler.costmodel.stages import StageLayers, stage_params
from compiler.model import ModelShape, ParamCount

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


def attention_core_flops_per_token_forward(shape: ModelShape, seq_len: int) -> float:
    """QK^T and AV over s/2 keys on average (causal), all layers, forward only."""
    w = attention_widths(shape)
    return shape.num_layers * 2.0 * w.heads * (w.qk_head_dim + w.v_head_dim) * seq_len / 2.0


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
    dtype: str

    @property
    def forward_flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


def gemm_size_saturation(x: float, half_dim: float) -> float:
    """x / (x + half): 0.5 at the half-saturation dim, -> 1 for large matrices."""
    return x / (x + half_dim)


def gemm_efficiency(g: Gemm, gen: GenerationEfficiency) -> float:
    """Achievable fraction of the dtype's dense peak for a GEMM of this size (efficiency.yaml)."""
    sat = (gemm_size_saturation(g.m, gen.gemm_half_dim) * gemm_size_saturation(g.n, gen.gemm_half_dim)
           * gemm_size_saturation(g.k, gen.gemm_half_dim))
    return gen.gemm_fraction_for(g.dtype) * sat


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


def mlp_gemms(setup: Setup, tokens: float, ffn: float, count: float, name: str) -> list[Gemm]:
    shape, tp, dt = setup.shape, setup.layout.tp, setup.recipe.gemm_dtype
    up = 2 if shape.mlp == "swiglu" else 1
    h = shape.hidden_size
    return [Gemm(f"{name}_fc1", tokens, up * ffn / tp, h, count, dt),
            Gemm(f"{name}_fc2", tokens, h, ffn / tp, count, dt)]


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
    tokens_per_expert = t * m.top_k * lay.ep / m.num_experts
    gemms.append(Gemm("router", t, m.num_experts, shape.hidden_size, 1, "bf16"))
    gemms += mlp_gemms(setup, tokens_per_expert, m.expert_ffn_hidden_size, local_experts, "expert")
    if m.num_shared_experts:
        gemms += mlp_gemms(setup, t, m.shared_ffn * m.num_shared_experts, 1, "shared_expert")
    return gemms


def logits_gemm(setup: Setup) -> Gemm:
    """The output layer runs in bf16 even in fp8 recipes (Megatron keeps it outside Transformer Engine)."""
    dt = "fp32" if setup.recipe.name == "fp32" else "bf16"
    return Gemm("logits", float(setup.tokens_per_microbatch), setup.shape.vocab_size / setup.layout.tp,
                setup.shape.hidden_size, 1, dt)


def gemm_time_s(g: Gemm, setup: Setup) -> float:
    return g.forward_flops / (setup.peak_flops_per_s(g.dtype) * gemm_efficiency(g, setup.gen))


# --- attention core and memory-bound work --------------------------------------------------------------


def attention_core_flops_forward_per_layer(setup: Setup) -> float:
    """One layer, one micro-batch, one GPU: local queries x (heads / tp) x s/2 keys (causal)."""
    w = attention_widths(setup.shape)
    return (2.0 * setup.tokens_per_microbatch * (w.heads / setup.layout.tp) * (w.qk_head_dim + w.v_head_dim)
            * setup.seq_len / 2.0)


def attention_core_time_s(setup: Setup) -> float:
    """Forward + backward of the attention core of one layer: 3 x forward FLOPs at the generation's
    flash-attention efficiency (bf16 peak)."""
    def compute() -> float:
        peak = setup.peak_flops_per_s("fp32" if setup.recipe.name == "fp32" else "bf16")
        return 3.0 * attention_core_flops_forward_per_layer(setup) / (peak * setup.gen.attention_fraction)

    return setup.memo("attention_core_s", compute)


def memory_bound_time_per_layer_s(setup: Setup, moe_layer: bool) -> float:
    """Elementwise work of one layer (forward + backward): activation_traffic x saved bytes / HBM rate."""
    saved = activation_bytes_per_layer_kind(setup, moe_layer=moe_layer, recompute="none")  # memoised
    traffic = setup.eff.activation_traffic.get(setup.recipe.name, setup.eff.activation_traffic["bf16"])
    return traffic * saved / (setup.gpu.spec.hbm_bandwidth_bytes_per_s * setup.gen.hbm_fraction)


# --- one stage, one micro-batch ------------------------------------------------------------------------


@dataclass(frozen=True)
class StageCompute:
    """Compute seconds of one micro-batch on one GPU of a stage (no communication)."""

    gemm_forward_s: float
    attention_s: float  # forward + backward
    memory_bound_s: float  # forward + backward
    recompute_s: float
    logits_forward_s: float
    overhead_s: float = 0.0  # fixed per-layer cost (launches, host syncs), forward + backward
    grad_accumulation_s: float = 0.0  # backward only: read + write of the gradient buffer

    @property
    def forward_s(self) -> float:
        return (self.gemm_forward_s + self.logits_forward_s
                + (self.attention_s + self.memory_bound_s + self.overhead_s) / 3.0)

    @property
    def backward_s(self) -> float:
        return (2.0 * (self.gemm_forward_s + self.logits_forward_s)
                + 2.0 * (self.attention_s + self.memory_bound_s + self.overhead_s) / 3.0 + self.grad_accumulation_s)


def layer_forward_gemm_time_s(setup: Setup, moe_layer: bool) -> float:
    return setup.memo(("layer_gemm_s", moe_layer),
                      lambda: sum(gemm_time_s(g, setup) for g in layer_gemms(setup, moe_layer)))


def grad_accumulation_time_s(setup: Setup, local_params: float) -> float:
    """Each micro-batch's weight-gradient GEMMs read and write the gradient of every local parameter."""
    bw = setup.gpu.spec.hbm_bandwidth_bytes_per_s * setup.gen.hbm_fraction
    return local_params * setup.eff.grad_accumulation_bytes_per_param / bw


def stage_compute(setup: Setup, sl: StageLayers) -> StageCompute:
    gemm_f = 0.0
    mem = 0.0
    for moe_layer, n in ((False, sl.dense), (True, sl.moe)):
        if n:
            gemm_f += n * layer_forward_gemm_time_s(setup, moe_layer)
            mem += n * memory_bound_time_per_layer_s(setup, moe_layer)
    attn = sl.layers * attention_core_time_s(setup)
    logits_f = setup.memo("logits_s", lambda: gemm_time_s(logits_gemm(setup), setup)) if sl.last else 0.0
    recompute = setup.layout.recompute
    if recompute == "full":
        re = gemm_f + (attn + mem) / 3.0
    elif recompute == "selective":
        re = attn / 3.0
    else:
        re = 0.0
    overhead = setup.eff.layer_overhead_s
    lay = setup.layout
    local_experts = setup.shape.moe.num_experts / lay.ep if setup.shape.moe else 0.0
    fixed = sl.dense * overhead["dense"] + sl.moe * (overhead["moe"] + overhead.get("moe_per_local_expert", 0.0)
                                                      * local_experts)
    local = stage_params(setup.shape, setup.params, sl, tp=lay.tp, ep=lay.ep, pp=lay.pp).total
    return StageCompute(gemm_forward_s=gemm_f, attention_s=attn, memory_bound_s=mem, recompute_s=re,
                        logits_forward_s=logits_f, overhead_s=fixed,
                        grad_accumulation_s=grad_accumulation_time_s(setup, local))
