"""`dtc smoke` for real: torchrun + gloo processes (2-4 ranks) on generated artifacts.

One launch per configuration, each checking several things: the run passed (every step, the
loss fell on the learnable task), the reduced world and mesh, the memory measured per rank
against the cost model's prediction (a ratio within a loose band), and that no process is
left behind. Needs torch and deepspeed: without them these tests FAIL (they do not skip).

Coverage: FSDP2 full shard (fp32, through the CLI with --json), HSDP, FSDP2 + TP + sequence
parallel (selective recompute), pipeline 1F1B + FSDP (full recompute); DeepSpeed ZeRO-1,
ZeRO-2, ZeRO-3 (fp32) and ZeRO-3 with CPU offload (bf16); a mesh that differs from the world,
a failing rank and a hang.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import pytest

from test_smoke import assert_no_leftovers, make_generated

pytestmark = pytest.mark.slow

RATIO_BAND = (0.25, 4.0)  # measured / predicted model states; the point is that both exist and agree roughly


def test_torch_and_deepspeed_installed():
    import deepspeed  # noqa: F401
    import torch.distributed as dist

    assert dist.is_available() and dist.is_gloo_available()


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    return tmp_path_factory.mktemp("smoke-gen")


def _smoke(folder: Path, target: str = "all", **kw):
    from compiler.smoke import run_smoke

    t0 = time.monotonic()
    report = run_smoke(folder, target=target, timeout_s=kw.pop("timeout_s", 300), **kw)
    print(f"{folder.name} {target}: {time.monotonic() - t0:.1f}s")
    from compiler.smoke.report import format_report

    print(format_report(report))
    return report


def _check_passed(t, *, world_ranks: int) -> None:
    assert t.status == "passed", f"{t.target}: {t.reason}\n{t.error}\n{t.error_tail}"
    assert t.steps_done == t.steps_requested == 4
    assert t.last_loss < t.first_loss
    assert len(t.ranks) == world_ranks
    states = next(c for c in t.comparisons if c.name == "model_states")
    assert states.ratio is not None and RATIO_BAND[0] < states.ratio < RATIO_BAND[1], states
    acts = next(c for c in t.comparisons if c.name == "activations")
    assert acts.measured_bytes and acts.predicted_bytes


def test_fsdp_full_shard_and_deepspeed_zero3_fp32_cli(gen):
    """FSDP2 full shard + DeepSpeed ZeRO-3, fp32, 2 ranks, through `python -m compiler smoke --json`."""
    from helpers import run_dtc

    folder = make_generated(gen, "z3-fp32", precision="fp32", dp_shard=4, zero_stage=3, micro_batch=2,
                            grad_accum=2, targets="fsdp, deepspeed, slurm")
    t0 = time.monotonic()
    r = run_dtc(["smoke", str(folder), "--json", "--timeout", "300"], timeout=700)
    print(f"cli: {time.monotonic() - t0:.1f}s\n{r.stderr[-3000:]}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads(r.stdout)
    assert data["ok"] and data["setup"]["world_size"] == 2 and data["setup"]["precision"] == "fp32"
    assert data["setup"]["degrees"]["dp_shard"] == 2
    assert any(c["what"] == "dp_shard" and c["plan"] == 4 and c["smoke"] == 2 for c in data["setup"]["changes"])
    by = {t["target"]: t for t in data["targets"]}
    assert set(by) == {"fsdp", "deepspeed"}
    for t in by.values():
        assert t["status"] == "passed" and t["loss_fell"] and t["steps_done"] == 4
        ratio = next(c for c in t["comparisons"] if c["name"] == "model_states")["ratio"]
        assert RATIO_BAND[0] < ratio < RATIO_BAND[1]
    fsdp_rank = by["fsdp"]["ranks"][0]
    # fp32 FSDP2 ZeRO-3 over 2 ranks: parameters and gradients are fp32 halves, Adam two more
    assert fsdp_rank["grad_bytes"] == fsdp_rank["param_bytes"]
    assert fsdp_rank["optimizer_bytes"] >= 2 * fsdp_rank["param_bytes"]
    ds_batch = {c["what"]: c["smoke"] for c in by["deepspeed"]["changes"]}
    assert ds_batch["ds_config.train_batch_size"] == 2 * 2 * 2
    saved = json.loads((folder / "smoke.json").read_text())
    assert saved == data
    assert_no_leftovers()


def test_fsdp_hsdp_bf16(gen):
    folder = make_generated(gen, "hsdp", dp_replicate=2, dp_shard=2, zero_stage=3, micro_batch=2, grad_accum=2,
                            targets="fsdp, slurm")
    report = _smoke(folder, "fsdp")
    assert report.ok
    d = report.setup["degrees"]
    assert (d["dp_replicate"], d["dp_shard"]) == (2, 2)
    _check_passed(report.targets[0], world_ranks=4)
    assert_no_leftovers()


@pytest.mark.parametrize("name,kw,target,ranks", [
    # FSDP2 ZeRO-2 keeps each unit's unsharded bf16 weights from its forward to its backward (reshard_after_forward
    # False): measured by a forward hook, they were missed at the optimizer step (x0.80 for every pure-dp plan)
    ("fsdp-z2", {"dp_shard": 2, "zero_stage": 2, "targets": "fsdp, slurm"}, "fsdp", 2),
    # DeepSpeed's hybrid sharding is ZeRO++ hpZ: states over all 4 ranks, a secondary bf16 copy over 2 (x0.66 when
    # costed like FSDP2's HSDP, x1.36 with the plan's persistence threshold on the 64-wide model)
    ("ds-hpz", {"dp_replicate": 2, "dp_shard": 2, "zero_stage": 3, "targets": "deepspeed, slurm"}, "deepspeed", 4),
    # FSDP2's CPUOffloadPolicy keeps one host copy of a parameter, the fp32 master it shards: no 16-bit copy
    # besides it (x0.89 when the host side counted one)
    ("fsdp-offload", {"dp_shard": 2, "zero_stage": 3, "offload_optimizer": "cpu", "offload_params": "cpu",
                      "targets": "fsdp, slurm"}, "fsdp", 2),
    # DeepSpeed ZeRO-1/2 with the optimizer offloaded accumulate the fp32 gradient partition on the GPU and copy it to
    # the host's partition (x1.25 when counted on the host only), the host's partition is 1/dp at ZeRO-1 too (x0.86
    # when counted whole)
    ("ds-z1-offload", {"dp_shard": 2, "zero_stage": 1, "offload_optimizer": "cpu", "targets": "deepspeed, slurm"},
     "deepspeed", 2),
    # DeepSpeed ZeRO-1 in bf16 runs BF16_Optimizer, which kept each bf16 gradient beside its fp32 accumulation until
    # the step (x1.17) until ds_config set bf16.immediate_grad_update
    ("ds-z1", {"dp_shard": 2, "zero_stage": 1, "targets": "deepspeed, slurm"}, "deepspeed", 2),
    # FSDP2 ZeRO-0 is fully_shard over a shard group of one without resharding: its unsharded bf16 parameters live
    # from forward to backward as at ZeRO-2, and were not measured (x0.89)
    ("fsdp-z0", {"dp_replicate": 2, "zero_stage": 0, "targets": "fsdp, slurm"}, "fsdp", 2),
    # DeepSpeed AutoTP splits the blocks' linear layers only: the embeddings and the output layer stay whole on each
    # tp rank (x1.13 when costed split by tp, as Megatron and the FSDP2 trainer split them)
    ("ds-tp2", {"tp": 2, "dp_shard": 2, "zero_stage": 2, "targets": "deepspeed, slurm"}, "deepspeed", 4),
])

def test_model_states_are_measured_as_costed(gen, name, kw, target, ranks):
    """Model states are exact byte arithmetic: the smoke's measurement matches the line items within 5%."""
    folder = make_generated(gen, name, micro_batch=2, grad_accum=2, **kw)
    report = _smoke(folder, target)
    t = report.targets[0]
    _check_passed(t, world_ranks=ranks)
    states = next(c for c in t.comparisons if c.name == "model_states")
    assert 0.95 < states.ratio < 1.05, states
    assert_no_leftovers()


