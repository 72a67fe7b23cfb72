"""What the cost model must know about the framework that runs a layout: ONE table.

A layout is costed *for a target*: Megatron-Core with Transformer Engine saves other
tensors, keeps other gradient buffers, overlaps other collectives and launches other
kernels than a PyTorch-eager FSDP2 or DeepSpeed trainer. Every such fact lives in
``FRAMEWORKS`` below (one row per framework profile), read by memory.py, compute.py,
comm.py and step.py through ``Setup.framework``. The render targets (``megatron``,
``fsdp``, ``deepspeed``) are profiles; so are the frameworks of published runs the
benchmarks cost (``megatron_lm_2021``, ``torchtitan``, ``llm_foundry``).
(This table moves into the target registry, compiler/targets/<name>/, when that lands.)

Sources of each fact are in the row's ``source``; the numbers they are used with live in
compiler/data/physics.yaml (kernel rates, bandwidth fractions).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, Mapping

from compiler.costmodel.activations import DEEPSEEK_V3, MEGATRON_TE, PAPER, TORCH_EAGER, ActivationImpl

AttentionKernel = Literal["cudnn", "fa3", "fa2", "fa1", "unfused"]


@dataclass(frozen=True)
class FrameworkProfile:
    """How one framework runs a transformer layer, as the cost model needs it."""

    name: str
    display_name: str
    activations: ActivationImpl  # which tensors autograd keeps (compiler/costmodel/activations.py)
    attention: AttentionKernel  # the kernel it asks for; physics.yaml maps it per GPU kernel class
    elementwise: Literal["fused", "eager"]  # norm / activation / rope / residual kernels
    main_grad_bytes: int  # bytes per gradient element kept in 16-bit mixed precision (4: fp32 main_grad)
    grad_reduce_bytes: int  # bytes per gradient element on the wire of the data-parallel reduction
    tp_overlap: bool  # tensor-parallel collectives overlapped with GEMMs (the rest is exposed)
    ops_per_dense_layer: int  # kernels launched by one dense layer's forward (backward: 2x)
    ops_per_moe_layer: int  # ... one MoE layer's forward (router, permute, dispatch, experts, combine)
    ops_per_local_expert: int  # more forward kernels per local expert (one GEMM per expert and projection)
    recompute_selective: Literal["attention_core", "per_op"]  # what 'selective' recomputes
    fp8_recipe: str  # default fp8 recipe (physics.yaml gemm.quantize_bytes_per_element key)
    hierarchical_all_to_all: bool  # MoE tokens cross the network once per destination node (DeepEP-style)
    source: str
    elementwise_traffic: float = 1.0  # HBM bytes of its elementwise kernels per byte of a fused implementation's
    ep_overlap: bool = False  # MoE all-to-all hidden behind another micro-batch's compute (DualPipe)
    optimizer_state_bytes: int = 0  # bytes of optimizer state per parameter; 0: the optimizer's fp32 default


# Eager PyTorch runs each elementwise op as its own kernel, reading and writing the whole tensor: counted on a
# Llama block (RMSNorm in fp32: cast, pow, mean, rsqrt, two muls, cast ~ 32 B/element vs a fused kernel's 4; RoPE
# ~5 ops vs 1; silu * up 10 B vs 6; residual adds equal) the eager block moves ~2.5x a fused block's bytes.
EAGER_ELEMENTWISE_TRAFFIC = 2.5

_MEGATRON_SOURCE = (
    "Megatron-Core 0.19 + Transformer Engine: fused norms/linears/SwiGLU (TE LayerNormLinear, LayerNormMLP), "
    "cuDNN fused attention (TE get_attention_backend); --bf16 keeps fp32 main_grad buffers and reduces "
    "gradients in fp32 unless --grad-reduce-in-bf16 (megatron/training/arguments.py: 'bfloat16 requires "
    "gradient accumulation and all-reduce to be done in fp32'); TP collectives overlap the weight-gradient "
    "GEMM (async TP all-reduce) and, with --tp-comm-overlap, TE userbuffers; kernels per layer counted from "
    "megatron/core/transformer/transformer_layer.py (norm+QKV, rope, attention, proj, bias-dropout-add, "
    "norm+fc1, SwiGLU, fc2, bias-dropout-add, plus fp8 casts); MoE layers add router, top-k, permute, "
    "dispatch, two grouped GEMMs, activation, combine and unpermute (megatron/core/transformer/moe), and per local "
    "expert a GEMM per projection and its fp8 input cast (TE GroupedLinear launches one GEMM per expert, "
    "transformer_engine/pytorch/module/grouped_linear.py); "
    "selective recompute = the attention core (Korthikanti et al. 2022)")

FRAMEWORKS: Mapping[str, FrameworkProfile] = MappingProxyType({
    "megatron": FrameworkProfile(
        "megatron", "Megatron-Core + Transformer Engine", MEGATRON_TE, "cudnn", "fused", 4, 4, True, 16, 44, 4,
        "attention_core", "fp8_tensorwise_delayed", True, _MEGATRON_SOURCE),
    "megatron_bridge": FrameworkProfile(
        "megatron_bridge", "NeMo 2 / Megatron-Bridge performance recipes", MEGATRON_TE, "cudnn", "fused", 2, 2, True,
        16, 44, 4, "attention_core", "fp8_tensorwise_current", True,
        _MEGATRON_SOURCE + "; NeMo 2 / Megatron-Bridge benchmark recipes reduce gradients in bf16: "
        "megatron/bridge/perf_recipes/_common.py _perf_precision 'always sets grad_reduce_in_fp32=False' "
        "(github.com/NVIDIA-NeMo/Megatron-Bridge), so main_grad buffers are bf16"),
    "deepseek_v3": FrameworkProfile(
        "deepseek_v3", "DeepSeek-V3's HAI-LLM (DualPipe, DeepEP)", DEEPSEEK_V3, "cudnn", "fused", 4, 4, False, 16, 44,
        4, "attention_core", "fp8_blockwise", True,
        "DeepSeek-V3 report (arXiv:2412.19437) sec. 3.2-3.3: DualPipe overlaps each chunk's all-to-all and PP "
        "communication with another chunk's computation ('nearly zero all-to-all communication overhead'), DeepEP "
        "node-limited dispatch (each token to at most 4 nodes, NVLink forwarding), fine-grained FP8 GEMMs (1x128 / "
        "128x128 scales), FP32 gradient accumulation, AdamW moments in BF16, recomputed RMSNorm and MLA "
        "up-projections, FP8 activation caches; no tensor parallelism",
        ep_overlap=True, optimizer_state_bytes=4),
    "llama3_meta": FrameworkProfile(
        "llama3_meta", "Meta's Llama 3 training stack (4D parallelism)", MEGATRON_TE, "fa2", "fused", 4, 4, False, 16,
        44, 4, "attention_core", "fp8_tensorwise_delayed", False,
        "Llama 3 paper (arXiv:2407.21783) sec. 3.3.2: TP/CP/PP/FSDP; FSDP shards optimizer states and gradients "
        "but does not reshard the model after the forward (ZeRO-2 with a layout's zero_stage=2); FP32 gradient "
        "accumulation and FP32 reduce-scatter; interleaved pipeline schedule with asynchronous point-to-point, "
        "stage inputs/outputs freed proactively; no activation checkpointing at 8K context. The stack is not "
        "public: fused elementwise kernels and a FlashAttention-2 class attention kernel (the public state of "
        "the art while the 405B was trained; FlashAttention-3 came out with the paper) and no overlap of "
        "tensor-parallel collectives (none is described) are assumptions"),
    "megatron_lm_2021": FrameworkProfile(
        "megatron_lm_2021", "Megatron-LM (2021-2022, before Transformer Engine)", PAPER, "unfused", "fused", 4, 4,
        False, 18, 44, 4, "attention_core", "fp8_tensorwise_delayed", False,
        "Megatron-LM as in Narayanan et al. 2021 / Korthikanti et al. 2022: attention as two batched GEMMs around "
        "a fused scale-mask-softmax kernel (no FlashAttention), the activation terms of Korthikanti Table 2, fp32 "
        "gradient accumulation and all-reduce, no overlap of tensor-parallel collectives"),
    "fsdp": FrameworkProfile(
        "fsdp", "PyTorch FSDP2 (dtc's generated trainer)", TORCH_EAGER, "fa2", "eager", 2, 4, False, 40, 60, 6,
        "per_op", "fp8_tensorwise_current", False,
        "dtc's fsdp_train.py / fsdp_config.py (torch 2.13): eager nn.Module blocks (nn.RMSNorm, SDPA whose flash "
        "backend is FlashAttention-2, repeat_interleave GQA, silu * up), MixedPrecisionPolicy(param_dtype=bf16, "
        "reduce_dtype=float32): bf16 gradients reduce-scattered in fp32 into fp32 sharded gradients; vanilla "
        "torch tensor parallel (Colwise/RowwiseParallel) runs its collectives on the critical path (async TP is "
        "a separate feature); selective checkpointing is op-level SAC (saves matmul / SDPA outputs); ~40 "
        "kernels per eager Llama block forward (counted from the block's code)"),
    "torchtitan": FrameworkProfile(
        "torchtitan", "torchtitan (FSDP2, torch 2.4-2.6)", TORCH_EAGER, "fa2", "eager", 2, 4, False, 40, 60, 6,
        "per_op", "fp8_tensorwise_current", False,
        "pytorch/torchtitan models/llama (eager blocks as dtc's fsdp target, SDPA flash backend), FSDP2 with "
        "MixedPrecisionPolicy(bf16, reduce fp32), Float8 via torchao tensorwise dynamic (current) scaling, "
        "'selective (op)' activation checkpointing saves matmul outputs (docs/performance.md); torch.compile "
        "fuses elementwise kernels when enabled", EAGER_ELEMENTWISE_TRAFFIC),
    "llm_foundry": FrameworkProfile(
        "llm_foundry", "MosaicML llm-foundry (PyTorch FSDP1 + Composer)", TORCH_EAGER, "fa1", "eager", 2, 4, False,
        34, 60, 6, "per_op", "fp8_tensorwise_delayed", False,
        "mosaicml/llm-foundry MPT blocks (LayerNorm without bias, the Triton flash-attention kernel with ALiBi, "
        "attn_impl: triton in the 2023 MPT yamls, a FlashAttention-1 class kernel; GELU MLP), FSDP FULL_SHARD with "
        "mixed_precision DEFAULT (fp32 gradients reduced in fp32) or PURE (bf16), Composer trainer "
        "(scripts/train/benchmarking/README.md)", EAGER_ELEMENTWISE_TRAFFIC),
    "deepspeed": FrameworkProfile(
        "deepspeed", "DeepSpeed (dtc's generated trainer)", TORCH_EAGER, "fa2", "eager", 2, 2, False, 40, 60, 6,
        "attention_core", "fp8_tensorwise_delayed", False,
        "dtc's ds_train.py (DeepSpeed 0.19.8): eager nn.Module blocks (nn.RMSNorm, SDPA, repeat_interleave GQA), "
        "bf16 gradients reduced in bf16 (DeepSpeed bf16 mode, communication_data_type default), ZeRO stages; AutoTP "
        "collectives on the critical path; selective recompute checkpoints the attention core only",
        EAGER_ELEMENTWISE_TRAFFIC),
})

# Render targets that are not training frameworks (the launcher) and cost as the framework they launch.
NON_FRAMEWORK_TARGETS = ("slurm",)
DEFAULT_FRAMEWORK = "megatron"


def framework_profile(name: str) -> FrameworkProfile:
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise KeyError(f"no framework profile {name!r}; known: {', '.join(FRAMEWORKS)}") from None


def costed_targets(targets: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The framework targets of a problem, in order (the launcher targets left out); the default
    framework when the problem names none."""
    out = tuple(t for t in targets if t not in NON_FRAMEWORK_TARGETS and t in FRAMEWORKS)
    return out or (DEFAULT_FRAMEWORK,)
