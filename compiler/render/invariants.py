"""Cross-artifact invariants, checked on every compile (STYLE.md 10.4).

All artifacts come from one Plan, so they must agree: the launcher's world equals
tp x pp x cp x dp; every framework trains the plan's global batch with the same
micro-batch and accumulation; the ZeRO stage and the FSDP strategy agree. Each target
checks its own files (``Target.check_artifacts`` in compiler/targets/<name>/render.py)
with the ``Checker`` below. A disagreement is a dtc bug, reported as an internal error
before anything is written.
"""
from __future__ import annotations

from compiler.errors import Diagnostic, RenderError
from compiler.plan import Plan
from compiler.targets import registry
from compiler.targets.base import load


class Checker:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.problems: list[str] = []

    def expect(self, where: str, what: str, got: object, want: object) -> None:
        if got != want:
            self.problems.append(f"{where}: {what} is {got!r}, the plan says {want!r}")


def invariant_problems(plan: Plan, files: dict[str, str]) -> list[str]:
    """Every disagreement between the artifacts and the plan, one line each. Also the check `dtc smoke`
    runs on a folder from disk (issue #16), so an artifact that does not parse is a problem, not a crash."""
    c = Checker(plan)
    lay = plan.layout
    c.expect("plan", "tp x pp x cp x dp", lay.world_size, plan.cluster.num_gpus)
    c.expect("plan", "micro x accumulation x dp", lay.global_batch, plan.training.global_batch)
    for target in registry.targets():  # each target's own files against the plan
        if target.check_artifacts and target.files and all(f in files for f in target.files):
            try:
                load(target.check_artifacts)(c, files)
            except (ValueError, TypeError, AttributeError, KeyError, SyntaxError, RecursionError) as exc:
                c.problems.append(f"{', '.join(target.files)}: cannot read it ({type(exc).__name__}: {exc})")
    return c.problems


def check_invariants(plan: Plan, files: dict[str, str]) -> None:
    """Raise RenderError (a bug) listing every disagreement between the artifacts and the plan."""
    problems = invariant_problems(plan, files)
    if problems:
        raise RenderError(Diagnostic(
            summary=f"the generated artifacts for {plan.name} disagree with the plan (a dtc bug)",
            detail="\n".join(problems), hint="please report this with the spec"))
