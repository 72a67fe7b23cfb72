"""`dtc smoke`: the pure parts (scaling, ds_config rewrite, sbatch rewrite, error extraction, report),
and the helpers the launch tests share (generated folders for pinned layouts, leftover checks).

The tests that launch real torchrun / DeepSpeed / SLURM processes are in test_smoke_*.py.
"""
from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from compiler.layout import Layout
from compiler.model import ModelShape, MoEShape
from compiler.smoke import launch as L
from compiler.smoke.report import Comparison, RankMeasure, SmokeReport, TargetResult, format_report
from compiler.smoke.scale import SmokeDegrees, check_ds_batch, local_world, map_degrees, reduce_shape, scale_plan
from compiler.smoke.slurm import rewrite_sbatch, smoke_env
from compiler.smoke.targets import as_argv, as_env, smoke_options

# ------------------------------------------------------------------------------------------- helpers
SPEC = """
name: {name}
model:
  num_layers: 8
  hidden_size: 512
  ffn_hidden_size: 1408
  num_attention_heads: 8
  num_kv_heads: 2
  vocab_size: 32000
training:
  tokens: 1B
  sequence_length: 1024
  global_batch: {gbs}
  precision: {precision}
cluster:
  gpu: {gpu}
  num_gpus: {num_gpus}
targets: [{targets}]
slurm:
  partition: gpu
  time_limit: 1h
  rdzv_port: {port}
  modules: [cuda/12.4]
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_plan(name: str = "smoke-test", *, precision: str = "bf16", targets: str = "fsdp, deepspeed, slurm",
              gbs: int = 32, gpu: str = "a100-80gb", **layout: Any):
    """A Plan for a pinned layout, costed by the real cost model (tests/plan_fixtures.py)."""
    from plan_fixtures import layout_for, plan_for, problem_for

    dp = layout.get("dp_replicate", 1) * layout.get("dp_shard", 1)
    world = dp * layout.get("tp", 1) * layout.get("pp", 1) * layout.get("cp", 1)
    problem = problem_for(SPEC.format(name=name, precision=precision, num_gpus=world, gbs=gbs, targets=targets,
                                      port=free_port(), gpu=gpu))
    return plan_for(problem, layout_for(problem, **layout))


def make_generated(parent: Path, name: str, **kw: Any) -> Path:
    """Render a pinned layout with the real renderers and write it like `dtc compile` does."""
    from compiler.artifacts import write_artifacts
    from compiler.render.all_targets import render

    plan = make_plan(name, **kw)
    out = parent / name
    write_artifacts(render(plan, targets=plan.targets), out)
    return out


def smoke_pids() -> list[int]:
    """Live processes started by any smoke launch of this test process (they carry DTC_SMOKE_RUN_ID). Under
    pytest-xdist each worker's launches inherit its PYTEST_XDIST_WORKER, so a smoke run of a test in the other
    worker, which may be running right now, is not taken for this one's leftover."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    ours = None if worker is None else f"PYTEST_XDIST_WORKER={worker}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[-1].split()[0] in (b"Z", b"X"):
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            if any(v.startswith(L.RUN_ID_ENV.encode() + b"=") for v in env) and (ours is None or ours in env):
                pids.append(int(entry))
        except (OSError, IndexError):
            continue
    return pids


