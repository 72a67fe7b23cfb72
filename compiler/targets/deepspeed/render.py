"""DeepSpeed target: ``ds_config.json`` (built as data) and the runtime's DeepSpeed trainer
(``dtc_runtime/``, copied verbatim) with its run config ``ds_train_config.json`` and the
``ds_train.py`` entry, for DeepSpeed 0.19.8.

``deepspeed_context(plan)`` computes the whole ds_config as a dict; ``render_deepspeed``
serialises it with ``json.dumps(indent=2, sort_keys=True)``. The learning-rate schedule is the
runtime's (Megatron's formula, set every step), so ds_config.json has no ``scheduler``;
gradients are accumulated and reduced in fp32 (``data_types.grad_accum_dtype``,
``communication_data_type``). Every key is one the
pinned release reads (tools/validators/deepspeed_check.py checks each generated config
with DeepSpeed's own ``DeepSpeedConfig`` at the plan's real data-parallel size).

How DeepSpeed runs a dtc layout (which layouts it can run is compiler.targets.support' table):

- pp > 1: DeepSpeed's pipeline engine (``deepspeed.pipe.PipelineModule``), ZeRO 0/1,
  its own 1F1B schedule, no virtual stages, no tensor parallelism.
- tp > 1: AutoTP (``tensor_parallel.autotp_size``), pp == 1.
- HSDP (dp_replicate > 1 with sharding): ZeRO-3 with ZeRO++ hpZ, a secondary copy of the
  weights sharded over ``zero_hpz_partition_size`` = dp_shard ranks.
- No context parallel, expert parallel, Megatron sequence parallel or fp8.
"""
from __future__ import annotations

import json
from typing import Any

from compiler import rules
from compiler.errors import RenderError
from compiler.layout import Layout
from compiler.model import ModelShape
from compiler.plan import Plan
from compiler.runtime_bundle import render_runtime_target
from compiler.targets.deepspeed.cost import COST, STAGE3_MAX_LIVE_PARAMETERS

CONFIG_FILE = "ds_config.json"
RUN_CONFIG_FILE = "ds_train_config.json"
TRAIN_FILE = "ds_train.py"

# NVMe offload needs a node-local directory; the spec has no field for it, so every plan uses
# this spec-independent default (PLAN notes say so: see deepspeed_notes). Edit ds_config.json
# (zero_optimization.offload_*.nvme_path) if your nodes mount NVMe elsewhere.
NVME_PATH = "/local_nvme"
ADAM_EPS = 1e-8  # torch / DeepSpeed / Megatron default; the spec has no eps field
SGD_MOMENTUM = 0.9
STEPS_PER_PRINT = 100
# DeepSpeed's own defaults for the stage-3 knobs that do not scale with the model
# (docs/config-json "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
# "sub_group_size": 1e9).
STAGE3_MAX_REUSE_DISTANCE = 10**9
SUB_GROUP_SIZE = 10**9
# fp16 dynamic loss scaling, DeepSpeed docs (config-json "fp16") defaults written out:
# loss_scale 0 means dynamic; start at 2**16, halve after 2 overflows, grow every 1000 steps.
FP16_LOSS_SCALING = {"loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                     "hysteresis": 2, "min_loss_scale": 1}
# ZeRO-Infinity async I/O for NVMe offload, DeepSpeed 0.19.8 defaults
# (runtime/swap_tensor/constants.py; "thread_count" of older docs is now "intra_op_parallelism").
AIO = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
       "overlap_events": True}


# ------------------------------------------------------------------------------ arithmetic
def deepspeed_dp_size(layout: Layout) -> int:
    """The world size DeepSpeed 0.19.8's batch identity divides by (``DeepSpeedConfig.world_size``).

    ``train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * W``
    is asserted in ``DeepSpeedConfig._batch_assertion`` (runtime/config.py), where W is:

    - pipeline engine: ``deepspeed.initialize`` builds ``DeepSpeedConfig(config, model.mpu())``
      and the PipelineParallelGrid reports the data-parallel size, world / pp = dp.
    - AutoTP: the training script passes no mpu (as in DeepSpeed's AutoTP tutorial), so
      ``DeepSpeedConfig`` takes ``dist.get_world_size()`` = dp * tp: W counts every TP rank
      although the TP ranks of a group see the same samples. The real number of distinct
      sequences per step is still micro * grad_accum * dp (ds_train.py prints it).
    - otherwise: the world size, = dp.
    """
    return layout.dp * layout.tp if layout.tp > 1 else layout.dp