def test_fsdp_tensor_parallel_loss_holds_the_gathered_logits(gen):
    """The FSDP2 trainer's output layer is ColwiseParallel with output_layouts=Replicate: each tp rank holds and
    reduces the whole logits, and under sequence parallel its column-parallel GEMMs save their all-gathered input
    (activations x1.17 when costed as Megatron's vocab-parallel loss and sharded inputs, x1.10 with the loss
    only, x1.04 with both: the tp=1 plan's own figure)."""
    folder = make_generated(gen, "fsdp-tp2-loss", tp=2, dp_shard=2, zero_stage=2, micro_batch=2, grad_accum=2,
                            sequence_parallel=True, targets="fsdp, slurm")
    report = _smoke(folder, "fsdp")
    t = report.targets[0]
    _check_passed(t, world_ranks=4)
    acts = next(c for c in t.comparisons if c.name == "activations")
    assert 0.95 < acts.ratio < 1.07, acts
    assert_no_leftovers()


def test_fsdp_tensor_parallel_sequence_parallel(gen):
    folder = make_generated(gen, "tp-sp", tp=2, dp_shard=2, zero_stage=2, micro_batch=2, grad_accum=2,
                            sequence_parallel=True, recompute="selective", targets="fsdp, slurm")
    report = _smoke(folder, "fsdp")
    assert report.ok and report.setup["degrees"]["tp"] == 2
    assert report.setup["layout"]["sequence_parallel"] and report.setup["layout"]["recompute"] == "selective"
    t = report.targets[0]
    _check_passed(t, world_ranks=4)
    # op-level SAC keeps each row-parallel matmul's output whole (partial sums) beside its reduce-scatter
    # output: x1.14 while only the shards were counted
    acts = next(c for c in t.comparisons if c.name == "activations")
    assert 0.95 < acts.ratio < 1.05, acts
    # TP halves each block's weights: a TP rank holds half of what a pure dp_shard=2 rank would
    assert t.ranks[0].param_bytes == t.ranks[1].param_bytes
    assert_no_leftovers()


