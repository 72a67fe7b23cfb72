"""The solver's lower bounds never exceed what the cost model returns (else pruning could lose the optimum)."""
from __future__ import annotations

import random
import textwrap

import pytest

from compiler.costmodel import parts as cm
from compiler.costmodel.evaluation import evaluate
from compiler.costmodel.pp_schedule import makespan_units
from compiler.estimate import Estimate
from compiler.problem import lower
from compiler.solver.bounds import Bounds, pipeline_units_lb
from compiler.solver.candidates import Sharding, Space
from compiler.spec.load import load_spec_text

SPECS = {
    "llama-405b": """
        name: b405
        model: {preset: llama3.1-405b}
        training: {tokens: 1T, sequence_length: 8192, global_batch: 512}
        cluster: {gpu: h100-sxm, num_gpus: 1024}
        targets: [megatron]
    """,
    "mixtral-fp8": """
        name: bmix
        model: {preset: mixtral-8x7b}
        training: {tokens: 1T, sequence_length: 4096, global_batch: 256, precision: fp8}
        cluster: {gpu: h100-sxm, num_gpus: 64}
        targets: [megatron]
    """,
    "llama-70b-nvfp4": """
        name: bnv
        model: {preset: llama3-70b}
        training: {tokens: 1T, sequence_length: 8192, global_batch: 256, precision: nvfp4}
        cluster: {gpu: gb300, num_gpus: 64}
        targets: [megatron]
    """,
    "gpt3-a100": """
        name: bgpt
        model: {preset: gpt3-175b}
        training: {tokens: 300B, sequence_length: 2048, global_batch: 1536}
        cluster: {gpu: a100-80gb, num_gpus: 512}
        targets: [megatron]
    """,
    "tiny-offload": """
        name: btiny
        model: {num_layers: 6, hidden_size: 1024, ffn_hidden_size: 2816, num_attention_heads: 16, num_kv_heads: 4,
                vocab_size: 32000}
        training: {tokens: 10B, sequence_length: 2048, global_batch: 64, optimizer: adamw}
        cluster: {gpu: a100-40gb, num_gpus: 16}
        targets: [deepspeed]
    """,
    # several framework targets: the bounds cost the slowest one (parts.bound_target), not the first
    "llama-8b-32k-megatron-fsdp": """
        name: bfsdp
        model: {preset: llama3-8b}
        training: {tokens: 1T, sequence_length: 32768, global_batch: 64}
        cluster: {gpu: h200, num_gpus: 64}
        targets: [megatron, fsdp]
    """,
    "llama-8b-megatron-deepspeed": """
        name: bds
        model: {preset: llama3-8b}
        training: {tokens: 1T, sequence_length: 4096, global_batch: 256}
        cluster: {gpu: a100-80gb, num_gpus: 32}
        targets: [megatron, deepspeed]
    """,
}


def _problem(name: str):
    return lower(load_spec_text(textwrap.dedent(SPECS[name]), f"{name}.yaml"))


def _sample(problem, n: int, seed: int):
    """n random layouts of the space (uniform over shapes, then over each inner choice)."""
    rng = random.Random(seed)
    space = Space(problem)
    shapes = space.shapes().shapes
    out = []
    while len(out) < n:
        shape = rng.choice(shapes)
        pipes, batches = space.pipeline_choices(shape.pp), space.batch_choices(shape.dp)
        shards, sps = space.sharding_choices(shape.dp), space.sp_choices(shape.tp, shape.cp)
        if not (pipes and batches and shards and sps):
            continue
        sched, vpp = rng.choice(pipes)
        mb, ga = rng.choice(batches)
        if sched == "interleaved_1f1b" and ga % shape.pp:
            continue
        sh: Sharding = rng.choice(shards)
        rc = rng.choice(space.recompute_choices())
        sp = rng.choice(sps)
        out.append((shape, sched, vpp, mb, ga, rc, sp, sh, space.layout(shape, sched, vpp, sh, mb, ga, rc, sp)))
    return space, out


