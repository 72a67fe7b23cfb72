"""The search space: divisor generators, GPU counts, pins and counts (the split: tests/unit/test_split.py)."""
from __future__ import annotations

import textwrap

import pytest

from compiler.layout import Layout
from compiler.problem import lower
from compiler.solver import feasibility as F
from compiler.arith import GpuCounts, batch_range, divisors, grad_accum_for, grad_accums_for
from compiler.solver.candidates import Space, count_layouts, enumerate_layouts
from compiler.spec.load import load_spec_text


def problem(extra: str = "", *, cluster: str = "{gpu: h100-sxm, num_gpus: 16}", batch: int = 32,
            model: str = "{preset: llama3-8b}", tol: float = 0.0):
    text = textwrap.dedent(f"""\
        name: t
        model: {model}
        training: {{tokens: 1T, sequence_length: 4096, global_batch: {batch}, global_batch_tolerance: {tol}}}
        cluster: {cluster}
        targets: [megatron]
        """) + textwrap.dedent(extra)
    return lower(load_spec_text(text, "t.yaml"))


def test_divisors() -> None:
    assert divisors(1) == (1,)
    assert divisors(12) == (1, 2, 3, 4, 6, 12)
    assert divisors(1953) == (1, 3, 7, 9, 21, 31, 63, 93, 217, 279, 651, 1953)


def test_gpu_counts() -> None:
    c = GpuCounts(1, 1024, 8, None)
    assert (c.lo, c.hi, c.step) == (8, 1024, 8) and 16 in c and 12 not in c and 1032 not in c
    assert c.count_multiples_of(3) == len([n for n in range(8, 1025, 8) if n % 3 == 0])
    small = GpuCounts(1, 4, 8, None)  # the spec asks for less than a node
    assert 3 in small and 5 not in small
    assert 24 in GpuCounts(1, 1, 8, 24) and 16 not in GpuCounts(1, 1, 8, 24)


