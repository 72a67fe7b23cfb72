"""What megatron-core 0.19.2 can run, as dtc renders it (megatron_args.sh).

Each rule is ``(knobs, precision) -> (field, reason) | None`` (see compiler.targets.base). Sources:
tools/validators/MEGATRON_FLAGS.md and megatron_check.py (``--use-megatron-fsdp`` with
``--data-parallel-sharding-strategy optim_grads|optim_grads_params``,
``--num-distributed-optimizer-instances``, ``--optimizer-cpu-offload``; no GPipe schedule). Where
Megatron accepts a combination dtc does not render (Megatron-FSDP with pipeline parallelism), the
rule says so.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from compiler.targets.base import gt1 as _gt1

if TYPE_CHECKING:
    from compiler.layout import Layout
    from compiler.model import ModelShape
    from compiler.rules import Knobs


def _mg_fsdp(k: "Knobs", precision: str) -> tuple[str, str] | None:
    # zero 2/3 run as Megatron-FSDP (--use-megatron-fsdp with --data-parallel-sharding-strategy
    # optim_grads / optim_grads_params; HSDP through --num-distributed-optimizer-instances).
    if k.zero_stage is not None and k.zero_stage >= 2 and _gt1(k.pp):
        return "zero_stage", (f"ZeRO-{k.zero_stage} runs as Megatron-FSDP, which dtc renders without pipeline "
                              f"parallelism, got pp={k.pp}")
    return None


def _mg_gpipe(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if _gt1(k.pp) and k.schedule == "gpipe":
        return "schedule", "Megatron has no GPipe schedule (it runs 1F1B or interleaved 1F1B)"
    return None


def _mg_offload(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if k.offload_params not in (None, "none"):
        return "offload_params", f"Megatron cannot offload parameters (offload_params={k.offload_params})"
    if k.offload_optimizer == "nvme":
        return "offload_optimizer", "Megatron offloads optimizer states to CPU only (--optimizer-cpu-offload), not NVMe"
    if k.offload_optimizer == "cpu" and k.zero_stage is not None and k.zero_stage != 1:
        return "offload_optimizer", ("Megatron's optimizer CPU offload (--optimizer-cpu-offload) runs with the "
                                     f"distributed optimizer (zero_stage 1), got zero_stage {k.zero_stage}")
    return None


def layout_model_unsupported(shape: "ModelShape", k: "Knobs") -> tuple[str, str] | None:
    """What megatron-core 0.19.2 cannot run of this model under these knobs:

    * an MoE model with tensor parallelism and no sequence parallelism, whatever ep: the MoE layer raises in training
      (core/transformer/moe/moe_layer.py: "During training, performance may degrade if MoE and tensor parallelism
      are enabled without also enabling sequence parallelism"; ValueError), and with ep > 1 the model config already
      refuses it (core/model_parallel_config.py: "When using expert parallelism and tensor parallelism, sequence
      parallelism must be used");
    * experts with biases split by an expert tensor-parallel degree above 1 (core/transformer/transformer_config.py:
      "Bias in Moe is only supported when ETP==1"; gpt-oss has them, Megatron-Bridge's GPTOSSProvider
      add_bias_linear)."""
    if shape.moe is None:
        return None
    if _gt1(k.tp) and k.sequence_parallel is False:
        return "sequence_parallel", (f"megatron-core's MoE layer needs sequence parallelism with tensor parallel "
                                     f"(tp={k.tp}) in training")
    if shape.linear_bias and _gt1(k.etp):  # (a Layout's knobs always name etp; while unknown the search may choose 1)
        return "etp", (f"megatron-core runs experts with biases only at expert tensor parallel 1 ('Bias in Moe is "
                       f"only supported when ETP==1'), got etp={k.etp}")
    return None


def model_unsupported(shape: "ModelShape", hyper: object = None) -> str | None:
    """What of a model megatron-core 0.19.2 cannot build as dtc renders it (None: it can): the clamped
    quick-GEGLU in a dense MLP layer. megatron/core/transformer/mlp.py fuses it only with a per-token scale (the
    expert path) and raises 'Only support fusion of gelu and swiglu' for a dense layer under the default bias
    activation fusion; gpt-oss has no dense layer."""
    if shape.mlp == "quick_geglu" and shape.num_moe_layers < shape.num_layers:
        return ("the quick_geglu MLP in a dense layer (megatron-core 0.19.2 fuses it in expert layers only; use an "
                "MoE model with every layer MoE, or mlp: swiglu)")
    return None


def notes(layout: "Layout") -> tuple[str, ...]:
    """How Megatron-LM runs ``layout``."""
    out = []
    if layout.zero_stage == 1 and layout.dp_replicate > 1:
        out.append(f"Megatron: --use-distributed-optimizer with --num-distributed-optimizer-instances "
                   f"{layout.dp_replicate}")
    if layout.zero_stage in (2, 3):
        strategy = "optim_grads" if layout.zero_stage == 2 else "optim_grads_params"
        out.append(f"Megatron: zero_stage {layout.zero_stage} runs as Megatron-FSDP (--use-megatron-fsdp "
                   f"--data-parallel-sharding-strategy {strategy})")
    return tuple(out)


RULES = (_mg_fsdp, _mg_gpipe, _mg_offload)