@pytest.mark.parametrize("name", sorted(SPECS))
def test_bounds_below_the_cost_model(name: str) -> None:
    problem = _problem(name)
    space, samples = _sample(problem, 60, seed=hash(name) % 1000)
    bounds = Bounds(problem)
    checked = 0
    for shape, sched, vpp, mb, ga, rc, sp, sh, layout in samples:
        # the bounds' target's own estimate (a layout's binding estimate is at least as slow, and any target that
        # cannot fit a layout rejects it)
        est = evaluate(problem, layout, target=bounds.target, pipeline_events=False, check_memory=False)
        assert isinstance(est, Estimate), (layout.tag, est)
        step = est.step_time_s
        sps = space.sp_choices(shape.tp, shape.cp)
        # shape: GPU-seconds per token
        batches = space.batch_choices(shape.dp)
        g = (bounds.gpu_s_per_token_lb(shape, sps, max(m for m, _ in batches))
             * bounds.shape_bubble_factor(shape, space.pipeline_choices(shape.pp), batches)
             + bounds.step_overhead_per_token_lb(shape, max(m * a for m, a in batches) * shape.dp))
        assert g <= step * layout.world_size / est.tokens_per_step, layout.tag
        # the micro-batch cap: at the layout's own micro-batch, with no bubble or fixed time, still below
        assert bounds.gpu_s_per_token_lb(shape, sps, mb) <= step * layout.world_size / est.tokens_per_step
        # recompute only adds time (the search's groups_lb bounds a shape by its groups without it)
        fb = {r: sum(bounds.stage_fb(shape, bounds.stages(1, 1)[0], mb, sp, r)) for r in ("none", "selective", "full")}
        assert fb["none"] <= fb["selective"] <= fb["full"], (layout.tag, fb)
        # group and layout: step time
        fbs = bounds.group_stage_fb(shape, vpp, mb, rc, sps)
        group = bounds.group_step_lb(shape, sched, vpp, mb, ga, rc, sps, fbs)
        assert group <= step, (layout.tag, group, step)
        full = bounds.layout_step_lb(shape, sched, vpp, mb, ga, sh, fbs, lambda: layout)
        assert group * 0.999 <= full <= step, (layout.tag, full, step)
        # memory
        total = est.memory.total_bytes_per_gpu
        assert bounds.option_memory_lb(shape, sched, vpp, mb, ga, rc, sp, sh) <= total, layout.tag
        opts = tuple((s, x) for s in sps for x in space.sharding_choices(shape.dp))
        assert bounds.group_memory_lb(shape, sched, vpp, mb, ga, rc, opts) <= total, layout.tag
        # a group's options at once (activations looked up once per sp) = each option alone, in a fresh Bounds
        alone = Bounds(problem)
        assert bounds.options_memory_lb(shape, sched, vpp, mb, ga, rc, opts) == [
            alone.option_memory_lb(shape, sched, vpp, mb, ga, rc, s, x) for s, x in opts], layout.tag
        # the family of (vpp, micro-batch, recompute), over its schedules and grad_accums (the search's stages_lb)
        pipes = tuple((s, opts) for s, v in space.pipeline_choices(shape.pp) if v == vpp)
        assert bounds.family_memory_lb(shape, vpp, pipes, mb, (ga,), rc) <= total, layout.tag
        # without the activations: below the family's bound at every micro-batch and recompute mode (the search
        # skips a vpp whose states alone do not fit)
        states = bounds.family_states_lb(shape, vpp, pipes)
        assert all(states <= bounds.family_memory_lb(shape, vpp, pipes, m, (ga,), r)
                   for m in (1, mb) for r in ("none", "selective", "full")), layout.tag
        # the search bisects the micro-batches on this bound at fixed grad_accums: it must only grow with them
        mems = [bounds.family_memory_lb(shape, vpp, pipes, m, (ga,), rc) for m in (1, 2, 3, mb, mb + 1, 2 * mb, 64)]
        ordered = sorted(zip((1, 2, 3, mb, mb + 1, 2 * mb, 64), mems))
        assert all(a[1] <= b[1] for a, b in zip(ordered, ordered[1:])), (layout.tag, ordered)
        # the bottleneck stage per token at the layout's micro-batch and recompute, times its vpp's bubble
        per_token = bounds.stage_gpu_s_per_token_lb(shape, vpp, sps, mb, rc) \
            * bounds.shape_bubble_factor(shape, [(sched, vpp)], [(mb, ga)])
        assert per_token <= step * layout.world_size / est.tokens_per_step, layout.tag
        checked += 1
    assert checked == 60