def train_batch_size(layout: Layout) -> int:
    return layout.micro_batch * layout.grad_accum * deepspeed_dp_size(layout)


# ------------------------------------------------------------------------------ support
def _check(plan: Plan) -> None:
    """The layout rules and DeepSpeed's support rules (compiler.rules) decide what it can run; render nothing else."""
    bad = rules.plan_violations(plan, ("deepspeed",))
    if bad:
        raise RenderError(f"DeepSpeed {plan.provenance.frameworks['deepspeed']} cannot run layout "
                          f"{plan.layout.tag}: {rules.describe(bad)}",
                          hint="the solver should not have chosen this layout for the deepspeed target; "
                               "please report, or remove deepspeed from targets")


def deepspeed_notes(plan: Plan) -> list[str]:
    """Remarks on how DeepSpeed runs this plan, for the plan's notes (PLAN.md)."""
    lay = plan.layout
    notes = []
    if lay.tp > 1:
        notes.append(f"DeepSpeed runs tp={lay.tp} with AutoTP; its batch identity counts every TP rank, so "
                     f"ds_config.json has train_batch_size={train_batch_size(lay)} = micro {lay.micro_batch} x "
                     f"grad_accum {lay.grad_accum} x world {deepspeed_dp_size(lay)}; the distinct sequences per "
                     f"step are {lay.global_batch}.")
    if lay.pp > 1:
        notes.append(f"DeepSpeed runs pp={lay.pp} with its pipeline engine (PipelineModule, 1F1B).")
    if lay.is_hsdp:
        notes.append(f"DeepSpeed runs hybrid sharding as ZeRO-3 with ZeRO++ hpZ (zero_hpz_partition_size="
                     f"{lay.dp_shard}): optimizer states and gradients are sharded over all {lay.dp} data-parallel "
                     f"ranks, weights are all-gathered within groups of {lay.dp_shard}.")
    if "nvme" in (lay.offload_optimizer, lay.offload_params):
        notes.append(f"NVMe offload writes to {NVME_PATH} on every node (a dtc default, not from the spec); "
                     "change zero_optimization.offload_*.nvme_path in ds_config.json if needed.")
    return notes


# ------------------------------------------------------------------------------ the config
def deepspeed_context(plan: Plan) -> dict[str, Any]:
    """The ds_config for ``plan`` as data (JSON-ready; serialised with sorted keys)."""
    _check(plan)
    lay = plan.layout
    shape = plan.model.shape
    cfg: dict[str, Any] = {
        "train_batch_size": train_batch_size(lay),
        "train_micro_batch_size_per_gpu": lay.micro_batch,
        "gradient_accumulation_steps": lay.grad_accum,
        "gradient_clipping": float(plan.training.grad_clip),
        "steps_per_print": STEPS_PER_PRINT,
        "wall_clock_breakdown": False,
        "zero_optimization": _zero(lay, shape),
        "optimizer": _optimizer(plan),
        # gradients accumulated and reduced in fp32, as the other two targets do and the cost model
        # counts (DeepSpeed's default for bf16 is to accumulate and reduce in the parameter dtype)
        "data_types": {"grad_accum_dtype": COST.grad_dtype},  # the cost model reads the same facts (cost.py)
        "communication_data_type": COST.grad_reduce_dtype,
    }
    cfg.update(_precision(str(plan.training.precision)))
    if lay.zero_stage > 0 and plan.training.optimizer == "sgd":
        # engine.py _do_optimizer_sanity_check: torch.optim.SGD is not in ZERO_SUPPORTED_OPTIMIZERS
        cfg["zero_allow_untested_optimizer"] = True
        if lay.offload_optimizer != "none":
            cfg["zero_force_ds_cpu_optimizer"] = False  # offload without DeepSpeedCPUAdam
    if "nvme" in (lay.offload_optimizer, lay.offload_params):
        cfg["aio"] = dict(AIO)
    if lay.recompute != "none":
        cfg["activation_checkpointing"] = _activation_checkpointing(lay, shape)
    if lay.pp > 1:
        cfg["pipeline"] = {
            "stages": lay.pp,  # the layers of each stage are ds_train.py's PLAN["stage_layers"]
            # full recompute: checkpoint every layer (runtime/pipe/engine.py); selective is done
            # inside the layer by ds_train.py's attention
            "activation_checkpoint_interval": 1 if lay.recompute == "full" else 0,
        }
    if lay.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": lay.tp}
    return cfg


