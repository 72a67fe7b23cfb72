"""Megatron-LM renderer: the pretrain_gpt.py flags as data over a matrix of layouts, then the real parser.

Each generated megatron_args.sh is sourced by bash (so the quoting is exercised for real) and
the resulting argument lists go through megatron-core 0.19.2's own arguments.py
(add_megatron_arguments + validate_args + TransformerConfig) in ONE subprocess:
tools/validators/megatron_check.py --batch, at each plan's world size. Without megatron-core
installed these tests FAIL and say to run tools/validators/install.sh.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compiler.errors import RenderError
from compiler.plan import Plan
from compiler.targets.megatron.render import (megatron_arg_groups, megatron_args, megatron_env, megatron_notes,
                                      moe_layer_pattern, pipeline_flags, render_megatron)
from compiler.split import PipelineSplit
from plan_fixtures import layout_for, plan_for, problem_for

ROOT = Path(__file__).resolve().parents[1]
VALIDATOR = ROOT / "tools" / "validators" / "megatron_check.py"
GPU_ARCH = {"ampere": 8, "ada": 8, "hopper": 9, "blackwell": 10}


def problem(preset: str = "llama3-8b", num_gpus: int = 8, *, gbs: int = 64, seq: int = 4096,
            precision: str = "bf16", optimizer: str = "adamw", gpu: str = "h100-sxm", extra: str = ""):
    return problem_for(f"""
name: mg
model:
  preset: {preset}
training:
  tokens: 1T
  sequence_length: {seq}
  global_batch: {gbs}
  precision: {precision}
  optimizer: {optimizer}
cluster:
  gpu: {gpu}
  num_gpus: {num_gpus}