def test_bounds_are_not_vacuous() -> None:
    """On a typical good layout the step bound is within 25% of the estimate (else pruning is weak)."""
    problem = _problem("llama-405b")
    space = Space(problem)
    shape = next(s for s in space.shapes().shapes if (s.tp, s.pp, s.cp, s.dp) == (8, 8, 1, 16))
    bounds = Bounds(problem)
    sh = Sharding(1, 16)
    layout = space.layout(shape, "interleaved_1f1b", 2, sh, 1, 32, "none", True)
    est = evaluate(problem, layout, pipeline_events=False, check_memory=False)
    fbs = bounds.group_stage_fb(shape, 2, 1, "none", (False, True))
    lb = bounds.layout_step_lb(shape, "interleaved_1f1b", 2, 1, 32, sh, fbs, lambda: layout)
    assert 0.75 * est.step_time_s <= lb <= est.step_time_s


@pytest.mark.parametrize("name, slowest", [("llama-8b-32k-megatron-fsdp", "fsdp"),
                                           ("llama-8b-megatron-deepspeed", "deepspeed")])
def test_several_targets_are_bounded_by_the_slowest(name: str, slowest: str) -> None:
    """With several framework targets the bounds cost the slowest (the binding estimate is the slowest target's):
    on a layout every target runs, the shape's GPU-seconds per token bound is within 15% of the binding estimate,
    where bounding with the first target's fused kernels fell 25-40% short and the search costed thousands of
    layouts it could have pruned."""
    from compiler.costmodel.evaluation import evaluate_targets

    problem = _problem(name)
    bounds = Bounds(problem)
    assert bounds.target == slowest
    space = Space(problem)
    shape = next(s for s in space.shapes().shapes if (s.tp, s.pp, s.cp) == (1, 1, 1))
    sh = next(x for x in space.sharding_choices(shape.dp) if x.zero_stage == 1 and x.dp_shard == shape.dp)
    mb, ga = max((b for b in space.batch_choices(shape.dp) if b[0] <= 2), key=lambda b: b[0])
    layout = space.layout(shape, "1f1b", 1, sh, mb, ga, "none", False)
    targets = evaluate_targets(problem, layout, pipeline_events=False, check_memory=False)
    assert targets.binding == slowest
    est = targets.result
    assert isinstance(est, Estimate)
    per_token = est.step_time_s * layout.world_size / est.tokens_per_step
    g = bounds.gpu_s_per_token_lb(shape, space.sp_choices(shape.tp, shape.cp), mb)
    assert 0.85 * per_token <= g <= per_token, (g, per_token)


@pytest.mark.parametrize("sched", ["gpipe", "1f1b", "interleaved_1f1b"])
def test_pipeline_closed_form_is_below_the_simulation(sched: str) -> None:
    """makespan >= (m + (pp-1)/v) (f + b) + 2 (pp v - 1) p2p, in units of f (the bound's premise)."""
    for pp in (2, 3, 4, 8):
        for m in (1, 2, 4, 8, 12, 16):
            for v in ((1,) if sched != "interleaved_1f1b" else (2, 3)):
                if sched == "interleaved_1f1b" and m % pp:
                    continue
                for r in (1.0, 2.0, 2.7, 3.3):
                    for x in (0.0, 0.05, 0.5, 2.0):
                        units = makespan_units(sched, pp, m, v, r, x)
                        closed = pipeline_units_lb(sched, pp, m, v) * (1 + r) + 2 * (pp * v - 1) * x
                        assert closed <= units * (1 + 1e-9)


