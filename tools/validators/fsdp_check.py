#!/usr/bin/env python3
"""Validate a generated FSDP2 folder with torch itself: the fsdp target's validator hook.

``validate_folder(folder, plan) -> [error]`` compiles fsdp_train.py and fsdp_config.py, imports
fsdp_config.py under torch (2.13), and checks what the trainer will do against the plan: the
device-mesh degrees and their product (the world size torchrun must launch), the pipeline's
layers per (virtual) stage (fsdp_config.STAGE_LAYERS and the stage split build_pipeline makes
from it), and the batch arithmetic.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any


def validate_folder(folder: str | Path, plan: Any) -> list[str]:
    folder = Path(folder)
    errors: list[str] = []
    for name in ("fsdp_config.py", "fsdp_train.py"):
        try:
            compile((folder / name).read_text(), str(folder / name), "exec")
        except SyntaxError as exc:
            errors.append(f"{name} does not compile: {exc}")
    if errors:
        return errors
    spec = importlib.util.spec_from_file_location(f"_dtc_fsdp_config_{abs(hash(str(folder)))}",
                                                  folder / "fsdp_config.py")
    assert spec is not None and spec.loader is not None
    C = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = C
    try:
        spec.loader.exec_module(C)  # imports torch
    finally:
        sys.modules.pop(spec.name, None)
    lay = plan.layout
    degrees = C.resolve_degrees(lay.world_size, env={})
    want = {"pp": lay.pp, "dp_replicate": lay.dp_replicate, "dp_shard": lay.dp_shard, "cp": lay.cp, "tp": lay.tp,
            "vpp": lay.vpp}
    got = {k: getattr(degrees, k) for k in want}
    if got != want:
        errors.append(f"fsdp_config.py's degrees {got} are not the plan's {want}")
    try:
        C.validate_world_size(degrees, lay.world_size)
    except Exception as exc:  # noqa: BLE001 - MeshSizeError
        errors.append(str(exc))
    layers = plan.model.shape.num_layers
    try:
        split = C.plan_stage_layers(degrees, layers)
    except ValueError as exc:
        errors.append(str(exc))
    else:
        if tuple(split) != plan.layer_split().chunk_layers:
            errors.append(f"fsdp_config.py splits the layers {list(split)}, the plan is costed with "
                          f"{list(plan.layer_split().chunk_layers)}")
        ranges = C.stage_layer_ranges(split)
        if [len(r) for r in ranges] != list(split) or (ranges and ranges[-1].stop != layers):
            errors.append(f"stage_layer_ranges({list(split)}) = {ranges} does not cover the {layers} layers")
    if C.GLOBAL_BATCH != lay.global_batch or C.MICRO_BATCH * C.GRAD_ACCUM * lay.dp != C.GLOBAL_BATCH:
        errors.append(f"fsdp_config.py's batch {C.MICRO_BATCH} x {C.GRAD_ACCUM} x dp {lay.dp} != "
                      f"GLOBAL_BATCH {C.GLOBAL_BATCH} (plan: {lay.global_batch})")
    return errors