def test_grad_accum_with_tolerance() -> None:
    assert grad_accum_for(1000, 0.0, 8, 1) == 125
    assert grad_accum_for(1000, 0.0, 16, 1) is None
    assert grad_accum_for(1000, 0.05, 16, 1) == 62  # 992, closest to 1000 (1008 is as close: lower wins)
    assert grad_accum_for(1000, 0.001, 16, 1) is None
    for batch, tol, dp in ((1000, 0.0, 8), (1000, 0.05, 16), (977, 0.3, 6), (10_000_000, 0.5, 5120), (50, 0.9, 7),
                           (3, 2.0, 4)):
        lo, hi = batch_range(batch, tol)
        want = []
        for mb in range(1, 300):  # by brute force: every grad_accum in range, the closest (the smaller on a tie)
            reach = [ga for ga in range(1, hi // (dp * mb) + 1) if lo <= ga * dp * mb <= hi]
            if reach:
                want.append((mb, min(reach, key=lambda ga: (abs(ga * dp * mb - batch), ga))))
        assert grad_accums_for(batch, tol, dp, range(1, 300)) == want, (batch, tol, dp)
        assert [(mb, grad_accum_for(batch, tol, dp, mb)) for mb in range(1, 300)
                if grad_accum_for(batch, tol, dp, mb) is not None] == want


def test_enumeration_obeys_every_structural_rule() -> None:
    p = problem()
    layouts = list(enumerate_layouts(p))
    assert len(layouts) == count_layouts(p) > 1000
    for layout in layouts[::37]:
        assert F.check_structure(p, layout) is None, layout.tag
    assert {l.world_size for l in layouts} == {16}
    assert {l.tp for l in layouts} == {1, 2, 4, 8}  # divides 32 heads and 8 KV heads, within a node


def test_structural_checks_name_the_rule() -> None:
    p = problem()
    base = dict(gpu="h100-sxm", gpus_per_node=8, tp=2, pp=2, cp=1, ep=1, dp_replicate=4, dp_shard=1, zero_stage=0,
                micro_batch=1, grad_accum=8)
    assert F.check_structure(p, Layout(**base)) is None
    cases = [
        (F.TP_NOT_DIVISOR, dict(tp=16, pp=1, dp_replicate=1, grad_accum=32)),
        (F.TP_NOT_DIVISOR, dict(tp=3, pp=1, dp_replicate=1, grad_accum=32, gpus_per_node=3)),
        (F.GPU_COUNT_NOT_ALLOWED, dict(dp_replicate=2, grad_accum=16)),
        (F.BATCH_NOT_DIVISIBLE, dict(grad_accum=3)),
        (F.NOT_CANONICAL, dict(zero_stage=1)),
        (F.CP_NOT_DIVISOR, dict(cp=3, tp=1, pp=1, dp_replicate=1, grad_accum=32, gpus_per_node=3)),
        (F.PP_SPLIT_INVALID, dict(pp=16, tp=1, dp_replicate=1, grad_accum=32, vpp=3,
                                  schedule="interleaved_1f1b")),
    ]
    for code, change in cases:
        r = F.check_structure(p, Layout(**{**base, **change}))
        assert r is not None and r.code in (code, F.GPU_COUNT_NOT_ALLOWED, F.GPU_NOT_OFFERED), (code, r)
    for code, change in cases[2:5]:
        assert F.check_structure(p, Layout(**{**base, **change})).code == code


def test_pins_cut_the_space() -> None:
    free = problem()
    pinned = problem("layout: {tensor_parallel: 4, zero_stage: 1, recompute: selective, sequence_parallel: true}\n")
    layouts = list(enumerate_layouts(pinned))
    assert 0 < len(layouts) < count_layouts(free)
    assert all((l.tp, l.zero_stage, l.recompute, l.sequence_parallel) == (4, 1, "selective", True) for l in layouts)


def test_batch_not_divisible_is_tallied_per_shape() -> None:
    p = problem(batch=977, cluster="{gpu: h100-sxm, num_gpus: 16}")  # a prime batch: dp must be 1
    space = Space(p).shapes()
    assert {s.dp for s in space.shapes} == {1}
    assert space.rejected_shapes[F.BATCH_NOT_DIVISIBLE] > 0


def test_tolerance_admits_more_data_parallel_degrees() -> None:
    exact = Space(problem(batch=977, cluster="{gpu: h100-sxm, max_gpus: 64}")).shapes()
    loose = Space(problem(batch=977, cluster="{gpu: h100-sxm, max_gpus: 64}", tol=0.05)).shapes()
    assert {s.dp for s in exact.shapes} == {1}
    assert {2, 4, 8, 16, 32, 64} <= {s.dp for s in loose.shapes}


def test_moe_expert_parallel_is_carved_out_of_dp_x_cp() -> None:
    """With etp = tp (None) ep divides dp x cp; with etp = 1 (Megatron only, ep > 1) ep divides tp x dp x cp."""
    p = problem(model="{preset: mixtral-8x7b}", cluster="{gpu: h100-sxm, num_gpus: 32}", batch=64)
    shapes = Space(p).shapes().shapes
    assert any(s.ep == 8 for s in shapes)
    assert any(s.etp == 1 and (s.dp * s.cp) % s.ep for s in shapes)  # only the expert fold makes these legal
    for s in shapes:
        assert 8 % s.ep == 0 and s.world == 32
        if s.etp is None:
            assert (s.dp * s.cp) % s.ep == 0
        else:
            assert s.etp == 1 < s.tp and s.ep > 1 and (s.tp * s.dp * s.cp) % s.ep == 0


def test_expert_tensor_parallel_is_searched_only_where_every_target_runs_it() -> None:
    """The torch targets split experts by tp (their support rules refuse another etp): a problem that also names
    one (no spec does today: they build no MoE model) searches etp = tp only."""
    import dataclasses

    from compiler.rules import Knobs
    from compiler.targets.support import unsupported_reasons

    p = problem(model="{preset: mixtral-8x7b}", cluster="{gpu: h100-sxm, num_gpus: 32}", batch=64)
    reasons = unsupported_reasons(("megatron", "fsdp", "deepspeed"), "bf16", Knobs(tp=2, etp=1, ep=1))[0]
    assert set(reasons) == {"fsdp", "deepspeed"} and all("etp=1" in r for r in reasons.values())
    both = dataclasses.replace(p, targets=("megatron", "fsdp"))
    assert all(s.etp is None for s in Space(both).shapes().shapes)
    assert any(s.etp == 1 for s in Space(p).shapes().shapes)


def test_rules_reading_skips_only_rules_that_cannot_fire() -> None:
    """The generators check partial knobs against ``rules.rules_reading`` only: a rule none of whose knobs is
    set must break nothing, and the subset must give the same verdict as every rule on sampled knobs."""
    import random
    from pathlib import Path

    from compiler import rules
    from compiler.spec.load import load_spec

    facts = lower(load_spec(Path(__file__).resolve().parents[3] / "specs" / "mixtral-8x7b.yaml")).facts
    for rule in rules.RULES:
        if rule.code != rules.FRAMEWORK_UNSUPPORTED:
            assert rule.check(facts, rules.Knobs()) is None, rule.code
    values = {"tp": [1, 2, 3, 8, 16], "pp": [1, 2, 5], "vpp": [1, 2, 3], "schedule": ["1f1b", "interleaved_1f1b"],
              "cp": [1, 2, 3], "ep": [1, 2, 3], "dp": [1, 2, 6], "dp_shard": [1, 2, 4], "zero_stage": [0, 1, 3],
              "micro_batch": [1, 3], "grad_accum": [1, 2, 7], "sequence_parallel": [False, True],
              "offload_optimizer": ["none", "nvme"], "offload_params": ["none", "cpu"], "gpus_per_node": [4, 8]}
    rng = random.Random(7)
    names = sorted(values)
    fired = 0
    for _ in range(600):
        chosen = rng.sample(names, rng.randint(1, 4))
        knobs = rules.Knobs(**{n: rng.choice(values[n]) for n in chosen})
        full = rules.first_violation(facts, knobs, codes=F.STRUCTURAL_CODES)
        subset = rules.rules_reading(frozenset(chosen), F.STRUCTURAL_CODES)
        assert rules.first_violation_of(facts, subset, knobs) == full, knobs
        fired += full is not None
    assert fired > 50  # the sample does break rules


def test_legal_rows_says_what_each_rows_own_question_says() -> None:
    """rules.legal_rows (asked once per dp by batch_choices and sharding_groups) against first_violation_of asked
    row by row with Knobs.partial: the same rows, for knobs that break a rule reading only the fixed ones (ep on a
    dense model), one reading the rows (the batch, the shard group), and several at once."""
    from compiler import rules

    p = problem(tol=0.25, batch=64)
    facts, codes = p.facts, F.STRUCTURAL_CODES

    def one_by_one(fixed: dict, names: tuple, rows: list) -> list:
        return [row for row in rows if rules.first_violation_of(
            facts, rules.rules_reading(frozenset(fixed) | frozenset(names), codes),
            rules.Knobs.partial(**fixed, **dict(zip(names, row)))) is None]

    batch_rows = [(mb, ga) for mb in range(1, 9) for ga in range(1, 40)]
    shard_rows = [(d, z) for z in range(4) for d in range(1, 13)]
    three = [(mb, ga, d) for mb in (1, 2, 3) for ga in (8, 16, 21, 32) for d in (1, 2, 3, 4)]
    cases = [({"dp": dp}, ("micro_batch", "grad_accum"), batch_rows) for dp in (1, 2, 3, 4, 6)]
    cases += [({"dp": dp}, ("dp_shard", "zero_stage"), shard_rows) for dp in (1, 4, 6, 12)]
    cases += [({"dp": 4, "ep": 2, "cp": 1}, ("micro_batch", "grad_accum"), batch_rows),  # ep on a dense model
              ({"dp": 2}, ("micro_batch", "grad_accum", "dp_shard"), three)]
    for fixed, names, rows in cases:
        got = rules.legal_rows(facts, codes, fixed, names, rows)
        assert got == one_by_one(fixed, names, rows), (fixed, names)
    assert rules.legal_rows(facts, codes, {"dp": 4, "ep": 2, "cp": 1}, ("micro_batch", "grad_accum"), batch_rows) == []
    assert 0 < len(rules.legal_rows(facts, codes, {"dp": 4}, ("micro_batch", "grad_accum"), batch_rows)) < len(batch_rows)
    with pytest.raises(TypeError):
        rules.legal_rows(facts, codes, {"dp": 4}, ("micro_batches",), [(1,)])


@pytest.mark.parametrize("extra", ["", "layout: {zero_stage: 3}", "layout: {data_parallel_shard: 4}",
                                   "layout: {offload_optimizer: cpu}"])
def test_sharding_counts_kept_per_signature_equal_each_dps_own(extra: str) -> None:
    """Space keeps a dp's sharding counts per (number of divisors, dp == 1) (the search counts every dp of a 16K-GPU
    space): each dp's counts, from a Space that has seen many other dps, equal its own choices counted afresh."""
    p = problem(extra, cluster="{gpu: h100-sxm, max_gpus: 512}", batch=4096, tol=0.5)
    shared = Space(p)
    for dp in range(1, 257):
        shared.class_counts(dp), shared.sharding_count(dp)
    for dp in range(1, 257):
        choices = shared.choice_classes(dp)  # (this dp's own, listed: class numbers are the Space's)
        cids = tuple(dict.fromkeys(cid for cid, _ in choices))
        want = (cids, tuple(sum(1 for c, _ in choices if c == cid) for cid in cids))
        assert shared.class_counts(dp) == want, dp
        assert shared.sharding_count(dp) == len(shared.sharding_choices(dp)) == len(choices), dp


def test_batch_rows_meet_the_batch_rule_by_construction() -> None:
    """batch_choices asks no rule row by row while the batch rule is the only one that reads (micro_batch,
    grad_accum): every row it lists is one the rules accept."""
    from compiler import rules

    for tol, batch in ((0.0, 4096), (0.3, 1000), (0.5, 10_000_000)):
        space = Space(problem(cluster="{gpu: h100-sxm, max_gpus: 512}", batch=batch, tol=tol))
        assert not space._check_batch_rows
        for dp in (1, 2, 3, 8, 24, 64, 100, 512):
            rows = space.batch_choices(dp)
            assert rows == tuple(rules.legal_rows(space.facts, F.STRUCTURAL_CODES, {"dp": dp},
                                                  ("micro_batch", "grad_accum"), rows)), (tol, dp)
