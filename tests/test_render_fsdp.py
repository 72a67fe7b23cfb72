"""FSDP2 renderer: the context as data over a matrix of layouts, then the real consumer.

``fsdp_context`` is checked as data; the generated ``fsdp_config.py`` is imported and its
API exercised in-process (degrees, mesh-size validation, reference model); the generated
``fsdp_train.py`` runs for real under torchrun on CPU (gloo) twice, 4 processes each:
tp2 x dp_shard2 and pp2 x dp_shard2 (1F1B), 2 steps.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from compiler.errors import RenderError
from compiler.targets.fsdp.render import fsdp_context, render_fsdp
from plan_fixtures import layout_for, plan_for, problem_for

LLAMA_SPEC = """
name: fsdp-test
model:
  preset: {preset}
training:
  tokens: 1T
  sequence_length: {seq}
  global_batch: 64
  precision: {precision}
cluster:
  gpu: h100-sxm
  num_gpus: {num_gpus}
"""

# Small enough that the generated script runs as written (full size) on CPU.
TINY_SPEC = """
name: tiny-fsdp
model:
  num_layers: 2
  hidden_size: 64
  ffn_hidden_size: 128
  num_attention_heads: 4
  num_kv_heads: 2
  vocab_size: 256
training:
  tokens: 1M
  sequence_length: 32
  global_batch: 4
  learning_rate: 0.001
cluster:
  gpu: h100-sxm
  num_gpus: 4