def test_p2p_cache_matches_the_cost_model() -> None:
    """Bounds.p2p_s shares its cache across the data-parallel degrees on one side of the NVLink domain: for
    every dp (inside one node and across nodes, GB200's 72-GPU domain too) it equals the cost model's send."""
    from compiler.costmodel import parts as cm
    from compiler.solver.candidates import Shape

    checked = 0
    for gpu, counts in (("h100-sxm", "max_gpus: 512"), ("gb200", "max_gpus: 576")):
        problem = lower(load_spec_text(textwrap.dedent(f"""
            name: p2p
            model: {{preset: llama3-8b}}
            training: {{tokens: 1T, sequence_length: 4096, global_batch: 4096}}
            cluster: {{gpu: {gpu}, {counts}}}
            targets: [megatron]
        """), "spec.yaml"))
        bounds = Bounds(problem)
        option = problem.gpu_options[0]
        for tp, cp, pp in ((1, 1, 2), (2, 1, 4), (4, 2, 2), (8, 1, 8)):
            for dp in (1, 2, 3, 4, 8, 9, 16, 64):
                for mb in (1, 4):
                    shape = Shape(0, option.name, option.gpus_per_node, tp, pp, cp, dp, 1)
                    probe = bounds._probe(shape, pp=pp, mb=mb)
                    want = cm.pipeline_send_s(bounds.setup(0, probe))
                    assert bounds.p2p_s(shape, mb) == want, (gpu, tp, cp, pp, dp, mb)
                    checked += 1
    assert checked == 128


def _states_bounds(model: str, target: str, max_gpus: int) -> Bounds:
    """The bounds of a spec of ``model`` for ``target`` on up to ``max_gpus`` H100s (the model-state tests)."""
    return Bounds(lower(load_spec_text(textwrap.dedent(f"""
        name: states
        model: {{preset: {model}}}
        training: {{tokens: 1T, sequence_length: 4096, global_batch: 4096}}
        cluster: {{gpu: h100-sxm, max_gpus: {max_gpus}}}
        targets: [{target}]
    """), "spec.yaml")))


def _cost_model_states(bounds: Bounds, shape, sl, sh: Sharding) -> float:
    """The cost model's model states of stage ``sl`` under the layout's own setup (no cache of the bounds)."""
    from compiler.costmodel import parts as cm

    layout = bounds._probe(shape, pp=shape.pp, sh=sh)  # a Layout with this shape's degrees and sharding
    return cm.model_state_bytes(bounds.setup(0, layout), bounds._stage_params(shape, shape.pp, 1, sl), layout)


def test_model_states_cache_matches_the_cost_model() -> None:
    """Bounds._model_states shares its cache across the data-parallel degrees (the states read the shard group,
    not the replicas, except under DeepSpeed's hpZ, whose key has dp): asked for each dp after other dps filled the cache, it equals the cost model's states of
    that dp's own layout, for every target's bookkeeping (Megatron, DeepSpeed, FSDP), with ZeRO 0-3, HSDP and
    offload."""
    from compiler.solver.candidates import Shape

    checked = 0
    for model, target, ep in (("llama3-8b", "megatron", 1), ("llama3-8b", "deepspeed", 1), ("llama3-8b", "fsdp", 1),
                              ("mixtral-8x7b", "megatron", 2)):
        bounds = _states_bounds(model, target, 512)
        option = bounds.problem.gpu_options[0]
        for tp, pp in ((1, 1), (2, 4), (8, 2)):
            for dp in (64, 2, 16, 6, 4):
                shape = Shape(0, option.name, option.gpus_per_node, tp, pp, 1, dp, ep)
                for shard in (d for d in (1, 2, 3, 4, 8, 16, 32, 64) if dp % d == 0):
                    for sh in (Sharding(0, 1), Sharding(1, shard), Sharding(2, shard), Sharding(3, shard),
                               Sharding(2, shard, offload_optimizer="cpu"),
                               Sharding(3, shard, offload_optimizer="cpu", offload_params="cpu")):
                        for sl in bounds.distinct(pp, 1):
                            want = _cost_model_states(bounds, shape, sl, sh)
                            assert bounds._model_states(shape, 1, sl, sh) == want, (model, target, tp, pp, dp, sh)
                            checked += 1
    assert checked > 1000


