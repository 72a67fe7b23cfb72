"""The targets dtc renders: one registration line each (their order is the order of files in the output).

    get(name) -> Target             the target a spec names (KeyError for an unknown name)
    targets() -> tuple[Target, ...] every target, in registration order
    names() -> tuple[str, ...]      their spec names (the spec's enum, its default targets)
    framework_versions() -> {...}   the releases every artifact is written for (plan.json)

Everything that used to list the targets by hand (the spec's enum, the solver's support check,
the renderers, the invariants, the SLURM scripts, smoke, the plan's versions) iterates over this.
"""
from __future__ import annotations

from typing import Mapping

from compiler.targets.base import Target

_TARGETS: dict[str, Target] = {}


def register(target: Target) -> None:
    assert target.name not in _TARGETS, f"target {target.name!r} registered twice"
    _TARGETS[target.name] = target


def get(name: str) -> Target:
    return _TARGETS[name]


def targets() -> tuple[Target, ...]:
    return tuple(_TARGETS.values())


def names() -> tuple[str, ...]:
    return tuple(_TARGETS)


def framework_versions() -> Mapping[str, str]:
    out: dict[str, str] = {}
    for target in _TARGETS.values():
        for package, version in target.versions.items():
            assert out.setdefault(package, version) == version, f"two versions of {package}"
    return dict(sorted(out.items()))


# ------------------------------------------------------------------------------ the registrations
from compiler.targets import deepspeed, fsdp, megatron, slurm  # noqa: E402

register(deepspeed.TARGET)
register(fsdp.TARGET)
register(megatron.TARGET)
register(slurm.TARGET)
