"""Model hyperparameters (rope base and scaling, norm eps, init std) and lr recipes in the catalog."""
from __future__ import annotations

import pytest

from compiler.catalog import load_catalog, load_recipes, recipe_for
from compiler.model import derived_hyperparameters, derive_dense_shape, small_init_std


@pytest.mark.parametrize("name,theta", [("llama2-7b", 10000.0), ("llama2-70b", 10000.0), ("llama3-8b", 500000.0),
                                        ("llama3-70b", 500000.0), ("llama3.1-405b", 500000.0),
                                        ("mixtral-8x7b", 1000000.0), ("mixtral-8x22b", 1000000.0),
                                        ("qwen2.5-72b", 1000000.0)])
def test_rope_base_of_the_published_configs(name, theta):
    assert load_catalog().models[name].hyperparameters.rope_theta == theta


def test_llama31_scaling_and_llama3_without():
    models = load_catalog().models
    for name in ("llama3.1-8b", "llama3.1-70b", "llama3.1-405b"):
        s = models[name].hyperparameters.rope_scaling
        assert (s.kind, s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings) == (
            "llama3", 8.0, 1.0, 4.0, 8192)
    assert models["llama3-70b"].hyperparameters.rope_scaling is None
    assert models["deepseek-v3"].hyperparameters.rope_scaling.kind == "yarn"


def test_every_preset_has_sourced_hyperparameters():
    for name, preset in load_catalog().models.items():
        h = preset.hyperparameters
        sources = dict(h.sources)
        assert (h.rope_theta is None) == (preset.shape.position == "learned"), name
        assert 0 < h.init_std <= 0.02 and 0 < h.norm_eps <= 1e-5, name
        for key in ("norm_eps", "init_std") + (("rope_theta",) if h.rope_theta else ()) + (
                ("rope_scaling",) if h.rope_scaling else ()):
            assert len(sources.get(key, "")) > 20, (name, key)


def test_init_std_per_size_differs():
    models = load_catalog().models
    assert models["llama3-8b"].hyperparameters.init_std == 0.01
    assert models["llama3-70b"].hyperparameters.init_std == 0.008944
    assert models["gpt3-175b"].hyperparameters.init_std == 0.006


def test_derived_shapes_get_llama3_values_and_small_init():
    shape = derive_dense_shape(70 * 10**9)
    h = derived_hyperparameters(shape)
    assert h.rope_theta == 500000.0 and h.norm_eps == 1e-5
    assert h.init_std == small_init_std(shape.hidden_size) == pytest.approx((2 / (5 * shape.hidden_size)) ** 0.5,
                                                                            abs=1e-6)


@pytest.mark.parametrize("params,lr,min_lr", [(125e6, 6e-4, 6e-5), (1.3e9, 2e-4, 2e-5), (7e9, 3e-4, 3e-5),
                                              (13e9, 3e-4, 3e-5), (70e9, 1.5e-4, 1.5e-5), (405e9, 8e-5, 8e-7)])
def test_lr_recipes_by_size(params, lr, min_lr):
    r = recipe_for(int(params))
    assert r.lr == pytest.approx(lr) and r.min_lr == pytest.approx(min_lr)
    assert "arXiv" in r.source or "Table" in r.source


def test_recipe_warmup():
    assert recipe_for(405 * 10**9).warmup_tokens_for(16 * 2**20) == 8000 * 16 * 2**20
    assert recipe_for(125 * 10**6).warmup_tokens_for(10**6) == 375 * 10**6
    assert len(load_recipes()) == 8
