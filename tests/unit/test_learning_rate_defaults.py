"""The learning rate defaults to the published recipe for the model's size (compiler/data/recipes.yaml), named
in the plan's notes; a spec's own learning rate wins."""
from __future__ import annotations

import pytest

from compiler.catalog import recipe_for
from plan_fixtures import layout_for, plan_for, problem_for

SPEC = """
name: lr
model:
  preset: {preset}
training:
  tokens: 1T
  sequence_length: 4096
  global_batch: 1024
{training}cluster:
  gpu: h100-sxm
  num_gpus: 64
targets: [megatron]
"""


@pytest.mark.parametrize("preset,lr", [("llama3-8b", 3.0e-4), ("llama3-70b", 1.5e-4), ("llama3.1-405b", 8.0e-5)])
def test_default_comes_from_the_recipe_by_size(preset: str, lr: float) -> None:
    problem = problem_for(SPEC.format(preset=preset, training=""))
    recipe = recipe_for(problem.params.total)
    assert problem.hyper.learning_rate == recipe.lr == lr
    assert problem.hyper.min_learning_rate == pytest.approx(lr * recipe.min_lr_ratio, rel=1e-12)
    plan = plan_for(problem, layout_for(problem, tp=8, pp=8, dp_shard=1, zero_stage=1), real_estimate=False)
    note = next(n for n in plan.notes if n.startswith("Learning rate"))
    assert f"{lr:g} peak" in note and " ".join(recipe.source.split()).rstrip(".") in note


def test_the_spec_wins() -> None:
    problem = problem_for(SPEC.format(preset="llama3-70b", training="  learning_rate: 2.0e-4\n"))
    assert problem.hyper.learning_rate == 2.0e-4 and problem.hyper.min_learning_rate == pytest.approx(2.0e-5)
    assert problem.hyper.learning_rate_source == ""
