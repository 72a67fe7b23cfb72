"""Transformer shapes and their exact parameter counts.

A ``ModelShape`` is the resolved architecture every later stage reasons from.
``count_params`` counts every tensor of a Llama/GPT/Mixtral/DeepSeek-style
decoder: embeddings, attention (MHA, GQA or DeepSeek MLA), the MLP (SwiGLU or
GELU), norms, MoE routers, routed and shared experts. Counts are exact for the
architectures in the catalog and are tested against the published totals.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal

MlpKind = Literal["swiglu", "gelu", "quick_geglu"]
# gated MLPs (gate and up projections, then down: three matrices): SwiGLU (Llama) and gpt-oss's quick-GEGLU
# (x * sigmoid(1.702 x) on the gate, +1 on the linear half, both clamped at 7; Megatron's --quick-geglu)
GATED_MLPS = ("swiglu", "quick_geglu")
NormKind = Literal["rmsnorm", "layernorm"]
PositionKind = Literal["rope", "learned"]
# The deepest model dtc reasons about: far beyond any published run (deepest: DeepNet, 1,000 layers), and the bound
# of every per-layer walk (the pipeline splits, the parameter counts) so that a typo in a spec, a plan.json or a
# published-run CSV is an error, never an endless loop (issue #16). The spec's num_layers field takes it from here.
MAX_LAYERS = 1024


@dataclass(frozen=True)
class MLAShape:
    """DeepSeek multi-head latent attention (DeepSeek-V2/V3 paper, section 2.1.1)."""

    q_lora_rank: int  # 0 means q is projected directly from hidden
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class MoEShape:
    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    num_shared_experts: int = 0
    shared_expert_ffn_hidden_size: int = 0  # 0 -> expert_ffn_hidden_size
    first_dense_layers: int = 0  # the first k layers use a dense MLP (DeepSeek-V3: 3)
    layer_freq: int = 1  # every n-th layer (after the dense ones) is MoE

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    vocab_size: int
    head_dim: int = 0  # 0 -> hidden_size // num_attention_heads
    mlp: MlpKind = "swiglu"
    norm: NormKind = "rmsnorm"
    position: PositionKind = "rope"
    max_position_embeddings: int = 0  # learned positions only; 0 -> unused
    tied_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases (Qwen) or all linear biases (GPT, with linear_bias)
    linear_bias: bool = False  # biases on every linear layer and norm (GPT-2/3, Megatron GPT)
    moe: MoEShape | None = None
    mla: MLAShape | None = None
    extra_params: int = 0  # published parts outside the decoder stack (e.g. DeepSeek-V3 MTP module)
    # sliding-window attention (Megatron's --window-size W,0 and --window-attn-skip-freq): a windowed layer's query
    # attends to itself and the W keys before it; 0: every layer attends to the whole causal context
    # (plan.json leaves these three out at their defaults: plans of other models keep their bytes)
    window_size: int = field(default=0, metadata={"omit_if_default": True})
    # every n-th layer (1-based) attends fully, the others are windowed; 0: none
    full_attention_every: int = field(default=0, metadata={"omit_if_default": True})
    # a learnable softmax offset per head (gpt-oss; Megatron --softmax-type learnable)
    attention_sinks: bool = field(default=False, metadata={"omit_if_default": True})

    def __post_init__(self) -> None:
        if not 1 <= self.num_layers <= MAX_LAYERS:  # (a plan.json or a CSV row reaches here unvalidated)
            raise ValueError(f"num_layers must be 1 to {MAX_LAYERS}, got {self.num_layers}")

    @property
    def gated_mlp(self) -> bool:
        return self.mlp in GATED_MLPS

    def is_window_layer(self, index: int) -> bool:
        """0-based ``index``: does that decoder layer attend through the sliding window? (Megatron's
        is_layer_window_attention: with skip frequency n, 1-based layer numbers divisible by n attend fully.)"""
        if not self.window_size:
            return False
        return not self.full_attention_every or (index + 1) % self.full_attention_every != 0

    @property
    def num_window_layers(self) -> int:
        return sum(self.is_window_layer(i) for i in range(self.num_layers))

    @property
    def kv_channels(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def is_moe_layer(self, index: int) -> bool:
        """0-based ``index``: is that decoder layer an MoE layer?"""
        if self.moe is None or index < self.moe.first_dense_layers:
            return False
        return (index - self.moe.first_dense_layers) % self.moe.layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelShape":
        d = dict(d)
        if d.get("moe") is not None:
            d["moe"] = MoEShape(**d["moe"])
        if d.get("mla") is not None:
            d["mla"] = MLAShape(**d["mla"])
        return cls(**d)


ROPE_SCALING_KINDS = ("llama3", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    """Rotary frequency scaling for long context: ``llama3`` (Llama 3.1: low/high_freq_factor) or
    ``yarn`` (DeepSeek-V3: beta_fast/beta_slow), over ``original_max_position_embeddings``."""

    kind: str
    factor: float
    original_max_position_embeddings: int
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    # yarn: the correction range's ends rounded to whole dimensions (DeepSeek-V3's reference code, Megatron's
    # default) or not (gpt-oss: its reference RotaryEmbedding does not round; Hugging Face's truncate: false)
    round_correction_range: bool = field(default=True, metadata={"omit_if_default": True})


@dataclass(frozen=True)
class ModelHyperparameters:
    """What a model needs besides its shape to be trained as published: the RoPE base and scaling,
    the norm epsilon and the initialisation std (each with its source in the catalog)."""

    rope_theta: float | None  # None: learned positions
    rope_scaling: RopeScaling | None
    norm_eps: float
    init_std: float
    sources: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)


# Small init (Nguyen & Salazar 2019, "Transformers without Tears", arXiv:1910.05895; GPT-NeoX's
# "small_init" and NeMo's Llama 3 70B init_method_std 0.008944 are of this size): std = sqrt(2 / (5 h)).
def small_init_std(hidden_size: int) -> float:
    return round(math.sqrt(2.0 / (5.0 * hidden_size)), 6)


def derived_hyperparameters(shape: ModelShape) -> ModelHyperparameters:
    """For a shape not in the catalog: Llama 3's RoPE base (500,000; Meta, "The Llama 3 Herd of
    Models", section 3.2) and norm epsilon (1e-5), learned positions without a base, and the small
    init above."""
    return ModelHyperparameters(
        rope_theta=500000.0 if shape.position == "rope" else None, rope_scaling=None, norm_eps=1e-5,
        init_std=small_init_std(shape.hidden_size),
        sources=(("rope_theta", "Llama 3 (arXiv:2407.21783) section 3.2: RoPE base 500,000"),
                 ("norm_eps", "Llama 3 config.json rms_norm_eps 1e-05"),
                 ("init_std", "sqrt(2 / (5 x hidden)), Nguyen & Salazar 2019 (arXiv:1910.05895) small init")))


@dataclass(frozen=True)
class ParamCount:
    """Parameters by part; ``total`` and ``active`` (per token, MoE) in count."""

    embedding: int
    output: int  # 0 when tied
    attention_per_layer: int
    dense_mlp_per_layer: int
    moe_router_per_layer: int
    expert_params_per_expert: int
    shared_expert_per_layer: int
    norms_per_layer: int
    final_norm: int
    num_dense_layers: int
    num_moe_layers: int
    num_experts: int
    top_k: int
    extra: int = 0

    @property
    def per_dense_layer(self) -> int:
        return self.attention_per_layer + self.dense_mlp_per_layer + self.norms_per_layer

    @property
    def per_moe_layer_total(self) -> int:
        return (self.attention_per_layer + self.norms_per_layer + self.moe_router_per_layer
                + self.shared_expert_per_layer + self.num_experts * self.expert_params_per_expert)

    @property
    def per_moe_layer_active(self) -> int:
        return (self.attention_per_layer + self.norms_per_layer + self.moe_router_per_layer
                + self.shared_expert_per_layer + self.top_k * self.expert_params_per_expert)

    @property
    def expert_total(self) -> int:
        """Routed-expert parameters of the whole model (the part EP splits)."""
        return self.num_moe_layers * self.num_experts * self.expert_params_per_expert

    @property
    def layers_total(self) -> int:
        return self.num_dense_layers * self.per_dense_layer + self.num_moe_layers * self.per_moe_layer_total

    @property
    def total(self) -> int:
        return self.embedding + self.output + self.layers_total + self.final_norm + self.extra

    @property
    def active(self) -> int:
        return (self.embedding + self.output + self.final_norm + self.extra
                + self.num_dense_layers * self.per_dense_layer
                + self.num_moe_layers * self.per_moe_layer_active)

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding - self.output


def _attention_params(s: ModelShape) -> int:
    h = s.hidden_size
    if s.mla is not None:
        m = s.mla
        qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * s.num_attention_heads * qk_head
        else:
            q = h * s.num_attention_heads * qk_head
        kv = (h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
              + m.kv_lora_rank * s.num_attention_heads * (m.qk_nope_head_dim + m.v_head_dim))
        o = s.num_attention_heads * m.v_head_dim * h
        return q + kv + o
    d = s.kv_channels
    q_out = s.num_attention_heads * d
    kv_out = s.num_kv_heads * d
    params = h * q_out + 2 * h * kv_out + q_out * h
    if s.attention_bias or s.linear_bias:
        params += q_out + 2 * kv_out
    if s.linear_bias:
        params += h  # output projection bias
    if s.attention_sinks:
        params += s.num_attention_heads  # one learnable softmax offset per head
    return params


def _mlp_params(s: ModelShape, ffn: int) -> int:
    h = s.hidden_size
    if s.gated_mlp:
        params = 3 * h * ffn
        if s.linear_bias:
            params += 2 * ffn + h
    else:
        params = 2 * h * ffn
        if s.linear_bias:
            params += ffn + h
    return params


def _norm_params(s: ModelShape) -> int:
    return s.hidden_size * (2 if s.norm == "layernorm" else 1)


def count_params(s: ModelShape) -> ParamCount:
    """Exact parameter count of ``s`` by part."""
    embedding = s.vocab_size * s.hidden_size
    if s.position == "learned":
        embedding += s.max_position_embeddings * s.hidden_size
    output = 0 if s.tied_embeddings else s.vocab_size * s.hidden_size
    norms = 2 * _norm_params(s)
    if s.mla is not None:
        norms += 0  # the MLA latent norms are counted in _attention_params
    n_moe = s.num_moe_layers
    moe = s.moe
    return ParamCount(
        embedding=embedding,
        output=output,
        attention_per_layer=_attention_params(s),
        dense_mlp_per_layer=_mlp_params(s, s.ffn_hidden_size),
        moe_router_per_layer=(moe.num_experts * s.hidden_size) if moe else 0,
        expert_params_per_expert=_mlp_params(s, moe.expert_ffn_hidden_size) if moe else 0,
        shared_expert_per_layer=(moe.num_shared_experts * _mlp_params(s, moe.shared_ffn)) if moe else 0,
        norms_per_layer=norms,
        final_norm=_norm_params(s),
        num_dense_layers=s.num_layers - n_moe,
        num_moe_layers=n_moe,
        num_experts=moe.num_experts if moe else 0,
        top_k=moe.top_k if moe else 0,
        extra=s.extra_params,
    )


# --- deriving a dense shape from a parameter count ------------------------------------------
#
# The rule (stated in the README): a Llama-3-style dense decoder -- SwiGLU, RMSNorm, RoPE,
# untied embeddings, vocab 128,256, head dim 128 (64 below 1B), FFN = 3.5 x hidden rounded
# to 256, GQA with 8 KV heads once there are >= 16 heads. Depth follows the Llama 3
# family (8B: 32 layers, 70B: 80, 405B: 126; Meta, "The Llama 3 Herd of Models", 2024,
# Table 3): layers = 32 * (P / 8e9) ** 0.4, rounded to a multiple of 4 and kept in [4, 128].
# The hidden size is then the multiple of 8 heads (so that TP of 1, 2, 4 and 8 divides the
# heads) whose exact count is closest to P, and the depth is re-fitted (a multiple of 2)
# to land on P.

DERIVED_VOCAB = 128_256  # Llama 3 tokenizer (Meta, "The Llama 3 Herd of Models", 2024)
DERIVED_FFN_RATIO = 3.5  # Llama 3 8B: 14336/4096 = 3.5; 70B: 28672/8192 = 3.5


def _round_to(x: float, step: int) -> int:
    return max(step, int(round(x / step)) * step)


def _derived(layers: int, hidden: int, head_dim: int) -> ModelShape:
    heads = hidden // head_dim
    kv = 8 if heads >= 16 and heads % 8 == 0 else heads
    return ModelShape(
        num_layers=layers, hidden_size=hidden, ffn_hidden_size=_round_to(DERIVED_FFN_RATIO * hidden, 256),
        num_attention_heads=heads, num_kv_heads=kv, vocab_size=DERIVED_VOCAB,
    )


def derive_dense_shape(num_params: int) -> ModelShape:
    """A Llama-3-style dense shape whose exact count is closest to ``num_params``."""
    layers = min(128, max(4, _round_to(32 * (num_params / 8e9) ** 0.4, 4)))
    head_dim = 128 if num_params >= 1e9 else 64
    step = 8 * head_dim
    best = _derived(layers, step, head_dim)
    hidden = step
    while True:
        shape = _derived(layers, hidden, head_dim)
        total = count_params(shape).total
        if abs(total - num_params) < abs(count_params(best).total - num_params):
            best = shape
        if total > num_params:
            return _refit_layers(best, num_params)
        hidden += step


def _refit_layers(shape: ModelShape, num_params: int) -> ModelShape:
    """Re-pick the depth (a multiple of 2) so the count lands closest to ``num_params``."""
    pc = count_params(shape)
    fixed = pc.total - pc.layers_total
    layers = max(2, _round_to((num_params - fixed) / pc.per_dense_layer, 2))
    return ModelShape(**{**shape.to_dict(), "num_layers": layers})