def test_deepspeed_autotp_full_recompute_keeps_the_rotary_table(gen):
    """DeepSpeed with tp > 1 partitions the checkpointed blocks' inputs (partition_activations) and empties each
    one after the forward: the rotary table, passed to every block, left the second layer's rope a 0-dim tensor
    (IndexError) until it opted out with no_checkpointing."""
    folder = make_generated(gen, "ds-tp2-full", tp=2, dp_shard=2, zero_stage=2, micro_batch=2, grad_accum=2,
                            recompute="full", targets="deepspeed, slurm")
    report = _smoke(folder, "deepspeed")
    assert report.setup["degrees"]["tp"] == 2 and report.setup["layout"]["recompute"] == "full"
    _check_passed(report.targets[0], world_ranks=4)
    # partition_activations keeps 1/tp of each layer's input: costed so, and measured as the slice it keeps
    # (the emptied input alone was counted before; x0.91)
    acts = next(c for c in report.targets[0].comparisons if c.name == "activations")
    assert 0.95 < acts.ratio < 1.05, acts
    assert_no_leftovers()


def test_fsdp_pipeline_1f1b(gen):
    folder = make_generated(gen, "pp", pp=2, dp_shard=2, zero_stage=3, micro_batch=1, grad_accum=4,
                            recompute="full", targets="fsdp, slurm")
    report = _smoke(folder, "fsdp")
    assert report.ok
    assert report.setup["degrees"]["pp"] == 2 and report.setup["layout"]["schedule"] == "1f1b"
    assert report.setup["grad_accum"] >= 2
    _check_passed(report.targets[0], world_ranks=4)
    assert_no_leftovers()


def test_deepspeed_pipeline_stage_layers(gen):
    """The DeepSpeed pipeline engine cuts the model where dtc's split says (ds_train.py's --stage-layers)."""
    folder = make_generated(gen, "ds-pp", pp=2, dp_shard=2, zero_stage=1, micro_batch=1, grad_accum=4,
                            targets="deepspeed, slurm")
    report = _smoke(folder, "deepspeed")
    assert report.ok, report.targets[0].error
    t = report.targets[0]
    _check_passed(t, world_ranks=4)
    assert "--stage-layers" in t.command
    assert_no_leftovers()