def assert_no_leftovers(*, allow: set[int] = frozenset()) -> None:
    """No child of the test process remains (except ``allow`` and their descendants, e.g. the
    SLURM test cluster's daemons), and no process of any smoke launch."""
    import psutil

    allowed = set(allow)
    for pid in allow:
        try:
            allowed.update(c.pid for c in psutil.Process(pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    deadline = time.monotonic() + 5
    while True:
        children = [p for p in psutil.Process().children(recursive=True)
                    if p.pid not in allowed and p.status() != psutil.STATUS_ZOMBIE]
        marked = smoke_pids()
        if not children and not marked:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"processes left behind: children {[(p.pid, p.name()) for p in children]}, "
                        f"smoke-marked {marked}")
        time.sleep(0.2)


# ------------------------------------------------------------------------------------------- world and degrees
def _layout(**kw: Any) -> Layout:
    values: dict[str, Any] = dict(gpu="h100-sxm", gpus_per_node=8, tp=1, pp=1, cp=1, ep=1, dp_replicate=1,
                                  dp_shard=1, zero_stage=0, micro_batch=1, grad_accum=1)
    values.update(kw)
    return Layout(**values)


def test_local_world_cpu_and_gpu():
    assert local_world(cpu_count=2, gpu_count=0) == ("cpu", 4)
    assert local_world(cpu_count=1, gpu_count=0) == ("cpu", 2)
    assert local_world(cpu_count=64, gpu_count=0) == ("cpu", 4)
    assert local_world(cpu_count=2, gpu_count=8) == ("cuda", 8)


def test_map_degrees_keeps_dp_then_pp_then_tp():
    lay = _layout(tp=8, pp=4, dp_shard=4, zero_stage=1, vpp=2, schedule="interleaved_1f1b", grad_accum=16)
    degrees, changes, _ = map_degrees(lay, device="cpu", max_ranks=4)
    assert degrees == SmokeDegrees(tp=1, pp=2, dp_shard=2, vpp=2)
    dropped = {c.what: (c.plan, c.smoke) for c in changes}
    assert dropped["tp"] == (8, 1) and dropped["pp"] == (4, 2) and dropped["dp_shard"] == (4, 2)
    # 8 GPUs keep all three axes
    degrees, _, _ = map_degrees(lay, device="cuda", max_ranks=8)
    assert degrees == SmokeDegrees(tp=2, pp=2, dp_shard=2, vpp=2)


def test_map_degrees_hsdp_cp_ep():
    lay = _layout(dp_replicate=4, dp_shard=8, cp=2, ep=4, zero_stage=3)
    degrees, changes, _ = map_degrees(lay, device="cpu", max_ranks=4)
    assert (degrees.dp_replicate, degrees.dp_shard, degrees.cp) == (2, 2, 1)
    whats = [c.what for c in changes]
    assert "cp" in whats and "ep" in whats
    assert any("CUDA" in c.why for c in changes if c.what == "cp")
    # with two ranks the replicate axis of HSDP goes, and the report says so
    degrees, changes, _ = map_degrees(lay, device="cpu", max_ranks=2)
    assert (degrees.dp_replicate, degrees.dp_shard) == (1, 2)
    assert any(c.what == "sharding" for c in changes)


def test_map_degrees_zero0_replicates():
    degrees, _, _ = map_degrees(_layout(dp_replicate=8, zero_stage=0), device="cpu", max_ranks=4)
    assert (degrees.dp_replicate, degrees.dp_shard) == (2, 1)


def test_reduce_shape_keeps_family():
    s = ModelShape(num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64, num_kv_heads=8,
                   vocab_size=128256)
    small = reduce_shape(s, tp=2, num_chunks=4)
    assert small.num_layers == 4
    assert small.num_attention_heads // small.num_kv_heads == 8  # GQA ratio
    assert small.num_kv_heads % 2 == 0 and small.num_attention_heads % 2 == 0
    assert small.hidden_size % small.num_attention_heads == 0 and small.kv_channels % 2 == 0
    assert abs(small.ffn_hidden_size / small.hidden_size - 3.5) < 0.5
    assert small.ffn_hidden_size % 16 == 0 and small.vocab_size % 2 == 0
    mha = reduce_shape(ModelShape(32, 4096, 11008, 32, 32, 32000, mlp="gelu", norm="layernorm",
                                  position="learned", max_position_embeddings=4096, tied_embeddings=True),
                       tp=1, num_chunks=1)
    assert mha.num_attention_heads == mha.num_kv_heads >= 4
    assert (mha.mlp, mha.norm, mha.position, mha.tied_embeddings) == ("gelu", "layernorm", "learned", True)
    moe = reduce_shape(ModelShape(32, 4096, 14336, 32, 8, 32000, moe=MoEShape(8, 2, 14336)), tp=1, num_chunks=1)
    assert moe.moe is not None and moe.moe.num_experts == 4 and moe.moe.top_k == 2


def test_scale_plan_1b_like():
    plan = make_plan("scale", precision="fp16", dp_shard=16, zero_stage=2, micro_batch=32, grad_accum=64,
                     targets="megatron, slurm", gbs=32768)
    setup = scale_plan(plan, device="cpu", max_ranks=4)
    assert setup.world_size == 2 and setup.degrees.dp_shard == 2
    assert (setup.micro_batch, setup.grad_accum, setup.global_batch) == (16, 8, 256)
    assert setup.precision == "bf16" and setup.layout.zero_stage == 2
    whats = {c.what for c in setup.changes}
    assert {"precision", "micro_batch", "grad_accum", "num_layers", "seq_len"} <= whats
    d = setup.to_dict()
    assert d["global_batch"] == 256 and d["layout_tag"].startswith("t1_p1_d2_z2")


def test_scale_plan_pipeline_microbatches():
    plan = make_plan("pipe", targets="megatron, slurm", pp=4, dp_shard=2, zero_stage=1, grad_accum=1, micro_batch=1,
                     gbs=2)
    setup = scale_plan(plan, device="cpu", max_ranks=4)
    assert setup.degrees.pp == 2 and setup.grad_accum >= 2
    assert any(c.what == "grad_accum" and "pipeline" in c.why for c in setup.changes)


# ------------------------------------------------------------------------------------------- DeepSpeed config
def test_ds_train_sets_the_zero_sizes_it_is_given_and_only_those_its_stage_uses():
    import argparse

    from compiler.runtime.deepspeed_train import adapt_ds_config, parse_args

    args = parse_args(["--zero-sizes", "stage3_param_persistence_threshold=640,reduce_bucket_size=4096"])
    assert isinstance(args, argparse.Namespace)
    z3 = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 51200, "reduce_bucket_size": 9}}
    ds, changes = adapt_ds_config(z3, args, None, 4, on_cpu=False)
    assert ds["zero_optimization"]["stage3_param_persistence_threshold"] == 640
    assert ds["zero_optimization"]["reduce_bucket_size"] == 4096
    assert {c["key"] for c in changes} >= {"zero_optimization.stage3_param_persistence_threshold"}
    z1 = {"zero_optimization": {"stage": 1, "reduce_bucket_size": 9}}
    ds, _ = adapt_ds_config(z1, args, None, 4, on_cpu=False)
    assert "stage3_param_persistence_threshold" not in ds["zero_optimization"]
    with pytest.raises(Exception, match="is not KEY=N"):
        adapt_ds_config(z3, parse_args(["--zero-sizes", "reduce_bucket_size=big"]), None, 4, on_cpu=False)


