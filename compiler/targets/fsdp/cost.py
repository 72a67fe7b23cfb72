"""How dtc's FSDP2 artifacts run a layout, as the cost model needs it (compiler.targets.cost).

render.py writes ``REDUCE_DTYPE`` from ``COST.grad_reduce_dtype``.
"""
from compiler.targets.cost import CostProfile

# the gradients' dtype (COST.grad_dtype, grad_reduce_dtype), as the memory breakdown cites it
GRAD_SOURCE = ("MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32): bf16 gradients reduce-scattered in fp32 "
               "into fp32 sharded gradients; the fp32 sharded parameter is the optimizer's master and the bf16 weights "
               "exist only unsharded, per unit (torch/distributed/fsdp/_fully_shard/_fsdp_param.py: the all-gather "
               "input is cast to param_dtype, the sharded grad takes the sharded parameter's dtype)")
# tensor parallel (COST.tp_overlap none), as the step breakdown cites it
TP_SOURCE = ("vanilla torch tensor parallel (Colwise/RowwiseParallel) runs its collectives on the critical path "
             "(async TP is a separate feature)")

COST = CostProfile(
    name="fsdp", display_name="PyTorch FSDP2 (dtc's generated trainer)", activations="torch_eager", attention="fa2",
    elementwise="eager", grad_dtype="fp32", grad_reduce_dtype="fp32", tp_overlap="none", ops_per_dense_layer=40,
    ops_per_moe_layer=60, ops_per_local_expert=6, recompute_selective="per_op", fp8_recipe="fp8_tensorwise_current",
    hierarchical_all_to_all=False, master_is_param=True, offload_moves_gradients=True, tp_splits_loss=False,
    cross_entropy="torch_fp32",
    dropout=False,  # compiler/runtime/model.py's blocks have no dropout
    source=f"dtc's fsdp_train.py (compiler/runtime/) with fsdp_config.json (torch 2.13): eager nn.Module blocks "
    f"(nn.RMSNorm, SDPA whose flash backend is FlashAttention-2, repeat_interleave GQA, silu * up), {GRAD_SOURCE}; "
    f"{TP_SOURCE}; selective checkpointing is op-level SAC (saves matmul / SDPA outputs); ~40 "
    "kernels per eager Llama block forward (counted from the block's code)", grad_source=GRAD_SOURCE, tp_source=TP_SOURCE)
