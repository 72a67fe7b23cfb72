"""render(plan) -> ArtifactSet: every target's files from one Plan, checked against each other.

Each target module exposes ``render_<target>(plan) -> dict[str, str]`` (relative
path -> text) and never reads the Spec. plan.json and the PLAN.md report are
always emitted. After rendering, the cross-artifact invariants run
(compiler.render.invariants): the same world size, batch and sharding in every file.
"""
from __future__ import annotations

import importlib
from typing import Callable, Sequence

from compiler.artifacts import ArtifactSet
from compiler.plan import Plan

# target -> (module, function); order = order of files in the ArtifactSet
RENDERERS: dict[str, tuple[str, str]] = {
    "deepspeed": ("compiler.render.deepspeed", "render_deepspeed"),
    "fsdp": ("compiler.render.fsdp", "render_fsdp"),
    "megatron": ("compiler.render.megatron", "render_megatron"),
    "slurm": ("compiler.render.slurm", "render_slurm"),
}
REPORT = ("compiler.render.report", "render_report")


def _load(entry: tuple[str, str]) -> Callable[..., dict[str, str]]:
    module, attr = entry
    return getattr(importlib.import_module(module), attr)


def render(plan: Plan, *, targets: Sequence[str] | None = None) -> ArtifactSet:
    """All artifacts for ``plan`` (default: the plan's own targets)."""
    wanted = tuple(targets) if targets is not None else tuple(plan.targets)
    by_target = {t: _load(RENDERERS[t])(plan) for t in RENDERERS if t in wanted}
    rendered = [(t, name) for t, out in by_target.items() for name in out]
    files: dict[str, str] = {"plan.json": plan.to_json()}
    files.update(_load(REPORT)(plan, rendered=rendered))
    for out in by_target.values():
        files.update(out)
    from compiler.render.invariants import check_invariants

    check_invariants(plan, files)
    return ArtifactSet(files)
