"""DeepSpeed renderer: ds_config.json as data over a matrix of layouts, then the real consumer.

The context (``deepspeed_context``) is checked as data per layout. Then every generated
config goes through DeepSpeed 0.19.8's own DeepSpeedConfig in ONE subprocess
(tools/validators/deepspeed_check.py --batch) at the plan's real data-parallel size, and
the generated ds_train.py's config handling and lr-schedule alignment run in one subprocess against
DeepSpeed's own classes, and the script runs for real once: torchrun, 2 CPU processes (gloo), ZeRO-2 bf16.
"""
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
from compiler.plan import Plan
from compiler.targets.deepspeed.render import (NVME_PATH, deepspeed_context, deepspeed_dp_size, deepspeed_notes,
                                       render_deepspeed)
from plan_fixtures import layout_for, plan_for, problem_for

ROOT = Path(__file__).resolve().parents[1]
VALIDATOR = ROOT / "tools" / "validators" / "deepspeed_check.py"

TINY_SPEC = """
name: tiny
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
  precision: {precision}
cluster:
  gpu: h100-sxm
  num_gpus: 2
"""


def llama(num_gpus: int = 8, precision: str = "bf16", optimizer: str = "adamw", preset: str = "llama3-8b"):
    return problem_for(f"""
name: ds
model:
  preset: {preset}
training:
  tokens: 1T
  sequence_length: 4096
  global_batch: 64
  precision: {precision}
  optimizer: {optimizer}
cluster:
  gpu: h100-sxm
  num_gpus: {num_gpus}
""" + ("targets: [megatron]\n" if precision == "fp8" else ""))  # fp8: a Megatron plan, rendered for DeepSpeed


def plan(problem, **layout: Any) -> Plan:
    return plan_for(problem, layout_for(problem, **layout), real_estimate=False)


# name -> (problem kwargs, layout kwargs); all on 8 GPUs unless the layout says otherwise
MATRIX: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # ZeRO-0 runs only fp32 parameters with dtc's fp32 gradient accumulation (support.py _ds_zero0)
    "z0_fp32": (dict(precision="fp32"), dict(dp_replicate=8)),
    "z1_fp16": (dict(precision="fp16"), dict(dp_shard=8, zero_stage=1)),
    "z2_fp32": (dict(precision="fp32"), dict(dp_shard=8, zero_stage=2, micro_batch=2)),
    "z3_full": ({}, dict(dp_shard=8, zero_stage=3, recompute="full")),
    "z2_offload_cpu": ({}, dict(dp_shard=8, zero_stage=2, offload_optimizer="cpu")),
    "z3_offload_cpu": ({}, dict(dp_shard=8, zero_stage=3, offload_optimizer="cpu", offload_params="cpu")),
    "z3_offload_nvme": ({}, dict(dp_shard=8, zero_stage=3, offload_optimizer="nvme", offload_params="nvme")),
    "pp2_z1": ({}, dict(pp=2, dp_shard=4, zero_stage=1, recompute="full")),
    "pp4_z0": (dict(precision="fp32"), dict(pp=4, dp_replicate=2)),
    "tp2_z1": ({}, dict(tp=2, dp_shard=4, zero_stage=1, recompute="selective")),
    "tp4_z2": ({}, dict(tp=4, dp_shard=2, zero_stage=2)),
    "hsdp_z3": (dict(num_gpus=16), dict(dp_replicate=2, dp_shard=8, zero_stage=3)),
    "sgd_z1": (dict(optimizer="sgd"), dict(dp_shard=8, zero_stage=1)),
    "adam_z2": (dict(optimizer="adam"), dict(dp_shard=8, zero_stage=2)),
}


@pytest.fixture(scope="module")
def matrix() -> dict[str, Plan]:
    return {name: plan(llama(**pk), **lk) for name, (pk, lk) in MATRIX.items()}