def test_family_states_are_equal_for_vpps_with_the_same_stages() -> None:
    """The search keeps Bounds.family_states_lb per (Bounds.compositions, options): vpps whose splits give the same
    candidate stages must have the same value, each asked of fresh bounds (uneven Megatron splits give vpps of one
    pp different stages: 126 layers on pp 4, 6 and 16)."""
    from compiler.solver.candidates import Shape

    problem = _states_bounds("llama3.1-405b", "megatron", 4096).problem
    option = problem.gpu_options[0]
    space = Space(problem)
    checked = groups = 0
    for tp, pp, dp in ((8, 4, 16), (8, 6, 8), (8, 16, 4), (4, 2, 32)):
        shape = Shape(0, option.name, option.gpus_per_node, tp, pp, 1, dp, 1)
        opts = tuple((sp, sh) for sp in space.sp_choices(tp, 1) for sh in space.sharding_choices(dp))
        by_stages: dict[tuple, set[float]] = {}
        for vpp in sorted({v for _, v in space.pipeline_choices(pp) if v > 1}):
            pipes = tuple((s, opts) for s, v in space.pipeline_choices(pp) if v == vpp)
            fresh = Bounds(problem)
            by_stages.setdefault(fresh.compositions(pp, vpp), set()).add(fresh.family_states_lb(shape, vpp, pipes))
            checked += 1
        assert all(len(values) == 1 for values in by_stages.values()), (tp, pp, dp, by_stages)
        groups += len(by_stages)
    assert groups > 4 and checked > groups  # some pp has vpps with different stages, and some share theirs


def test_model_states_fall_with_the_shard_group() -> None:
    """Bounds._least_states keeps, of each (ZeRO stage, offloads) class, only the widest shard group: the cost
    model's model states must never grow with dp_shard within a class (every target's bookkeeping, dense and
    expert parameters, with context parallelism)."""
    from compiler.solver.candidates import Shape

    checked = 0
    for model, target, ep in (("llama3-8b", "megatron", 1), ("llama3-8b", "deepspeed", 1), ("llama3-8b", "fsdp", 1),
                              ("mixtral-8x7b", "megatron", 4), ("mixtral-8x7b", "megatron", 8)):
        bounds = _states_bounds(model, target, 1024)
        option = bounds.problem.gpu_options[0]
        for tp, pp, cp in ((1, 1, 1), (2, 4, 1), (4, 2, 2)):
            shape = Shape(0, option.name, option.gpus_per_node, tp, pp, cp, 128, ep)
            for zero, off_opt, off_params in ((0, "none", "none"), (1, "none", "none"), (2, "none", "none"),
                                              (3, "none", "none"), (2, "cpu", "none"), (3, "cpu", "cpu")):
                for sl in bounds.distinct(pp, 1):
                    before = float("inf")
                    for shard in (1, 2, 4, 8, 16, 32, 64, 128):
                        sh = Sharding(zero, shard, offload_optimizer=off_opt, offload_params=off_params)
                        states = _cost_model_states(bounds, shape, sl, sh)
                        assert states <= before, (model, target, tp, pp, cp, zero, off_opt, off_params, shard)
                        before = states
                        checked += 1
    assert checked > 1000


# the shape-level bounds of the search (search._Search.groups_lb and stages_lb): no feasible layout of a shape has a smaller
# objective key, with the budget and the memory it uses to leave groups out (tight budgets, small GPUs)
GROUPS_SPECS = {
    "tiny-tight": """
        name: gtiny
        model: {num_layers: 8, hidden_size: 2048, ffn_hidden_size: 5632, num_attention_heads: 16, num_kv_heads: 4,
                vocab_size: 32000}
        training: {tokens: 20B, sequence_length: 4096, global_batch: 64}
        cluster: {gpu: a100-40gb, max_gpus: 16}
        budget: {max_cost: $9000, objective: cheapest}
        targets: [megatron]
    """,
    "llama-70b-cheapest": """
        name: gbig
        model: {preset: llama3-70b}
        training: {tokens: 300B, sequence_length: 4096, global_batch: 256}
        cluster: {gpu: h100-sxm, max_gpus: 128}
        budget: {objective: cheapest}
        targets: [megatron]
    """,
    "mixtral-nvfp4-cheapest": """
        name: gnv
        model: {preset: mixtral-8x7b}
        training: {tokens: 100B, sequence_length: 4096, global_batch: 128, precision: nvfp4}
        cluster: {gpu: b200, max_gpus: 32}
        budget: {objective: cheapest}
        targets: [megatron]
    """,
    "llama-8b-fastest": """
        name: gllama
        model: {preset: llama3-8b}
        training: {tokens: 100B, sequence_length: 8192, global_batch: 64, global_batch_tolerance: 0.1}
        cluster: {gpu: h100-sxm, max_gpus: 32}
        budget: {objective: fastest}
        targets: [megatron, fsdp]
    """,
}


