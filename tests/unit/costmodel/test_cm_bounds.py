"""The solver's pruning bounds never exceed the full estimate, for any completion of a partial layout."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.costmodel import evaluate, memory_lower_bound_bytes, step_time_lower_bound_s
from compiler.estimate import Estimate

from cm_helpers import make_layout, make_problem

PROBLEMS = {
    "dense": make_problem("llama3-8b", num_gpus=16, gbs=64),
    "moe": make_problem("mixtral-8x7b", num_gpus=16, gbs=64),
}
KNOBS = ("tp", "pp", "cp", "ep", "dp_shard", "zero_stage", "micro_batch", "recompute", "sequence_parallel",
         "offload_optimizer", "offload_params")


@st.composite
def layouts(draw):
    name = draw(st.sampled_from(sorted(PROBLEMS)))
    p = PROBLEMS[name]
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    cp = draw(st.sampled_from([1, 2]))
    dp = 16 // (tp * pp * cp) if 16 % (tp * pp * cp) == 0 else None
    if not dp:
        tp, pp, cp, dp = 2, 2, 1, 4
    zero = draw(st.integers(0, 3))
    shard = dp if zero else 1
    ep = draw(st.sampled_from([e for e in (1, 2, 4, 8) if (dp * cp) % e == 0])) if name == "moe" else 1
    mb = draw(st.sampled_from([1, 2]))
    ga = max(1, p.global_batch // (mb * dp))
    if pp > 1 and ga % pp:
        ga = pp
    lay = make_layout(p, tp=tp, pp=pp, cp=cp, ep=ep, dp_replicate=dp // shard, dp_shard=shard, zero_stage=zero,
                      micro_batch=mb, grad_accum=ga, recompute=draw(st.sampled_from(["none", "selective", "full"])),
                      sequence_parallel=tp > 1 and draw(st.booleans()),
                      offload_optimizer=draw(st.sampled_from(["none", "cpu"])) if zero else "none",
                      offload_params="cpu" if zero == 3 and draw(st.booleans()) else "none")
    known = draw(st.sets(st.sampled_from(KNOBS)))
    return p, lay, known


@settings(max_examples=60, deadline=None, derandomize=True)
@given(layouts())
def test_bounds_hold_for_every_completion(case):
    p, lay, known = case
    est = evaluate(p, lay, check_memory=False, pipeline_events=False)
    assert isinstance(est, Estimate)
    gpu = p.gpu_options[0]
    partial = {k: getattr(lay, k) for k in known}
    assert memory_lower_bound_bytes(p, gpu, num_gpus=16, **partial) <= est.memory.total_bytes_per_gpu
    assert step_time_lower_bound_s(p, gpu, num_gpus=16, global_batch=lay.global_batch) <= est.step_time_s


def test_bounds_are_useful_when_everything_is_known():
    """Fully pinned, the memory bound is within a small factor of the estimate (it keeps model states)."""
    p = PROBLEMS["dense"]
    lay = make_layout(p, tp=2, pp=2, dp_shard=4, zero_stage=1, recompute="full")
    est = evaluate(p, lay, check_memory=False)
    knobs = {k: getattr(lay, k) for k in KNOBS}
    bound = memory_lower_bound_bytes(p, p.gpu_options[0], num_gpus=16, **knobs)
    assert 0.3 * est.memory.total_bytes_per_gpu < bound <= est.memory.total_bytes_per_gpu
    assert step_time_lower_bound_s(p, p.gpu_options[0], num_gpus=16) > 0.2 * est.step_time_s