# ------------------------------------------------------------------------------ context as data
def test_batch_identity_uses_deepspeeds_world_size(matrix: dict[str, Plan]) -> None:
    for name, p in matrix.items():
        lay, cfg = p.layout, deepspeed_context(p)
        assert cfg["train_micro_batch_size_per_gpu"] == lay.micro_batch, name
        assert cfg["gradient_accumulation_steps"] == lay.grad_accum, name
        assert cfg["train_batch_size"] == lay.micro_batch * lay.grad_accum * deepspeed_dp_size(lay), name
        # DeepSpeed divides by dp, except that AutoTP (no mpu) counts the TP ranks too
        assert deepspeed_dp_size(lay) == (lay.dp * lay.tp if lay.tp > 1 else lay.dp), name
    assert deepspeed_context(matrix["pp2_z1"])["train_batch_size"] == matrix["pp2_z1"].training.global_batch
    tp2 = matrix["tp2_z1"]
    assert deepspeed_context(tp2)["train_batch_size"] == 2 * tp2.training.global_batch


def test_zero_sections(matrix: dict[str, Plan]) -> None:
    h = 4096
    assert deepspeed_context(matrix["z0_fp32"])["zero_optimization"] == {"stage": 0}
    z1 = deepspeed_context(matrix["z1_fp16"])["zero_optimization"]
    assert z1 == {"stage": 1, "overlap_comm": True, "contiguous_gradients": True, "reduce_scatter": True,
                  "reduce_bucket_size": h * h, "allgather_partitions": True, "allgather_bucket_size": h * h}
    z3 = deepspeed_context(matrix["z3_full"])["zero_optimization"]
    assert z3["stage"] == 3 and z3["reduce_bucket_size"] == h * h
    assert z3["stage3_prefetch_bucket_size"] == int(0.9 * h * h)
    assert z3["stage3_param_persistence_threshold"] == 10 * h
    assert z3["stage3_max_live_parameters"] == 10**9 and "zero_hpz_partition_size" not in z3
    assert "allgather_bucket_size" not in z3
    hsdp = deepspeed_context(matrix["hsdp_z3"])
    assert hsdp["zero_optimization"]["zero_hpz_partition_size"] == 8
    assert hsdp["train_batch_size"] == matrix["hsdp_z3"].training.global_batch


