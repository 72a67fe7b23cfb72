"""The whole pipeline in one call: Spec -> Problem -> Plan -> ArtifactSet (no disk writes)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from compiler.artifacts import ArtifactSet
from compiler.plan import Plan
from compiler.problem import Problem, lower
from compiler.render.all_targets import render
from compiler.spec.load import LoadedSpec, load_spec


def plan_spec(path: str | Path) -> tuple[Problem, Plan]:
    from compiler.solver import solve

    problem = lower(load_spec(path))
    return problem, solve(problem)


def compile_spec(path: str | Path, *, targets: Sequence[str] | None = None) -> tuple[Plan, ArtifactSet]:
    """Load, solve and render one spec; pure apart from reading ``path``."""
    _, plan = plan_spec(path)
    return plan, render(plan, targets=targets)


def compile_loaded(loaded: LoadedSpec, *, targets: Sequence[str] | None = None) -> tuple[Plan, ArtifactSet]:
    from compiler.solver import solve

    plan = solve(lower(loaded))
    return plan, render(plan, targets=targets)
