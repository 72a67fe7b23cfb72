"""What the cost model must know about how a framework runs a layout: a ``CostProfile``.

A layout is costed *for a target*: Megatron-Core with Transformer Engine saves other tensors,
keeps other gradient buffers, overlaps other collectives and launches other kernels than a
PyTorch-eager FSDP2 or DeepSpeed trainer. Each of dtc's framework targets carries its profile
as ``Target.cost`` (compiler/targets/<name>/__init__.py), next to the renderer that writes the
artifacts the profile describes, so that both read one value: the gradient dtype and the dtype
gradients are reduced in, which collectives the artifacts overlap, the fp8 recipe the renderer
selects. The frameworks of published runs that are not dtc targets (NeMo / Megatron-Bridge
recipes, torchtitan, llm-foundry, Meta's and DeepSeek's stacks) have profiles of the same type
in compiler/calibration/frameworks.py.

The cost model reads a profile through ``compiler.costmodel.context.Setup.framework``; the
numbers a fact is used with (kernel rates, bandwidth fractions) live in
compiler/data/physics.yaml. This module imports nothing of the cost model, so that the target
registry stays cheap to import.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

AttentionKernel = Literal["cudnn", "fa3", "fa2", "fa1", "unfused"]
TpOverlap = Literal["none", "backward", "full"]
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class CostProfile:
    """How one framework runs a transformer layer, as the cost model needs it (each fact sourced in ``source``)."""

    name: str
    display_name: str
    # which tensors autograd keeps: a name of compiler.costmodel.activations.IMPLS
    activations: str
    attention: AttentionKernel  # the kernel it asks for; physics.yaml maps it per GPU kernel class
    # norm / activation / rope / residual kernels: fused (Transformer Engine, Apex, torch.compile) or eager PyTorch
    # ops, each its own kernel (the bytes each moves: physics.yaml memory_bound.bytes_per_element)
    elementwise: Literal["fused", "eager"]
    # 16-bit mixed precision: the dtype of the gradients kept between backward and the optimizer step
    # (Megatron's main_grad buffer, DeepSpeed's grad_accum_dtype, FSDP2's sharded .grad) ...
    grad_dtype: Literal["fp32", "bf16"]
    # ... and the dtype they are reduced in across data parallel (Megatron --grad-reduce-in-bf16, DeepSpeed
    # communication_data_type, FSDP2 MixedPrecisionPolicy.reduce_dtype)
    grad_reduce_dtype: Literal["fp32", "bf16"]
    # tensor-parallel collectives hidden behind GEMMs: none (vanilla torch TP), backward (the dgrad all-reduce /
    # reduce-scatter runs asynchronously under the wgrad GEMM: Megatron / Transformer Engine by default), full
    # (+ forward: Transformer Engine userbuffers, --tp-comm-overlap; torch async TP)
    tp_overlap: TpOverlap
    ops_per_dense_layer: int  # kernels launched by one dense layer's forward (backward: 2x)
    ops_per_moe_layer: int  # ... one MoE layer's forward (router, permute, dispatch, experts, combine)
    ops_per_local_expert: int  # more forward kernels per local expert (one GEMM per expert and projection)
    # what 'selective' recomputes: the attention core (Megatron), every elementwise op keeping the matmul and
    # attention outputs (PyTorch op-level SAC), or that keeping only every other matmul output (torchtitan)
    recompute_selective: Literal["attention_core", "per_op", "per_op_every_other_mm"]
    fp8_recipe: str  # fp8 scaling recipe (physics.yaml gemm.quantize_bytes_per_element key) ...
    hierarchical_all_to_all: bool  # MoE tokens cross the network once per destination node (DeepEP-style)
    source: str
    # ... except on these GPU generations: ((generation, recipe), ...)
    fp8_recipe_by_generation: tuple[tuple[str, str], ...] = ()
    ep_overlap: bool = False  # MoE all-to-all hidden behind another micro-batch's compute (DualPipe)
    # the MoE dispatcher all-gathers each token's top_k routed copies over the expert tensor-parallel group and
    # reduce-scatters them back (Megatron-Core's alltoall and flex dispatchers, token_dispatcher.py
    # dispatch_postprocess / combine_preprocess: gather_from_sequence_parallel_region of the tokens the all-to-all
    # brought, over pg_collection.expt_tp); False: the routed path moves one hidden state over tp, as a dense MLP
    moe_tp_gathers_copies: bool = False
    # the MoE dispatch moves FP8 hidden states under an fp8 recipe (DeepSeek-V3 report sec. 3.3.2: the activations
    # are quantised to FP8 before the dispatch, for the up-projections' FP8 Fprop). False: the hidden states travel
    # in bf16 and the expert GEMMs quantise after the dispatch, as Megatron-Core's alltoall, DeepEP and HybridEP
    # dispatchers do (transformer/moe/token_dispatcher.py dispatches the layer input as it is; fused_a2a.py's
    # HybridEP: "Currently, we do not support fp8 dispatch")
    moe_dispatch_fp8: bool = False
    # the training iteration is captured as one CUDA graph and replayed (Megatron-Core --cuda-graph-impl
    # full_iteration, megatron/core/full_cuda_graph.py: forward and backward of every micro-batch in one
    # graph): the host submits one graph launch per step instead of each kernel, and MoE layers do not wait
    # for the host (token counts stay on the device: moe_paged_stash, padded expert buffers), so no layer is
    # launch-bound. "none": kernels launched one by one (partial TE graphs of a few modules are not modelled)
    cuda_graphs: Literal["none", "full_iteration"] = "none"
    # nvfp4 under a distributed optimizer or FSDP: the compute weights are NVFP4 tensors (row- and column-wise copies,
    # no 16-bit copy) all-gathered in NVFP4 (Megatron-LM --fp4-param-gather, which the renderer then emits)
    fp4_param_gather: bool = False
    optimizer_state_bytes: int = 0  # bytes of optimizer state per parameter; 0: the optimizer's fp32 default
    # the optimizer's fp32 master copy is the (sharded) parameter itself and the 16-bit weights exist only
    # unsharded for compute (FSDP2 with MixedPrecisionPolicy): no persistent 16-bit copy of a sharded weight
    master_is_param: bool = False
    # ZeRO-3: parameters gathered at once are capped at this many (DeepSpeed stage3_max_live_parameters, with
    # its reduce bucket for the unsharded gradients); 0: whole units (FSDP: the unit in use and the next)
    zero3_live_params: float = 0.0
    # ZeRO 1-3 keep the optimizer's flat fp32 partition as a copy of the parameters' partition even when the
    # parameters are fp32 (DeepSpeed: stage_1_and_2.py single_partition_of_fp32_groups, stage3.py
    # fp32_partitioned_groups_flat): an fp32 run still holds a "master" copy
    zero_fp32_partition_copy: bool = False
    # with the optimizer offloaded, the accumulated gradient shard lives in host memory beside the optimizer
    # (DeepSpeed: stage_1_and_2.py initialize_optimizer_states puts single_partition_of_fp32_groups[i].grad on
    # self.device = 'cpu' under cpu_offload, stage3.py its fp32 gradient partition; FSDP2: CPUOffloadPolicy moves
    # the sharded gradients to CPU). False: the gradient buffer stays on the GPU (Megatron's
    # --optimizer-cpu-offload copies main_grad out for each step). Whether the GPU also keeps one:
    # offload_keeps_gradient_partition
    offload_moves_gradients: bool = False
    # ZeRO-1/2 with the optimizer offloaded still accumulate the reduced gradient partition on the GPU (in
    # grad_dtype) and copy it to the host's partition at the accumulation boundary, so the GPU keeps the partition
    # too (DeepSpeed 0.19.8 with an fp32 grad_accum_dtype: stage_1_and_2.py copy_grads_in_partition ->
    # _get_compact_grad_partition_slice -> _build_compact_grad_partition_buffer on the accelerator; measured by
    # the smoke as averaged_gradients). ZeRO-3 (stage3.py) does not.
    offload_keeps_gradient_partition: bool = False
    # tensor parallel splits the vocabulary: word embeddings, output layer and logits are 1/tp per rank (Megatron's
    # VocabParallelEmbedding and parallel output layer, the FSDP2 trainer's RowwiseParallel / ColwiseParallel plan
    # for tok_embeddings and output, compiler/runtime/parallel.py). False: every tp rank holds them whole and
    # computes the full logits (DeepSpeed AutoTP splits only the blocks' linear layers of
    # compiler/runtime/model.py Transformer._tp_plan)
    tp_splits_vocab: bool = True
    # the loss runs over this rank's vocabulary shard (Megatron's vocab-parallel cross entropy). False: the logits
    # are gathered and every tp rank holds and reduces them whole (the FSDP2 trainer's output layer is
    # ColwiseParallel with output_layouts=Replicate, compiler/runtime/parallel.py apply_tp)
    tp_splits_loss: bool = True
    # full recompute keeps each layer's input split over the tp group, not whole: DeepSpeed's partition_activations
    # (deepspeed/runtime/activation_checkpointing/checkpointing.py partition_activations: each rank keeps its
    # 1/tp slice and all-gathers the input again before the layer's recompute), which the DeepSpeed renderer turns
    # on for tp > 1 from this flag. Megatron and FSDP2 keep the sequence-parallel shard, or the whole input without
    # sequence parallel
    full_recompute_inputs_split_over_tp: bool = False
    # ZeRO-3 parameter gathers per decoder layer and pass: FSDP gathers a wrapped block at once (1); DeepSpeed
    # ZeRO-3 fetches each submodule's partitioned parameters on its own (parameters under its persistence
    # threshold stay gathered), so a layer costs one collective per weight matrix
    zero3_gathers_per_layer: int = 1
    # the gathers (and the gradient reduce-scatters) block the computation instead of running beside it:
    # DeepSpeed ZeRO-3 before its prefetching coordinator synchronised every fetch (stage3.py fetch_sub_module
    # 'This call is blocking', torch.cuda.synchronize after the all-gather; overlap_comm False by default), and
    # a fetch is tied to a submodule's forward hooks, so full recompute fetches every parameter a third time
    zero3_blocking: bool = False
    # hybrid sharding (ZeRO-3 with dp_replicate > 1): "replicas": each group of dp_shard ranks holds a whole sharded
    # copy of the model states, gathers and reduce-scatters run inside it and the gradient shards are all-reduced
    # across the replicas once per step (FSDP2's 2-D HSDP mesh, Megatron). "hpz": DeepSpeed ZeRO++ hpZ
    # (zero_hpz_partition_size): every state stays partitioned over all dp ranks and gradients are reduce-scattered
    # over all of them; a secondary 16-bit copy of the weights, partitioned over dp_shard ranks, is made as each
    # parameter is released after its first forward of a step and freed after the optimizer step, and every gather
    # but that first forward's reads it (DeepSpeed 0.19.8 runtime/zero/partition_parameters.py _partition_param
    # / _partition_param_sec / _all_gather_coalesced, stage3.py _post_step invalidate_secondary_tensor)
    hybrid_shard: Literal["replicas", "hpz"] = "replicas"
    # an otherwise eager block whose norms run as one fused kernel each (torchtitan's norm_type = "fused_rmsnorm":
    # a Triton kernel that saves x, weight and rstd, not the fp32 copies of composite RMSNorm, and moves the bytes
    # of a fused norm, physics.yaml memory_bound.bytes_per_element)
    fused_norm: bool = False
    # the loss over the output layer's logits (physics.yaml memory_bound.cross_entropy_bytes_per_element): one fused
    # kernel (Transformer Engine's, Megatron-Core --cross-entropy-fusion-impl te; flash-attn's xentropy), Megatron-Core's
    # jit-fused steps (--cross-entropy-loss-fusion, native), its unfused fp32 vocab_parallel_cross_entropy, or
    # F.cross_entropy on fp32 logits
    cross_entropy: Literal["fused", "megatron_native", "megatron_fp32", "torch_fp32"] = "fused"
    # (precision, implementation): the loss under a training precision where it differs from cross_entropy (the
    # renderer emits the same; compiler/costmodel/compute.py cross_entropy_time_s reads cross_entropy_for)
    cross_entropy_by_precision: tuple[tuple[str, str], ...] = ()
    # whether the layers run dropout (and save its masks): False for a stack that trains without (dtc's targets);
    # None for a published stack, which trained GPT-2/3-style (biased) models with dropout 0.1
    # (compiler.costmodel.activations.uses_dropout)
    dropout: bool | None = None
    # the part of ``source`` that says in which dtype the gradients are kept and reduced (grad_dtype,
    # grad_reduce_dtype), which the memory breakdown's gradients line cites; "": ``source`` whole
    grad_source: str = ""
    # the part of ``source`` that says how the tensor-parallel collectives run where none is overlapped
    # (tp_overlap "none"), which the step breakdown's tp_comm line cites; "": ``source`` whole
    tp_source: str = ""

    @property
    def grad_fact(self) -> str:
        """What to cite for the gradients' dtype: grad_source, else the whole source."""
        return self.grad_source or self.source

    @property
    def tp_fact(self) -> str:
        """What to cite for tensor-parallel collectives that are not overlapped: tp_source, else the whole source."""
        return self.tp_source or self.source

    @property
    def grad_bytes(self) -> int:
        return DTYPE_BYTES[self.grad_dtype]

    @property
    def grad_reduce_bytes(self) -> int:
        return DTYPE_BYTES[self.grad_reduce_dtype]

    def cross_entropy_for(self, precision: str) -> str:
        """The cross-entropy implementation this framework runs under a training precision (bf16, fp16, fp8, fp32)."""
        return _override(self.cross_entropy_by_precision, precision, self.cross_entropy)

    def fp8_recipe_on(self, generation: str) -> str:
        """The fp8 scaling recipe this framework runs on a GPU generation (the renderer emits the same)."""
        return _override(self.fp8_recipe_by_generation, generation, self.fp8_recipe)


def _override(pairs: tuple[tuple[str, str], ...], key: str, default: str) -> str:
    """The value ``pairs`` give ``key`` (the first pair naming it), else ``default``: a profile's by-precision and
    by-generation exceptions."""
    return next((value for name, value in pairs if name == key), default)
