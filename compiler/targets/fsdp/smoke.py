"""`dtc smoke` options of fsdp_train.py (run by the shared torchrun runner, compiler.smoke.targets.run_entry)."""
from __future__ import annotations

from compiler.smoke.scale import SmokeSetup
from compiler.smoke.targets import model_options


def smoke_options(setup: SmokeSetup) -> dict[str, str | None]:
    """fsdp_train.py's options: the mesh overrides, the smoke batch and model, the device and, where the plan's
    dtype cannot run here (fp16 on CPU), --param-dtype."""
    d = setup.degrees
    opts: dict[str, str | None] = {"--steps": str(setup.steps), "--tp": str(d.tp), "--pp": str(d.pp),
                                   "--cp": str(d.cp), "--dp-shard": str(d.dp_shard),
                                   "--dp-replicate": str(d.dp_replicate), "--vpp": str(d.vpp)}
    opts.update(model_options(setup, "fsdp", seq_flag="--seq"))
    opts["--device"] = setup.device
    if setup.precision != setup.plan_precision:
        opts["--param-dtype"] = setup.precision
    return opts


def notes(setup: SmokeSetup, summary: dict) -> list[str]:
    out = []
    if setup.precision != setup.plan_precision:
        out.append(f"--param-dtype {setup.precision}: the plan's {setup.plan_precision} parameters run as "
                   f"{setup.precision} here")
    if summary.get("sac_cache_counted") is False:
        out.append("selective-checkpoint cache not counted in the saved activations (torch internals differ from "
                   "torch 2.13's)")
    if summary.get("recompute_counted") is False:
        out.append("the block rematerialised during backward is not counted in the saved activations (torch "
                   "internals differ from torch 2.13's)")
    return out
