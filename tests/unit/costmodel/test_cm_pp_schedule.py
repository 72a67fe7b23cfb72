"""The schedule simulator against the textbook (Narayanan et al. 2021 sec. 2.2; Korthikanti et al. 2022 sec. 4.2.3)."""
from __future__ import annotations

import pytest

from compiler.costmodel.pp_schedule import (inflight_microbatches, peak_inflight_chunks, round_ratio, simulate,
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
    from compiler.costmodel.evaluation import evaluate

    p = problem_factory("llama3-8b", num_gpus=8, gbs=64)
    est = evaluate(p, layout_factory(p, pp=4, vpp=2, schedule="interleaved_1f1b", dp_replicate=2, grad_accum=32),
                   check_memory=False)
    pipeline_part = sum(i.value for i in est.time.items
                        if i.name not in ("dp_comm", "zero_per_microbatch_comm", "optimizer_step", "offload",
                                          "sync_and_fixed"))
    assert max(e.end_s for e in est.pipeline) == pytest.approx(pipeline_part, rel=1e-9)
    assert est.pipeline_bubble_fraction == pytest.approx(est.time.item("pp_bubble").value / pipeline_part, rel=1e-9)


def test_round_ratio_is_three_significant_digits():
    assert round_ratio(2.123456) == 2.12 and round_ratio(0.0123456) == 0.0123 and round_ratio(0) == 0


# --- cost bounded by construction (issue #16, item 2) -------------------------------------------

from compiler.costmodel import pp_schedule as P  # noqa: E402


@pytest.mark.parametrize("p", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("x", [0.0, 0.05, 0.5, 3.0])
def test_gpipe_closed_form_is_the_simulation(p, x):
    for m in (1, 2, p - 1, p, p + 1, 3 * p + 2, 64):
        if m >= 1:
            for r in (1.0, 2.0, 3.3):
                assert P.gpipe_makespan_units(p, m, r, x) == pytest.approx(simulate("gpipe", p, m, 1, r, x).makespan,
                                                                             rel=1e-12)


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 1), ("interleaved_1f1b", 2),
                                        ("interleaved_1f1b", 3), ("interleaved_1f1b", 5)])
def test_in_flight_closed_form_is_the_walk(schedule, v):
    for p in (2, 3, 4, 8):
        for m in sorted({1, 2, p - 1, p, p + 1, 2 * p, 5 * p, 5 * p + 3}):
            if m < 1 or (schedule == "interleaved_1f1b" and v > 1 and m % p):
                continue
            for s in range(p):
                assert P.peak_inflight_chunks(schedule, s, p, m, v) == P.peak_inflight_chunks_by_walk(
                    schedule, s, p, m, v), (schedule, s, p, m, v)


def _extrapolated(schedule, p, m, v, r, x):
    sizes = P.window_sizes(p, m, v)
    assert sizes[-1] < m
    return P._extrapolated_makespan(schedule, p, m, v, r, x, sizes)