def test_smoke_options_are_the_scripts_own_options():
    """One set of options per target: on the command line locally, as DTC_SMOKE_<OPTION> for --slurm."""
    plan = make_plan("opts", precision="fp16", dp_shard=8, zero_stage=3, micro_batch=2, grad_accum=4,
                     targets="fsdp, deepspeed, slurm")
    setup = scale_plan(plan, device="cpu", max_ranks=4, steps=3)
    s = setup.shape
    ds = smoke_options(setup, "deepspeed")
    assert ds["--steps"] == "3" and ds["--micro-batch"] == "2" and ds["--grad-accum"] == "4"
    assert "--allow-resize" in ds and ds["--allow-resize"] is None  # the world is smaller than the plan's
    assert (ds["--tp"], ds["--pp"], ds["--dp-shard"]) == ("1", "1", "2")
    assert (ds["--heads"], ds["--kv-heads"], ds["--ffn"]) == tuple(
        str(v) for v in (s.num_attention_heads, s.num_kv_heads, s.ffn_hidden_size))
    assert ds["--seq"] == str(setup.seq_len) and "--config" not in ds  # the generated ds_config.json
    argv = as_argv(ds)
    assert argv[argv.index("--allow-resize") + 1].startswith("--")
    env = as_env(ds)
    assert env["DTC_SMOKE_ALLOW_RESIZE"] == "1" and env["DTC_SMOKE_KV_HEADS"] == str(s.num_kv_heads)
    assert env["DTC_SMOKE_SEQ"] == str(setup.seq_len)
    # ds_config.json's hidden-sized ZeRO-3 sizes, for the reduced model (the renderer's rule)
    h = s.hidden_size
    assert ds["--zero-sizes"] == (f"reduce_bucket_size={h * h},stage3_prefetch_bucket_size={int(0.9 * h * h)},"
                                  f"stage3_param_persistence_threshold={10 * h}")
    assert env["DTC_SMOKE_ZERO_SIZES"] == ds["--zero-sizes"]
    fsdp = smoke_options(setup, "fsdp")
    assert fsdp["--param-dtype"] == "bf16"  # fp16 cannot run on CPU
    assert fsdp["--seq"] == str(setup.seq_len) and fsdp["--device"] == "cpu" and fsdp["--dp-shard"] == "2"
    assert "--model-factory" not in fsdp
    job = smoke_env(setup, Path("/gen"), {"PATH": "/usr/bin"}, "deepspeed")
    assert job["DTC_NPROC_PER_NODE"] == "2" and job["DTC_SMOKE_MICRO_BATCH"] == "2"
    assert job["DTC_SMOKE_ALLOW_RESIZE"] == "1" and "DTC_SMOKE_PARAM_DTYPE" not in job
    assert smoke_env(setup, Path("/gen"), {"PATH": "/usr/bin"}, "fsdp")["DTC_SMOKE_PARAM_DTYPE"] == "bf16"