@pytest.mark.parametrize("name", sorted(GROUPS_SPECS))
def test_groups_bound_below_every_feasible_layout(name: str) -> None:
    from compiler.solver import feasibility as F
    from compiler.solver.objective import objective_key
    from compiler.solver.search import _Search, _search_evaluate

    problem = lower(load_spec_text(textwrap.dedent(GROUPS_SPECS[name]), f"{name}.yaml"))
    search = _Search(problem, 0, _search_evaluate)
    space = search.space
    rng = random.Random(7)
    shapes = [s for s in space.shapes().shapes if space.inner_count(s)]
    checked = infeasible = 0
    for shape in rng.sample(shapes, min(20, len(shapes))):
        lb = search.groups_lb(shape)
        stages = search.stages_lb(shape)  # no threshold: memory asked for every vpp
        fastest = search.fastest_lb(shape)  # the refinement before stages_lb: never above it
        assert fastest <= stages * (1 + 1e-12), (shape, fastest, stages)
        layouts = list(space.layouts_of(shape))
        for layout in rng.sample(layouts, min(60, len(layouts))):
            if layout.schedule == "interleaved_1f1b" and layout.grad_accum % layout.pp:
                continue
            if not search.supported(layout, object()):  # a fresh key: no cached verdict
                continue
            est = _search_evaluate(problem, layout)
            if not isinstance(est, Estimate) or F.check_estimate(problem, est) is not None:
                infeasible += 1
                continue
            key = objective_key(problem, est)
            assert lb <= key * (1 + 1e-9) and stages <= key * (1 + 1e-9), (layout.tag, lb, stages, key)
            assert fastest <= key * (1 + 1e-9), (layout.tag, fastest, key)
            checked += 1
    assert checked >= 10 and infeasible >= 3, (checked, infeasible)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_stage_time_per_token_falls_with_the_micro_batch(name: str) -> None:
    """Each piece of a stage (a dense or MoE layer, the first / last stage's extras) takes no more time per token
    at a larger micro-batch, with or without recompute, so neither does any stage nor the bottleneck stage: the
    premise of gpu_s_per_token_lb and stage_gpu_s_per_token_lb (they cost the largest micro-batch allowed)."""
    problem = _problem(name)
    space = Space(problem)
    bounds = Bounds(problem)
    rng = random.Random(3)
    kinds = ("dense", "moe", "first", "last") if problem.shape.moe else ("dense", "first", "last")
    checked = 0
    for shape in rng.sample(space.shapes().shapes, 8):
        for sp in space.sp_choices(shape.tp, shape.cp):
            for rc in space.recompute_choices():
                for kind in kinds:
                    per_token = [sum(bounds._unit_fb(shape, mb, sp, rc, kind)) / mb for mb in range(1, 17)]
                    assert all(b <= a * (1 + 1e-12) for a, b in zip(per_token, per_token[1:])), (kind, per_token)
                    checked += 1
    assert checked >= 24


