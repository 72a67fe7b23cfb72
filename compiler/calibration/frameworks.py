"""The frameworks of published runs that are not dtc targets, as cost profiles (compiler.targets.cost).

dtc's own targets (megatron, fsdp, deepspeed) carry their profiles in the target registry
(``compiler.targets.registry.get(name).cost``): those describe dtc's artifacts. The runs of the
calibration set were made with other stacks, whose facts are collected here, each with its source.
``published_profile(name)`` finds either kind by name.
"""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Mapping

from compiler.targets import registry
from compiler.targets.cost import CostProfile
from compiler.targets.deepspeed.cost import COST as DEEPSPEED
from compiler.targets.deepspeed.cost import source_with as deepspeed_source_with
from compiler.targets.megatron.cost import COST as MEGATRON
from compiler.targets.megatron.cost import SOURCE as MEGATRON_CORE_SOURCE

# NeMo's and Megatron-Bridge's recipes run Megatron-Core with Transformer Engine userbuffers overlapping the
# tensor-parallel collectives of both passes (tp_comm_overlap in their performance recipes); their MoE runs are
# costed with a node-aware (DeepEP-style) dispatch unless the row's recipe says which dispatcher ran
# (compiler.calibration.runs.with_bridge_recipe: BridgeRecipe.node_aware_dispatch); dtc's own Megatron target
# renders --moe-token-dispatcher-type alltoall, which sends every token copy: not hierarchical; their loss is stated
# per profile below for every precision, not dtc's renderer's fp16/fp32 exception
_BRIDGE = replace(MEGATRON, tp_overlap="full", hierarchical_all_to_all=True, cross_entropy_by_precision=(),
                  dropout=None)  # dtc's renderer sets dropout 0; the published runs' GPT-3 configs are not checked

# the gradients' dtype of the profiles below that keep them in bf16 (CostProfile.grad_source)
_DEEPSPEED_BF16_GRADS = ("bf16 gradients reduced in bf16 (DeepSpeed bf16 mode: grad_accum_dtype and "
                         "communication_data_type default to the model dtype, deepspeed/runtime/engine.py get_data_types "
                         "/ communication_data_type)")
_NEMO_2407_BF16_GRADS = ("NeMo 24.07 performance runs (NVIDIA/NeMo-Framework-Launcher examples/training/llama/h100/*.sh: "
                         "+training.model.optim.grad_sync_dtype=bf16, fp8_hybrid with amax history 1024, i.e. delayed "
                         "scaling, launcher_scripts/conf/training/llama/*.yaml) keep and reduce gradients in bf16")
_BRIDGE_BF16_GRADS = ("NeMo 2 / Megatron-Bridge benchmark recipes reduce gradients in bf16: megatron/bridge/perf_recipes/"
                      "_common.py _perf_precision 'always sets grad_reduce_in_fp32=False' "
                      "(github.com/NVIDIA-NeMo/Megatron-Bridge), so main_grad buffers are bf16")