def test_check_ds_batch_reports_disagreement():
    lay = _layout(dp_shard=4, zero_stage=2, micro_batch=2, grad_accum=4)
    why = check_ds_batch({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 2,
                          "gradient_accumulation_steps": 4}, lay)
    assert why and "30" in why and "32" in why
    assert "lacks" in check_ds_batch({"train_batch_size": 32}, lay)


# ------------------------------------------------------------------------------------------- sbatch / megatron
SBATCH = """#!/bin/bash
# header
#SBATCH --job-name=run
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=128
#SBATCH --time=3-00:00:00
#SBATCH --partition=gpu
#SBATCH --exclusive
#SBATCH --output=logs/%x-%j.out
#SBATCH --error=logs/%x-%j.err
#SBATCH --requeue
#SBATCH --signal=B:USR1@120

set -euo pipefail
srun torchrun x.py
"""


def test_rewrite_sbatch_only_touches_directives(tmp_path):
    text = rewrite_sbatch(SBATCH, partition="debug", cpus_per_task=2, time_limit_s=300, output_dir=tmp_path)
    directives = [l for l in text.splitlines() if l.startswith("#SBATCH")]
    assert "#SBATCH --nodes=1" in directives and "#SBATCH --partition=debug" in directives
    assert "#SBATCH --cpus-per-task=2" in directives and "#SBATCH --time=6" in directives
    assert "#SBATCH --job-name=run-smoke" in directives and "#SBATCH --no-requeue" in directives
    assert f"#SBATCH --output={tmp_path}/%x-%j.out" in directives
    assert not any("gpus" in d or "exclusive" in d or d == "#SBATCH --requeue" for d in directives)
    body = lambda t: [l for l in t.splitlines() if not l.startswith("#SBATCH")]  # noqa: E731
    assert body(text) == body(SBATCH)


# ------------------------------------------------------------------------------------------- errors, locks
def test_own_error_picks_the_rank_error():
    stderr = textwrap.dedent("""\
        [rank1]: /x/warnings.py:1: FutureWarning: deprecated
        [rank1]: Traceback (most recent call last):
        [rank1]:   File "a.py", line 3, in <module>
        [rank1]: ValueError: warmup_num_steps must be a positive integer, got 0
        """)
    error, tail = L.own_error(stderr)
    assert error == "ValueError: warmup_num_steps must be a positive integer, got 0"
    assert "FutureWarning" not in tail
    assert L.own_error("fsdp_train.py: error: the device mesh pp=1 needs 4 ranks\n")[0].startswith("fsdp_train.py")


def test_clear_stale_locks(tmp_path):
    op = tmp_path / "cpu_adam"
    op.mkdir()
    lock = op / "lock"
    lock.write_text("")
    assert L.clear_stale_locks(tmp_path) == []  # too young: a build may have just taken it
    old = time.time() - 120
    os.utime(lock, (old, old))
    assert L.clear_stale_locks(tmp_path) == [lock] and not lock.exists()


