"""Which framework a layout is costed for: the cost profile of a dtc target (compiler.targets.cost).

The facts themselves live with each target (``compiler.targets.registry.get(name).cost``) or, for
the frameworks of published runs that are not dtc targets, in compiler/calibration/frameworks.py;
callers pass such a profile to ``evaluate(target=...)`` directly.
"""
from __future__ import annotations

from compiler.targets import registry
from compiler.targets.cost import CostProfile

DEFAULT_TARGET = "megatron"  # what a problem that names no framework target is costed for


def profile_of(target: str | CostProfile) -> CostProfile:
    """The cost profile of a dtc target name (a profile is returned as it is)."""
    if isinstance(target, CostProfile):
        return target
    try:
        cost = registry.get(target).cost
    except KeyError:
        cost = None
    if cost is None:
        known = ", ".join(t.name for t in registry.targets() if t.cost is not None)
        raise ValueError(f"no cost profile for target {target!r}; dtc's framework targets are {known} "
                         "(published-run frameworks: compiler.calibration.frameworks.published_profile)")
    return cost


def costed_targets(targets: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The framework targets of a problem, in order (launchers such as slurm left out); the default
    framework when the problem names none."""
    out = []
    for name in targets:
        try:
            if registry.get(name).cost is not None:
                out.append(name)
        except KeyError:
            continue
    return tuple(out) or (DEFAULT_TARGET,)
