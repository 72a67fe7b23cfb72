"""solve(): the plan, its alternatives, the accounting, infeasibility, budgets, deadlines, pins, targets."""
from __future__ import annotations

import textwrap

import pytest

from compiler.errors import InfeasibleError
from compiler.estimate import CommVolume, Estimate
from compiler.problem import lower
from compiler.solver import feasibility as F
from compiler.solver import solve
from compiler.solver.objective import objective_key, rank_key
from compiler.solver.search import search
from compiler.spec.load import load_spec_text
from plan_fixtures import zero_estimate


def problem(model: str = "{preset: llama3-8b}", training: str = "tokens: 100B, sequence_length: 4096, global_batch: 64",
            cluster: str = "{gpu: h100-sxm, num_gpus: 16}", budget: str = "{objective: fastest}",
            layout: str = "{}", targets: str = "[megatron]"):
    text = textwrap.dedent(f"""\
        name: t
        model: {model}
        training: {{{training}}}
        cluster: {cluster}
        budget: {budget}
        layout: {layout}
        targets: {targets}
        """)
    return lower(load_spec_text(text, "t.yaml"))


def accounted(plan_or_summary) -> None:
    s = getattr(plan_or_summary, "search", plan_or_summary)
    layouts = sum(n for code, n in s.rejections_by_code.items() if code not in F.SHAPE_CODES)
    assert s.num_considered == s.num_pruned_by_bound + layouts + s.num_feasible
    assert s.num_evaluated <= s.num_considered


def test_plan_and_alternatives() -> None:
    p = problem()
    plan = solve(p, top_k=3)
    assert plan.layout.world_size == 16 and plan.layout.global_batch == 64
    assert plan.training.global_batch == 64
    assert [c.rank for c in plan.alternatives] == [2, 3, 4]
    assert all(c.why_lost for c in plan.alternatives)
    # ranked at the spec's confidence (default p80): the time to train times each estimate's band factor
    keys = [objective_key(p, plan.estimate)] + [objective_key(p, c.estimate) for c in plan.alternatives]
    # the search ranks the exact estimates; plan.json's are rounded to 4 significant digits (compiler/plan.py), so
    # keys recomputed from the plan follow the ranking up to that rounding
    assert all(a <= b * (1 + 1e-3) for a, b in zip(keys, keys[1:]))
    assert len({c.layout for c in plan.alternatives} | {plan.layout}) == 4
    assert plan.estimate.memory.total_bytes_per_gpu <= plan.estimate.memory.usable_bytes_per_gpu
    accounted(plan)
    assert plan.search.num_pruned_by_bound > 0


def test_deterministic() -> None:
    p = problem()
    assert solve(p, top_k=2).to_json() == solve(p, top_k=2).to_json()


def test_top_k_zero_and_default() -> None:
    p = problem()
    assert solve(p, top_k=0).alternatives == ()
    assert len(solve(p).alternatives) == p.top_k


def test_infeasible_reports_tally_and_closest_misses() -> None:
    p = problem(model="{preset: llama3.1-405b}", cluster="{gpu: a100-40gb, num_gpus: 8}",
                training="tokens: 1T, sequence_length: 8192, global_batch: 64")
    with pytest.raises(InfeasibleError) as info:
        solve(p)
    exc = info.value
    text = exc.render()
    assert "no layout fits llama3.1-405b on 8 x a100-40gb (seq 8192, global batch 64)" in text
    assert "(0 of them feasible)" in text and "out_of_memory" in text and "closest misses" in text and "fix:" in text
    s = exc.summary
    assert s.num_feasible == 0 and s.rejections_by_code[F.OUT_OF_MEMORY] > 0
    assert s.closest_misses and s.closest_misses[0].code == F.OUT_OF_MEMORY
    assert "more per GPU" in s.closest_misses[0].fix
    accounted(s)


@pytest.mark.slow  # a refit / solve of several seconds: the full run keeps it, the fast tier does not
def test_budget_is_honoured_and_halving_it_changes_the_answer() -> None:
    def run(budget: str):
        return problem(model="{params: 70B}", training="tokens: 2T, sequence_length: 4096, global_batch: 1024",
                       cluster="{gpu: h100-sxm}", budget=f"{{max_cost: '{budget}', objective: fastest}}")
    rich = solve(run("$5M"), top_k=1)
    assert rich.estimate.cost_usd <= 5e6 and rich.layout.world_size % 8 == 0
    half = solve(run("$2.5M"), top_k=1)
    assert half.estimate.cost_usd <= 2.5e6
    assert half.estimate.time_to_train_s >= rich.estimate.time_to_train_s
    assert half.layout.world_size <= rich.layout.world_size
    with pytest.raises(InfeasibleError) as info:
        solve(run("$1M"), top_k=1)
    assert info.value.summary.rejections_by_code[F.OVER_BUDGET] > 0
    miss = info.value.summary.closest_misses[0]
    assert miss.code == F.OVER_BUDGET and "cheapest layout costs" in miss.message


