"""FSDP2 target: ``fsdp_config.py`` (the plan as an importable module) and ``fsdp_train.py`` (torchrun entry).

``fsdp_context(plan)`` computes every value the templates place; the templates
``fsdp/fsdp_config.py.j2`` and ``fsdp/fsdp_train.py.j2`` hold the code, which depends
only on torch 2.13 (the fsdp target's versions, compiler/targets/fsdp/__init__.py).

How FSDP2 runs a dtc layout (the support rules are ``compiler.targets.support`` "fsdp"):

- ZeRO-0: ``fully_shard`` over a 2-D (dp_replicate, dp_shard=1) mesh, i.e. replicated
  parameters with all-reduced gradients (DDP semantics, and it composes with TP/PP);
  ZeRO-2: ``reshard_after_forward=False``; ZeRO-3: ``reshard_after_forward=True``;
  ZeRO-1 is not available in FSDP2.
- HSDP: the same 2-D (dp_replicate, dp_shard) mesh with dp_shard > 1.
- TP/SP: DTensor ``parallelize_module`` with torchtitan's Llama plan.
- PP: ``torch.distributed.pipelining`` with a manual split into pp x vpp stages
  (GPipe, 1F1B, interleaved 1F1B) holding Megatron's split of the layers (compiler.split, the
  split the plan is costed with: ``STAGE_LAYERS``); microbatches = grad_accum.
- CP: ``context_parallel`` on CUDA only (torch 2.13 has no CPU sharding rule for SDPA).
- Offload: ``CPUOffloadPolicy`` (parameters + optimizer together, ZeRO-3).
- Precision: MixedPrecisionPolicy(bf16 or fp16 params, fp32 reduce); fp16 adds dynamic
  loss scaling; fp32 keeps fp32 parameters.
"""
from __future__ import annotations

import ast
from typing import Any

from compiler import rules
from compiler.errors import Diagnostic, RenderError
from compiler.plan import Plan
from compiler.render.environment import render_template
from compiler.render.report import provenance_header
from compiler.targets.fsdp.cost import COST

CONFIG_FILE = "fsdp_config.py"
TRAIN_FILE = "fsdp_train.py"
MESH_DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")

_PARAM_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_MODEL_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
               "vocab_size", "mlp", "norm", "tied_embeddings", "attention_bias", "linear_bias")


def _check_supported(plan: Plan) -> None:
    bad = rules.plan_violations(plan, ("fsdp",))
    if bad:
        raise RenderError(Diagnostic(
            summary=f"FSDP2 cannot run layout {plan.layout.tag}: {rules.describe(bad)}",
            detail="the solver should not have chosen this layout for a plan with the fsdp target",
            hint="remove fsdp from targets, or pin a layout FSDP2 supports; if the solver chose it, please report"))


def _sharding(plan: Plan) -> tuple[str, str]:
    lay = plan.layout
    if lay.zero_stage == 0:
        return "replicate", "ZeRO-0: a (dp_replicate, dp_shard=1) mesh, parameters replicated, gradients all-reduced"
    name = "full_shard" if lay.zero_stage == 3 else "shard_grad_op"
    if lay.dp_replicate > 1:
        return ("hybrid_" + name,
                f"HSDP: ZeRO-{lay.zero_stage} within {lay.dp_shard} ranks, replicated {lay.dp_replicate} times")
    return name, f"ZeRO-{lay.zero_stage} over {lay.dp_shard} ranks"


def _model(plan: Plan) -> dict[str, Any]:
    shape = plan.model.shape
    values = {key: getattr(shape, key) for key in _MODEL_KEYS}
    values["head_dim"] = shape.kv_channels
    return values


