"""The targets' support rules (compiler/targets/<name>/support.py): one rule per case, and the solver's cache key."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.targets import registry
from compiler.targets.support import support_key, target_reason, unsupported_reasons
from compiler.layout import Layout
from compiler.rules import Knobs


def L(**kw) -> Layout:
    base = dict(gpu="h100-sxm", gpus_per_node=8, tp=1, pp=1, cp=1, ep=1, dp_replicate=1, dp_shard=8, zero_stage=1,
                micro_batch=1, grad_accum=8)
    base.update(kw)
    return Layout(**base)


def reason(target: str, precision: str = "bf16", **kw) -> str | None:
    hit = target_reason(target, Knobs.of(L(**kw)), precision)
    return None if hit is None else hit[1]


@pytest.mark.parametrize("kw,needle", [
    (dict(cp=2, dp_shard=4), "context parallel"),
    (dict(ep=2), "expert parallel"),
    (dict(tp=2, sequence_parallel=True, dp_shard=4), "sequence parallel"),
    (dict(pp=2, zero_stage=2, dp_shard=4), "ZeRO stage 0 or 1"),
    (dict(pp=2, dp_shard=4, schedule="gpipe"), "1F1B"),
    (dict(pp=2, dp_shard=4, vpp=2, schedule="interleaved_1f1b"), "virtual stages"),
    (dict(pp=2, tp=2, dp_shard=2), "AutoTP"),
    (dict(tp=2, zero_stage=3, dp_shard=4), "ZeRO stage 0-2"),
    (dict(zero_stage=2, dp_replicate=2, dp_shard=4), "hpZ"),
    (dict(zero_stage=1, offload_optimizer="nvme"), "NVMe"),
])
def test_deepspeed_rules(kw, needle) -> None:
    r = reason("deepspeed", **kw)
    assert r is not None and needle in r


def test_deepspeed_runs() -> None:
    for kw in (dict(), dict(zero_stage=3, dp_replicate=2, dp_shard=4), dict(pp=2, dp_shard=4),
               dict(tp=2, zero_stage=2, dp_shard=4), dict(zero_stage=3, offload_optimizer="nvme", offload_params="cpu")):
        assert reason("deepspeed", **kw) is None, kw
    # ZeRO-0 accumulates fp32 gradients only for fp32 parameters (engine.py _do_optimizer_sanity_check raises for
    # bf16 with an fp32 grad_accum_dtype: the CPU smoke of a ZeRO-0 plan failed with it)
    z0 = dict(zero_stage=0, dp_shard=1, dp_replicate=8)
    assert "unsupported mix of model_dtype and grad_accum_dtype" in reason("deepspeed", **z0)
    assert reason("deepspeed", precision="fp32", **z0) is None
    assert "fp8" in reason("deepspeed", precision="fp8")
    assert "nvfp4" in reason("deepspeed", precision="nvfp4") and "nvfp4" in reason("fsdp", precision="nvfp4")
    assert reason("megatron", precision="nvfp4") is None


@pytest.mark.parametrize("kw,ok", [
    (dict(zero_stage=1), False),
    (dict(zero_stage=2), True),
    (dict(zero_stage=3, dp_replicate=2, dp_shard=4), True),
    (dict(zero_stage=0, dp_shard=1, dp_replicate=8), True),
    (dict(zero_stage=3, offload_optimizer="cpu", offload_params="cpu"), True),
    (dict(zero_stage=3, offload_optimizer="cpu"), False),
    (dict(zero_stage=3, offload_params="cpu"), False),
    (dict(zero_stage=3, offload_optimizer="nvme", offload_params="nvme"), False),
    (dict(zero_stage=3, pp=2, dp_shard=4, schedule="gpipe"), True),
    (dict(zero_stage=2, cp=2, dp_shard=4, tp=2, sequence_parallel=True), True),
    (dict(zero_stage=2, ep=2), False),
])
def test_fsdp_rules(kw, ok) -> None:
    assert (reason("fsdp", **kw) is None) == ok, reason("fsdp", **kw)


@pytest.mark.parametrize("kw,ok", [
    (dict(zero_stage=1, dp_replicate=2, dp_shard=4), True),  # --num-distributed-optimizer-instances
    (dict(zero_stage=3), True),  # Megatron-FSDP
    (dict(zero_stage=3, pp=2, dp_shard=4), False),
    (dict(zero_stage=1, pp=2, dp_shard=4, schedule="gpipe"), False),
    (dict(zero_stage=1, pp=4, dp_shard=2, vpp=2, schedule="interleaved_1f1b"), True),
    (dict(zero_stage=1, offload_optimizer="cpu"), True),
    (dict(zero_stage=2, offload_optimizer="cpu"), False),
    (dict(zero_stage=3, offload_params="cpu"), False),
    (dict(ep=8, cp=1), True),
])
def test_megatron_rules(kw, ok) -> None:
    assert (reason("megatron", **kw) is None) == ok, reason("megatron", **kw)


def test_only_the_spec_targets_are_asked() -> None:
    layout = L(zero_stage=1, cp=2, dp_shard=4)
    got, field = unsupported_reasons(("megatron", "fsdp", "slurm"), "bf16", Knobs.of(layout))
    assert set(got) == {"fsdp"} and field == "zero_stage"
    assert registry.get("slurm").support == ()


layouts = st.builds(
    lambda tp, pp, cp, dpr, dps, zero, sched, vpp, sp, oo, op: L(
        tp=tp, pp=pp, cp=cp, dp_replicate=dpr, dp_shard=dps if zero else 1, zero_stage=zero,
        schedule=("interleaved_1f1b" if vpp > 1 else sched) if pp > 1 else "1f1b", vpp=vpp if pp > 1 else 1,
        sequence_parallel=sp and tp > 1, offload_optimizer=oo if zero else "none",
        offload_params=op if zero == 3 else "none"),
    st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 3]), st.sampled_from([1, 2]), st.sampled_from([1, 2]),
    st.sampled_from([1, 2, 4]), st.sampled_from([0, 1, 2, 3]), st.sampled_from(["gpipe", "1f1b"]),
    st.sampled_from([1, 2, 3]), st.booleans(), st.sampled_from(["none", "cpu", "nvme"]),
    st.sampled_from(["none", "cpu", "nvme"]))


def _scaled(a: Layout) -> Layout:
    """The same layout with every degree that is > 1 made larger: support_key does not change."""
    up = lambda x, k=2: x * k if x > 1 else x  # noqa: E731
    return a.with_(tp=up(a.tp), pp=a.pp + 1 if a.pp > 1 else 1, cp=up(a.cp), dp_replicate=up(a.dp_replicate),
                   dp_shard=up(a.dp_shard), vpp=a.vpp + 1 if a.vpp > 1 else 1, gpus_per_node=16)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(layouts, st.sampled_from(["bf16", "fp8"]))
def test_support_key_decides_support(a: Layout, precision: str) -> None:
    """The solver caches support per support_key: equal keys must mean equal answers, per target."""
    b = _scaled(a)
    assert support_key(a) == support_key(b)
    for target in registry.names():
        assert (target_reason(target, Knobs.of(a), precision) is None) == \
            (target_reason(target, Knobs.of(b), precision) is None), target
