"""A layout is costed for every framework target a spec names: the cost facts live with each target
(compiler/targets/<name>/cost.py) and the renderers write the same values; plan.json records each target's
figures, PLAN.md and `dtc estimate` show them where they differ."""
from __future__ import annotations

import json

import pytest

from compiler.plan import Plan
from compiler.targets import registry
from helpers import REPO, run_cli

MULTI = REPO / "generated" / "llama2-7b-8xh100"  # targets: deepspeed, fsdp, megatron, slurm


def _plan(folder) -> Plan:
    return Plan.from_json((folder / "plan.json").read_text())


def test_every_framework_target_has_a_cost_profile_and_launchers_none() -> None:
    for target in registry.targets():
        if target.launches_others:
            assert target.cost is None, target.name
        else:
            assert target.cost is not None and target.cost.name == target.name, target.name
            assert target.cost.source


def test_the_fsdp_renderer_writes_the_reduce_dtype_the_cost_model_reads() -> None:
    cost = registry.get("fsdp").cost
    config = json.loads((MULTI / "fsdp_config.json").read_text())
    want = {"fp32": "float32", "bf16": "bfloat16"}[cost.grad_reduce_dtype]
    assert config["reduce_dtype"] == want


def test_the_deepspeed_renderer_writes_the_gradient_dtypes_the_cost_model_reads() -> None:
    cost = registry.get("deepspeed").cost
    config = json.loads((MULTI / "ds_config.json").read_text())
    assert config["data_types"]["grad_accum_dtype"] == cost.grad_dtype
    assert config["communication_data_type"] == cost.grad_reduce_dtype
    assert cost.grad_dtype == "fp32"  # dtc's trainer keeps fp32 gradients (issue #13), and is costed so


@pytest.mark.parametrize("generation, flags", [
    ("hopper", ["--fp8-format", "hybrid", "--fp8-recipe", "delayed"]),
    ("blackwell", ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"]),
])
def test_the_megatron_renderer_emits_the_fp8_recipe_the_cost_model_costs(generation, flags) -> None:
    from compiler.calibration.runs import gpu_option, make_problem
    from compiler.catalog import load_catalog
    from compiler.costmodel.context import make_setup
    from compiler.layout import Layout
    from compiler.targets.megatron.render import _precision

    plan = _plan(REPO / "generated" / "llama3-405b")
    plan = plan.__class__(**{**plan.__dict__, "training": plan.training.__class__(
        **{**plan.training.__dict__, "precision": "fp8"}), "cluster": plan.cluster.__class__(
        **{**plan.cluster.__dict__, "generation": generation})})
    emitted = [tok for group in _precision(plan) for tok in group]
    assert emitted[1:5] == flags
    recipe = registry.get("megatron").cost.fp8_recipe_on(generation)
    assert recipe == ("mxfp8" if generation == "blackwell" else "fp8_tensorwise_delayed")
    # and the cost model costs that recipe for a problem that does not name one
    gpu = load_catalog().find_gpu("b200" if generation == "blackwell" else "h100-sxm")
    option = gpu_option(gpu, 8)
    problem = make_problem(plan.model.shape, option, seq_len=4096, global_batch=8, tokens=10**9, precision="fp8",
                           num_gpus=8, targets=("megatron",))
    lay = Layout(gpu=gpu.name, gpus_per_node=8, tp=8, pp=1, cp=1, ep=1, dp_replicate=1, dp_shard=1, zero_stage=0,
                 micro_batch=1, grad_accum=8)
    assert make_setup(problem, lay, option).quant_recipe == recipe


@pytest.mark.parametrize("precision, fused", [("bf16", True), ("fp8", True), ("fp16", False), ("fp32", False)])
def test_the_megatron_renderer_emits_the_loss_the_cost_model_costs(precision, fused) -> None:
    """--cross-entropy-loss-fusion (native) exactly where the cost profile costs Megatron-Core's jit-fused loss: under
    bf16 and fp8; fp16 and fp32 keep the unfused fp32 loss (the fused backward casts the gradient to bf16), and the
    cost model costs a different number of bytes per logit for each."""
    from compiler.costmodel.compute import cross_entropy_time_s
    from compiler.costmodel.context import make_setup
    from compiler.calibration.runs import gpu_option, make_problem
    from compiler.catalog import load_catalog
    from compiler.layout import Layout
    from compiler.targets.megatron.render import megatron_args

    plan = _plan(REPO / "generated" / "llama3-70b")
    plan = plan.__class__(**{**plan.__dict__, "training": plan.training.__class__(
        **{**plan.training.__dict__, "precision": precision})})
    args = megatron_args(plan)
    assert ("--cross-entropy-loss-fusion" in args) is fused
    if fused:
        assert args[args.index("--cross-entropy-fusion-impl") + 1] == "native"  # te: refused by megatron-core 0.19.2
    else:
        assert "--cross-entropy-fusion-impl" not in args
    impl = registry.get("megatron").cost.cross_entropy_for(precision)
    assert impl == ("megatron_native" if fused else "megatron_fp32")
    gpu = load_catalog().find_gpu("h100-sxm")
    option = gpu_option(gpu, 8)
    times = {}
    for p in (precision, "bf16" if not fused else "fp16"):
        problem = make_problem(plan.model.shape, option, seq_len=4096, global_batch=8, tokens=10**9, precision=p,
                               num_gpus=8, targets=("megatron",))
        lay = Layout(gpu=gpu.name, gpus_per_node=8, tp=8, pp=1, cp=1, ep=1, dp_replicate=1, dp_shard=1,
                     zero_stage=0, micro_batch=1, grad_accum=8)
        times[p] = cross_entropy_time_s(make_setup(problem, lay, option))[0]
    fused_f, unfused_f = (times[precision], times["fp16"]) if fused else (times["bf16"], times[precision])
    assert fused_f < unfused_f  # 22 against 38 bytes per logit forward (physics.yaml)


def test_plan_json_records_each_target_and_the_binding_one_is_the_estimate() -> None:
    plan = _plan(MULTI)
    framework_targets = [t for t in plan.targets if registry.get(t).cost is not None]
    assert [e.target for e in plan.target_estimates] == framework_targets
    (binding,) = [e for e in plan.target_estimates if e.binding]
    est = plan.estimate
    assert (binding.step_time_s, binding.memory_bytes_per_gpu) == (est.step_time_s, est.memory.total_bytes_per_gpu)
    assert binding.step_time_s == max(e.step_time_s for e in plan.target_estimates)
    assert all(e.memory_bytes_per_gpu <= e.usable_bytes_per_gpu for e in plan.target_estimates)  # fits under each


def test_plan_md_shows_a_table_per_target_only_where_they_differ() -> None:
    text = (MULTI / "PLAN.md").read_text()
    assert "| target | step time |" in text
    for e in _plan(MULTI).target_estimates:
        assert registry.get(e.target).display_name in text
    single = REPO / "generated" / "llama3-405b"  # megatron + slurm: one framework target
    assert len(_plan(single).target_estimates) == 1
    assert "| target | step time |" not in (single / "PLAN.md").read_text()


def test_estimate_shows_and_reproduces_the_per_target_figures() -> None:
    path = str(MULTI / "plan.json")
    out = json.loads(run_cli(["estimate", "--plan", path, "--json"]).stdout)
    assert out["reproduces_plan"] is True
    assert [t["target"] for t in out["targets"]] == [e.target for e in _plan(MULTI).target_estimates]
    text = run_cli(["estimate", "--plan", path]).stdout
    assert "per target" in text and "(binding)" in text
