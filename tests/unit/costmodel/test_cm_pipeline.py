"""The schedule simulator against the textbook (Narayanan et al. 2021 sec. 2.2; Korthikanti et al. 2022 sec. 4.2.3)."""
from __future__ import annotations

import pytest

from compiler.costmodel.pipeline import (inflight_microbatches, peak_inflight_chunks, round_ratio, simulate,
                                         textbook_bubble_fraction)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (2, 8), (4, 4), (4, 16), (8, 8), (8, 64), (16, 128)])
def test_bubble_is_p_minus_1_over_m_plus_p_minus_1(schedule, p, m):
    """GPipe and 1F1B idle (p-1)/(m+p-1) of the step (Narayanan et al. 2021, sec. 2.2.1)."""
    sim = simulate(schedule, p, m, 1, 2.0, 0.0)
    assert sim.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-12)
    assert sim.makespan == pytest.approx((m + p - 1) * 3.0)


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 16, 4), (8, 32, 4), (8, 64, 8)])
def test_interleaving_divides_the_bubble_by_v(p, m, v):
    """Interleaved 1F1B: bubble time (p-1)/v of a micro-batch, i.e. (p-1)/(v m) of the ideal time
    (Narayanan et al. 2021, sec. 2.2.2)."""
    plain = simulate("1f1b", p, m, 1, 2.0, 0.0)
    inter = simulate("interleaved_1f1b", p, m, v, 2.0, 0.0)
    ideal = m * 3.0
    assert (inter.makespan - ideal) / ideal == pytest.approx((p - 1) / (v * m), rel=1e-12)
    assert inter.makespan - ideal == pytest.approx((plain.makespan - ideal) / v, rel=1e-12)
    assert inter.bubble_fraction == pytest.approx(textbook_bubble_fraction("interleaved_1f1b", p, m, v))


@pytest.mark.parametrize("p,m", [(4, 8), (8, 8), (4, 2)])
def test_1f1b_holds_at_most_p_microbatches_gpipe_all(p, m):
    """Seed exercise 2: same bubble, but 1F1B's first stage holds min(p, m) micro-batches, GPipe all m."""
    assert peak_inflight_chunks("1f1b", 0, p, m, 1) == min(p, m)
    assert peak_inflight_chunks("gpipe", 0, p, m, 1) == m
    assert [peak_inflight_chunks("1f1b", s, p, m, 1) for s in range(p)] == [min(p - s, m) for s in range(p)]


@pytest.mark.parametrize("p,v", [(4, 2), (4, 4), (8, 2), (8, 5)])
def test_interleaved_first_stage_holds_p_times_1_plus_p_minus_1_over_pv(p, v):
    """Korthikanti et al. 2022 sec. 4.2.3: with interleaving the first stage stores
    p (1 + (p-1)/(p v)) micro-batches' worth of activations."""
    m = 4 * p
    assert inflight_microbatches("interleaved_1f1b", 0, p, m, v) == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_p2p_latency_lengthens_the_critical_path():
    base = simulate("1f1b", 4, 8, 1, 2.0, 0.0).makespan
    slow = simulate("1f1b", 4, 8, 1, 2.0, 0.1).makespan
    # at least the fill and the drain cross p - 1 links each; the 1F1B steady state waits on them too
    assert slow - base >= 2 * 3 * 0.1 - 1e-9
    assert simulate("1f1b", 4, 8, 1, 2.0, 0.2).makespan > slow


def test_events_are_consistent():
    sim = simulate("interleaved_1f1b", 4, 8, 2, 2.0, 0.05, keep_events=True)
    assert len(sim.events) == 2 * 4 * 8 * 2
    per_stage: dict[int, list] = {}
    for stage, chunk, mb, kind, start, end in sim.events:
        assert end > start >= 0
        per_stage.setdefault(stage, []).append((start, end))
    for spans in per_stage.values():  # a stage runs one operation at a time
        spans.sort()
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:]))
    assert max(e[5] for e in sim.events) == pytest.approx(sim.makespan)


def test_step_time_uses_the_simulated_makespan(problem_factory, layout_factory):
    """The estimate's pipeline part equals the simulated schedule (events) to the rounding of the cache key."""
    from compiler.costmodel import evaluate

    p = problem_factory("llama3-8b", num_gpus=8, gbs=64)
    est = evaluate(p, layout_factory(p, pp=4, vpp=2, schedule="interleaved_1f1b", dp_replicate=2, grad_accum=32),
                   check_memory=False)
    pipeline_part = sum(i.value for i in est.time.items
                        if i.name not in ("dp_comm", "optimizer_step", "offload", "sync_and_fixed"))
    assert max(e.end_s for e in est.pipeline) == pytest.approx(pipeline_part, rel=1e-9)
    assert est.pipeline_bubble_fraction == pytest.approx(est.time.item("pp_bubble").value / pipeline_part, rel=1e-9)


def test_round_ratio_is_three_significant_digits():
    assert round_ratio(2.123456) == 2.12 and round_ratio(0.0123456) == 0.0123 and round_ratio(0) == 0
