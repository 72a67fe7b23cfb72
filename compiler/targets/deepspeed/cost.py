"""How dtc's DeepSpeed artifacts run a layout, as the cost model needs it (compiler.targets.cost)."""
from compiler.targets.cost import CostProfile

# DeepSpeed's own default for the stage-3 cap on gathered parameters, written into ds_config.json by render.py
# (docs/config-json "stage3_max_live_parameters": 1e9); the cost model caps ZeRO-3's gathered weights by it
STAGE3_MAX_LIVE_PARAMETERS = 10**9

# the gradients' dtype (COST.grad_dtype, grad_reduce_dtype), as the memory breakdown cites it
GRAD_SOURCE = ("gradients accumulated and reduced in fp32 (render.py writes this profile's grad_dtype and "
               "grad_reduce_dtype as ds_config.json's data_types.grad_accum_dtype and communication_data_type)")
# tensor parallel (COST.tp_overlap none), as the step breakdown cites it
TP_SOURCE = "AutoTP collectives on the critical path"


def source_with(grad_source: str) -> str:
    """The profile's source with ``grad_source`` as its gradients' sentence (DeepSpeed's own defaults differ:
    compiler/calibration/frameworks.py)."""
    return (f"dtc's ds_train.py (DeepSpeed 0.19.8): eager nn.Module blocks (nn.RMSNorm, SDPA, repeat_interleave GQA), "
            f"{grad_source}, ZeRO stages; {TP_SOURCE}; selective recompute checkpoints the attention core only")


COST = CostProfile(
    name="deepspeed", display_name="DeepSpeed (dtc's generated trainer)", activations="torch_eager", attention="fa2",
    elementwise="eager", grad_dtype="fp32", grad_reduce_dtype="fp32", tp_overlap="none", ops_per_dense_layer=40,
    ops_per_moe_layer=60, ops_per_local_expert=6, recompute_selective="attention_core",
    fp8_recipe="fp8_tensorwise_delayed", hierarchical_all_to_all=False, zero3_live_params=STAGE3_MAX_LIVE_PARAMETERS,
    zero_fp32_partition_copy=True,
    offload_moves_gradients=True, offload_keeps_gradient_partition=True, tp_splits_vocab=False,
    tp_splits_loss=False, full_recompute_inputs_split_over_tp=True, cross_entropy="torch_fp32",
    hybrid_shard="hpz",
    dropout=False,  # compiler/runtime/model.py's blocks have no dropout
    source=source_with(GRAD_SOURCE), grad_source=GRAD_SOURCE, tp_source=TP_SOURCE)
