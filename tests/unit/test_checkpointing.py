"""Checkpoint sizing, save interval, signal lead time and segments (compiler/checkpointing.py)."""
from __future__ import annotations

import math

import pytest

from compiler import checkpointing as ck


def test_bytes_per_parameter_by_target():
    assert ck.checkpoint_bytes(10**9, "megatron") == 14 * 10**9
    assert ck.checkpoint_bytes(10**9, "deepspeed") == 14 * 10**9
    assert ck.checkpoint_bytes(10**9, "fsdp") == 12 * 10**9
    assert ck.checkpoint_bytes(10**9, "megatron", "sgd") == 10 * 10**9


def test_llama3_405b_on_16k_gpus():
    """The 405B run: 5.7 TB per checkpoint; 2,048 nodes writing at Tectonic's sustained 2 TB/s take
    under 3 s; Llama 3's own failure rate gives a job MTBF of about 3 hours on 16,384 GPUs."""
    p = ck.policy(target="megatron", num_params=405_853_388_800, optimizer="adamw", num_gpus=16384, num_nodes=2048,
                  step_s=6.0, run_s=54 * 86400, time_limit_s=2 * 86400)
    assert p.checkpoint_bytes == pytest.approx(5.68e12, rel=0.01)
    assert p.save_s == pytest.approx(5.68e12 / 2e12, rel=0.01)
    assert p.mtbf_h == pytest.approx(54 * 24 / 419, rel=1e-9)  # ~3.1 h
    assert p.interval_s == pytest.approx(math.sqrt(2 * p.save_s * p.mtbf_h * 3600), rel=1e-9)
    assert p.signal_lead_s == math.ceil(6.0 + 2 * p.save_s + 60)
    assert p.segments == math.ceil(54 * 86400 / (2 * 86400 - p.signal_lead_s - ck.RESTART_S))
    assert p.expected_loss_per_failure_s == pytest.approx(p.interval_s / 2 + ck.RESTART_S)


def test_small_jobs_save_rarely_and_lead_time_is_capped():
    p = ck.policy(target="fsdp", num_params=8 * 10**9, optimizer="adamw", num_gpus=8, num_nodes=1, step_s=2.0,
                  run_s=3600, time_limit_s=None)
    assert p.segments == 1 and p.interval_steps == round(p.interval_s / 2.0)
    assert p.interval_s >= 10 * p.save_s
    assert ck.signal_lead_s(10**6, 1.0) == ck.SLURM_MAX_SIGNAL_S


def test_a_time_limit_too_short_to_save_is_an_error():
    with pytest.raises(ValueError, match="cannot save"):
        ck.segments(10**6, 600, 500)


def test_policy_of_a_too_short_time_limit_has_no_segments():
    p = ck.policy(target="fsdp", num_params=10**9, optimizer="adamw", num_gpus=8, num_nodes=1, step_s=1.0,
                  run_s=10**5, time_limit_s=90)
    assert p.segments is None and p.interval_steps >= 1
