"""What torch 2.13's FSDP2 can run, as dtc renders it (fsdp_config.json + fsdp_train.py, compiler/runtime/).

Each rule is ``(knobs, precision) -> (field, reason) | None`` (see compiler.targets.base). Sources:
torch ``fully_shard`` / ``CPUOffloadPolicy`` / ``torch.distributed.pipelining``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from compiler.targets.base import expert_tp_differs
from compiler.targets.base import gt1 as _gt1

if TYPE_CHECKING:
    from compiler.layout import Layout
    from compiler.rules import Knobs


def _fsdp_zero1(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if k.zero_stage == 1:
        return "zero_stage", ("FSDP2 has no optimizer-only sharding (ZeRO-1); use zero_stage 2 "
                              "(reshard_after_forward=False) or 3")
    return None


def _fsdp_ep(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if _gt1(k.ep):
        return "ep", f"expert parallel (ep={k.ep}) is not rendered for FSDP2"
    if expert_tp_differs(k):
        return "etp", f"an expert tensor parallel degree (etp={k.etp}) other than tp ({k.tp}) is Megatron's; FSDP2's " \
                      "tensor parallel plan splits the experts by tp"
    return None


def _fsdp_fp8(k: "Knobs", precision: str) -> tuple[str, str] | None:
    if precision == "fp8":
        return "precision", "fp8 training (torchao float8) is not rendered for FSDP2"
    if precision == "nvfp4":
        return "precision", "nvfp4 training (Transformer Engine NVFP4BlockScaling) is not rendered for FSDP2"
    return None


def _fsdp_offload(k: "Knobs", precision: str) -> tuple[str, str] | None:
    oo, op = k.offload_optimizer, k.offload_params
    if oo in (None, "none") and op in (None, "none"):
        return None
    where = "offload_params" if op not in (None, "none") else "offload_optimizer"
    if "nvme" in (oo, op):
        return where, "FSDP2 cannot offload to NVMe (CPUOffloadPolicy offloads to host memory only)"
    if None in (oo, op, k.zero_stage):
        return None  # the rest of the combination is still open
    if k.zero_stage == 3 and oo == "cpu" and op == "cpu":
        return None
    return where, ("FSDP2's CPUOffloadPolicy offloads parameters, gradients and optimizer states together: "
                   "only offload_params=cpu with offload_optimizer=cpu at zero_stage 3, got "
                   f"offload_optimizer={oo} offload_params={op}")


def notes(layout: "Layout") -> tuple[str, ...]:
    """How FSDP2 runs ``layout``."""
    out = []
    if layout.zero_stage == 2:
        out.append("FSDP2: zero_stage 2 is fully_shard(reshard_after_forward=False)")
    if layout.zero_stage in (2, 3) and layout.dp_replicate > 1:
        out.append(f"FSDP2: hybrid sharding on a 2-D mesh ({layout.dp_replicate} replicate x "
                   f"{layout.dp_shard} shard)")
    return tuple(out)


RULES = (_fsdp_zero1, _fsdp_ep, _fsdp_fp8, _fsdp_offload)