@pytest.mark.parametrize("name", sorted(GROUPS_SPECS))
def test_groups_bound_is_the_least_key_of_the_layouts_that_may_fit(name: str) -> None:
    """Without a threshold, groups_lb is exactly the least layout-bound key (Bounds.layout_step_lb, what explore
    prunes by) over the options whose memory bound fits, of the shape's groups (vpp, micro-batch, grad_accum,
    recompute) whose group memory bound fits and whose step bound keeps the budget and deadline: every group and
    option asked here, where groups_lb takes the groups best first, leaves out by a bisection on the family's memory
    bound the micro-batches that cannot fit, and asks a group's options only when its own key is the least left."""
    from compiler.solver.objective import key_lb_from_step
    from compiler.solver.search import RECOMPUTE_MODES, _Search, _search_evaluate

    problem = lower(load_spec_text(textwrap.dedent(GROUPS_SPECS[name]), f"{name}.yaml"))
    search = _Search(problem, 0, _search_evaluate)
    space, bounds = search.space, search.bounds
    rng = random.Random(11)
    shapes = [s for s in space.shapes().shapes if space.inner_count(s)]
    finite = 0
    for shape in rng.sample(shapes, min(25, len(shapes))):
        pricing = search._pricing[shape.option]
        sps = space.sp_choices(shape.tp, shape.cp)
        rcs = tuple(rc for rc in RECOMPUTE_MODES if rc in space.recompute_choices())
        usable = bounds.usable_bytes(shape)
        scheds: dict[int, list[str]] = {}
        for sched, vpp in space.pipeline_choices(shape.pp):
            if search.num_options(shape, sched, vpp):
                scheds.setdefault(vpp, []).append(sched)
        want = float("inf")
        for vpp, names in scheds.items():
            for mb, ga in space.batch_choices(shape.dp):
                if names[0] == "interleaved_1f1b" and ga % shape.pp:
                    continue
                for rc in rcs:
                    step = bounds.group_step_lb(shape, names[0], vpp, mb, ga, rc, sps)
                    if search._limits_broken(pricing, step, mb * ga * shape.dp, shape.world):
                        continue
                    if not any(bounds.group_memory_lb(shape, sched, vpp, mb, ga, rc, search.options(shape, sched, vpp))
                               * search.memory_factor <= usable for sched in names):
                        continue
                    for sched in names:
                        for sp, sh in search.options(shape, sched, vpp):
                            if bounds.option_memory_lb(shape, sched, vpp, mb, ga, rc, sp, sh) * search.memory_factor \
                                    > usable:
                                continue
                            layout_step = bounds.layout_step_lb(
                                shape, sched, vpp, mb, ga, sh, bounds.group_stage_fb(shape, vpp, mb, rc, (sp,)),
                                lambda: space.layout(shape, sched, vpp, sh, mb, ga, rc, sp))
                            if search._limits_broken(pricing, layout_step, mb * ga * shape.dp, shape.world):
                                continue
                            key = key_lb_from_step(problem, pricing, layout_step, mb * ga * shape.dp, shape.world)
                            want = min(want, key * search.shape_floor(shape))
        got = _Search(problem, 0, _search_evaluate).groups_lb(shape)
        assert got == pytest.approx(want, rel=1e-12) or got == want == float("inf"), (shape, got, want)
        finite += want < float("inf")
    assert finite >= 5, finite


@pytest.mark.parametrize("name", sorted(GROUPS_SPECS))
def test_groups_bound_stopped_short_resumes_to_the_same_minimum(name: str) -> None:
    """groups_lb with a ``stop`` (what the search passes: the next shape's key) returns at once when its least key
    left passes it, a lower bound above ``stop`` that is not final, and resumes its walk on the next call: raising
    the stop step by step ends at the exact minimum a single call finds, and a value never falls on the way."""
    from compiler.solver.search import _Search, _search_evaluate

    problem = lower(load_spec_text(textwrap.dedent(GROUPS_SPECS[name]), f"{name}.yaml"))
    fresh, stepped = _Search(problem, 0, _search_evaluate), _Search(problem, 0, _search_evaluate)
    space = fresh.space
    rng = random.Random(13)
    shapes = [s for s in space.shapes().shapes if space.inner_count(s)]
    stopped = 0
    for shape in rng.sample(shapes, min(25, len(shapes))):
        want = fresh.groups_lb(shape)
        stop, seen = 0.0, []
        while True:
            got = stepped.groups_lb(shape, stop=stop)
            final = stepped._groups[shape][1]
            seen.append(got)
            if final:
                break
            assert got > stop, (shape, got, stop)
            stopped += 1
            stop = got * 1.0001
        assert seen == sorted(seen), (shape, seen)
        assert seen[-1] == pytest.approx(want, rel=1e-12) or seen[-1] == want == float("inf"), (shape, seen, want)
        assert shape not in stepped._group_walks  # a finished walk is let go
    assert stopped >= 5, stopped


