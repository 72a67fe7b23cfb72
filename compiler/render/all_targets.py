"""render(plan) -> ArtifactSet: every target's files from one Plan, checked against each other.

Each target (compiler/targets/<name>/, listed in compiler.targets.registry) renders
``{relative path: text}`` from the Plan and never reads the Spec. plan.json and the PLAN.md
report are always emitted. After rendering, the cross-artifact invariants run
(compiler.render.invariants): the same world size, batch and sharding in every file.
"""
from __future__ import annotations

from typing import Sequence

from compiler.artifacts import ArtifactSet
from compiler.plan import Plan


def render(plan: Plan, *, targets: Sequence[str] | None = None) -> ArtifactSet:
    """All artifacts for ``plan`` (default: the plan's own targets)."""
    from compiler.render.invariants import check_invariants
    from compiler.render.report import render_report
    from compiler.targets import registry

    wanted = tuple(targets) if targets is not None else tuple(plan.targets)
    by_target = {t.name: t.render(plan) for t in registry.targets() if t.name in wanted}
    seen: set[str] = set()  # a file two targets ship (dtc_runtime/ for fsdp and deepspeed) is listed once
    rendered: list[tuple[str, str]] = []
    for t, out in by_target.items():
        rendered += [(t, name) for name in out if name not in seen]
        seen.update(out)
    files: dict[str, str] = {"plan.json": plan.to_json()}
    files.update(render_report(plan, rendered=rendered))
    for out in by_target.values():
        files.update(out)
    check_invariants(plan, files)
    return ArtifactSet(files)
