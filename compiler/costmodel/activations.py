"""Activation memory: the tensors autograd keeps for backward, one function per saved group.

Built from Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models" (section 4.1 and Table 2), term by term, so that the GPT case
(layernorm, GELU MLP of 4h, multi-head attention, dropout, unfused softmax) adds up
to exactly ``s*b*h*(34 + 5*a*s/h)`` bytes per layer, and generalised to the real
shape: GQA (narrower K and V), SwiGLU (gate and up projections), flash attention
(no s^2 term: the output and the fp32 log-sum-exp only), MoE (router
probabilities, the dispatched copies of each token per chosen expert, the expert
MLPs), MLA latents, and context parallelism (each rank holds s/cp tokens).

Every term is "bytes per token" of one layer for one micro-batch, tagged with
whether tensor parallelism shards it (the paper's 24/t part) or not (the 10 part,
which only sequence parallelism shards). ``activation_bytes_per_layer`` applies tp,
sp and the recompute mode; the pipeline schedule decides how many micro-batches
are in flight (compiler/costmodel/pp_schedule.py).

Which tensors are saved depends on the implementation; an ``ActivationImpl`` names
the differences (the same formulas, different switches):

* ``PAPER``: Korthikanti et al. 2022 (Megatron-LM 2022, unfused softmax).
* ``MEGATRON_TE``: Megatron-Core with Transformer Engine, the default for
  predictions: fused flash/cuDNN attention, fused SwiGLU that saves only the fc1
  output, fp32 norm statistics.
* ``TORCH_EAGER`` (and ``TORCH_EAGER_CPU``, its CPU variant): plain PyTorch modules (nn.RMSNorm, F.scaled_dot_product_attention,
  F.silu(gate) * up), as in torchtitan / llm-foundry model code; measured in
  tests/test_costmodel_measured.py.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Literal

from compiler.model import ModelShape

FP32_BYTES = 4
MASK_BYTES = 1  # dropout masks are bytes (Korthikanti et al. 2022, section 4.1)
PAPER_SOURCE = "Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large Transformer Models', sec. 4.1 + Table 2"


@dataclass(frozen=True)
class ActivationImpl:
    """Which tensors an implementation saves for backward."""

    name: str
    attention: Literal["flash", "unfused"]  # unfused saves softmax (and dropout) s x s matrices
    norm_stats_bytes: int  # bytes per norm statistic per token (fp32 rstd; layernorm also the mean)
    rmsnorm_fp32_copies: int  # composite RMSNorm saves fp32 copies of its input and output (0: fused kernel)
    swiglu_saved_widths: int  # ffn-wide tensors saved inside SwiGLU besides the fc2 input
    attention_output_copy: bool  # the out-projection input is a second copy of the attention output
    gqa_expanded_kv: bool  # K and V are saved after being repeated to every query head
    source: str
    dropout_mask_act_dtype: bool = False  # dropout keeps a scaled mask in the activation dtype (CPU), not bytes
    recompute_norms_and_up_proj: bool = False  # norm outputs and MLA up-projections are recomputed in backward
    fp8_activation_cache: bool = False  # SwiGLU inputs, attention outputs and dispatched tokens cached in fp8
    # MoE experts scale their SwiGLU output by the routing probability in an op of its own, which saves that output
    expert_scale_saves_output: bool = False
    # sequence parallel all-gathers a column-parallel GEMM's input before the GEMM, which saves it whole for its
    # weight gradient (torch.distributed.tensor.parallel ColwiseParallel(input_layouts=Shard(1)): the redistribute
    # to Replicate happens in the module's input hook); Megatron saves the shard and gathers again in backward
    # (Korthikanti et al. 2022 sec. 4.2.2)
    sp_gathers_gemm_inputs: bool = False
    # RoPE's cos and sin recast to the activation dtype at each call and saved by the rotation's products, per layer:
    # megatron-core's unfused _apply_rotary_pos_emb_bshd (rope_utils.py: ``cos_ = (torch.cos(freqs) * mscale).to(
    # t.dtype)``) for q and k, 4 tables of the rotary width; fused RoPE (Transformer Engine) and the torch trainers'
    # shared fp32 table save none per layer
    rope_cast_tables: int = 0


PAPER = ActivationImpl("paper", "unfused", 0, 0, 2, False, False, PAPER_SOURCE)
MEGATRON_TE = ActivationImpl(
    "megatron_te", "flash", FP32_BYTES, 0, 2, False, False,
    "Megatron-Core + Transformer Engine: fused attention saves O and the fp32 softmax stats (Dao et al. 2022, "
    "FlashAttention, sec. 3.1); fused norms save input + fp32 rsigma; bias_swiglu saves the fc1 output [gate, up] "
    "only (megatron/core/fusions/fused_bias_swiglu.py)")
TORCH_EAGER = ActivationImpl(
    "torch_eager", "flash", FP32_BYTES, 2, 3, False, True,
    "PyTorch eager modules (torch 2.13): nn.RMSNorm computes in fp32 and saves the fp32 input, the fp32 normalised "
    "output and rstd; F.layer_norm saves input, mean, rstd; F.silu saves its input and the product saves silu(gate) "
    "and up; SDPA (flash kernel) saves q, k, v, out, logsumexp; repeat_interleave expands GQA K/V before SDPA; "
    "under sequence parallel the column-parallel GEMMs save their all-gathered input (measured in "
    "tests/test_costmodel_measured.py and by dtc smoke)", sp_gathers_gemm_inputs=True)
TORCH_EAGER_CPU = replace(
    TORCH_EAGER, name="torch_eager_cpu", dropout_mask_act_dtype=True,
    source=TORCH_EAGER.source + "; on CPU, F.dropout multiplies by a scaled mask kept in the input dtype "
    "(CUDA's native_dropout keeps a 1-byte bool mask)")
DEEPSEEK_V3 = replace(
    MEGATRON_TE, name="deepseek_v3", recompute_norms_and_up_proj=True, fp8_activation_cache=True,
    source="DeepSeek-V3 report (arXiv:2412.19437) sec. 3.3.2-3.3.3: 'recompute all RMSNorm operations and MLA "
           "up-projections during back-propagation', the input of the Linear after attention cached in E5M6, SwiGLU "
           "inputs cached in FP8, tokens dispatched in FP8")
DEFAULT_IMPL = MEGATRON_TE


def fused_counterpart(impl: ActivationImpl) -> ActivationImpl:
    """What the same block saves when its norms, activation and attention run as fused kernels: no fp32 copies
    of a composite RMSNorm, only [gate, up] of SwiGLU, no expanded GQA K/V, 1-byte dropout masks, no second copy
    of the attention output (the tensors an eager block adds on top are its elementwise implementation's own)."""
    return replace(impl, rmsnorm_fp32_copies=0, swiglu_saved_widths=2, gqa_expanded_kv=False,
                   attention_output_copy=False, dropout_mask_act_dtype=False)
# the activation profiles a cost profile (compiler/targets/cost.py) names
IMPLS = {impl.name: impl for impl in (PAPER, MEGATRON_TE, TORCH_EAGER, TORCH_EAGER_CPU, DEEPSEEK_V3)}


@dataclass(frozen=True)
class Term:
    """One saved-tensor group of a layer: bytes per token, and whether tp shards it."""

    name: str
    bytes_per_token: float
    tp_sharded: bool
    # under sequence parallel the tensor is saved all-gathered, whole, not as the rank's sequence shard
    sp_gathered: bool = False
    # one tensor per sequence position, broadcast over the micro-batch's sequences (RoPE's tables): bytes_per_token
    # is per position of one sequence, whatever the micro-batch size
    per_sequence: bool = False


# --- shape helpers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionWidths:
    heads: int
    kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    latent_width: int  # MLA: compressed q and kv (+ decoupled rope key) saved as GEMM inputs

    @property
    def q_width(self) -> int:
        return self.heads * self.qk_head_dim

    @property
    def k_width(self) -> int:
        return self.kv_heads * self.qk_head_dim

    @property
    def v_width(self) -> int:
        return self.kv_heads * self.v_head_dim

    @property
    def out_width(self) -> int:
        return self.heads * self.v_head_dim


def attention_widths(shape: ModelShape) -> AttentionWidths:
    if shape.mla is not None:
        m = shape.mla
        # MLA materialises per-head K and V from the latent in training (DeepSeek-V2 paper, sec. 2.1.2).
        return AttentionWidths(shape.num_attention_heads, shape.num_attention_heads,
                               m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim,
                               m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)
    d = shape.kv_channels
    return AttentionWidths(shape.num_attention_heads, shape.num_kv_heads, d, d, 0)


def uses_dropout(shape: ModelShape, trained_with: bool | None = None) -> bool:
    """Whether the layers save dropout masks. ``trained_with``: the training stack's own setting (a cost profile's
    ``dropout``: dtc's targets train without); None, a published stack's: GPT-2/3-style models (biases everywhere)
    trained with dropout 0.1 (Megatron-LM GPT default --hidden-dropout/--attention-dropout 0.1), Llama-style models
    without."""
    return shape.linear_bias if trained_with is None else trained_with


# --- the saved-tensor groups, one function each (bytes per token of one layer) -------------


def norm_input_bytes_per_token(hidden: int, act_bytes: int, impl: ActivationImpl, norm: str) -> float:
    """A norm saves its input (2sbh in the paper) and its fp32 statistics (rstd; layernorm also the mean);
    a composite fp32 RMSNorm instead keeps fp32 copies of its input and normalised output."""
    stats = impl.norm_stats_bytes * (2 if norm == "layernorm" else 1)
    if norm == "rmsnorm" and impl.rmsnorm_fp32_copies:
        return impl.rmsnorm_fp32_copies * hidden * FP32_BYTES + stats
    return hidden * act_bytes + stats


def gemm_input_bytes_per_token(width: int, act_bytes: float) -> float:
    """A linear layer saves its input for the weight gradient."""
    return width * act_bytes


def attention_qkv_bytes_per_token(w: AttentionWidths, act_bytes: int, impl: ActivationImpl) -> float:
    """Q, K and V saved by the attention core (4sbh + 2sbh for MHA in the paper)."""
    kv_heads = w.heads if impl.gqa_expanded_kv else w.kv_heads
    return (w.q_width + kv_heads * w.qk_head_dim + kv_heads * w.v_head_dim) * act_bytes


def attention_scores_bytes_per_token(heads: int, seq_kv: int, act_bytes: int, dropout: bool) -> float:
    """Unfused attention: softmax output (2as^2b), dropout mask (as^2b) and dropout output (2as^2b)."""
    per_score = act_bytes + (MASK_BYTES + act_bytes if dropout else 0)
    return heads * seq_kv * per_score


def attention_logsumexp_bytes_per_token(heads: int) -> float:
    """Flash attention keeps one fp32 log-sum-exp per head per query instead of the s x s matrix."""
    return heads * FP32_BYTES


def attention_output_bytes_per_token(w: AttentionWidths, act_bytes: int, impl: ActivationImpl,
                                     gemm_bytes: float | None = None) -> float:
    """The attention output, saved as the out-projection input (2sbh); some code keeps a copy, and fp8
    GEMMs keep their own fp8 copy of it for the weight gradient."""
    out: float = w.out_width * act_bytes * (2 if impl.attention_output_copy else 1)
    if gemm_bytes is not None and gemm_bytes != act_bytes:
        out += w.out_width * gemm_bytes
    return out


def dropout_mask_bytes_per_token(hidden: int, act_bytes: int = MASK_BYTES, impl: ActivationImpl | None = None) -> float:
    """A hidden-size dropout mask after the attention and after the MLP (sbh each: one byte per element)."""
    return hidden * (act_bytes if impl is not None and impl.dropout_mask_act_dtype else MASK_BYTES)


# gpt-oss's clamped quick-GEGLU saves two ffn-wide tensors more than SwiGLU does in the same implementation. Fused
# (megatron/core/fusions/fused_bias_geglu.py weighted_bias_quick_geglu_impl, which mlp.py and TEGroupedMLP call):
# both halves are clamped and concatenated before the fused function, so clamp keeps the fc1 output for its
# backward and the function saves the clamped copy (4 widths where bias_swiglu saves the fc1 output only: 2).
# Unfused (mlp.py / experts.py glu with every fusion off): the clamped gate and sigmoid(1.702 gate) besides what
# the SwiGLU glu keeps (the fc1 output, the activation's output and x_linear + offset). Measured by dtc smoke on
# megatron-core 0.19.2's CPU layers (tests/test_smoke_megatron.py gpt-oss).
CLAMPED_QUICK_GEGLU_EXTRA_WIDTHS = 2


def mlp_activation_bytes_per_token(ffn: int, mlp: str, act_bytes: int, impl: ActivationImpl) -> float:
    """GELU saves its input (8sbh for ffn=4h); SwiGLU saves gate and up (and silu(gate) in eager code); the
    clamped quick-GEGLU two ffn-wide tensors more (CLAMPED_QUICK_GEGLU_EXTRA_WIDTHS)."""
    if mlp == "gelu":
        widths = 1
    else:
        widths = impl.swiglu_saved_widths + (CLAMPED_QUICK_GEGLU_EXTRA_WIDTHS if mlp == "quick_geglu" else 0)
    return widths * ffn * act_bytes


def moe_router_bytes_per_token(num_experts: int) -> float:
    """Router probabilities in fp32 (softmax/sigmoid output kept for the gate gradient)."""
    return num_experts * FP32_BYTES


def moe_dispatch_bytes_per_token(hidden: int, top_k: int, act_bytes: int, gemm_bytes: float | None = None) -> float:
    """Each token is copied once per chosen expert: the expert fc1 input (fp8 under fp8 GEMMs), and the
    expert output kept by the weighted combine for the gradient of the routing weights."""
    return top_k * hidden * ((gemm_bytes or act_bytes) + act_bytes)


# --- a layer as a list of terms ---------------------------------------------------------------


def attention_terms(shape: ModelShape, seq_kv: int, act_bytes: int, impl: ActivationImpl,
                    gemm_bytes: float, dropout: bool) -> list[Term]:
    w = attention_widths(shape)
    h = shape.hidden_size
    terms = [
        Term("attention_norm_input", norm_input_bytes_per_token(h, act_bytes, impl, shape.norm), False),
        Term("qkv_input", gemm_input_bytes_per_token(h, gemm_bytes), False),
        Term("qkv", attention_qkv_bytes_per_token(w, act_bytes, impl), True),
        Term("attention_output", attention_output_bytes_per_token(w, act_bytes, impl, gemm_bytes), True),
    ]
    if w.latent_width:
        terms.append(Term("mla_latents", gemm_input_bytes_per_token(w.latent_width, gemm_bytes), False))
    if impl.rope_cast_tables and shape.position == "rope":
        # the tables span the whole sequence and head dimension on every tp rank (gathered under sp)
        rotary = shape.mla.qk_rope_head_dim if shape.mla is not None else w.qk_head_dim
        terms.append(Term("rope_tables", impl.rope_cast_tables * rotary * act_bytes, False, sp_gathered=True,
                          per_sequence=True))
    if impl.attention == "unfused":
        terms.append(Term("attention_scores", attention_scores_bytes_per_token(w.heads, seq_kv, act_bytes, dropout), True))
    else:
        terms.append(Term("attention_lse", attention_logsumexp_bytes_per_token(w.heads), True))
    if dropout:
        terms.append(Term("attention_dropout_mask", dropout_mask_bytes_per_token(h, act_bytes, impl), False))
    return terms


def dense_mlp_terms(shape: ModelShape, act_bytes: int, impl: ActivationImpl, gemm_bytes: float,
                    dropout: bool) -> list[Term]:
    h, f = shape.hidden_size, shape.ffn_hidden_size
    terms = [
        Term("mlp_norm_input", norm_input_bytes_per_token(h, act_bytes, impl, shape.norm), False),
        Term("mlp_input", gemm_input_bytes_per_token(h, gemm_bytes), False),
        Term("mlp_activation", mlp_activation_bytes_per_token(f, shape.mlp, act_bytes, impl), True),
        Term("mlp_fc2_input", gemm_input_bytes_per_token(f, gemm_bytes), True),
    ]
    if dropout:
        terms.append(Term("mlp_dropout_mask", dropout_mask_bytes_per_token(h, act_bytes, impl), False))
    return terms


def moe_mlp_terms(shape: ModelShape, act_bytes: int, impl: ActivationImpl, gemm_bytes: float) -> list[Term]:
    assert shape.moe is not None
    m, h = shape.moe, shape.hidden_size
    terms = [
        Term("mlp_norm_input", norm_input_bytes_per_token(h, act_bytes, impl, shape.norm), False),
        Term("mlp_input", gemm_input_bytes_per_token(h, act_bytes), False),  # router input, kept in bf16
        Term("moe_router_probs", moe_router_bytes_per_token(m.num_experts), False),
        Term("moe_dispatched_tokens", moe_dispatch_bytes_per_token(h, m.top_k, act_bytes, gemm_bytes), False),
        Term("moe_expert_activation",
             m.top_k * mlp_activation_bytes_per_token(m.expert_ffn_hidden_size, shape.mlp, act_bytes, impl), True),
        Term("moe_expert_fc2_input", m.top_k * gemm_input_bytes_per_token(m.expert_ffn_hidden_size, gemm_bytes), True),
    ]
    if impl.expert_scale_saves_output:
        terms.append(Term("moe_expert_scaled_output", m.top_k * m.expert_ffn_hidden_size * act_bytes, True))
    if m.num_shared_experts:
        f = m.shared_ffn * m.num_shared_experts
        terms.append(Term("shared_expert_activation", mlp_activation_bytes_per_token(f, shape.mlp, act_bytes, impl), True))
        terms.append(Term("shared_expert_fc2_input", gemm_input_bytes_per_token(f, gemm_bytes), True))
    return terms


# Saved under sequence parallel as the expert tensor-parallel group's gather, not the rank's shard: megatron-core's
# alltoall dispatcher all-gathers the received token copies over the expert TP group before the experts
# (core/transformer/moe/token_dispatcher.py: gather_from_sequence_parallel_region(..., group=self.tp_group)), and
# the grouped fc1 saves that input for its weight gradient. With the default etp = tp that is every token's copies.
GATHERED_OVER_EXPERT_TP = ("moe_dispatched_tokens",)


def with_expert_tp_gather(terms: tuple[Term, ...], expert_tp: int) -> tuple[Term, ...]:
    """``terms`` with the expert inputs an expert tensor-parallel group of ``expert_tp`` ranks gathers: each rank
    keeps expert_tp sequence-parallel shards of them (GATHERED_OVER_EXPERT_TP)."""
    if expert_tp == 1:
        return terms
    return tuple(replace(t, bytes_per_token=t.bytes_per_token * expert_tp) if t.name in GATHERED_OVER_EXPERT_TP
                 else t for t in terms)


FP8_GEMM_INPUT_BYTES = 1  # Transformer Engine saves the fp8-cast input of each fp8 GEMM for the weight gradient
# NVFP4: Transformer Engine keeps only the column-wise (transposed, Hadamard-transformed) FP4 copy of a Linear's input
# for the wgrad GEMM (transformer_engine/pytorch/module/linear.py: inputmat.update_usage(rowwise_usage=False,
# columnwise_usage=True)): 4-bit values packed two per byte plus one E4M3 scale per 16 elements
# (pytorch/tensor/nvfp4_tensor.py NVFP4Quantizer; Megatron-LM docs/api-guide/core/generalized_tensor_parallel.md:
# "NVFP4 | 16 | 0.5000 | 1/16 = 0.0625 | 0.5625")
NVFP4_GEMM_INPUT_BYTES = 0.5625


def layer_terms(shape: ModelShape, *, moe_layer: bool, seq_kv: int, act_bytes: int,
                impl: ActivationImpl = DEFAULT_IMPL, gemm_bytes: float | None = None,
                dropout: bool | None = None) -> tuple[Term, ...]:
    """All saved-tensor groups of one decoder layer. ``gemm_bytes``: bytes per saved GEMM input
    (1 under fp8 GEMMs: Transformer Engine keeps the fp8 copy; 0.5625 under nvfp4; default: ``act_bytes``).
    ``dropout``: the training stack's setting (uses_dropout)."""
    gb = gemm_bytes or act_bytes
    drop = uses_dropout(shape, dropout)
    mlp = moe_mlp_terms(shape, act_bytes, impl, gb) if moe_layer else dense_mlp_terms(shape, act_bytes, impl, gb, drop)
    terms = attention_terms(shape, seq_kv, act_bytes, impl, gb, drop) + mlp
    if impl.recompute_norms_and_up_proj:
        dropped = ("qkv_input", "mlp_input") + (("qkv",) if shape.mla is not None else ())
        terms = [t for t in terms if t.name not in dropped]
    if impl.sp_gathers_gemm_inputs:
        terms = [replace(t, sp_gathered=True) if t.name in ("qkv_input", "mlp_input") else t for t in terms]
    if impl.fp8_activation_cache:
        w = attention_widths(shape)
        cached = {"attention_output": w.out_width * 1.0}
        if shape.moe is not None:
            cached["moe_dispatched_tokens"] = shape.moe.top_k * shape.hidden_size * 1.0
            cached["moe_expert_activation"] = shape.moe.top_k * mlp_activation_bytes_per_token(
                shape.moe.expert_ffn_hidden_size, shape.mlp, 1, impl)
        terms = [replace(t, bytes_per_token=cached[t.name]) if t.name in cached else t for t in terms]
    return tuple(terms)


RECOMPUTED_BY_SELECTIVE = ("attention_scores", "attention_lse")  # the attention core (Korthikanti sec. 5)
# PyTorch op-level selective activation checkpointing (torchtitan's 'selective (op)', dtc's fsdp trainer:
# torch.utils.checkpoint.create_selective_checkpoint_contexts saving mm / addmm / bmm / SDPA outputs) keeps
# the matmul and attention outputs and recomputes every elementwise op: of a layer's terms it keeps these,
# plus the block input and the outputs of the two output projections (attention out, fc2: row_parallel_outputs_kept).
KEPT_BY_PER_OP_SAC = ("qkv", "attention_output", "attention_lse", "mlp_activation", "moe_router_probs",
                      "moe_expert_activation", "shared_expert_activation")


def _sp_div(tp: int, sequence_parallel: bool) -> int:
    return tp if sequence_parallel else 1


def reduce_scatter_output_kept(tp: int, sequence_parallel: bool) -> float:
    """What op-level SAC keeps of a row-parallel GEMM's reduction, in hidden widths per token: under sequence
    parallel the reduce-scatter's output shard, which the policy saves (``_c10d_functional.reduce_scatter_tensor``,
    torchtitan's save list); without it the all-reduce, which it does not save."""
    return 1.0 / tp if sequence_parallel and tp > 1 else 0.0


def row_parallel_outputs_kept(tp: int, sequence_parallel: bool) -> float:
    """What op-level SAC keeps of one row-parallel GEMM (attention out, fc2), in hidden widths per token: the matmul
    output, whole (the partial sums exist before any reduction), and its reduction's (reduce_scatter_output_kept).
    Measured by dtc smoke (FSDP2 tp=2 + sp, selective: x1.14 before the whole matmul output was counted)."""
    return 1.0 + reduce_scatter_output_kept(tp, sequence_parallel)


def every_other_mm_sac_bytes_per_token(shape: ModelShape, *, moe_layer: bool, tp: int, sequence_parallel: bool,
                                       act_bytes: int) -> float:
    """torchtitan's op-level selective checkpointing keeps the outputs of matmuls and SDPA 'except every second
    mm' (torchtitan/models/llama/parallelize_llama.py _custom_policy): of a Llama block's wq, wk, wv, wo, w1, w3,
    w2 it keeps wq, wv, w1 and w2 (the 1st, 3rd, 5th and 7th), with SDPA's output and log-sum-exp and the block
    input; everything else is recomputed in backward. MoE layers keep the router probabilities, the routed
    experts' first matmul outputs and the layer's input instead of w1 and w2."""
    w = attention_widths(shape)
    h, sp_div = shape.hidden_size, _sp_div(tp, sequence_parallel)
    kept = (w.q_width + w.kv_heads * w.v_head_dim + w.out_width) * act_bytes / tp  # wq, wv, SDPA output
    kept += attention_logsumexp_bytes_per_token(w.heads) / tp
    kept += h * act_bytes * (1.0 / sp_div + row_parallel_outputs_kept(tp, sequence_parallel))  # block input, w2
    # wo's matmul is recomputed, but its reduction's output is kept
    kept += h * act_bytes * reduce_scatter_output_kept(tp, sequence_parallel)
    if moe_layer and shape.moe is not None:
        m = shape.moe
        kept += moe_router_bytes_per_token(m.num_experts) + m.top_k * m.expert_ffn_hidden_size * act_bytes / tp
    else:
        kept += shape.ffn_hidden_size * act_bytes / tp  # w1
    return kept


def activation_bytes_per_token_per_layer(terms: tuple[Term, ...], *, tp: int, sequence_parallel: bool,
                                         recompute: str, hidden: int, act_bytes: int,
                                         full_input_split: bool = False, micro_batch: int = 1) -> float:
    """Bytes per token of one layer under tp/sp and a recompute mode (Korthikanti Table 2), for micro-batches of
    ``micro_batch`` sequences (per-sequence terms are shared by them)."""
    if recompute == "full":
        # Only the layer input is kept (2sbh); with sp it is the sequence-parallel shard, and 1/tp too where the
        # implementation splits it (``full_input_split``: DeepSpeed's partition_activations)
        return hidden * act_bytes / (tp if sequence_parallel or full_input_split else 1)
    if recompute == "selective_per_op":
        kept = [t for t in terms if t.name in KEPT_BY_PER_OP_SAC]
        total = hidden * act_bytes * (1.0 / _sp_div(tp, sequence_parallel) + 2.0 * row_parallel_outputs_kept(
            tp, sequence_parallel))
        for t in kept:
            share = (2.0 / 3.0) if t.name.endswith("activation") and t.bytes_per_token > 0 else 1.0
            total += share * _per_token(t, micro_batch) / _term_shards(t, tp, sequence_parallel)
        return total
    total = 0.0
    for t in terms:
        if recompute == "selective" and t.name in RECOMPUTED_BY_SELECTIVE:
            continue
        total += _per_token(t, micro_batch) / _term_shards(t, tp, sequence_parallel)
    return total


def _per_token(t: Term, micro_batch: int) -> float:
    return t.bytes_per_token / micro_batch if t.per_sequence else t.bytes_per_token


def _term_shards(t: Term, tp: int, sequence_parallel: bool) -> int:
    """Over how many ranks a saved tensor is split: tp when tp shards it, or when sequence parallel does and the
    implementation keeps the shard (not the all-gathered whole)."""
    return tp if t.tp_sharded or (sequence_parallel and not t.sp_gathered) else 1


def activation_bytes_per_layer(terms: tuple[Term, ...], *, tokens: int, tp: int, sequence_parallel: bool,
                               recompute: str, hidden: int, act_bytes: int, full_input_split: bool = False,
                               micro_batch: int = 1) -> float:
    """Bytes one layer keeps for one micro-batch of ``tokens`` local tokens (micro_batch * seq / cp)."""
    return tokens * activation_bytes_per_token_per_layer(
        terms, tp=tp, sequence_parallel=sequence_parallel, recompute=recompute, hidden=hidden, act_bytes=act_bytes,
        full_input_split=full_input_split, micro_batch=micro_batch)


def recompute_working_set_bytes(terms: tuple[Term, ...], *, tokens: int, tp: int, sequence_parallel: bool,
                                recompute: str, hidden: int, act_bytes: int, micro_batch: int = 1) -> float:
    """During backward, recompute rematerialises one layer at a time: full -> that layer's whole
    activations; selective -> that layer's attention core."""
    if recompute == "none":
        return 0.0
    if recompute == "full":
        return activation_bytes_per_layer(terms, tokens=tokens, tp=tp, sequence_parallel=sequence_parallel,
                                          recompute="none", hidden=hidden, act_bytes=act_bytes, micro_batch=micro_batch)
    core = tuple(t for t in terms if t.name in RECOMPUTED_BY_SELECTIVE)
    return activation_bytes_per_layer(core, tokens=tokens, tp=tp, sequence_parallel=sequence_parallel,
                                      recompute="none", hidden=hidden, act_bytes=act_bytes, micro_batch=micro_batch)


# --- first and last stage extras -------------------------------------------------------------


def embedding_activation_bytes_per_token(shape: ModelShape, dropout: bool | None = None) -> float:
    """The embedding keeps only its dropout mask (Korthikanti sec. 4.2); lookups save indices."""
    return dropout_mask_bytes_per_token(shape.hidden_size) if uses_dropout(shape, dropout) else 0.0


def output_layer_activation_bytes_per_token(shape: ModelShape, act_bytes: int, impl: ActivationImpl) -> float:
    """Final norm input and the output-layer (logits GEMM) input."""
    h = shape.hidden_size
    return norm_input_bytes_per_token(h, act_bytes, impl, shape.norm) + gemm_input_bytes_per_token(h, act_bytes)


@dataclass(frozen=True)
class LossMemory:
    """The loss on the last stage for one cross-entropy implementation (CostProfile.cross_entropy), in bytes per
    logit (tokens x vocab / tp of the output layer): what one micro-batch keeps from its forward to its backward,
    and what exists beside it only while the loss runs."""

    kept_what: str
    transient_what: str
    source: str
    per_logit: Callable[[int], tuple[float, float]]  # the logits' bytes (the activation dtype) -> (kept, transient)


# by cross-entropy implementation (the keys of physics.yaml memory_bound.cross_entropy_bytes_per_element, which
# prices the same kernels' HBM traffic); ``b`` is the bytes of one logit (2 under bf16/fp16/fp8/nvfp4, 4 under fp32).
# The three kernels that run on CPU are measured by benchmarks/loss_memory.py (torch.profiler's allocation events:
# the bytes left from the forward, and the peak of one forward + backward), which tests/test_loss_memory.py runs
LOSS_MEMORY: dict[str, LossMemory] = {
    "fused": LossMemory(
        "logits kept for the loss gradient", "gradient",
        "Transformer Engine's Triton cross entropy up to 2.17 (transformer_engine/pytorch/triton/cross_entropy.py "
        "cross_entropy_forward writes the gradient into the logits in place and cross_entropy.py saves only them; "
        "TE 2.18's PR #3193 keeps an fp32 gradient instead) and flash-attn's xentropy (llm-foundry's "
        "fused_crossentropy: saves the logits, its backward writes a new gradient, inplace_backward=False): no fp32 "
        "copy of the logits; the gradient counts as flash-attn's (TE's is in place)",
        lambda b: (float(b), float(b))),
    "megatron_native": LossMemory(
        "fp32 softmax of the micro-batch in its loss", "fp32 gradient and its bf16 cast",
        "Megatron-Core's jit-fused vocab-parallel cross entropy (megatron/core/fusions/fused_cross_entropy.py, "
        "--cross-entropy-loss-fusion native): the fused steps save a new fp32 softmax, calculate_gradients writes a "
        "new fp32 gradient and casts it to bf16 beside it; measured 4 B kept, 10 B at the peak (megatron-core "
        "0.19.2 with its jit_fuser functions compiled by torch.compile, as on GPUs; benchmarks/loss_memory.py)",
        lambda b: (float(FP32_BYTES), FP32_BYTES + 2.0)),
    "megatron_fp32": LossMemory(
        "fp32 softmax of the micro-batch in its loss", "16-bit logits or gradient beside it",
        "Megatron-Core's unfused vocab_parallel_cross_entropy (megatron/core/tensor_parallel/cross_entropy.py): "
        ".float() copies 16-bit logits (fp32 logits are used as they are), every later step is in place and the "
        "softmax is saved; backward turns it into the gradient in place and autograd casts that to the logits' "
        "dtype; measured 4 B kept, 6 B at the peak with bf16 logits and 4 B with fp32 ones (megatron-core 0.19.2, "
        "benchmarks/loss_memory.py)",
        lambda b: (float(FP32_BYTES), float(b) if b < FP32_BYTES else 0.0)),
    "torch_fp32": LossMemory(
        "fp32 log-softmax of the micro-batch in its loss", "2 fp32 gradients",
        "F.cross_entropy(logits.float()) (torchtitan; dtc's trainers, compiler/runtime/model.py cross_entropy): "
        "log_softmax saves its fp32 output; in the backward nll_loss writes a dense fp32 gradient and "
        "log_softmax's backward a second one beside it; measured 4 B kept, 12 B at the peak (torch 2.13, "
        "benchmarks/loss_memory.py)",
        lambda b: (float(FP32_BYTES), 2.0 * FP32_BYTES)),
}