def fsdp_context(plan: Plan) -> dict[str, Any]:
    """Every value the FSDP2 templates place, computed from the plan."""
    _check_supported(plan)
    lay, t = plan.layout, plan.training
    world, nodes = lay.world_size, lay.num_nodes
    if world % nodes:
        raise RenderError(Diagnostic(
            summary=f"world size {world} does not split evenly over {nodes} nodes of {lay.gpus_per_node} GPUs",
            hint="use a GPU count that is a multiple of the node size (or below one node)"))
    precision = str(t.precision)
    sharding, sharding_note = _sharding(plan)
    tokens = int(t.tokens)
    return {
        "header": provenance_header(plan),
        "plan_name": plan.name,
        "describe": lay.describe(),
        "layout_tag": lay.tag,
        "torch_version": plan.provenance.frameworks["torch"],
        "mesh_dim_names": MESH_DIM_NAMES,
        "degrees": {"pp": lay.pp, "dp_replicate": lay.dp_replicate, "dp_shard": lay.dp_shard, "cp": lay.cp,
                    "tp": lay.tp, "vpp": lay.vpp},
        "world_size": world,
        "num_nodes": nodes,
        "nproc_per_node": world // nodes,
        "zero_stage": lay.zero_stage,
        "sharding": sharding,
        "sharding_note": sharding_note,
        "reshard_after_forward": lay.zero_stage == 3,
        "param_dtype": _PARAM_DTYPES[precision],
        "reduce_dtype": _PARAM_DTYPES[COST.grad_reduce_dtype],  # the cost model reads the same fact
        "use_grad_scaler": precision == "fp16",
        "offload": "cpu" if lay.offload_params == "cpu" else "none",
        "sequence_parallel": lay.sequence_parallel,
        "ac_mode": lay.recompute,
        "micro_batch": lay.micro_batch,
        "grad_accum": lay.grad_accum,
        "global_batch": lay.global_batch,
        "seq_len": int(t.seq_len),
        "pp_schedule": lay.schedule,
        "pp_microbatches": lay.grad_accum,
        "optimizer": str(t.optimizer),
        "lr": float(t.learning_rate),
        "min_lr": float(t.min_learning_rate),
        "warmup_fraction": round(int(t.warmup_tokens) / tokens, 6) if tokens else 0.0,
        "weight_decay": float(t.weight_decay),
        "betas": (float(t.adam_beta1), float(t.adam_beta2)),
        "grad_clip": float(t.grad_clip),
        "seed": int(t.seed),
        "model": _model(plan),
        "stage_layers": plan.layer_split().chunk_layers,
        "split_note": plan.layer_split().split.describe(),
    }


def render_fsdp(plan: Plan) -> dict[str, str]:
    """{"fsdp_config.py": ..., "fsdp_train.py": ...} for ``plan``."""
    context = fsdp_context(plan)
    return {
        CONFIG_FILE: render_template("fsdp/fsdp_config.py.j2", **context),
        TRAIN_FILE: render_template("fsdp/fsdp_train.py.j2", **context),
    }


# ------------------------------------------------------------------------------ invariants
def _module_constants(text: str) -> dict[str, object]:
    values: dict[str, object] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return values


def check_artifacts(c: Any, files: dict[str, str]) -> None:
    """fsdp_config.py's constants agree with the plan (compiler.render.invariants)."""
    text = files[CONFIG_FILE]
    lay = c.plan.layout
    k = _module_constants(text)
    for name, want in (("TP", lay.tp), ("PP", lay.pp), ("CP", lay.cp), ("DP_REPLICATE", lay.dp_replicate),
                       ("DP_SHARD", lay.dp_shard), ("WORLD_SIZE", lay.world_size), ("ZERO_STAGE", lay.zero_stage),
                       ("MICRO_BATCH", lay.micro_batch), ("GRAD_ACCUM", lay.grad_accum),
                       ("GLOBAL_BATCH", c.plan.training.global_batch)):
        c.expect("fsdp_config.py", name, k.get(name), want)
    mesh = 1
    for name in ("TP", "PP", "CP", "DP_REPLICATE", "DP_SHARD"):
        mesh *= int(k.get(name, 1))  # type: ignore[arg-type]
    c.expect("fsdp_config.py", "the mesh size", mesh, lay.world_size)
    if lay.zero_stage in (2, 3):
        c.expect("fsdp_config.py", "RESHARD_AFTER_FORWARD", k.get("RESHARD_AFTER_FORWARD"), lay.zero_stage == 3)
