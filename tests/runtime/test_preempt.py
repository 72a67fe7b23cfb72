"""compiler/smoke/preempt.py: signalling the trainers of a real torchrun launch, and the verdict."""
from __future__ import annotations

import pytest
from launching import install_runtime, launch
from test_runtime_trainers import write_config

from compiler.smoke.preempt import MARK_ENV, Signaller, compare, new_mark


def _summary(steps, losses, **extra):
    return {"loss_steps": steps, "losses": losses, **extra}


def test_compare_verdicts():
    ref = _summary([1, 2, 3, 4, 5, 6], [6.0, 5.0, 4.0, 3.0, 2.0, 1.0])
    stopped = _summary([1, 2, 3], [6.0, 5.0, 4.0], stopped_by_signal=True, last_step=3)
    ok = compare(ref, stopped, _summary([4, 5, 6], [3.0, 2.0, 1.0 + 1e-7], resumed_from_step=3), at=3)
    assert ok.losses_match and ok.resumed_from_step == 3 and ok.compared_steps == [4, 5, 6]
    bad = compare(ref, stopped, _summary([4, 5, 6], [3.0, 2.1, 1.0], resumed_from_step=3), at=3)
    assert not bad.losses_match and "differ by up to 0.1" in bad.reason
    fresh = compare(ref, stopped, _summary([1, 2, 3, 4, 5, 6], ref["losses"], resumed_from_step=None), at=3)
    assert not fresh.losses_match and "resumed from step None" in fresh.reason
    late = compare(ref, {**stopped, "last_step": 4}, _summary([5, 6], [2.0, 1.0], resumed_from_step=4), at=3)
    assert late.losses_match and "acted on after step 4" in late.reason
    never = compare(ref, {**stopped, "stopped_by_signal": False}, ref, at=3)
    assert not never.losses_match


@pytest.mark.slow
def test_signaller_stops_a_torchrun_launch_after_the_step(tmp_path):
    """Workers print straight to the launcher's pipe (no --tee: torchrun's tee tails the log files
    late, after a fast run has already passed step K)."""
    install_runtime(tmp_path)
    write_config(tmp_path, parallel={"dp_shard": 2, "zero_stage": 3}, steps=8)
    mark = new_mark()
    signaller = Signaller(mark, 3, ("fsdp_train.py",))
    run = launch(tmp_path, "fsdp_train.py", [], nproc=2, extra_env={MARK_ENV: mark}, on_line=signaller)
    assert run.returncode == 0, run.text[-3000:]
    assert signaller.sent and len(signaller.sent_to) == 2  # the two trainers, not torchrun
    assert "stop signal: stopped after step 3" in run.text and "step 4/8" not in run.text
    assert (tmp_path / "ckpt" / "step_000000003" / "COMPLETE").is_file()
    assert run.summary["stopped_by_signal"] and run.summary["last_step"] == 3
