"""Property tests of the solver against brute force on small problems (Hypothesis, derandomized).

For random small specs (model shape, batch, GPU count or range, objective, budget,
deadline, targets, a few pins): enumerate every layout of the space, cost each with the
cost model, apply the framework table and the budget/deadline, and rank the feasible
ones. Then ``solve`` must return exactly the brute-force winner and runners-up (the
ranking is total and deterministic), every returned layout must be feasible, and its
search summary must account for every layout once. When brute force finds nothing
feasible, ``solve`` must raise InfeasibleError.
"""
from __future__ import annotations

import textwrap

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from compiler.errors import InfeasibleError, SpecError
from compiler.estimate import Estimate
from compiler.problem import lower
from compiler.solver import solve
from compiler.solver import feasibility as F
from compiler.solver.candidates import Space, count_layouts, enumerate_layouts
from compiler.solver.objective import rank_key
from compiler.solver.objective import ranked as order
from compiler.solver.search import _calibrated_evaluate, _search_evaluate
from compiler.spec.load import load_spec_text

TOP_K = 3


@st.composite
def small_specs(draw) -> str:
    layers = draw(st.sampled_from([2, 3, 4]))
    heads = draw(st.sampled_from([4, 8]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8) if heads % h == 0]))
    hidden = heads * draw(st.sampled_from([64, 128]))
    moe = draw(st.booleans()) and draw(st.booleans())
    model = (f"{{num_layers: {layers}, hidden_size: {hidden}, ffn_hidden_size: {hidden * 3}, "
             f"num_attention_heads: {heads}, num_kv_heads: {kv}, vocab_size: {draw(st.sampled_from([1024, 32000]))}"
             + (", moe: {num_experts: 4, top_k: 2, expert_ffn_hidden_size: %d}" % hidden if moe else "") + "}")
    seq = draw(st.sampled_from([256, 1024]))
    batch = draw(st.sampled_from([2, 4, 6, 8]))
    tol = draw(st.sampled_from([0.0, 0.0, 0.25]))
    gpu = draw(st.sampled_from(["a100-40gb", "h100-sxm"]))
    gpn = draw(st.sampled_from([4, 8]))
    if draw(st.booleans()):
        cluster = f"{{gpu: {gpu}, gpus_per_node: {gpn}, num_gpus: {draw(st.sampled_from([1, 2, 4, 8]))}}}"
    else:
        cluster = f"{{gpu: {gpu}, gpus_per_node: 4, max_gpus: {draw(st.sampled_from([4, 8, 12]))}}}"
    objective = draw(st.sampled_from(["fastest", "cheapest", "throughput"]))
    budget = f"objective: {objective}"
    if draw(st.booleans()):
        budget += f", max_cost: {draw(st.sampled_from([50, 500, 5000]))}"
    if draw(st.booleans()):
        budget += f", deadline: {draw(st.sampled_from(['1h', '1d', '30d']))}"
    targets = draw(st.sampled_from([["megatron"], ["fsdp"], ["deepspeed"], ["megatron", "fsdp"],
                                    ["deepspeed", "fsdp", "megatron", "slurm"]]))
    pins = ["offload_params: none"]
    if draw(st.booleans()):
        pins.append("offload_optimizer: none")
    if draw(st.booleans()):
        pins.append(f"recompute: {draw(st.sampled_from(['none', 'selective', 'full']))}")
    if draw(st.booleans()):
        pins.append(f"zero_stage: {draw(st.sampled_from([0, 1, 3]))}")
    return textwrap.dedent(f"""\
        name: prop
        model: {model}
        training: {{tokens: {draw(st.sampled_from(['1B', '100B']))}, sequence_length: {seq}, global_batch: {batch},
                   global_batch_tolerance: {tol}}}
        cluster: {cluster}
        budget: {{{budget}}}
        layout: {{{', '.join(pins)}}}
        targets: [{', '.join(targets)}]
        """)


def lowered(text: str):
    """The Problem, or None when the pins already break a layout rule (validate refuses the spec; every such
    refusal carries a rule's code)."""
    try:
        return lower(load_spec_text(text, "prop.yaml"))
    except SpecError as exc:
        assert all(d.code for d in exc.diagnostics), exc.render()
        return None


def brute_force(problem):
    ranked = []
    for layout in enumerate_layouts(problem):
        assert F.check_structure(problem, layout) is None, layout.tag
        if F.check_framework(problem, layout) is not None:
            continue
        est = _search_evaluate(problem, layout)
        if not isinstance(est, Estimate) or F.check_estimate(problem, est) is not None:
            continue
        ranked.append((layout, est))
    # the final order: rank_key, and under 'cheapest' the costs within 1% of the cheapest first, fastest first
    return [(rank_key(problem, layout, est), layout) for layout, est in order(problem, ranked)]


@settings(derandomize=True, max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(small_specs())
def test_solve_matches_brute_force(text: str) -> None:
    problem = lowered(text)
    assume(problem is not None)
    ranked = brute_force(problem)
    if not ranked:
        try:
            solve(problem, top_k=TOP_K)
        except InfeasibleError as exc:
            assert exc.summary.num_feasible == 0
            return
        raise AssertionError("solve found a plan where brute force found nothing feasible")
    plan = solve(problem, top_k=TOP_K)
    got = [plan.layout] + [c.layout for c in plan.alternatives]
    want = [layout for _, layout in ranked[:TOP_K + 1]]
    assert [l.tag for l in got] == [l.tag for l in want]
    for layout in got:  # every returned layout is feasible under the cost model
        est = _search_evaluate(problem, layout)
        assert isinstance(est, Estimate) and F.check_estimate(problem, est) is None
        assert F.check_framework(problem, layout) is None
        assert F.check_structure(problem, layout) is None, layout.tag
    # a thin pick names the best well-calibrated layout: the brute-force best of those _calibrated_evaluate keeps
    note = next((n for n in plan.notes if n.startswith("the pick lies in a thin regime")), None)
    assert (note is not None) == bool(plan.estimate.band and plan.estimate.band.thin)
    if note is not None:
        safe = order(problem, [(layout, est) for _, layout in ranked
                               if isinstance(est := _calibrated_evaluate(problem, layout), Estimate)])
        if safe:
            assert f"alternative: {safe[0][0].describe()} on" in note, (note, safe[0][0].describe())
        else:
            assert "no layout of a well-calibrated regime is feasible" in note, note
    s = plan.search
    assert s.num_considered == count_layouts(problem)
    layout_rejections = sum(n for code, n in s.rejections_by_code.items() if code not in F.SHAPE_CODES)
    assert s.num_considered == s.num_pruned_by_bound + layout_rejections + s.num_feasible
    assert s.num_feasible <= len(ranked)


@settings(derandomize=True, max_examples=40, deadline=None)
@given(small_specs())
def test_enumeration_is_the_structurally_valid_space(text: str) -> None:
    """Every enumerated layout passes the structural rules, none twice, and the count is exact."""
    problem = lowered(text)
    assume(problem is not None)
    tags = [layout.tag + layout.gpu for layout in enumerate_layouts(problem)]
    assert len(tags) == len(set(tags)) == count_layouts(problem)
    space = Space(problem)
    for shape in space.shapes().shapes:
        assert shape.world == shape.tp * shape.pp * shape.cp * shape.dp
