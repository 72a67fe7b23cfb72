"""What the FSDP2/DeepSpeed targets ship: the runtime verbatim, entry scripts, a checked run config."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compiler.catalog import load_catalog
from compiler.runtime.config import ConfigError, run_config_from_dict
from compiler.runtime_bundle import (
    CONFIG_FILE,
    UnsupportedModel,
    data_section,
    dump,
    entry_script,
    model_config,
    run_config,
    runtime_files,
)

REPO = Path(__file__).resolve().parents[2]


def test_runtime_files_are_the_package_verbatim():
    files = runtime_files()
    on_disk = sorted(p.name for p in (REPO / "compiler/runtime").glob("*.py"))
    assert sorted(Path(k).name for k in files) == on_disk
    for key, text in files.items():
        assert text == (REPO / "compiler/runtime" / Path(key).name).read_text()


@pytest.mark.parametrize("preset,theta,scaled", [("llama3-70b", 500000.0, False), ("llama3.1-405b", 500000.0, True),
                                                  ("llama2-7b", 10000.0, False), ("gpt3-175b", 10000.0, False)])
def test_model_config_from_the_catalog(preset, theta, scaled):
    p = load_catalog().models[preset]
    m = model_config(p.shape, p.hyperparameters, 4096)
    assert m["rope_theta"] == theta and (m["rope_scaling"] is not None) == scaled
    assert m["init_std"] == p.hyperparameters.init_std and m["norm_eps"] == p.hyperparameters.norm_eps


def test_moe_and_yarn_are_refused():
    models = load_catalog().models
    with pytest.raises(UnsupportedModel, match="mixture-of-experts"):
        model_config(models["mixtral-8x7b"].shape, models["mixtral-8x7b"].hyperparameters, 4096)
    with pytest.raises(UnsupportedModel):
        model_config(models["deepseek-v3"].shape, models["deepseek-v3"].hyperparameters, 4096)


def _config(**changes):
    p = load_catalog().models["llama3-8b"]
    values = dict(name="x", layout_tag="tp1", model=model_config(p.shape, p.hyperparameters, 8192),
                  parallel={"dp_shard": 8, "zero_stage": 3}, micro_batch=1, grad_accum=4, seq_len=8192,
                  train_steps=1000, peak_lr=3e-4, min_lr=3e-5, warmup_steps=100,
                  optimizer={"weight_decay": 0.1, "grad_clip": 1.0}, data=data_section([("/d/a", 1.0)], "/tok"),
                  checkpoint={"dir": "checkpoints", "interval_steps": 50}, param_dtype="bfloat16", init=None, seed=1)
    values.update(changes)
    return run_config(**values)


def test_run_config_is_checked_by_the_runtime():
    cfg = run_config_from_dict(json.loads(dump(_config())))
    assert cfg.global_batch == 32 and cfg.model.rope_theta == 500000.0
    with pytest.raises(ConfigError, match="min_lr"):
        _config(min_lr=1.0)
    with pytest.raises(ConfigError, match="sources"):
        _config(data={"synthetic": False})


@pytest.mark.slow
def test_a_shipped_folder_trains_from_any_directory(tmp_path):
    folder = tmp_path / "generated"
    folder.mkdir()
    for rel, text in runtime_files().items():
        (folder / rel).parent.mkdir(exist_ok=True)
        (folder / rel).write_text(text)
    (folder / "fsdp_train.py").write_text(entry_script("fsdp_train", "FSDP2 entry."))
    (folder / CONFIG_FILE).write_text(dump(_config(data=data_section(None, None),
                                                   checkpoint={"dir": "checkpoints", "interval_steps": 1})))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    torchrun = Path(sys.executable).with_name("torchrun")
    run = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node=2", str(folder / "fsdp_train.py"),
                          "--steps", "2", "--layers", "2", "--hidden", "64", "--vocab", "256", "--seq", "32",
                          "--micro-batch", "2", "--grad-accum", "1", "--dp-shard", "2"],
                         cwd=elsewhere, capture_output=True, text=True, timeout=300,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "step 2/2 loss" in run.stdout
    assert (folder / "checkpoints" / "step_000000002" / "COMPLETE").is_file()  # relative to the config
