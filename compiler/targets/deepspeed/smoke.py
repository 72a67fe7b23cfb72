"""`dtc smoke` options of ds_train.py (run by the shared torchrun runner, compiler.smoke.targets.run_entry)."""
from __future__ import annotations

import json
from pathlib import Path

from compiler.errors import Diagnostic, Location, SmokeError
from compiler.plan import Plan
from compiler.smoke.scale import SmokeSetup, check_ds_batch
from compiler.smoke.targets import built_shape, model_options
from compiler.targets.deepspeed.render import hidden_sized_zero


def smoke_options(setup: SmokeSetup) -> dict[str, str | None]:
    """ds_train.py's options: the degrees, the smoke batch and model. train_batch_size is recomputed for the
    smaller world; the preflight has checked the generated config against the plan's world, so
    --allow-resize hides nothing. The ZeRO sizes ds_config.json derives from the hidden size are the reduced
    model's (--zero-sizes): with the plan's, stage3_param_persistence_threshold (10 x hidden) kept every matrix of
    a 64-wide model whole on every rank, a full 16-bit copy the cost model (rightly, at plan scale) does not
    count."""
    d = setup.degrees
    opts: dict[str, str | None] = {"--steps": str(setup.steps), "--tp": str(d.tp), "--pp": str(d.pp),
                                   "--dp-shard": str(d.dp_shard), "--allow-resize": None}
    opts.update(model_options(setup, "deepspeed", seq_flag="--seq"))  # DTC_SMOKE_SEQ under SLURM (dest "seq")
    sizes = hidden_sized_zero(setup.layout, built_shape(setup.shape, "deepspeed"))
    if sizes:
        opts["--zero-sizes"] = ",".join(f"{key}={value}" for key, value in sizes.items())
    return opts


def preflight(generated_dir: Path, plan: Plan) -> None:
    """ds_config.json's batch fields must agree with the plan (DeepSpeed would refuse them)."""
    path = generated_dir / "ds_config.json"
    try:
        cfg = json.loads(path.read_text())
    except ValueError as exc:
        raise SmokeError(Diagnostic(summary=f"ds_config.json is not valid JSON: {exc}",
                                    location=Location(str(path)), hint="recompile the spec")) from None
    why = check_ds_batch(cfg, plan.layout)
    if why:
        raise SmokeError(Diagnostic(
            summary="ds_config.json's batch fields disagree", location=Location(str(path)),
            detail=why + f"\nplan layout: {plan.layout.describe()}",
            hint="DeepSpeed would refuse it (\"Check batch related parameters\"); recompile the spec "
                 "instead of editing ds_config.json"))


def notes(setup: SmokeSetup, summary: dict) -> list[str]:
    if setup.device == "cpu":
        return ["CPU: ds_train.py uses torch's AdamW (--cpu-optimizer torch, no fused_adam / cpu_adam JIT build) "
                "and skips the shared-memory allreduce op"]
    return []
