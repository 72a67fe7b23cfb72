"""The target registry (compiler/targets): one package and one registration line per target, and
everything that lists targets iterates over it."""
from __future__ import annotations

import json
import sys

import pytest

from compiler.targets import registry
from compiler.targets.base import load
from helpers import REPO

sys.path.insert(0, str(REPO))


def test_every_target_package_is_registered_once() -> None:
    packages = sorted(p.parent.name for p in (REPO / "compiler/targets").glob("*/__init__.py"))
    assert packages == sorted(registry.names())
    for target in registry.targets():
        assert registry.get(target.name) is target
        module = __import__(f"compiler.targets.{target.name}", fromlist=["TARGET"])
        assert module.TARGET is target


def test_hooks_resolve_and_templates_ship() -> None:
    for t in registry.targets():
        for ref in (t.renderer, t.check_artifacts, *(vars(t.smoke).values() if t.smoke else ()),
                    t.slurm.context if t.slurm else None):
            if isinstance(ref, str) and ":" in ref:
                assert callable(load(ref)), ref
        if t.templates:
            folder = REPO / "compiler/targets" / t.name / t.templates
            assert any(folder.glob("*.j2")), folder
        assert t.versions and t.files


def test_everything_that_lists_targets_iterates_the_registry() -> None:
    from compiler.commands.smoke import SMOKE_TARGETS
    from compiler.smoke import ALL_TARGETS as SMOKE_ALL
    from compiler.spec.models import ALL_TARGETS

    names = registry.names()
    assert ALL_TARGETS == names
    schema = json.loads((REPO / "schemas/spec.schema.json").read_text())
    assert tuple(schema["properties"]["targets"]["items"]["enum"]) == names
    assert tuple(SMOKE_TARGETS) == SMOKE_ALL == tuple(t.name for t in registry.targets() if t.smoke)
    plan = json.loads((REPO / "generated/llama3-405b/plan.json").read_text())
    assert plan["provenance"]["frameworks"] == dict(registry.framework_versions())


@pytest.mark.slow
@pytest.mark.parametrize("folder", sorted(p.parent.name for p in (REPO / "generated").glob("*/plan.json")))
def test_generated_files_pass_their_targets_validators(folder: str) -> None:
    """Each committed generated/<name>/ through the real consumer of every target it holds (DeepSpeed's
    DeepSpeedConfig, megatron-core's argument checks and layer split, torch loading fsdp_config.json,
    bash -n and shellcheck)."""
    from compiler.plan import Plan

    path = REPO / "generated" / folder
    plan = Plan.from_json((path / "plan.json").read_text())
    checked = 0
    for target in registry.targets():
        if target.name in plan.targets and target.validator:
            errors = load(target.validator)(path, plan)
            assert errors == [], (target.name, errors)
            checked += 1
    assert checked == len(plan.targets)
