"""The targets' support, as compiler.rules and the solver ask for it.

Each target states what it can run as support rules in its own package
(compiler/targets/<name>/support.py), ``(knobs, precision) -> (field, reason) | None`` over a
layout's knobs, any of them unknown (None): a rule that needs an unknown knob says nothing, so the
same rules judge a spec's pins, the solver's candidates and a finished plan. ``compiler.rules``
evaluates them for every target of the problem under the code ``framework_unsupported`` (a plan
must be runnable by every target it is rendered for); renderers check the same rules so that they
never emit a config the solver would have refused.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping

from compiler.targets import registry

if TYPE_CHECKING:
    from compiler.layout import Layout
    from compiler.rules import Knobs


def target_reason(target: str, knobs: "Knobs", precision: str, shape: Any = None) -> tuple[str, str] | None:
    """(field, why) ``target`` cannot run ``knobs`` (all failing rules joined; for the model ``shape`` when given),
    or None if it can (so far)."""
    return registry.get(target).reason(knobs, precision, shape)


def unsupported_reasons(targets: Iterable[str], precision: str, knobs: "Knobs", shape: Any = None
                        ) -> tuple[dict[str, str], str]:
    """({target: reason} for every target that cannot run ``knobs`` (for the model ``shape`` when given), the
    field of the first)."""
    out: dict[str, str] = {}
    first = ""
    for target in targets:
        hit = target_reason(target, knobs, precision, shape)
        if hit:
            first = first or hit[0]
            out[target] = hit[1]
    return out, first


def model_reasons(targets: Iterable[str], shape: Any, hyper: Any = None) -> dict[str, str]:
    """{target: why} for every target that cannot build the model ``shape`` (Target.model_support)."""
    from compiler.targets.base import load

    out: dict[str, str] = {}
    for name in targets:
        hook = registry.get(name).model_support
        reason = load(hook)(shape, hyper) if hook else None
        if reason:
            out[name] = reason
    return out


def describe_unsupported(reasons: Mapping[str, str]) -> str:
    """One line for a Rejection message: 'DeepSpeed: ...; Megatron: ...'."""
    return "; ".join(f"{registry.get(t).display_name}: {r}" for t, r in sorted(reasons.items()))


def support_key_of(*, tp: int, pp: int, cp: int, ep: int, sequence_parallel: bool, zero_stage: int, vpp: int,
                   schedule: str, dp_replicate: int, dp_shard: int, offload_optimizer: str,
                   offload_params: str, etp: int | None = None) -> tuple:
    """Everything the targets' support rules read, coarsened to what they compare: two layouts with the
    same key are supported by the same targets (the solver caches on it; a test holds it). ``etp``: the expert
    tensor-parallel degree (None: tp)."""
    return (tp > 1, pp > 1, cp > 1, ep > 1, sequence_parallel, zero_stage, vpp > 1, schedule, dp_replicate > 1,
            dp_shard > 1, offload_optimizer, offload_params, etp is not None and etp != tp,
            (tp if etp is None else etp) > 1)


def support_key(layout: "Layout") -> tuple:
    return support_key_of(tp=layout.tp, pp=layout.pp, cp=layout.cp, ep=layout.ep,
                          sequence_parallel=layout.sequence_parallel, zero_stage=layout.zero_stage, vpp=layout.vpp,
                          schedule=layout.schedule, dp_replicate=layout.dp_replicate, dp_shard=layout.dp_shard,
                          offload_optimizer=layout.offload_optimizer, offload_params=layout.offload_params,
                          etp=layout.etp)


def framework_notes(problem: Any, layout: "Layout") -> tuple[str, ...]:
    """How each target of ``problem`` runs ``layout`` (for PLAN.md and the plan's notes)."""
    out: list[str] = []
    for target in registry.targets():
        if target.name in problem.targets and target.notes is not None:
            out += target.notes(layout)
    return tuple(out)