def _precision(precision: str) -> dict[str, Any]:
    if precision == "fp16":
        return {"bf16": {"enabled": False}, "fp16": {"enabled": True, **FP16_LOSS_SCALING}}
    if precision == "bf16":
        # immediate_grad_update: BF16_Optimizer (ZeRO-1 and the pipeline engine in bf16) adds each bf16 gradient to
        # its fp32 accumulation buffer as it is produced and frees it (bf16_optimizer.py
        # accumulate_hp_grads_and_remove_lp); without it every gradient lives twice, bf16 and fp32, through the end
        # of backward: 2 B per parameter the cost model does not count (the smoke measured x1.17)
        return {"bf16": {"enabled": True, "immediate_grad_update": True}, "fp16": {"enabled": False}}
    return {"bf16": {"enabled": False}, "fp16": {"enabled": False}}


# the ZeRO sizes _zero derives from the hidden size: a reduced model (dtc smoke) runs with its own
HIDDEN_SIZED_KEYS = ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                     "stage3_param_persistence_threshold")


def hidden_sized_zero(lay: Layout, shape: ModelShape) -> dict[str, int]:
    """The zero_optimization sizes ds_config.json would hold for ``shape`` (those of HIDDEN_SIZED_KEYS its stage
    uses)."""
    zero = _zero(lay, shape)
    return {key: zero[key] for key in HIDDEN_SIZED_KEYS if key in zero}


def _zero(lay: Layout, shape: ModelShape) -> dict[str, Any]:
    """ZeRO section for the stage.

    Bucket sizes follow the Hugging Face transformers DeepSpeed integration's "auto" rule
    (transformers/integrations/deepspeed.py, HfTrainerDeepSpeedConfig.trainer_config_finalize):
    reduce_bucket_size = hidden_size**2, stage3_prefetch_bucket_size = 0.9 * hidden_size**2,
    stage3_param_persistence_threshold = 10 * hidden_size. The all-gather bucket of ZeRO 1/2
    uses the same size as the reduce bucket (DeepSpeed's ZeRO tutorial sets both equal). The
    other stage-3 knobs keep DeepSpeed's documented defaults (config-json page).
    """
    h = shape.hidden_size
    if lay.zero_stage == 0:
        return {"stage": 0}
    zero: dict[str, Any] = {
        "stage": lay.zero_stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_scatter": True,
        "reduce_bucket_size": h * h,
    }
    if lay.zero_stage in (1, 2):
        zero["allgather_partitions"] = True
        zero["allgather_bucket_size"] = h * h
    else:
        zero.update({
            "stage3_prefetch_bucket_size": int(0.9 * h * h),
            "stage3_param_persistence_threshold": 10 * h,
            "stage3_max_live_parameters": STAGE3_MAX_LIVE_PARAMETERS,
            "stage3_max_reuse_distance": STAGE3_MAX_REUSE_DISTANCE,
            "sub_group_size": SUB_GROUP_SIZE,
            # save consolidated 16-bit weights with save_checkpoint / save_16bit_model
            "stage3_gather_16bit_weights_on_model_save": True,
        })
        if lay.is_hsdp:
            zero["zero_hpz_partition_size"] = lay.dp_shard
    if lay.offload_optimizer != "none":
        off: dict[str, Any] = {"device": lay.offload_optimizer, "pin_memory": True}
        if lay.offload_optimizer == "nvme":
            # buffer_count 4: Adam keeps 4 states per parameter (offload_config.py docstring)
            off.update({"nvme_path": NVME_PATH, "buffer_count": 4, "fast_init": False})
        zero["offload_optimizer"] = off
    if lay.offload_params != "none":
        off = {"device": lay.offload_params, "pin_memory": True}
        if lay.offload_params == "nvme":
            off.update({"nvme_path": NVME_PATH, "buffer_count": 5, "buffer_size": 10**8, "max_in_cpu": 10**9})
        zero["offload_param"] = off
    return zero