"""


def llama_plan(num_gpus: int = 8, precision: str = "bf16", preset: str = "llama3-8b", seq: int = 4096, **layout: Any):
    text = LLAMA_SPEC.format(num_gpus=num_gpus, precision=precision, preset=preset, seq=seq)
    if precision == "fp8":  # a plan made for Megatron (the only target that trains fp8), rendered for FSDP2
        text += "targets: [megatron]\n"
    problem = problem_for(text)
    return plan_for(problem, layout_for(problem, **layout), real_estimate=False)


# ------------------------------------------------------------------------------ context as data
MATRIX: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "zero0_ddp": (dict(dp_replicate=8, zero_stage=0),
                  dict(sharding="replicate", reshard_after_forward=False,
                       degrees=dict(pp=1, dp_replicate=8, dp_shard=1, cp=1, tp=1, vpp=1))),
    "zero2": (dict(dp_shard=8, zero_stage=2),
              dict(sharding="shard_grad_op", reshard_after_forward=False)),
    "zero3": (dict(dp_shard=8, zero_stage=3),
              dict(sharding="full_shard", reshard_after_forward=True, offload="none")),
    "hsdp": (dict(dp_replicate=2, dp_shard=4, zero_stage=3),
             dict(sharding="hybrid_full_shard", reshard_after_forward=True,
                  degrees=dict(pp=1, dp_replicate=2, dp_shard=4, cp=1, tp=1, vpp=1))),
    "tp_sp": (dict(tp=4, dp_shard=2, zero_stage=3, sequence_parallel=True, recompute="selective"),
              dict(sequence_parallel=True, ac_mode="selective",
                   degrees=dict(pp=1, dp_replicate=1, dp_shard=2, cp=1, tp=4, vpp=1))),
    "pp_1f1b": (dict(pp=2, dp_shard=4, zero_stage=2, schedule="1f1b", micro_batch=2, grad_accum=4),
                dict(pp_schedule="1f1b", pp_microbatches=4, micro_batch=2, grad_accum=4, global_batch=32)),
    "pp_gpipe": (dict(pp=4, dp_shard=2, zero_stage=3, schedule="gpipe", recompute="full"),
                 dict(pp_schedule="gpipe", ac_mode="full")),
    "pp_interleaved": (dict(pp=2, vpp=2, dp_shard=4, zero_stage=3, schedule="interleaved_1f1b"),
                       dict(pp_schedule="interleaved_1f1b",
                            degrees=dict(pp=2, dp_replicate=1, dp_shard=4, cp=1, tp=1, vpp=2))),
    "offload": (dict(dp_shard=8, zero_stage=3, offload_params="cpu", offload_optimizer="cpu"),
                dict(offload="cpu", reshard_after_forward=True)),
    "cp": (dict(cp=2, dp_shard=4, zero_stage=3),
           dict(degrees=dict(pp=1, dp_replicate=1, dp_shard=4, cp=2, tp=1, vpp=1))),
}


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_context_matrix(case: str) -> None:
    layout, expected = MATRIX[case]
    ctx = fsdp_context(llama_plan(**layout))
    for key, value in expected.items():
        assert ctx[key] == value, (case, key, ctx[key])
    assert ctx["mesh_dim_names"] == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    d = ctx["degrees"]
    assert d["pp"] * d["dp_replicate"] * d["dp_shard"] * d["cp"] * d["tp"] == ctx["world_size"] == 8
    assert ctx["nproc_per_node"] * ctx["num_nodes"] == ctx["world_size"]
    assert ctx["global_batch"] == ctx["micro_batch"] * ctx["grad_accum"] * d["dp_replicate"] * d["dp_shard"]
    assert ctx["pp_microbatches"] == ctx["grad_accum"]


@pytest.mark.parametrize("precision,param,scaler", [("bf16", "bfloat16", False), ("fp32", "float32", False),
                                                     ("fp16", "float16", True)])
def test_context_precision(precision: str, param: str, scaler: bool) -> None:
    ctx = fsdp_context(llama_plan(precision=precision, dp_shard=8, zero_stage=3))
    assert (ctx["param_dtype"], ctx["reduce_dtype"], ctx["use_grad_scaler"]) == (param, "float32", scaler)


def test_context_model_family() -> None:
    llama = fsdp_context(llama_plan(dp_shard=8, zero_stage=3))["model"]
    assert (llama["mlp"], llama["norm"], llama["tied_embeddings"]) == ("swiglu", "rmsnorm", False)
    assert (llama["num_attention_heads"], llama["num_kv_heads"], llama["head_dim"]) == (32, 8, 128)
    gpt = fsdp_context(llama_plan(preset="gpt-1.7b", seq=2048, dp_shard=8, zero_stage=3))["model"]
    assert (gpt["mlp"], gpt["norm"], gpt["tied_embeddings"]) == ("gelu", "layernorm", True)


def test_context_optimizer_from_plan() -> None:
    plan = llama_plan(dp_shard=8, zero_stage=3)
    ctx = fsdp_context(plan)
    assert ctx["lr"] == plan.training.learning_rate and ctx["min_lr"] == plan.training.min_learning_rate
    assert ctx["betas"] == (0.9, 0.95) and ctx["grad_clip"] == 1.0 and ctx["seed"] == 1234
    assert ctx["warmup_fraction"] == pytest.approx(0.01)


@pytest.mark.parametrize("layout,precision,needle", [
    (dict(dp_shard=8, zero_stage=1), "bf16", "ZeRO-1"),
    (dict(dp_shard=8, zero_stage=3), "fp8", "fp8"),
    (dict(dp_shard=8, zero_stage=3, offload_optimizer="cpu"), "bf16", "CPUOffloadPolicy"),
    (dict(dp_shard=8, zero_stage=3, offload_params="nvme", offload_optimizer="nvme"), "bf16", "NVMe"),
])
def test_unsupported_layouts_refused(layout: dict, precision: str, needle: str) -> None:
    with pytest.raises(RenderError, match=needle):
        render_fsdp(llama_plan(precision=precision, **layout))


def test_render_is_deterministic_and_parses() -> None:
    plan = llama_plan(tp=2, pp=2, dp_shard=2, zero_stage=3, sequence_parallel=True)
    first, second = render_fsdp(plan), render_fsdp(plan)
    assert first == second and set(first) == {"fsdp_config.py", "fsdp_train.py"}
    for name, text in first.items():
        ast.parse(text, name)
        assert text.startswith("# Generated by dtc from ") and text.endswith("\n") and not text.endswith("\n\n")


# ------------------------------------------------------------------------------ the generated module
def _write(plan, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in render_fsdp(plan).items():
        (directory / name).write_text(text)
    return directory


def _import_config(directory: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, directory / "fsdp_config.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tp_config(tmp_path_factory):
    """fsdp_config.py of a tp2 x dp_shard2 ZeRO-3 plan, imported."""
    import torch  # noqa: F401  - the smoke extra: required here; a missing torch fails the test
    directory = _write(llama_plan(num_gpus=4, tp=2, dp_shard=2, zero_stage=3), tmp_path_factory.mktemp("tp_cfg"))
    return _import_config(directory, "fsdp_config_tp")


def test_generated_module_api(tp_config) -> None:
    C = tp_config
    for fn in ("build_mesh", "apply_tp", "apply_ac", "apply_fsdp", "build_pipeline", "parallelize",
               "build_reference_model", "resolve_degrees", "validate_world_size", "dp_mesh", "set_grad_sync",
               "build_optimizer", "lr_at", "grad_norm", "clip_grads"):
        assert callable(getattr(C, fn)), fn
    assert (C.PP, C.DP_REPLICATE, C.DP_SHARD, C.CP, C.TP) == (1, 1, 2, 1, 2)
    assert C.MESH_DIM_NAMES == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    assert (C.ZERO_STAGE, C.RESHARD_AFTER_FORWARD, C.PARAM_DTYPE, C.REDUCE_DTYPE) == (3, True, "bfloat16", "float32")
    assert C.PLAN_DEGREES.world_size == C.WORLD_SIZE == 4


def test_mesh_size_mismatch_fails_fast_with_message(tp_config) -> None:
    C = tp_config
    with pytest.raises(C.MeshSizeError, match=r"needs 4 ranks, but WORLD_SIZE is 8.*--tp/--pp"):
        C.validate_world_size(C.PLAN_DEGREES, 8)
    C.validate_world_size(C.PLAN_DEGREES, 4)


def test_degree_overrides(tp_config) -> None:
    C = tp_config
    assert C.resolve_degrees(4, env={}) == C.PLAN_DEGREES
    scaled = C.resolve_degrees(2, overrides={"tp": 1}, env={})
    assert (scaled.tp, scaled.dp_shard, scaled.world_size) == (1, 2, 2)
    from_env = C.resolve_degrees(6, env={"DTC_SMOKE_TP": "1", "DTC_SMOKE_DP_SHARD": "-1"})
    assert (from_env.tp, from_env.dp_shard) == (1, 6)
    cli_wins = C.resolve_degrees(4, overrides={"tp": 4, "dp_shard": 1}, env={"DTC_SMOKE_TP": "1"})
    assert (cli_wins.tp, cli_wins.dp_shard) == (4, 1)
    with pytest.raises(C.MeshSizeError, match="not an integer"):
        C.resolve_degrees(4, env={"DTC_SMOKE_PP": "two"})
    with pytest.raises(C.MeshSizeError, match="divisible"):
        C.resolve_degrees(3, overrides={"dp_shard": -1}, env={})


def test_reference_model_family(tp_config) -> None:
    import torch

    C = tp_config
    cfg = C.reference_config(layers=2, hidden=64, seq_len=16, vocab=256, tp=2)
    assert cfg["num_attention_heads"] % 2 == 0 and cfg["num_kv_heads"] % 2 == 0
    assert cfg["num_attention_heads"] // cfg["num_kv_heads"] == 4  # llama3-8b's GQA ratio
    model = C.build_reference_model(layers=2, hidden=64, seq_len=16, vocab=256, tp=2)
    assert isinstance(model.layers, torch.nn.ModuleDict)
    block = model.layers["0"]
    assert block.feed_forward.w3 is not None  # SwiGLU
    logits = model(torch.randint(0, 256, (2, 16)))
    assert logits.shape == (2, 16, 256)
    split = C.split_stage(model, 1, (1, 1))
    assert split.tok_embeddings is None and list(split.layers) == ["1"] and split.output is not None
    assert model.tok_embeddings is not None and list(model.layers) == ["0", "1"]  # the original is intact


def test_reference_model_gpt_family(tmp_path: Path) -> None:
    import torch  # noqa: F401  - required; a missing torch fails the test
    C = _import_config(_write(llama_plan(preset="gpt-1.7b", seq=2048, dp_shard=8, zero_stage=3), tmp_path),
                        "fsdp_config_gpt")
    model = C.build_reference_model(layers=1, hidden=64, seq_len=8, vocab=128)
    assert model.output.weight is model.tok_embeddings.weight  # tied
    assert model.layers["0"].feed_forward.w3 is None  # GELU MLP
    assert type(model.norm).__name__ == "LayerNorm"


def test_train_entry_rejects_wrong_world_size(tmp_path: Path) -> None:
    """The entry checks the mesh before any collective: a world of 1 for a 4-rank mesh exits 2 at once."""
    import torch  # noqa: F401  - required; a missing torch fails the test
    directory = _write(plan_for(problem_for(TINY_SPEC), layout_for(problem_for(TINY_SPEC), tp=2, dp_shard=2,
                                                                    zero_stage=3), real_estimate=False), tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, "fsdp_train.py", "--steps", "1"], cwd=directory, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "needs 4 ranks, but WORLD_SIZE is 1" in proc.stderr


def test_train_entry_measures_saved_activations_with_a_dtype_override(tmp_path: Path) -> None:
    """One process (a world of one, mesh overridden from the environment): a selective-recompute fp16 plan
    run as fp32; the summary counts the saved activations, the selective-checkpoint cache included."""
    import torch  # noqa: F401  - required; a missing torch fails the test
    problem = problem_for(TINY_SPEC.replace("learning_rate: 0.001", "learning_rate: 0.001\n  precision: fp16"))
    directory = _write(plan_for(problem, layout_for(problem, tp=2, dp_shard=2, zero_stage=3, recompute="selective"),
                                real_estimate=False), tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", DTC_SMOKE_TP="1", DTC_SMOKE_DP_SHARD="1", DTC_SMOKE_PARAM_DTYPE="fp32")
    proc = subprocess.run([sys.executable, "fsdp_train.py", "--steps", "2", "--micro-batch", "2"], cwd=directory,
                          env=env, capture_output=True, text=True, timeout=180)
    summary = _summary(proc, 2)
    assert summary["param_dtype"] == "float32" and summary["ac_mode"] == "selective"
    assert summary["sac_cache_counted"] is True
    rank = summary["ranks"][0]
    # at least the logits (micro 2 x seq 32 x vocab 256, fp32) and each block's cached matmul outputs
    assert rank["saved_activation_bytes"] > 2 * 32 * 256 * 4, rank


# ------------------------------------------------------------------------------ torchrun, 4 CPU processes
def _torchrun(directory: Path, nproc: int, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for key in [k for k in env if k.startswith("DTC_SMOKE_")]:
        del env[key]
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={nproc}", "fsdp_train.py", *args],
                          cwd=directory, env=env, capture_output=True, text=True, timeout=600)
    return proc, time.monotonic() - start


def _summary(proc: subprocess.CompletedProcess, steps: int) -> dict[str, Any]:
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    lines = proc.stdout.splitlines()
    step_lines = [l for l in lines if l.startswith("step ")]
    assert [l.split()[1] for l in step_lines] == [f"{i}/{steps}" for i in range(1, steps + 1)], proc.stdout
    losses = [float(l.split()[3]) for l in step_lines]
    summaries = [json.loads(l) for l in lines if l.startswith("{") and "dtc_fsdp_summary" in l]
    assert len(summaries) == 1, proc.stdout
    summary = summaries[0]
    assert summary["losses"] == pytest.approx(losses, abs=1e-4)
    assert summary["steps"] == steps and summary["last_loss"] < summary["first_loss"]
    assert summary["backend"] == "gloo" and summary["device"] == "cpu"
    return summary


@pytest.mark.slow
def test_torchrun_tp2_dp_shard2(tmp_path: Path) -> None:
    import torch  # noqa: F401  - required; a missing torch fails the test
    problem = problem_for(TINY_SPEC)
    plan = plan_for(problem, layout_for(problem, tp=2, dp_shard=2, zero_stage=3), real_estimate=False)
    proc, wall = _torchrun(_write(plan, tmp_path), 4, "--steps", "2")
    summary = _summary(proc, 2)
    print(f"torchrun tp2 x dp_shard2: {wall:.1f}s wall")
    assert summary["world_size"] == 4
    assert summary["mesh"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2}
    assert summary["zero_stage"] == 3 and summary["reshard_after_forward"] is True
    ranks = summary["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3]
    full_bytes = summary["num_params"] * 4  # fp32 master weights
    for r in ranks:  # each rank holds about a quarter: tp halves, then dp_shard halves
        assert 0.2 * full_bytes < r["param_bytes"] < 0.3 * full_bytes, r
        assert r["optimizer_bytes"] == pytest.approx(2 * r["param_bytes"], rel=0.01)  # AdamW: 2 states
        assert r["saved_activation_bytes"] > 0, r


@pytest.mark.slow
def test_torchrun_pp2_dp_shard2_1f1b(tmp_path: Path) -> None:
    import torch  # noqa: F401  - required; a missing torch fails the test
    problem = problem_for(TINY_SPEC)
    plan = plan_for(problem, layout_for(problem, pp=2, dp_shard=2, zero_stage=3, schedule="1f1b"),
                    real_estimate=False)
    proc, wall = _torchrun(_write(plan, tmp_path), 4, "--steps", "2")
    summary = _summary(proc, 2)
    print(f"torchrun pp2 x dp_shard2 (1F1B): {wall:.1f}s wall")
    assert summary["mesh"] == {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 1}
    assert summary["schedule"] == "1f1b" and summary["grad_accum"] == 2
    stages = {r["coords"]["pp"] for r in summary["ranks"]}
    assert stages == {0, 1}