def test_offload(matrix: dict[str, Plan]) -> None:
    z2 = deepspeed_context(matrix["z2_offload_cpu"])
    assert z2["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert "offload_param" not in z2["zero_optimization"] and "aio" not in z2
    cpu = deepspeed_context(matrix["z3_offload_cpu"])["zero_optimization"]
    assert cpu["offload_param"] == {"device": "cpu", "pin_memory": True}
    nvme = deepspeed_context(matrix["z3_offload_nvme"])
    zo = nvme["zero_optimization"]
    assert zo["offload_optimizer"]["device"] == "nvme" and zo["offload_optimizer"]["nvme_path"] == NVME_PATH
    assert zo["offload_param"]["device"] == "nvme" and zo["offload_param"]["nvme_path"] == NVME_PATH
    assert zo["offload_optimizer"]["pin_memory"] and zo["offload_param"]["pin_memory"]
    assert set(nvme["aio"]) == {"block_size", "queue_depth", "intra_op_parallelism", "single_submit",
                                "overlap_events"}


def test_precision(matrix: dict[str, Plan]) -> None:
    # the bf16 gradient freed once added to its fp32 buffer (BF16_Optimizer), as the cost model counts one copy
    assert deepspeed_context(matrix["z3_full"])["bf16"] == {"enabled": True, "immediate_grad_update": True}
    fp16 = deepspeed_context(matrix["z1_fp16"])
    assert fp16["bf16"] == {"enabled": False}
    assert fp16["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                            "hysteresis": 2, "min_loss_scale": 1}
    fp32 = deepspeed_context(matrix["z2_fp32"])
    assert fp32["bf16"] == {"enabled": False} and fp32["fp16"] == {"enabled": False}


def test_optimizer_scheduler_clipping(matrix: dict[str, Plan]) -> None:
    p = matrix["z1_fp16"]
    cfg, t = deepspeed_context(p), p.training
    assert cfg["optimizer"] == {"type": "AdamW", "params": {"lr": t.learning_rate, "eps": 1e-8,
                                                            "betas": [t.adam_beta1, t.adam_beta2],
                                                            "weight_decay": t.weight_decay}}
    # the runtime sets Megatron's schedule every step (no DeepSpeed scheduler); gradients in fp32
    assert "scheduler" not in cfg
    assert cfg["data_types"] == {"grad_accum_dtype": "fp32"} and cfg["communication_data_type"] == "fp32"
    run = json.loads(render_deepspeed(p)["ds_train_config.json"])
    assert run["schedule"]["peak_lr"] == t.learning_rate and run["schedule"]["min_lr"] == t.min_learning_rate
    assert run["schedule"]["decay_steps"] == t.num_steps
    assert run["schedule"]["warmup_steps"] == -(-t.warmup_tokens // t.tokens_per_step)
    assert cfg["gradient_clipping"] == t.grad_clip
    assert cfg["wall_clock_breakdown"] is False and "seed" not in cfg
    sgd = deepspeed_context(matrix["sgd_z1"])
    assert sgd["optimizer"]["type"] == "SGD" and sgd["zero_allow_untested_optimizer"] is True
    adam = deepspeed_context(matrix["adam_z2"])["optimizer"]
    assert adam["type"] == "Adam" and adam["params"]["adam_w_mode"] is False


def test_pipeline_autotp_and_checkpointing(matrix: dict[str, Plan]) -> None:
    pp = deepspeed_context(matrix["pp2_z1"])
    assert pp["pipeline"] == {"stages": 2, "activation_checkpoint_interval": 1}
    # the layers of each stage: Megatron's split of the plan (compiler.split), in ds_train_config.json
    run = json.loads(render_deepspeed(matrix["pp2_z1"])["ds_train_config.json"])
    assert [len(s) for s in run["parallel"]["stage_layers"]] == list(matrix["pp2_z1"].layer_split().chunk_layers)
    assert pp["activation_checkpointing"]["partition_activations"] is False
    assert deepspeed_context(matrix["pp4_z0"])["pipeline"]["activation_checkpoint_interval"] == 0
    assert "activation_checkpointing" not in deepspeed_context(matrix["pp4_z0"])
    tp = deepspeed_context(matrix["tp2_z1"])
    assert tp["tensor_parallel"] == {"autotp_size": 2} and "pipeline" not in tp
    assert tp["activation_checkpointing"]["partition_activations"] is True
    for name in ("z0_fp32", "pp2_z1"):
        assert "tensor_parallel" not in deepspeed_context(matrix[name])


def test_notes_explain_what_the_config_cannot(matrix: dict[str, Plan]) -> None:
    assert deepspeed_notes(matrix["z0_fp32"]) == []
    assert any(NVME_PATH in n for n in deepspeed_notes(matrix["z3_offload_nvme"]))
    assert any("train_batch_size=128" in n and "distinct sequences per step are 64" in n
               for n in deepspeed_notes(matrix["tp2_z1"]))
    assert any("zero_hpz_partition_size=8" in n for n in deepspeed_notes(matrix["hsdp_z3"]))


@pytest.mark.parametrize("layout, needle", [  # the solver's table, compiler.targets.support
    (dict(tp=2, cp=2, dp_shard=2, zero_stage=1), "context parallel"),
    (dict(dp_shard=8, zero_stage=1, ep=2), "expert parallel"),
    (dict(tp=2, dp_shard=4, zero_stage=1, sequence_parallel=True), "sequence parallel"),
    (dict(pp=2, dp_shard=4, zero_stage=2), "ZeRO stage 0 or 1"),
    (dict(pp=2, tp=2, dp_shard=2, zero_stage=1), "cannot be combined with AutoTP"),
    (dict(pp=2, vpp=2, schedule="interleaved_1f1b", dp_shard=4, zero_stage=1), "own 1F1B"),
    (dict(dp_replicate=2, dp_shard=4, zero_stage=1), "hpZ"),
    (dict(dp_shard=8, zero_stage=2, offload_optimizer="nvme"), "NVMe needs ZeRO-3"),
    (dict(dp_replicate=8, offload_optimizer="cpu"), "ZeRO stage 1 or more"),
])
def test_unsupported_layouts_raise(layout: dict[str, Any], needle: str) -> None:
    with pytest.raises(RenderError, match=needle):
        deepspeed_context(plan(llama(), **layout))


def test_fp8_raises() -> None:
    with pytest.raises(RenderError, match="fp8"):
        render_deepspeed(plan(llama(precision="fp8"), dp_shard=8, zero_stage=1))


# ------------------------------------------------------------------------------ the files
def test_files_are_deterministic_and_headed(matrix: dict[str, Plan]) -> None:
    for name, p in matrix.items():
        files = render_deepspeed(p)
        assert {"ds_config.json", "ds_train.py", "ds_train_config.json", "dtc_runtime/model.py"} <= set(files), name
        assert files == render_deepspeed(p) == render_deepspeed(Plan.from_json(p.to_json())), name
        text = files["ds_config.json"]
        cfg = json.loads(text)
        assert cfg == deepspeed_context(p)
        assert text == json.dumps(cfg, indent=2, sort_keys=True) + "\n"
        script = files["ds_train.py"]
        assert script.endswith("\n") and not script.endswith("\n\n")
        compile(ast.parse(script, filename=f"{name}/ds_train.py"), f"{name}/ds_train.py", "exec")
        assert str(ROOT) not in script and str(ROOT) not in text


@pytest.mark.slow  # runs DeepSpeed's own validator in a process (torch and all), as tests/test_validators.py
def test_deepspeed_accepts_every_config(matrix: dict[str, Plan], tmp_path: Path) -> None:
    """ONE validator process: DeepSpeed's DeepSpeedConfig + unknown-key checks, at each plan's real dp."""
    jobs = []
    for name, p in matrix.items():
        path = tmp_path / f"{name}.json"
        path.write_text(render_deepspeed(p)["ds_config.json"])
        jobs.append({"path": str(path), "dp": p.layout.dp})  # the validator multiplies by autotp_size itself
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    proc = subprocess.run([sys.executable, str(VALIDATOR), "--batch", str(batch)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    bad = [r for r in results if not r["ok"]]
    assert not bad and proc.returncode == 0, \
        f"rejected by DeepSpeed:\n{json.dumps(bad, indent=1)}\n{proc.stderr[-3000:]}"
    assert len(results) == len(jobs)


@pytest.mark.slow  # launches torchrun
def test_ds_train_runs_on_cpu_with_torchrun(tmp_path: Path) -> None:
    """The generated script trains for real: 2 processes, gloo, ZeRO-2 bf16, 4 steps, no JIT builds;
    the loss falls on the fixed learnable batch and the summary line measures every rank."""
    problem = problem_for(TINY_SPEC.format(precision="bf16"))
    files = render_deepspeed(plan(problem, dp_shard=2, zero_stage=2))
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    ext = tmp_path / "torch_extensions"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "DTC_SMOKE_STEPS": "4", "DTC_SMOKE_KV_HEADS": "1",  # options from the environment too
           "DTC_SMOKE_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "ds_train.py", "--ffn", "96", "--synthetic"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    elapsed = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    steps = [line for line in proc.stdout.splitlines() if line.startswith("[ds_train] step ")]
    assert [line.split()[2] for line in steps] == ["1/4", "2/4", "3/4", "4/4"], out[-3000:]
    lrs = [float(line.split(" lr ")[1].split()[0]) for line in steps]
    assert lrs[0] > 0, "the first optimizer step ran at lr 0"
    summaries = [json.loads(line) for line in proc.stdout.splitlines() if "dtc_deepspeed_summary" in line]
    assert len(summaries) == 1, out[-3000:]
    summary = summaries[0]
    assert summary["steps"] == 4 and summary["last_loss"] < summary["first_loss"]
    assert summary["losses"] == sorted(summary["losses"], reverse=True), "the fixed batch's loss falls every step"
    assert summary["model"]["num_kv_heads"] == 1 and summary["model"]["ffn_hidden_size"] == 96
    assert summary["zero_stage"] == 2 and summary["precision"] == "bf16" and summary["optimizer"] == "AdamW"
    assert sorted(r["rank"] for r in summary["ranks"]) == [0, 1]
    full_bf16 = summary["num_params"] * 2
    for r in summary["ranks"]:  # ZeRO-2: full bf16 weights, gradients and fp32 states partitioned over 2
        assert r["param_bytes"] == full_bf16, r
        assert 0.4 * full_bf16 < r["grad_bytes"] < 1.2 * full_bf16, r
        assert r["master_bytes"] == pytest.approx(full_bf16, rel=0.05), r  # fp32 half
        assert r["optimizer_bytes"] == pytest.approx(2 * full_bf16, rel=0.05), r  # Adam: 2 fp32 halves
        assert r["saved_activation_bytes"] > 0 and r["peak_memory_bytes"] > 0, r
    assert not ext.exists() or not any(ext.rglob("*.so")), "a DeepSpeed op was JIT-compiled on CPU"
    print(f"ds_train.py torchrun x2: {elapsed:.1f}s")