def _optimizer(plan: Plan) -> dict[str, Any]:
    t = plan.training
    if t.optimizer == "sgd":
        return {"type": "SGD", "params": {"lr": float(t.learning_rate), "momentum": SGD_MOMENTUM,
                                          "weight_decay": float(t.weight_decay)}}
    params: dict[str, Any] = {
        "lr": float(t.learning_rate),
        "betas": [float(t.adam_beta1), float(t.adam_beta2)],
        "eps": ADAM_EPS,
        "weight_decay": float(t.weight_decay),
    }
    if t.optimizer == "adam":
        # "Adam" alone means AdamW in DeepSpeed (engine.py: adam_w_mode defaults to True)
        return {"type": "Adam", "params": {**params, "adam_w_mode": False}}
    return {"type": "AdamW", "params": params}


def _activation_checkpointing(lay: Layout, shape: ModelShape) -> dict[str, Any]:
    """deepspeed.checkpointing settings, used by ds_train.py's checkpointed layers.

    partition_activations splits each saved layer input over the TP group (AutoTP): on when tp > 1,
    as the cost profile costs it (COST.full_recompute_inputs_split_over_tp); keeping checkpoints on
    the CPU is left off (it costs PCIe time the cost model does not charge).
    """
    return {
        "partition_activations": COST.full_recompute_inputs_split_over_tp and lay.tp > 1,
        "cpu_checkpointing": False,
        "contiguous_memory_optimization": False,
        "number_checkpoints": None,
        "synchronize_checkpoint_boundary": False,
        "profile": False,
    }


# ------------------------------------------------------------------------------ the files
def render_deepspeed(plan: Plan) -> dict[str, str]:
    """ds_config.json, dtc_runtime/*.py (verbatim), ds_train_config.json and ds_train.py for ``plan``."""
    cfg = deepspeed_context(plan)
    files = render_runtime_target(
        plan, target="deepspeed", config_file=RUN_CONFIG_FILE, entry_file=TRAIN_FILE, module="deepspeed_train",
        doc=f"DeepSpeed entry for {plan.name} (layout {plan.layout.tag}): torchrun|deepspeed ... ds_train.py "
            f"[--steps N]; runs dtc_runtime/deepspeed_train.py with {RUN_CONFIG_FILE} and {CONFIG_FILE} "
            "(all beside this file).")
    files[CONFIG_FILE] = json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return files


# ------------------------------------------------------------------------------ invariants
def check_artifacts(c: Any, files: dict[str, str]) -> None:
    """ds_config.json agrees with the plan (compiler.render.invariants)."""
    cfg = json.loads(files[CONFIG_FILE])
    lay = c.plan.layout
    c.expect("ds_config.json", "train_micro_batch_size_per_gpu", cfg.get("train_micro_batch_size_per_gpu"),
             lay.micro_batch)
    c.expect("ds_config.json", "gradient_accumulation_steps", cfg.get("gradient_accumulation_steps"), lay.grad_accum)
    # DeepSpeed's identity: train_batch_size = micro x accumulation x the world it divides by
    # (dp, or dp x tp under AutoTP, which counts every TP rank; see deepspeed_dp_size above).
    ranks = lay.dp * (lay.tp if lay.tp > 1 else 1)
    c.expect("ds_config.json", "train_batch_size", cfg.get("train_batch_size"),
             lay.micro_batch * lay.grad_accum * ranks)
    c.expect("ds_config.json", "zero_optimization.stage", cfg.get("zero_optimization", {}).get("stage"),
             lay.zero_stage)
    if lay.pp > 1:
        c.expect("ds_config.json", "pipeline.stages", cfg.get("pipeline", {}).get("stages"), lay.pp)
    if lay.tp > 1:
        c.expect("ds_config.json", "tensor_parallel.autotp_size", cfg.get("tensor_parallel", {}).get("autotp_size"),
                 lay.tp)