@pytest.mark.parametrize("stage", [1, 2])
def test_deepspeed_zero12_bf16(gen, stage):
    folder = make_generated(gen, f"ds-z{stage}", dp_shard=2, zero_stage=stage, micro_batch=2, grad_accum=2,
                            targets="deepspeed, slurm")
    report = _smoke(folder, "deepspeed")
    assert report.ok
    t = report.targets[0]
    _check_passed(t, world_ranks=2)
    assert report.setup["layout"]["zero_stage"] == stage and report.setup["precision"] == "bf16"
    assert_no_leftovers()


def test_deepspeed_zero3_cpu_offload(gen):
    folder = make_generated(gen, "ds-z3-offload", dp_shard=2, zero_stage=3, micro_batch=2, grad_accum=2,
                            offload_optimizer="cpu", offload_params="cpu", targets="deepspeed, slurm")
    cfg = json.loads((folder / "ds_config.json").read_text())
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    report = _smoke(folder, "deepspeed")
    assert report.ok
    t = report.targets[0]
    _check_passed(t, world_ranks=2)
    states = next(c for c in t.comparisons if c.name == "model_states")
    assert "offloaded_to_host" in states.predicted_items
    assert_no_leftovers()


# ------------------------------------------------------------------------------------------- failures
def test_mesh_that_differs_from_the_world_fails_fast(gen, tmp_path):
    """A mesh of 2 ranks launched on a world of 1: fsdp_train.py refuses before any collective."""
    from compiler.smoke import load_plan, targets as T
    from compiler.smoke.scale import scale_plan

    folder = make_generated(gen, "mesh", dp_shard=2, zero_stage=3, micro_batch=1, grad_accum=1,
                            targets="fsdp, slurm")
    plan, _ = load_plan(folder)
    setup = dataclasses.replace(scale_plan(plan, device="cpu", max_ranks=2), world_size=1)
    ctx = T.RunContext(generated_dir=folder, plan=plan, setup=setup, workdir=tmp_path, timeout_s=120)
    t0 = time.monotonic()
    result = T.run_target(ctx, "fsdp")
    assert time.monotonic() - t0 < 90
    assert result.status == "failed" and "exited with" in result.reason
    assert result.error and "needs 2 ranks, but WORLD_SIZE is 1" in result.error, result
    assert result.error_rank == 0
    assert_no_leftovers()


WORKER = """
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
if sys.argv[1] == "fail" and rank == 1:
    raise ValueError("boom from rank 1")
if sys.argv[1] == "hang" and rank == 1:
    time.sleep(600)
dist.barrier()
print("step 1/1 loss 1.0 time 0.1s", flush=True)
"""


def _launch_worker(tmp_path: Path, mode: str, **kw):
    from compiler.smoke import launch as L
    from compiler.smoke.targets import torchrun_argv

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in __import__("os").environ.items()}
    env["OMP_NUM_THREADS"] = "1"
    spec = L.LaunchSpec(argv=torchrun_argv(2, tmp_path / "logs") + [str(script), mode], env=env, cwd=tmp_path,
                        log_dir=tmp_path / "logs", **kw)
    return L.run_launch(spec)


def test_failing_rank_is_reported_with_its_own_error(tmp_path):
    result = _launch_worker(tmp_path, "fail", timeout_s=120)
    assert result.returncode not in (0, None) and result.hang is None
    assert result.failing_rank == 1
    assert result.error == "ValueError: boom from rank 1"
    assert_no_leftovers()


def test_hang_is_ended_by_the_setup_clock(tmp_path):
    t0 = time.monotonic()
    result = _launch_worker(tmp_path, "hang", timeout_s=120, setup_timeout_s=12)
    assert result.hang == "setup" and result.returncode is None
    assert time.monotonic() - t0 < 60
    assert result.killed >= 1
    assert_no_leftovers()
    print(sys.version)