@pytest.mark.parametrize("name", sorted(SPECS))
def test_one_micro_batch_activations_are_proportional_to_it(name: str) -> None:
    """One micro-batch's activations of a stage are its micro-batch x those at micro-batch 1, for every recompute
    mode and sequence-parallel setting: what FamilyMemory.linear_fit assumes for its guess (the search's bisection
    checks the guess with the bound itself, so this keeps the guess good, not the bound valid)."""
    problem = _problem(name)
    space = Space(problem)
    bounds = Bounds(problem)
    rng = random.Random(5)
    checked = 0
    for shape in rng.sample(space.shapes().shapes, 6):
        for sp in space.sp_choices(shape.tp, shape.cp):
            for rc in space.recompute_choices():
                for sl in bounds.distinct(shape.pp, 1):
                    def per_mb(mb: int) -> float:
                        layout = bounds._probe(shape, pp=shape.pp, mb=mb, rc=rc, sp=sp)
                        return cm.stage_activation_bytes(bounds.setup(shape.option, layout), sl)
                    one = per_mb(1)
                    for mb in (2, 3, 7, 16):
                        assert per_mb(mb) == pytest.approx(mb * one, rel=1e-12), (shape, sp, rc, sl, mb)
                    checked += 1
    assert checked >= 12


def test_first_fitting_is_the_bisection_of_the_family_bound() -> None:
    """_first_fitting (a bisection pivoted at FamilyMemory.linear_fit's guess) finds what a plain scan of the
    family memory bound finds: the first micro-batch (largest first) whose bound fits, within every range."""
    from compiler.solver.search import RECOMPUTE_MODES, _Search, _search_evaluate

    inside = checked = 0
    for name in sorted(GROUPS_SPECS):
        problem = lower(load_spec_text(textwrap.dedent(GROUPS_SPECS[name]), f"{name}.yaml"))
        search = _Search(problem, 0, _search_evaluate)
        shapes = [s for s in search.space.shapes().shapes if search.space.inner_count(s)]
        for shape in random.Random(13).sample(shapes, min(30, len(shapes))):
            got = _check_first_fitting(search, shape, RECOMPUTE_MODES)
            checked += got[0]
            inside += got[1]
    assert checked >= 100 and inside >= 10, (checked, inside)


def _check_first_fitting(search, shape, modes: tuple[str, ...]) -> tuple[int, int]:
    """(ranges checked, those whose answer is inside) for the first pipeline choice of ``shape`` with options."""
    space, bounds = search.space, search.bounds
    inside = checked = 0
    usable = bounds.usable_bytes(shape)
    for sched, vpp in space.pipeline_choices(shape.pp):
        opts = search.options(shape, sched, vpp)
        if not opts:
            continue
        every_ga = search._micro_batches(shape.dp, shape.pp if sched == "interleaved_1f1b" else 1)[2]
        if not every_ga:
            continue
        pipes = ((sched, opts),)
        family = bounds.family_memory(shape, vpp, pipes)
        fewest = bounds.family_inflight(shape, vpp, pipes, every_ga)
        mbs = search._micro_batches(shape.dp, 1)[0]
        for rc in modes:
            if rc not in space.recompute_choices():
                continue
            fits = [family.lb(mb, every_ga, rc, fewest) * search.memory_factor <= usable for mb in mbs]
            for end in {len(mbs), len(mbs) // 2, 1}:
                want = next((i for i in range(end) if fits[i]), end)
                assert search._first_fitting(family, mbs, every_ga, rc, fewest, usable, end) == want, \
                    (shape, sched, vpp, rc, end)
                # the guess only pivots the bisection: a wrong one finds the same
                for guess in (0.0, 0.5, float("inf"), *(mbs[i] * f for i in range(0, len(mbs), 3) for f in (1, 1.5))):
                    assert search._first_fitting(_Guessing(family, guess), mbs, every_ga, rc, fewest, usable,
                                                 end) == want, (shape, sched, vpp, rc, end, guess)
                inside += 0 < want < end
                checked += 1
        break
    return checked, inside


class _Guessing:
    """A family memory bound whose linear_fit guess is ``guess``."""

    def __init__(self, family, guess: float):
        self.family, self.guess = family, guess

    def lb(self, *args):
        return self.family.lb(*args)

    def linear_fit(self, *args) -> float:
        return self.guess