def test_cheapest_within_deadline() -> None:
    base = dict(training="tokens: 100B, sequence_length: 4096, global_batch: 256",
                cluster="{gpu: h100-sxm, max_gpus: 64}")
    free = solve(problem(budget="{objective: cheapest}", **base), top_k=0)
    assert any("no deadline" in n for n in free.notes)
    roomy = 2 * free.estimate.time_to_train_s  # a deadline the plan meets: the same plan
    same = solve(problem(budget=f"{{objective: cheapest, deadline: {roomy:.0f}s}}", **base), top_k=0)
    assert same.layout == free.layout
    tight = free.estimate.time_to_train_s * 0.999  # only a faster (and not cheaper) layout meets it
    try:
        rushed = solve(problem(budget=f"{{objective: cheapest, deadline: {tight:.0f}s}}", **base), top_k=0)
    except InfeasibleError:
        return
    assert rushed.estimate.time_to_train_s <= tight and rushed.estimate.cost_usd >= free.estimate.cost_usd * 0.99


def test_cheapest_ties_go_to_the_faster_plan() -> None:
    """Issue #15: 'cheapest' picked 128 GPUs over 512 to save 0.03% at 4x the time. Costs within 1% of the
    cheapest are ties; the fastest of them wins, and the plan says what the cheapest would have been. 'Fastest'
    and 'cheapest' are at the spec's confidence (p80 by default: the point estimate times its band's factor),
    as the solver ranks them (objective.ranked_time_s / ranked_cost_usd)."""
    from compiler.solver.objective import CHEAPEST_TIE, ranked_time_s

    prob = problem(budget="{objective: cheapest}", training="tokens: 1T, sequence_length: 8192, global_batch: 1024",
                   cluster="{gpu: h100-sxm, max_gpus: 512}", targets="[megatron]")
    plan = solve(prob, top_k=5)
    note = next(n for n in plan.notes if n.startswith("objective 'cheapest': costs within 1%"))
    assert f"{plan.estimate.num_gpus} GPUs" in note and "instead of the cheapest" in note
    cheapest = min([plan.estimate.cost_usd] + [a.estimate.cost_usd for a in plan.alternatives])
    assert plan.estimate.cost_usd <= cheapest * (1 + CHEAPEST_TIE)
    for alt in plan.alternatives:  # every runner-up in the band is slower; the ones outside cost more
        if alt.estimate.cost_usd <= cheapest * (1 + CHEAPEST_TIE):
            assert ranked_time_s(prob, alt.estimate) >= ranked_time_s(prob, plan.estimate)
            assert alt.why_lost.startswith("ties on cost")


def test_throughput_uses_the_largest_allowed_count() -> None:
    plan = solve(problem(budget="{objective: throughput}", cluster="{gpu: h100-sxm, max_gpus: 36}"), top_k=0)
    assert plan.layout.world_size == 32
    assert any("largest allowed GPU count" in n for n in plan.notes)


def test_fastest_without_budget_says_why_it_uses_every_gpu() -> None:
    plan = solve(problem(cluster="{gpu: h100-sxm, max_gpus: 64}"), top_k=0)
    assert plan.layout.world_size == 64
    assert any("more GPUs train faster" in n for n in plan.notes)


def test_pins_and_targets_cut_the_space() -> None:
    plan = solve(problem(layout="{pipeline_parallel: 2, recompute: full}"), top_k=2)
    for layout in [plan.layout] + [c.layout for c in plan.alternatives]:
        assert layout.pp == 2 and layout.recompute == "full"
    ds = solve(problem(targets="[deepspeed]"), top_k=3)
    for layout in [ds.layout] + [c.layout for c in ds.alternatives]:
        assert layout.cp == 1 and not layout.sequence_parallel and not (layout.pp > 1 and layout.tp > 1)
    assert ds.search.rejections_by_code[F.FRAMEWORK_UNSUPPORTED] > 0