targets: [megatron]
{extra}""")


def plan(prob, **layout: Any) -> Plan:
    return plan_for(prob, layout_for(prob, **layout), real_estimate=False)


MATRIX: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "ddp": ({}, dict(dp_replicate=8)),
    "distopt_tp_sp": ({}, dict(tp=2, dp_shard=4, zero_stage=1, recompute="selective", sequence_parallel=True)),
    "fsdp_z2": ({}, dict(dp_shard=8, zero_stage=2)),
    "fsdp_z3_hsdp": (dict(num_gpus=16), dict(dp_replicate=2, dp_shard=8, zero_stage=3, recompute="full")),
    "distopt_hsdp": (dict(num_gpus=16), dict(dp_replicate=2, dp_shard=8, zero_stage=1)),
    "vpp": (dict(num_gpus=16), dict(tp=2, pp=4, vpp=2, schedule="interleaved_1f1b", dp_shard=2, zero_stage=1)),
    "cp": (dict(num_gpus=16, seq=8192), dict(tp=2, cp=2, dp_shard=4, zero_stage=1, sequence_parallel=True)),
    "uneven_pp": (dict(preset="llama3.1-405b", num_gpus=128, gbs=128),
                  dict(tp=8, pp=8, dp_shard=2, zero_stage=1, recompute="full", sequence_parallel=True)),
    # NeMo's Llama 3.1 405B: pp 8 x vpp 8 with the embedding and the loss counted as layers
    "account_vpp": (dict(preset="llama3.1-405b", num_gpus=128, gbs=128),
                    dict(tp=8, pp=8, vpp=8, schedule="interleaved_1f1b", dp_shard=2, zero_stage=1,
                         sequence_parallel=True)),
    # 126 layers on pp 8 x vpp 9: only an explicit --pipeline-model-parallel-layout balances it
    "layout_vpp": (dict(preset="llama3.1-405b", num_gpus=128, gbs=128),
                   dict(tp=8, pp=8, vpp=9, schedule="interleaved_1f1b", dp_shard=2, zero_stage=1,
                        sequence_parallel=True)),
    # a pinned uneven split: Megatron's 9 / 18 x 6 / 9
    "first_last_vpp": (dict(preset="llama3.1-405b", num_gpus=128, gbs=128),
                       dict(tp=8, pp=8, vpp=9, schedule="interleaved_1f1b", dp_shard=2, zero_stage=1,
                            sequence_parallel=True, split=PipelineSplit("uneven", first=9, last=9))),
    "deepseek_mla_moe": (dict(preset="deepseek-v3", num_gpus=64, gbs=128),
                         dict(tp=2, pp=4, ep=8, dp_shard=8, zero_stage=1, sequence_parallel=True)),
    "mixtral_ep": (dict(preset="mixtral-8x7b", num_gpus=16), dict(tp=2, ep=8, dp_shard=8, zero_stage=1,
                                                                   sequence_parallel=True)),
    "mixtral_fsdp_ep": (dict(preset="mixtral-8x7b", num_gpus=16), dict(dp_shard=16, zero_stage=3, ep=8)),
    "qwen_qkv_bias": (dict(preset="qwen2.5-7b"), dict(tp=4, dp_shard=2, zero_stage=1, sequence_parallel=True)),
    "gpt3_fp16_gelu": (dict(preset="gpt3-175b", num_gpus=64, precision="fp16", seq=2048), dict(tp=8, pp=8)),
    "offload_cpu": ({}, dict(dp_shard=8, zero_stage=1, offload_optimizer="cpu")),
    "fp32_sgd": (dict(precision="fp32", optimizer="sgd"), dict(dp_replicate=8)),
    "fp8_hopper": (dict(precision="fp8"), dict(tp=2, dp_shard=4, zero_stage=1)),
    "fp8_blackwell": (dict(precision="fp8", gpu="b200"), dict(tp=2, dp_shard=4, zero_stage=1)),
    "nvfp4_distopt": (dict(precision="nvfp4", gpu="gb300", num_gpus=8), dict(tp=2, dp_shard=4, zero_stage=1)),
    "nvfp4_ddp": (dict(precision="nvfp4", gpu="b200"), dict(dp_replicate=8)),
    # model.init: Megatron starts from the converted checkpoint (--pretrained-checkpoint, convert_init.sh)
    "pretrained_init": (dict(preset="llama3-8b\n  init: /models/llama3-8b-hf"), dict(dp_shard=8, zero_stage=1)),
    "data": (dict(extra="data:\n  tokenizer: tok/tokenizer.json\n  datasets: [{path: data/my-corpus_text_document}]\n"),
             dict(dp_shard=8, zero_stage=1)),
}


@pytest.fixture(scope="module")
def matrix() -> dict[str, Plan]:
    return {name: plan(problem(**pk), **lk) for name, (pk, lk) in MATRIX.items()}


def value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


# ------------------------------------------------------------------------------ flags as data
def test_parallel_sizes_and_data_parallel(matrix: dict[str, Plan]) -> None:
    for name, p in matrix.items():
        a, lay = megatron_args(p), p.layout
        assert value(a, "--tensor-model-parallel-size") == str(lay.tp), name
        assert value(a, "--pipeline-model-parallel-size") == str(lay.pp), name
        assert value(a, "--context-parallel-size") == (str(lay.cp) if lay.cp > 1 else None), name
        assert value(a, "--expert-model-parallel-size") == (str(lay.ep) if lay.ep > 1 else None), name
        assert ("--sequence-parallel" in a) == lay.sequence_parallel, name
        assert ("--use-distributed-optimizer" in a) == (lay.zero_stage == 1), name
        assert ("--use-megatron-fsdp" in a) == (lay.zero_stage >= 2), name
        assert value(a, "--micro-batch-size") == str(lay.micro_batch)
        assert value(a, "--global-batch-size") == str(p.training.global_batch)
        assert value(a, "--train-iters") == str(p.training.num_steps)
    a = megatron_args(matrix["fsdp_z3_hsdp"])
    assert value(a, "--data-parallel-sharding-strategy") == "optim_grads_params"
    assert value(a, "--num-distributed-optimizer-instances") == "2" and value(a, "--ckpt-format") == "fsdp_dtensor"
    assert value(megatron_args(matrix["fsdp_z2"]), "--data-parallel-sharding-strategy") == "optim_grads"
    assert value(megatron_args(matrix["distopt_hsdp"]), "--num-distributed-optimizer-instances") == "2"
    assert {"--overlap-grad-reduce", "--overlap-param-gather"} <= set(megatron_args(matrix["distopt_hsdp"]))
    ddp = megatron_args(matrix["ddp"])
    assert "--overlap-grad-reduce" in ddp and "--overlap-param-gather" not in ddp
    assert value(megatron_args(matrix["vpp"]), "--num-virtual-stages-per-pipeline-rank") == "2"


def test_pipeline_split_flags(matrix: dict[str, Plan]) -> None:
    assert pipeline_flags(4, 1, PipelineSplit()) == [["--pipeline-model-parallel-size", "4"]]
    a = megatron_args(matrix["uneven_pp"])  # 126 layers on pp 8: 128 units / 8 ranks
    assert {"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"} <= set(a)
    a = megatron_args(matrix["account_vpp"])
    assert value(a, "--num-virtual-stages-per-pipeline-rank") == "8"
    assert {"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"} <= set(a)
    a = megatron_args(matrix["layout_vpp"])  # the layout fixes vpp itself (arguments.py:907)
    assert "--num-virtual-stages-per-pipeline-rank" not in a
    assert value(a, "--pipeline-model-parallel-layout") == "E|,(t|)*15,(tt|)*55,tL"
    a = megatron_args(matrix["first_last_vpp"])
    assert (value(a, "--decoder-first-pipeline-num-layers"), value(a, "--decoder-last-pipeline-num-layers")) == \
        ("9", "9")
    assert value(a, "--num-virtual-stages-per-pipeline-rank") == "9"
    for name, p in matrix.items():  # every plan records the split it is costed with
        assert p.layout.split is not None, name


def test_model_flags(matrix: dict[str, Plan]) -> None:
    a = megatron_args(matrix["ddp"])  # Llama 3 8B
    for flag, v in [("--num-layers", "32"), ("--hidden-size", "4096"), ("--ffn-hidden-size", "14336"),
                    ("--num-attention-heads", "32"), ("--num-query-groups", "8"), ("--seq-length", "4096"),
                    ("--max-position-embeddings", "8192"), ("--position-embedding-type", "rope"),
                    ("--normalization", "RMSNorm"), ("--vocab-size", "128256"), ("--tokenizer-type", "NullTokenizer"),
                    ("--transformer-impl", "transformer_engine")]:
        assert value(a, flag) == v, flag
    for flag in ("--group-query-attention", "--swiglu", "--untie-embeddings-and-output-weights",
                 "--disable-bias-linear", "--mock-data", "--bf16"):
        assert flag in a
    assert "--use-mcore-models" not in a and "--kv-channels" not in a
    gpt = megatron_args(matrix["gpt3_fp16_gelu"])
    assert value(gpt, "--position-embedding-type") == "learned_absolute"
    assert value(gpt, "--normalization") == "LayerNorm" and "--fp16" in gpt
    assert "--swiglu" not in gpt and "--disable-bias-linear" not in gpt and "--group-query-attention" not in gpt
    assert "--untie-embeddings-and-output-weights" not in gpt  # GPT-3 ties them
    ds = megatron_args(matrix["deepseek_mla_moe"])
    for flag, v in [("--q-lora-rank", "1536"), ("--kv-lora-rank", "512"), ("--qk-head-dim", "128"),
                    ("--qk-pos-emb-head-dim", "64"), ("--v-head-dim", "128"), ("--num-experts", "256"),
                    ("--moe-router-topk", "8"), ("--moe-ffn-hidden-size", "2048"), ("--ffn-hidden-size", "18432"),
                    ("--moe-shared-expert-intermediate-size", "2048"), ("--moe-layer-freq", "([0]*3+[1]*58)")]:
        assert value(ds, flag) == v, flag
    assert "--multi-latent-attention" in ds and "--group-query-attention" not in ds
    assert "--moe-layer-freq" not in megatron_args(matrix["mixtral_ep"])  # every layer is MoE: the default
    assert moe_layer_pattern([0, 1, 0, 1, 1]) == "([0]*1+[1]*1+[0]*1+[1]*2)"
    qwen = megatron_args(matrix["qwen_qkv_bias"])
    assert {"--add-qkv-bias", "--disable-bias-linear"} <= set(qwen) and value(qwen, "--num-query-groups") == "4"


def test_optimizer_precision_recompute(matrix: dict[str, Plan]) -> None:
    p = matrix["distopt_tp_sp"]
    a, t = megatron_args(p), p.training
    assert value(a, "--optimizer") == "adam" and value(a, "--lr-decay-style") == "cosine"
    assert float(value(a, "--lr")) == t.learning_rate and float(value(a, "--min-lr")) == t.min_learning_rate
    assert int(value(a, "--lr-warmup-iters")) == -(-t.warmup_tokens // t.tokens_per_step)
    assert value(a, "--lr-decay-iters") == str(t.num_steps)
    assert float(value(a, "--adam-beta2")) == t.adam_beta2 and float(value(a, "--clip-grad")) == t.grad_clip
    assert float(value(a, "--weight-decay")) == t.weight_decay and value(a, "--seed") == str(t.seed)
    assert value(a, "--recompute-granularity") == "selective" and "--recompute-method" not in a
    full = megatron_args(matrix["fsdp_z3_hsdp"])
    assert (value(full, "--recompute-granularity"), value(full, "--recompute-method"),
            value(full, "--recompute-num-layers")) == ("full", "uniform", "1")
    sgd = megatron_args(matrix["fp32_sgd"])
    assert value(sgd, "--optimizer") == "sgd" and not {"--bf16", "--fp16", "--adam-beta1"} & set(sgd)
    h = megatron_args(matrix["fp8_hopper"])
    assert (value(h, "--fp8-format"), value(h, "--fp8-recipe")) == ("hybrid", "delayed") and "--bf16" in h
    b = megatron_args(matrix["fp8_blackwell"])
    assert (value(b, "--fp8-format"), value(b, "--fp8-recipe")) == ("e4m3", "mxfp8")
    # nvfp4: TE's NVFP4BlockScaling through --fp4-format, the weights kept in NVFP4 under the distributed optimizer
    # (as the cost model costs them: 1.125 B per parameter, no separate weight cache) but not under plain DDP
    n4 = megatron_args(matrix["nvfp4_distopt"])
    assert (value(n4, "--fp4-format"), value(n4, "--fp4-recipe")) == ("e2m1", "nvfp4") and "--bf16" in n4
    assert "--fp4-param-gather" in n4 and not any(f.startswith("--fp8") for f in n4)
    assert "--fp4-param-gather" not in megatron_args(matrix["nvfp4_ddp"])
    assert any("Transformer Engine 2.8" in n for n in megatron_notes(matrix["nvfp4_ddp"]))
    off = megatron_args(matrix["offload_cpu"])
    assert {"--optimizer-cpu-offload", "--use-precision-aware-optimizer"} <= set(off)
    data = megatron_args(matrix["data"])
    assert value(data, "--data-path") == "data/my-corpus_text_document" and "--mock-data" not in data


def test_environment_and_notes(matrix: dict[str, Plan]) -> None:
    assert megatron_env(matrix["ddp"]) == {}
    assert megatron_env(matrix["distopt_tp_sp"]) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # tp > 1 on Hopper
    assert megatron_env(matrix["fsdp_z2"]) == {"CUDA_DEVICE_MAX_CONNECTIONS": None}  # Megatron-FSDP: unset
    assert megatron_env(matrix["fp8_blackwell"]) == {}  # no longer required from Blackwell on
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in render_megatron(matrix["fsdp_z2"])["megatron_args.sh"]
    assert any("15, 16 x 6, 15 layers per pipeline rank" in n for n in megatron_notes(matrix["uneven_pp"]))
    assert any("fsdp_dtensor" in n for n in megatron_notes(matrix["fsdp_z3_hsdp"]))


def test_groups_are_ordered(matrix: dict[str, Plan]) -> None:
    names = [name for name, _ in megatron_arg_groups(matrix["distopt_tp_sp"])]
    assert names == ["parallelism", "model", "batch and iterations", "optimizer and learning-rate schedule",
                     "precision", "loss", "activation recompute", "data and tokenizer", "logging", "checkpointing"]


@pytest.mark.parametrize("kwargs, layout, needle", [
    (dict(num_gpus=48), dict(tp=3, dp_shard=16, zero_stage=1), "num_attention_heads"),
    (dict(num_gpus=16), dict(tp=16), "num_kv_heads"),
    (dict(preset="mixtral-8x7b", num_gpus=16), dict(dp_shard=16, zero_stage=1, ep=16), "num_experts"),
    (dict(preset="mixtral-8x7b", num_gpus=16), dict(tp=2, ep=8, dp_shard=8, zero_stage=1), "sequence parallel"),
    (dict(num_gpus=8), dict(dp_shard=8, zero_stage=1, ep=2), "MoE model"),
    (dict(num_gpus=8, seq=4098), dict(cp=2, dp_shard=4, zero_stage=1), "2 x context_parallel"),
    (dict(num_gpus=8), dict(pp=2, schedule="gpipe", dp_shard=4, zero_stage=1), "GPipe"),  # frameworks table
    (dict(num_gpus=8), dict(dp_shard=8, zero_stage=3, offload_params="cpu"), "offload parameters"),
    (dict(num_gpus=8), dict(dp_shard=8, zero_stage=3, offload_optimizer="nvme"), "CPU only"),
    (dict(num_gpus=8), dict(pp=2, dp_shard=4, zero_stage=2), "Megatron-FSDP"),
])
def test_dtc_checks_megatron_lacks(kwargs: dict[str, Any], layout: dict[str, Any], needle: str) -> None:
    with pytest.raises(RenderError, match=needle):
        render_megatron(plan(problem(**kwargs), **layout))


# ------------------------------------------------------------------------------ the file
def source_args(path: Path, env: dict[str, str] | None = None) -> tuple[list[str], str | None]:
    """(MEGATRON_ARGS, CUDA_DEVICE_MAX_CONNECTIONS) as bash sees them after sourcing the file."""
    script = (f'source {path} || exit 9; printf "%s\\0" "${{MEGATRON_ARGS[@]}}"; '
              'printf "%s" "${CUDA_DEVICE_MAX_CONNECTIONS-<unset>}"')
    base = {k: v for k, v in os.environ.items() if k not in ("CHECKPOINT_DIR", "CUDA_DEVICE_MAX_CONNECTIONS")}
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                          env={**base, **(env or {})})
    *args, conn = proc.stdout.split("\0")
    return args, None if conn == "<unset>" else conn


def test_files_are_deterministic_and_headed(matrix: dict[str, Plan], tmp_path: Path) -> None:
    for name, p in matrix.items():
        files = render_megatron(p)
        assert list(files) == ["megatron_args.sh"] + (["convert_init.sh"] if p.model.init else [])
        text = files["megatron_args.sh"]
        assert text == render_megatron(Plan.from_json(p.to_json()))["megatron_args.sh"], name
        assert text.splitlines()[0] == ("# Generated by dtc from test.yaml -- do not edit; "
                                        "run: dtc compile test.yaml")
        assert text.endswith(")\n") and str(ROOT) not in text
        path = tmp_path / f"{name}.sh"
        path.write_text(text)
        subprocess.run(["bash", "-n", str(path)], check=True)
        args, conn = source_args(path)
        assert args == [a.replace("${CHECKPOINT_DIR:-checkpoints}", "checkpoints")
                        .replace("${PRETRAINED_CHECKPOINT:-pretrained-megatron}", "pretrained-megatron")
                        for a in megatron_args(p)], name
        assert conn == megatron_env(p).get("CUDA_DEVICE_MAX_CONNECTIONS"), name
    if shutil.which("shellcheck"):
        subprocess.run(["shellcheck", *map(str, sorted(tmp_path.glob("*.sh")))], check=True)


def test_checkpoint_dir_expands_at_run_time(matrix: dict[str, Plan], tmp_path: Path) -> None:
    path = tmp_path / "args.sh"
    path.write_text(render_megatron(matrix["ddp"])["megatron_args.sh"])
    assert '"${CHECKPOINT_DIR:-checkpoints}"' in path.read_text()
    args, _ = source_args(path, {"CHECKPOINT_DIR": "/scratch/my run/ckpt"})
    assert value(args, "--save") == value(args, "--load") == "/scratch/my run/ckpt"
    args, _ = source_args(path)
    assert value(args, "--save") == "checkpoints"


@pytest.mark.slow  # runs Megatron-LM's own validator in a process (torch and all), as tests/test_validators.py
def test_megatron_parses_and_validates_every_list(matrix: dict[str, Plan], tmp_path: Path) -> None:
    from compiler.checkpointing import plan_policy

    """ONE validator process: megatron-core 0.19.2's own parser and checks, at each plan's world size."""
    jobs = []
    for name, p in matrix.items():
        path = tmp_path / f"{name}.sh"
        path.write_text(render_megatron(p)["megatron_args.sh"])
        flags, conn = source_args(path)
        jobs.append({"name": name, "flags": flags, "world_size": p.layout.world_size,
                     "env": {"CUDA_DEVICE_MAX_CONNECTIONS": conn},
                     "gpu_arch": GPU_ARCH[p.cluster.generation]})
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    proc = subprocess.run([sys.executable, str(VALIDATOR), "--batch", str(batch)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    if proc.returncode == 3:
        pytest.fail("megatron-core 0.19.2 is not installed in this venv: run tools/validators/install.sh\n"
                    + proc.stderr[-2000:])
    results = {r["path"]: r for r in map(json.loads, proc.stdout.splitlines())}
    bad = {k: r["errors"] for k, r in results.items() if not r["ok"]}
    assert not bad and proc.returncode == 0, f"rejected by Megatron-LM:\n{json.dumps(bad, indent=1)}\n" \
                                             f"{proc.stderr[-3000:]}"
    assert set(results) == set(matrix)
    for name, p in matrix.items():
        derived = results[name]["derived"]
        assert derived["data_parallel_size"] == p.layout.dp, name
        assert derived["num_microbatches"] == p.layout.grad_accum, name
        assert (derived["virtual_pipeline_model_parallel_size"] or 1) == p.layout.vpp, name
        # megatron-core builds exactly the split the plan is costed with
        assert tuple(derived["chunk_layers"]) == p.layer_split().chunk_layers, name
        # saves asynchronously where megatron-core can (torch_dist; validate_args keeps it on only with a
        # persistent worker), on the checkpoint policy's interval
        assert derived["async_save"] is (p.layout.zero_stage < 2), name
        assert derived["ckpt_format"] == ("torch_dist" if p.layout.zero_stage < 2 else "fsdp_dtensor"), name
        assert derived["save_interval"] == min(plan_policy(p, "megatron").interval_steps,
                                               p.training.num_steps), name


@pytest.mark.slow  # runs Megatron-LM's own validator in a process (torch and all), as tests/test_validators.py
def test_committed_plans_build_their_costed_split(tmp_path: Path) -> None:
    """Every generated/*/megatron_args.sh, parsed by megatron-core at its plan's world size, builds the
    decoder layers per (rank, virtual stage) that its plan.json is costed with."""
    jobs, plans = [], {}
    for args_file in sorted((ROOT / "generated").glob("*/megatron_args.sh")):
        p = Plan.from_json((args_file.parent / "plan.json").read_text())
        flags, conn = source_args(args_file)
        name = args_file.parent.name
        plans[name] = p
        jobs.append({"name": name, "flags": flags, "world_size": p.layout.world_size,
                     "env": {"CUDA_DEVICE_MAX_CONNECTIONS": conn}, "gpu_arch": GPU_ARCH[p.cluster.generation]})
    assert jobs, "no committed Megatron plans under generated/"
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    proc = subprocess.run([sys.executable, str(VALIDATOR), "--batch", str(batch)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    results = {r["path"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert set(results) == set(plans), proc.stderr[-3000:]
    for name, p in plans.items():
        assert results[name]["ok"], (name, results[name]["errors"])
        assert tuple(results[name]["derived"]["chunk_layers"]) == p.layer_split().chunk_layers, name


def test_pretrained_init_converts_then_loads(matrix: dict[str, Plan], tmp_path: Path) -> None:
    """model.init: convert_init.sh (pinned Megatron-Bridge, shellcheck-clean) writes the checkpoint that
    --pretrained-checkpoint reads while the run has none of its own; PLAN.md names the command."""
    import shutil

    from compiler.render.report import render_report
    from compiler.targets.megatron.render import MEGATRON_BRIDGE_VERSION, PRETRAINED_DIR, init_conversion_command

    p = matrix["pretrained_init"]
    files = render_megatron(p)
    convert = files["convert_init.sh"]
    assert f"pip install megatron-bridge=={MEGATRON_BRIDGE_VERSION}" in convert
    assert "AutoBridge.import_ckpt(sys.argv[1], sys.argv[2])" in convert and "INIT=/models/llama3-8b-hf" in convert
    (tmp_path / "convert_init.sh").write_text(convert)
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is not installed (scripts/setup.sh installs it)"
    r = subprocess.run([shellcheck, "-S", "style", str(tmp_path / "convert_init.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    (tmp_path / "args.sh").write_text(files["megatron_args.sh"])
    args, _ = source_args(tmp_path / "args.sh")
    assert value(args, "--pretrained-checkpoint") == PRETRAINED_DIR
    assert "convert_init.sh" not in render_megatron(matrix["ddp"])
    assert "--pretrained-checkpoint" not in megatron_args(matrix["ddp"])
    assert init_conversion_command(p) in render_report(p)["PLAN.md"]
