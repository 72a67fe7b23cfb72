"""The FSDP2 target's real consumer: the runtime trainer's own config parser and stage builder.

``validate_folder(folder, plan) -> [error]`` compiles fsdp_train.py and the shipped dtc_runtime/
modules, reads fsdp_config.json with the shipped runtime's ``load_run_config`` (the exact code the
trainer runs), and checks what the trainer will do against the plan: the mesh degrees, the batch,
the decoder layers of every pipeline (virtual) stage (``ParallelConfig.stages``, what
``parallel.build_pipeline`` builds) against Megatron's split the plan is costed with, and that the
model is the planned shape with the catalog's rope base and init std.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any


def validate_folder(folder: str | Path, plan: Any) -> list[str]:
    folder = Path(folder)
    errors: list[str] = []
    files = [folder / "fsdp_train.py", *sorted((folder / "dtc_runtime").glob("*.py"))]
    for path in files:
        try:
            compile(path.read_text(), str(path), "exec")
        except (OSError, SyntaxError) as exc:
            errors.append(f"{path.name}: {exc}")
    if errors:
        return errors
    sys.path.insert(0, str(folder))
    try:
        for name in [m for m in sys.modules if m == "dtc_runtime" or m.startswith("dtc_runtime.")]:
            del sys.modules[name]  # another folder's copy
        config = importlib.import_module("dtc_runtime.config")
        cfg = config.load_run_config(folder / "fsdp_config.json")
    except Exception as exc:  # noqa: BLE001 - the trainer's own refusal, reported
        return [f"fsdp_config.json: the runtime refuses it: {exc}"]
    finally:
        sys.path.remove(str(folder))
    lay, par = plan.layout, cfg.parallel
    got = (par.tp, par.pp, par.cp, par.dp_replicate, par.dp_shard, par.vpp, par.zero_stage)
    want = (lay.tp, lay.pp, lay.cp, lay.dp_replicate, lay.dp_shard, lay.vpp, lay.zero_stage)
    if got != want:
        errors.append(f"fsdp_config.json's degrees {got} are not the plan's {want}")
    split = plan.layer_split()
    stages = par.stages(cfg.model.num_layers)
    costed = [len(split.layers(c % lay.pp, c // lay.pp)) for c in range(split.num_chunks)]
    if [len(s) for s in stages] != costed:
        errors.append(f"fsdp_config.json splits the layers {[len(s) for s in stages]}, the plan is costed with "
                      f"{costed}")
    if cfg.global_batch != plan.training.global_batch:
        errors.append(f"fsdp_config.json's batch {cfg.batch.micro_batch} x {cfg.batch.grad_accum} x dp {par.dp} != "
                      f"the plan's global batch {plan.training.global_batch}")
    hyper = plan.model.hyperparameters
    if cfg.model.num_layers != plan.model.shape.num_layers or cfg.model.hidden_size != plan.model.shape.hidden_size:
        errors.append("fsdp_config.json's model is not the planned shape")
    if hyper.rope_theta is not None and cfg.model.rope_theta != hyper.rope_theta:
        errors.append(f"fsdp_config.json's rope_theta {cfg.model.rope_theta} is not the catalog's {hyper.rope_theta}")
    if cfg.model.init_std != hyper.init_std:
        errors.append(f"fsdp_config.json's init_std {cfg.model.init_std} is not the catalog's {hyper.init_std}")
    return errors