# ------------------------------------------------------------------------------------------- report
def test_report_text_json_and_ok():
    plan = make_plan("rep", dp_shard=2, zero_stage=3, micro_batch=1, grad_accum=2, targets="fsdp")
    setup = scale_plan(plan, device="cpu", max_ranks=4)
    t = TargetResult("fsdp", "passed", launched=True, steps_done=4, steps_requested=4,
                     losses=[5.5, 5.4, 5.3, 5.2], step_time_s=0.5, wall_s=20,
                     ranks=[RankMeasure(0, 100, 100, 200, 50, 450)],
                     comparisons=[Comparison("model_states", 400, 500, ("weights",))])
    skipped = TargetResult("megatron", "skipped", reason="Megatron-LM needs CUDA GPUs; none here")
    report = SmokeReport("generated/rep/", plan.name, plan.layout.tag, "0" * 64, setup.to_dict(), [t, skipped])
    assert report.ok
    text = format_report(report)
    assert "loss 5.5000 -> 5.2000" in text and "ratio x0.80" in text and "skipped" in text
    data = json.loads(report.to_json())
    assert data["targets"][0]["comparisons"][0]["ratio"] == 0.8 and data["counts"]["skipped"] == 1
    report.explicit = True
    assert not report.ok  # a named target that was skipped did not pass
    report.explicit = False
    report.targets = [skipped]
    assert not report.ok  # nothing ran


def test_cli_refuses_before_launch(tmp_path):
    from helpers import run_cli

    r = run_cli(["smoke", str(tmp_path)], exit_code=2)
    assert "no plan.json" in r.stderr
    gen = make_generated(tmp_path, "bad-ds", dp_shard=2, zero_stage=2, micro_batch=2, targets="deepspeed")
    cfg = json.loads((gen / "ds_config.json").read_text())
    cfg["train_batch_size"] += 2
    (gen / "ds_config.json").write_text(json.dumps(cfg))
    t0 = time.monotonic()
    r = run_cli(["smoke", str(gen), "--target", "deepspeed"], exit_code=2)  # the manifest no longer matches
    assert "was changed after dtc wrote it" in r.stderr and "  ds_config.json" in r.stderr
    from helpers import refresh_manifest

    refresh_manifest(gen)  # edited on purpose: the artifacts still have to agree with plan.json
    r = run_cli(["smoke", str(gen), "--target", "deepspeed"], exit_code=2)
    assert "disagree with plan.json" in r.stderr and "train_batch_size" in r.stderr
    assert time.monotonic() - t0 < 20
    r = run_cli(["smoke", str(gen), "--target", "fsdp"], exit_code=2)
    assert "no fsdp artifacts" in r.stderr


@pytest.mark.slow
def test_preempt_at_resumes_both_torch_targets_exactly(tmp_path):
    """Issue 13's check: dtc smoke DIR --target fsdp,deepspeed --steps 6 --preempt-at 3 --json."""
    import json as _json

    from helpers import run_cli

    gen = make_generated(tmp_path, "preempt", dp_shard=2, zero_stage=2, targets="fsdp, deepspeed")
    out = run_cli(["smoke", str(gen), "--target", "fsdp,deepspeed", "--steps", "6", "--preempt-at", "3", "--json"])
    report = _json.loads(out.stdout)
    for t in report["targets"]:
        assert t["status"] == "passed", t
        assert t["preemption"]["resumed_from_step"] == 3 and t["preemption"]["losses_match"] is True, t
        assert t["preemption"]["compared_steps"] == [4, 5, 6] and t["preemption"]["max_abs_diff"] <= 1e-6


@pytest.mark.parametrize("target", ["fsdp", "deepspeed"])
def test_smoke_options_mean_the_same_on_the_command_line_and_in_the_environment(target, monkeypatch) -> None:
    """A SLURM smoke passes the options as DTC_SMOKE_<DEST> (the job script's environment); the trainer must
    read each one as the command line would (a --seq-len spelled DTC_SMOKE_SEQ_LEN was silently ignored: the
    job trained 1024-token sequences against a 64-token prediction)."""
    import importlib

    from compiler.smoke.scale import scale_plan
    from compiler.smoke.targets import as_argv, as_env, smoke_options

    from compiler.plan import Plan

    folder = Path(__file__).resolve().parents[1] / "generated" / "llama2-7b-8xh100"
    plan = Plan.from_json((folder / "plan.json").read_text())
    setup = scale_plan(plan, device="cpu", max_ranks=2, steps=3)
    options = smoke_options(setup, target)
    module = importlib.import_module({"fsdp": "compiler.runtime.fsdp_train",
                                      "deepspeed": "compiler.runtime.deepspeed_train"}[target])
    from_argv = vars(module.parse_args(as_argv(options)))
    for name, value in as_env(options).items():
        monkeypatch.setenv(name, value)
    assert vars(module.parse_args([])) == from_argv
