"""Checkpoint folders (complete or invisible) and the lr schedule (against megatron-core's own)."""
from __future__ import annotations

import json

import pytest
import torch
from megatron_import import megatron_module

from compiler.runtime import checkpoint as ck
from compiler.runtime.config import ConfigError, ParallelConfig
from compiler.runtime.schedule import LRSchedule


def _save(root, step, payload="x", keep=0):
    def write(tmp):
        (tmp / "shard.bin").write_text(payload)

    return ck.save(root, step, {"step": step, "consumed_samples": step * 8}, write, rank=0, barrier=lambda: None,
                   keep=keep)


def test_only_complete_checkpoints_are_found(tmp_path):
    assert ck.latest(tmp_path) is None and ck.latest(None) is None
    _save(tmp_path, 10)
    # a save that died half-way: its temporary folder exists, with data but no COMPLETE marker
    tmp = ck.prepare(tmp_path, 20)
    (tmp / "shard.bin").write_text("partial")
    # and a step folder that lost its marker (e.g. copied by hand) is not trusted either
    broken = ck.step_dir(tmp_path, 30)
    broken.mkdir()
    (broken / "meta.json").write_text(json.dumps({"step": 30}))
    found = ck.latest(tmp_path)
    assert found.step == 10 and found.meta["consumed_samples"] == 80
    assert (found.path / ck.COMPLETE).read_text().strip() == "10"
    _save(tmp_path, 20, "full")  # the next save of that step clears the leftover
    assert ck.latest(tmp_path).step == 20
    assert (ck.step_dir(tmp_path, 20) / "shard.bin").read_text() == "full"
    assert not ck.tmp_dir(tmp_path, 20).exists()


def test_keep_and_resave(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, keep=2)
    assert ck.complete_steps(tmp_path) == [3, 4]
    _save(tmp_path, 4, "again", keep=2)
    assert (ck.step_dir(tmp_path, 4) / "shard.bin").read_text() == "again"


def test_a_failing_writer_leaves_no_complete_checkpoint(tmp_path):
    _save(tmp_path, 5)

    def write(tmp):
        (tmp / "half").write_text("...")
        raise OSError("disk full")

    with pytest.raises(OSError):
        ck.save(tmp_path, 6, {"step": 6}, write, rank=0, barrier=lambda: None)
    assert ck.latest(tmp_path).step == 5


@pytest.mark.parametrize("style", ["cosine", "linear", "constant"])
def test_schedule_is_megatrons(style):
    sched_mod = megatron_module("megatron.core.optimizer_param_scheduler")
    peak, low, warmup, decay = 3e-4, 3e-5, 10, 100
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    theirs = sched_mod.OptimizerParamScheduler(
        opt, init_lr=0.0, max_lr=peak, min_lr=low, lr_warmup_steps=warmup, lr_decay_steps=decay,
        lr_decay_style=style, start_wd=0.1, end_wd=0.1, wd_incr_steps=decay, wd_incr_style="constant")
    ours = LRSchedule(peak, low, warmup, decay, style)
    for step in range(1, 120):
        theirs.step(1)  # Megatron's num_steps after `step` increments
        assert ours.lr_at(step) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12, abs=1e-15), step


def test_schedule_fitted_to_a_short_run():
    s = LRSchedule(1e-3, 1e-4, 2000, 100_000).fitted(6)
    assert (s.warmup_steps, s.decay_steps) == (1, 6)
    assert s.lr_at(6) == pytest.approx(1e-4)


def test_stage_layers_are_checked():
    par = ParallelConfig(pp=2, stage_layers=((0,), (1, 2, 3)))
    assert par.stages(4) == [[0], [1, 2, 3]]
    assert ParallelConfig(pp=2, vpp=2).stages(6) == [[0, 1], [2, 3], [4], [5]]
    with pytest.raises(ConfigError, match="once each"):
        ParallelConfig(pp=2, stage_layers=((0, 2), (1, 3))).stages(4)
    with pytest.raises(ConfigError, match="2 stages, pp x vpp is 4"):
        ParallelConfig(pp=2, vpp=2, stage_layers=((0,), (1,))).stages(2)
