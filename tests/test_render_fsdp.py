"""FSDP2 renderer: the runtime shipped verbatim, fsdp_config.json as data over a matrix of layouts
(checked by the runtime's own parser), then the real consumer: the generated folder trains under
torchrun on CPU (gloo), tp2 x dp_shard2 and pp2 x dp_shard2 (1F1B), 2 steps each."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from compiler.errors import RenderError
from compiler.runtime.config import run_config_from_dict
from compiler.targets.fsdp.render import render_fsdp
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


# ------------------------------------------------------------------------------ the config as data
MATRIX: dict[str, dict[str, Any]] = {
    "zero0_ddp": dict(dp_replicate=8, zero_stage=0),
    "zero2": dict(dp_shard=8, zero_stage=2),
    "zero3": dict(dp_shard=8, zero_stage=3),
    "hsdp": dict(dp_replicate=2, dp_shard=4, zero_stage=3),
    "tp_sp": dict(tp=4, dp_shard=2, zero_stage=3, sequence_parallel=True, recompute="selective"),
    "pp_1f1b": dict(pp=2, dp_shard=4, zero_stage=2, schedule="1f1b", micro_batch=2, grad_accum=4),
    "pp_gpipe": dict(pp=4, dp_shard=2, zero_stage=3, schedule="gpipe", recompute="full"),
    "pp_interleaved": dict(pp=2, vpp=2, dp_shard=4, zero_stage=3, schedule="interleaved_1f1b"),
    "offload": dict(dp_shard=8, zero_stage=3, offload_params="cpu", offload_optimizer="cpu"),
    "cp": dict(cp=2, dp_shard=4, zero_stage=3),
}


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_config_matrix(case: str) -> None:
    plan = llama_plan(**MATRIX[case])
    files = render_fsdp(plan)
    cfg = json.loads(files["fsdp_config.json"])
    parsed = run_config_from_dict(cfg)  # the trainer's own parser accepts it
    lay, par = plan.layout, cfg["parallel"]
    assert (par["tp"], par["pp"], par["cp"], par["dp_replicate"], par["dp_shard"], par["vpp"], par["zero_stage"]) == (
        lay.tp, lay.pp, lay.cp, lay.dp_replicate, lay.dp_shard, lay.vpp, lay.zero_stage)
    assert par["recompute"] == lay.recompute and par["sequence_parallel"] == lay.sequence_parallel
    assert par["offload"] == ("cpu" if lay.offload_params == "cpu" else "none")
    assert parsed.global_batch == plan.training.global_batch
    if lay.pp > 1:  # Megatron's split, the one costed
        split = plan.layer_split()
        assert [len(s) for s in parsed.parallel.stages(parsed.model.num_layers)] == list(split.chunk_layers)
        assert par["pp_schedule"] == lay.schedule


def test_model_hyperparameters_come_from_the_catalog() -> None:
    llama = json.loads(render_fsdp(llama_plan(dp_shard=8, zero_stage=3))["fsdp_config.json"])["model"]
    assert llama["rope_theta"] == 500000.0 and llama["init_std"] == 0.01 and llama["norm_eps"] == 1e-5
    l2 = json.loads(render_fsdp(llama_plan(preset="llama2-7b", dp_shard=8, zero_stage=3))["fsdp_config.json"])
    assert l2["model"]["rope_theta"] == 10000.0
    l31 = json.loads(render_fsdp(llama_plan(preset="llama3.1-8b", dp_shard=8, zero_stage=3))["fsdp_config.json"])
    assert l31["model"]["rope_scaling"] == {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 8192}
    gpt = json.loads(render_fsdp(llama_plan(preset="gpt-1.7b", seq=2048, dp_shard=8,
                                            zero_stage=3))["fsdp_config.json"])["model"]
    assert gpt["position"] == "learned" and gpt["mlp"] == "gelu" and gpt["linear_bias"] is True
    assert json.loads(render_fsdp(llama_plan(dp_shard=8, zero_stage=3))["fsdp_config.json"])["data"] == {
        "synthetic": True}


def test_files_are_the_runtime_verbatim_and_deterministic() -> None:
    from compiler.runtime_bundle import runtime_files

    plan = llama_plan(dp_shard=8, zero_stage=3)
    first, second = render_fsdp(plan), render_fsdp(plan)
    assert first == second
    assert {k: v for k, v in first.items() if k.startswith("dtc_runtime/")} == runtime_files()
    assert {"fsdp_config.json", "fsdp_train.py"} <= set(first)
    compile(ast.parse(first["fsdp_train.py"]), "fsdp_train.py", "exec")


def test_unsupported_layouts_and_models_raise() -> None:
    with pytest.raises(RenderError):
        render_fsdp(llama_plan(precision="fp8", dp_shard=8, zero_stage=3))


# ------------------------------------------------------------------------------ the real consumer
@pytest.mark.slow
@pytest.mark.parametrize("layout", [dict(tp=2, dp_shard=2, zero_stage=3), dict(pp=2, dp_shard=2, zero_stage=2,
                                                                                 schedule="1f1b", grad_accum=2)],
                         ids=["tp2_dp2", "pp2_dp2"])
def test_generated_folder_trains_under_torchrun(tmp_path: Path, layout: dict[str, Any]) -> None:
    problem = problem_for(TINY_SPEC)
    files = render_fsdp(plan_for(problem, layout_for(problem, **layout), real_estimate=False))
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
                           str(tmp_path / "fsdp_train.py"), "--steps", "2", "--checkpoint-dir", str(tmp_path / "ck")],
                          cwd="/", env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    summary = json.loads(next(line for line in proc.stdout.splitlines() if "dtc_fsdp_summary" in line))
    assert summary["steps"] == 2 and summary["world_size"] == 4
    assert (tmp_path / "ck" / "step_000000002" / "COMPLETE").is_file()
    print(f"fsdp_train.py {layout}: {time.monotonic() - t0:.1f}s")