@pytest.mark.parametrize("p", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("x", [0.0, 0.05, 0.3, 1.0])
def test_1f1b_extrapolation_is_exact(p, x):
    """Past the window the 1F1B makespan is the whole simulation's (to rounding)."""
    for r in (1.0, 2.0, 3.3):
        m = max(P.window_sizes(p, 1)[-1], 300) + 37
        assert _extrapolated("1f1b", p, m, 1, r, x) == pytest.approx(simulate("1f1b", p, m, 1, r, x).makespan,
                                                                     rel=1e-9)


@pytest.mark.parametrize("p,v", [(2, 2), (3, 3), (4, 2), (4, 4), (8, 2), (8, 4)])
def test_interleaved_extrapolation_is_within_one_percent(p, v):
    """Interleaved 1F1B can settle into long cycles when p2p is many forwards long; the
    extrapolation stays within 1% there, and exact at realistic p2p costs."""
    m = p * (P.window_sizes(p, p, v)[-1] // p + 23)
    for r in (1.0, 2.0, 3.3):
        for x, tolerance in ((0.0, 1e-9), (0.05, 1e-9), (1.0, 0.01), (3.7, 0.01), (40.0, 0.01)):
            whole = simulate("interleaved_1f1b", p, m, v, r, x).makespan
            assert _extrapolated("interleaved_1f1b", p, m, v, r, x) == pytest.approx(whole, rel=tolerance), (r, x)


def test_makespan_cost_does_not_grow_with_the_microbatches(monkeypatch):
    """A million micro-batches (gradient accumulation of a 10M-sequence batch on 8 GPUs) costs what
    a few hundred do: the operations simulated per makespan stay under MAX_SIMULATED_OPS."""
    simulated: list[int] = []
    real = P.simulate

    def counting(schedule, pp, m, v, *args, **kw):
        simulated.append(2 * pp * v * m)
        return real(schedule, pp, m, v, *args, **kw)

    monkeypatch.setattr(P, "simulate", counting)
    for schedule, p, v in (("1f1b", 2, 1), ("1f1b", 16, 1), ("interleaved_1f1b", 8, 4), ("interleaved_1f1b", 32, 4),
                           ("gpipe", 8, 1)):
        for m in (10**3, 10**4 + 7, 10**6 - 1, 10**7):
            if schedule == "interleaved_1f1b":
                m -= m % p
            simulated.clear()
            P._makespan_units.__wrapped__(schedule, p, m, v, 2.0, 0.05)
            assert sum(simulated) <= P.MAX_SIMULATED_OPS, (schedule, p, v, m, sum(simulated))


def test_deepest_pipeline_costs_a_bounded_window(monkeypatch):
    from compiler.spec.models import MAX_LAYERS, MAX_PIPELINE_PARALLEL

    p = MAX_PIPELINE_PARALLEL
    v = MAX_LAYERS // p
    sizes = P.window_sizes(p, 10**7 - 10**7 % p, v)
    assert len(sizes) == 2 and sum(2 * p * v * s for s in sizes) <= 1.5 * P.MAX_SIMULATED_OPS


def test_pipeline_events_are_kept_only_for_small_steps():
    assert len(P.pipeline_events("1f1b", 4, 8, 1, 1.0, 2.0, 0.01)) == 2 * 4 * 8
    big = P.MAX_PIPELINE_EVENTS // (2 * 4) + 1
    assert P.pipeline_events("1f1b", 4, big, 1, 1.0, 2.0, 0.01) == ()


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved_1f1b"])
def test_the_makespan_alone_is_the_event_simulation_bit_for_bit(schedule: str) -> None:
    """Keeping the events (what PLAN.md's picture reads) changes nothing of the makespan the cost model reads,
    on the plan cached across calls; every operation appears once."""
    for pp in (2, 3, 4, 8):
        for v in ((1, 2, 3) if schedule == "interleaved_1f1b" else (1,)):
            for m in ((pp, 2 * pp, 5 * pp) if schedule == "interleaved_1f1b" else (1, 2, pp + 1, 3 * pp, 40)):
                for r, x in ((2.0, 0.0), (1.73, 0.013), (2.4, 0.37), (3.0, 1.9)):
                    fast = simulate(schedule, pp, m, v, r, x)
                    full = simulate(schedule, pp, m, v, r, x, keep_events=True)
                    assert fast.makespan == full.makespan and fast.busy == full.busy, (pp, v, m, r, x)
                    assert fast.events == () and len(full.events) == 2 * pp * v * m


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved_1f1b"])
def test_one_f_one_b_plan_is_the_listed_one(schedule: str) -> None:
    """Without interleaving, the simulation's per-stage plan is built in closed form (the three runs of
    one_f_one_b_order): the same tuples as from the operation lists, for every depth and micro-batch count up
    to 16 x 40 and some deeper pipelines and longer steps."""
    for pp in (*range(1, 17), 24, 32):
        for m in (*range(1, 41), 128, 255):
            assert P._step_plan.__wrapped__(schedule, pp, m, 1) == P._listed_plan(schedule, pp, m, 1), (pp, m)


def test_interleaved_plan_is_the_listed_one() -> None:
    """Interleaved 1F1B's per-stage plan built without the operation lists (Megatron's chunk order,
    _interleaved_chunk) is the one built from them: pp up to 12 and 16, v up to 8, m from pp (all warm-up) to 12 pp."""
    checked = 0
    for pp in (*range(1, 13), 16):
        for v in (2, 3, 4, 5, 8):
            for m in (pp, 2 * pp, 3 * pp, 5 * pp, 12 * pp):
                want = P._listed_plan("interleaved_1f1b", pp, m, v)
                assert P._step_plan.__wrapped__("interleaved_1f1b", pp, m, v) == want, (pp, v, m)
                checked += 1
    assert checked == 13 * 5 * 5