def test_several_targets_cost_each_layout_for_the_binding_one() -> None:
    """A plan rendered for several frameworks must fit under each and runs as fast as the slowest."""
    from compiler.costmodel.evaluation import evaluate, evaluate_targets

    p = problem(targets="[megatron, fsdp]")
    plan = solve(p, top_k=0)
    both = evaluate_targets(p, plan.layout)
    mg = evaluate(p, plan.layout, target="megatron")
    assert both.binding == "fsdp" and both.result.step_time_s > mg.step_time_s
    assert plan.estimate.step_time_s == pytest.approx(both.result.step_time_s, rel=1e-3)  # the plan rounds


def test_a_search_ruled_out_by_a_target_keeps_only_what_it_cannot_run() -> None:
    """target_costs' relaxed search (ruled_out_by): the best layouts the dropped target cannot run, every layout
    the target runs counted as framework_unsupported; the union with the layouts it runs is the whole space."""
    from dataclasses import replace

    from compiler.rules import Knobs
    from compiler.solver.search import _Search, _search_evaluate
    from compiler.targets.support import target_reason

    p = problem(targets="[megatron, fsdp]")
    relaxed = replace(p, targets=("fsdp",), top_k=3)
    ruled = _Search(relaxed, 3, _search_evaluate, ruled_out_by="megatron")
    ruled.run()
    assert ruled.top
    for e in ruled.best_first():
        assert target_reason("megatron", Knobs.of(e.layout), p.precision, p.shape) is not None, e.layout.describe()
    free = _Search(relaxed, 3, _search_evaluate)
    free.run()
    joint = solve(replace(p, targets=("fsdp", "megatron")), top_k=0).search
    total = free.num_considered
    assert ruled.num_considered == joint.num_considered == total
    # unsupported: what fsdp cannot run, and of the rest what megatron runs too (the joint search's supported)
    fu = F.FRAMEWORK_UNSUPPORTED
    assert ruled.tally.counts[fu] == free.tally.counts.get(fu, 0) + total - joint.rejections_by_code[fu]


def test_batch_tolerance_realises_a_nearby_batch() -> None:
    p = problem(training="tokens: 100B, sequence_length: 4096, global_batch: 1000, global_batch_tolerance: 0.05",
                cluster="{gpu: h100-sxm, num_gpus: 64}")
    plan = solve(p, top_k=0)
    b = plan.layout.global_batch
    assert 950 <= b <= 1050 and b == plan.training.global_batch
    assert plan.training.requested_global_batch == 1000
    exact = problem(training="tokens: 100B, sequence_length: 4096, global_batch: 1000",
                    cluster="{gpu: h100-sxm, num_gpus: 64}")
    assert solve(exact, top_k=0).layout.global_batch == 1000


def test_examples_name_each_code() -> None:
    result = search(problem(), top_k=1)
    assert set(result.plan.search.rejections_by_code) <= set(result.examples)


def _estimate_with(layout, seconds: float, comm_bytes: float) -> Estimate:
    e = zero_estimate(layout)
    vol = CommVolume("x", "dp", 2, "inter_node", comm_bytes, 0.0, 0.0)
    return Estimate(**{**e.__dict__, "time_to_train_s": seconds, "comm": (vol,)})


def test_tie_break_prefers_fewer_dims_then_less_communication_then_the_tag() -> None:
    p = problem()
    from plan_fixtures import layout_for

    simple = layout_for(p, dp_replicate=16)
    fancy = layout_for(p, tp=2, dp_replicate=8)
    key = lambda layout, seconds, comm: rank_key(p, layout, _estimate_with(layout, seconds, comm))  # noqa: E731
    assert key(simple, 100.0, 9e9) < key(fancy, 100.0, 1.0)
    # equal within 1e-9 relative: still a tie
    assert key(simple, 100.0 * (1 + 1e-11), 9e9) < key(fancy, 100.0, 1.0)
    a, b = layout_for(p, dp_replicate=16, micro_batch=2), layout_for(p, dp_replicate=16, micro_batch=4)
    assert key(a, 100.0, 2.0) > key(b, 100.0, 1.0)  # same dims: less communication wins
    assert key(a, 100.0, 1.0) < key(b, 100.0, 1.0)  # all equal: the tag decides
    # a real difference beats the tie-break
    assert key(fancy, 99.0, 9e9) < key(simple, 100.0, 1.0)