PUBLISHED_FRAMEWORKS: Mapping[str, CostProfile] = MappingProxyType({
    # published DeepSpeed runs keep DeepSpeed's bf16-mode defaults; dtc's ds_config.json asks for fp32 (cost.py)
    "deepspeed_defaults": replace(
        DEEPSPEED, dropout=None, grad_dtype="bf16", grad_reduce_dtype="bf16", source=deepspeed_source_with(_DEEPSPEED_BF16_GRADS),
        grad_source=_DEEPSPEED_BF16_GRADS),
    "nemo_2407": replace(
        _BRIDGE, name="nemo_2407", display_name="NeMo 24.07 (Megatron-Core, NeMo-Framework-Launcher recipes)",
        grad_dtype="bf16", grad_reduce_dtype="bf16", fp8_recipe="fp8_tensorwise_delayed", fp8_recipe_by_generation=(),
        cross_entropy="megatron_fp32",
        source=MEGATRON_CORE_SOURCE + "; " + _NEMO_2407_BF16_GRADS + "; their GPT-3 and "
        "Llama 2 configs leave cross_entropy_loss_fusion off, Megatron-Core's unfused fp32 "
        "vocab_parallel_cross_entropy (the Llama 3 and Nemotron ones: compiler/calibration/runs.py)",
        grad_source=_NEMO_2407_BF16_GRADS),
    "megatron_bridge": replace(
        _BRIDGE, name="megatron_bridge", display_name="NeMo 2 / Megatron-Bridge performance recipes",
        grad_dtype="bf16", grad_reduce_dtype="bf16", fp8_recipe="fp8_tensorwise_current", fp8_recipe_by_generation=(),
        cross_entropy="fused",
        source=MEGATRON_CORE_SOURCE + "; " + _BRIDGE_BF16_GRADS + "; their "
        "loss is Transformer Engine's fused cross entropy (cross_entropy_fusion_impl te: v0.1.0's perf YAMLs, "
        "perf_recipes/_common.py _benchmark_common)", grad_source=_BRIDGE_BF16_GRADS),
    "deepseek_v3": CostProfile(
        name="deepseek_v3", display_name="DeepSeek-V3's HAI-LLM (DualPipe, DeepEP)", activations="deepseek_v3",
        attention="cudnn", elementwise="fused", grad_dtype="fp32", grad_reduce_dtype="fp32", tp_overlap="none",
        ops_per_dense_layer=16, ops_per_moe_layer=44, ops_per_local_expert=4, recompute_selective="attention_core",
        fp8_recipe="fp8_blockwise", hierarchical_all_to_all=True, ep_overlap=True, optimizer_state_bytes=4,
        moe_dispatch_fp8=True,
        source="DeepSeek-V3 report (arXiv:2412.19437) sec. 3.2-3.3: DualPipe overlaps each chunk's all-to-all and PP "
        "communication with another chunk's computation ('nearly zero all-to-all communication overhead'), DeepEP "
        "node-limited dispatch (each token to at most 4 nodes, NVLink forwarding) of FP8 activations (sec. 3.3.2), "
        "fine-grained FP8 GEMMs (1x128 / "
        "128x128 scales), FP32 gradient accumulation, AdamW moments in BF16, recomputed RMSNorm and MLA "
        "up-projections, FP8 activation caches; no tensor parallelism; a fused cross entropy (an assumption: the stack is "
        "not public)"),
    "llama3_meta": CostProfile(
        name="llama3_meta", display_name="Meta's Llama 3 training stack (4D parallelism)", activations="megatron_te",
        attention="fa2", elementwise="fused", grad_dtype="fp32", grad_reduce_dtype="fp32", tp_overlap="none",
        ops_per_dense_layer=16, ops_per_moe_layer=44, ops_per_local_expert=4, recompute_selective="attention_core",
        fp8_recipe="fp8_tensorwise_delayed", hierarchical_all_to_all=False,
        source="Llama 3 paper (arXiv:2407.21783) sec. 3.3.2: TP/CP/PP/FSDP; FSDP shards optimizer states and gradients "
        "but does not reshard the model after the forward (ZeRO-2 with a layout's zero_stage=2); FP32 gradient "
        "accumulation and FP32 reduce-scatter; interleaved pipeline schedule with asynchronous point-to-point, "
        "stage inputs/outputs freed proactively; no activation checkpointing at 8K context. The stack is not "
        "public: fused elementwise kernels and a FlashAttention-2 class attention kernel (the public state of "
        "the art while the 405B was trained; FlashAttention-3 came out with the paper) and no overlap of "
        "tensor-parallel collectives (none is described) and a fused cross entropy are assumptions"),
    "megatron_lm_2021": CostProfile(
        name="megatron_lm_2021", display_name="Megatron-LM (2021-2022, before Transformer Engine)",
        activations="paper", attention="unfused", elementwise="fused", grad_dtype="fp32", grad_reduce_dtype="fp32",
        tp_overlap="none", ops_per_dense_layer=18, ops_per_moe_layer=44, ops_per_local_expert=4,
        recompute_selective="attention_core", fp8_recipe="fp8_tensorwise_delayed", hierarchical_all_to_all=False,
        cross_entropy="megatron_fp32",
        source="Megatron-LM as in Narayanan et al. 2021 / Korthikanti et al. 2022: attention as two batched GEMMs "
        "around a fused scale-mask-softmax kernel (no FlashAttention), the activation terms of Korthikanti Table 2, "
        "fp32 gradient accumulation and all-reduce, no overlap of tensor-parallel collectives, the fp32 "
        "vocab_parallel_cross_entropy (mpu/cross_entropy.py on output.float())"),
    "torchtitan": CostProfile(
        name="torchtitan", display_name="torchtitan (FSDP2, torch 2.4-2.6)", activations="torch_eager",
        attention="fa2", elementwise="eager", grad_dtype="fp32", grad_reduce_dtype="fp32", tp_overlap="none",
        ops_per_dense_layer=40, ops_per_moe_layer=60, ops_per_local_expert=6,
        recompute_selective="per_op_every_other_mm", fp8_recipe="fp8_tensorwise_current",
        hierarchical_all_to_all=False, master_is_param=True, cross_entropy="torch_fp32",
        source="pytorch/torchtitan models/llama (eager blocks as dtc's fsdp target, SDPA flash backend), FSDP2 with "
        "MixedPrecisionPolicy(bf16, reduce fp32), Float8 via torchao tensorwise dynamic (current) scaling, "
        "'selective (op)' activation checkpointing saves the outputs of matmuls and SDPA 'except every second mm' "
        "(torchtitan/models/llama/parallelize_llama.py _custom_policy); torch.compile "
        "fuses elementwise kernels when enabled; the fp32 sharded parameter is the optimizer's master and takes the "
        "fp32 reduced gradient (as dtc's fsdp target); the loss is F.cross_entropy on fp32 logits "
        "(2024: models/llama/model.py self.output(h).float(); since: components/loss.py pred.float())"),
    "llm_foundry": CostProfile(
        name="llm_foundry", display_name="MosaicML llm-foundry (PyTorch FSDP1 + Composer)", activations="torch_eager",
        attention="fa1", elementwise="eager", grad_dtype="fp32", grad_reduce_dtype="fp32", tp_overlap="none",
        ops_per_dense_layer=34, ops_per_moe_layer=60, ops_per_local_expert=6, recompute_selective="per_op",
        fp8_recipe="fp8_tensorwise_delayed", hierarchical_all_to_all=False, master_is_param=True, cross_entropy="fused",
        source="mosaicml/llm-foundry MPT blocks (LayerNorm without bias, the Triton flash-attention kernel with ALiBi, "
        "attn_impl: triton in the 2023 MPT yamls, a FlashAttention-1 class kernel; GELU MLP), FSDP FULL_SHARD with "
        "mixed_precision DEFAULT (fp32 gradients reduced in fp32) or PURE (bf16), Composer trainer "
        "(scripts/train/benchmarking/README.md); FSDP1 flat parameters are fp32 shards (the master), gradients "
        "reduced in fp32 into fp32 shards (torch/distributed/fsdp/_flat_param.py); loss_fn defaults to "
        "fused_crossentropy, flash-attn's xentropy kernel (llmfoundry/models/mpt/modeling_mpt.py)"),
})


def published_profile(name: str) -> CostProfile:
    """A published-run framework's profile, or a dtc target's (the registry's) by its name."""
    if name in PUBLISHED_FRAMEWORKS:
        return PUBLISHED_FRAMEWORKS[name]
    try:
        cost = registry.get(name).cost
    except KeyError:
        cost = None
    if cost is None:
        known = sorted(PUBLISHED_FRAMEWORKS) + [t.name for t in registry.targets() if t.cost is not None]
        raise KeyError(f"no cost profile {name!r}; known: {', '.join(known)}")
    return cost
