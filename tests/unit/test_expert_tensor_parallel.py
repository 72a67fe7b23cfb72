"""Expert tensor parallelism (Megatron --expert-tensor-parallel-size): the expert layers re-fold a pipeline stage's
tp x cp x dp ranks as etp x ep x expert-dp. From the layout and its rules through the cost model and the Megatron
arguments to the published runs whose recipes set it."""
from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, run_cli
from plan_fixtures import BASE_SPEC, layout_for, plan_for, problem_for

from compiler import rules
from compiler.catalog import load_catalog
from compiler.costmodel import comm, compute, memory
from compiler.costmodel.evaluation import evaluate
from compiler.costmodel.parts import setup_for
from compiler.costmodel.stages import stage_params
from compiler.estimate import Estimate
from compiler.layout import Layout
from compiler.rules import Knobs
from compiler.targets.megatron.render import render_megatron
from compiler.targets.megatron.support import layout_model_unsupported

def spec_text(preset: str, gpus: int, gbs: int) -> str:
    return BASE_SPEC.format(name="moe", preset=preset, seq=4096, gbs=gbs, gpu="h100-sxm", num_gpus=gpus) \
        + "targets: [megatron, slurm]\n"


def mixtral(gpus: int = 32, gbs: int = 256):
    return problem_for(spec_text("mixtral-8x7b", gpus, gbs))


def test_an_etp_equal_to_tp_is_the_default_and_plan_json_leaves_it_out():
    p = mixtral()
    same = layout_for(p, tp=2, ep=8, etp=2, dp_shard=16, zero_stage=1, sequence_parallel=True)
    assert same.etp is None and same.expert_tp == 2 and same == dataclasses.replace(same, etp=None)
    assert "etp" not in same.to_dict() and "etp" not in plan_for(p, same, real_estimate=False).to_dict()["layout"]
    folded = same.with_(etp=1)
    assert folded.expert_tp == 1 and folded.to_dict()["etp"] == 1 and Layout.from_dict(folded.to_dict()) == folded
    assert "_e8_et1_" in folded.tag and "ep=8 etp=1" in folded.describe()
    assert folded.expert_dp == 2 * 16 // 8  # tp x dp x cp over etp x ep


@pytest.mark.parametrize("knobs, code, field, words", [
    # Megatron's default (etp = tp): ep carved out of dp x cp
    (dict(tp=2, ep=8, etp=2, dp=4, cp=1), rules.EP_INVALID, "ep", "must divide data_parallel x context_parallel (4)"),
    (dict(tp=2, ep=8, etp=1, dp=4, cp=1), None, None, ""),  # 8 divides tp x dp x cp = 8
    (dict(tp=2, ep=8, etp=1, dp=2, cp=1), rules.EP_INVALID, "ep", "x expert_tensor_parallel must divide"),
    (dict(tp=2, ep=8, dp=4, cp=1), None, None, ""),  # etp not chosen yet: some etp folds it
    (dict(tp=1, ep=8, dp=4, cp=1), rules.EP_INVALID, "ep", "must divide data_parallel x context_parallel"),
    (dict(tp=4, ep=2, etp=3, dp=4, cp=1), rules.EP_INVALID, "etp", "divide the expert ffn_hidden_size (14336)"),
])
def test_the_expert_fold_rule(knobs, code, field, words):
    found = rules.violations(mixtral().facts, Knobs(**knobs), codes=(rules.EP_INVALID,))
    if code is None:
        assert found == []
    else:
        assert [r.code for r in found] == [code] and found[0].details["field"] == field and words in found[0].message


def test_etp_needs_an_moe_model():
    dense = problem_for()
    found = rules.violations(dense.facts, Knobs(tp=2, etp=1, dp=4, cp=1), codes=(rules.EP_INVALID,))
    assert found and found[0].details["field"] == "etp" and "needs an MoE model" in found[0].message


def test_a_spec_pin_is_judged_at_its_line(tmp_path: Path):
    spec = tmp_path / "moe.yaml"
    spec.write_text(spec_text("mixtral-8x7b", 32, 256)
                    + "layout:\n  tensor_parallel: 4\n  expert_tensor_parallel: 3\n")
    result = run_cli(["validate", str(spec)], exit_code=2)
    assert "moe.yaml:15:27: error[ep_invalid]" in result.stderr and "(14336)" in result.stderr


def test_the_torch_targets_refuse_another_etp():
    from compiler.targets.support import unsupported_reasons

    reasons = unsupported_reasons(("megatron", "fsdp", "deepspeed"), "bf16", Knobs(tp=4, etp=1))[0]
    assert sorted(reasons) == ["deepspeed", "fsdp"]
    assert unsupported_reasons(("fsdp",), "bf16", Knobs(tp=4, etp=4))[0] == {}


def test_the_cost_model_splits_the_experts_by_etp():
    p = mixtral()
    base = layout_for(p, tp=2, ep=4, dp_shard=16, zero_stage=1, sequence_parallel=True)
    folded = base.with_(etp=1)
    a, b = setup_for(p, base, p.gpu_options[0]), setup_for(p, folded, p.gpu_options[0])
    sl = a.stages[0]
    sa = stage_params(p.shape, p.params, sl, tp=2, ep=4, pp=1)
    sb = stage_params(p.shape, p.params, sl, tp=2, ep=4, pp=1, etp=1)
    # the routed experts whole on each rank: twice the expert parameters, the rest alike
    assert sb.expert == pytest.approx(2 * sa.expert) and sb.dense == sa.dense
    # expert data parallel: tp x dp x cp / (ep x etp) = 2 x 16 / 4 (8 with etp = tp)
    assert memory.expert_shard_degree(base) == 4 and memory.expert_shard_degree(folded) == 8
    # each rank's experts see half the tokens, whole: the same FLOPs per GPU
    assert compute.tokens_per_local_expert(b) == pytest.approx(compute.tokens_per_local_expert(a) / 2)
    flops = [sum(g.forward_flops for g in compute.layer_gemms(s, True) if g.name.startswith("expert")) for s in (a, b)]
    assert flops[0] == pytest.approx(flops[1])
    # no tensor-parallel collective on the routed path (Mixtral has no shared expert): the attention's pair only
    assert comm.tp_comm_time_per_moe_layer_s(b)[0] == pytest.approx(comm.tp_comm_time_per_layer_s(b)[0] / 2)
    # at the default etp = tp, Megatron-Core all-gathers the routed copies (top_k = 2 per token) over tp: the
    # attention's message and two more, where a dense layer moves two
    assert comm.moe_layer_tp_messages(a) == (1.0, 2.0)
    msg, link = comm.activation_message_bytes(a), comm.tp_link(a)
    assert comm.tp_comm_time_per_moe_layer_s(a)[0] == pytest.approx(
        comm.all_reduce_time_s(msg, 2, link) + comm.all_reduce_time_s(2 * msg, 2, link))
    assert comm.tp_comm_time_per_layer_s(a)[0] == pytest.approx(2 * comm.all_reduce_time_s(msg, 2, link))
    # the ep group: 4 ranks of stride etp; inside one 8-GPU node either way, then across nodes at ep = 8, etp = 2
    assert comm.ep_link(b).link == comm.INTRA
    wide = setup_for(p, base.with_(ep=8), p.gpu_options[0])
    assert comm.ep_link(wide).link == comm.INTER and comm.ep_link(setup_for(p, folded.with_(ep=8),
                                                                              p.gpu_options[0])).link == comm.INTRA


def test_the_expert_inputs_are_the_expert_tp_groups_gather():
    """megatron-core's alltoall dispatcher all-gathers the received copies over the expert TP group before fc1,
    which saves them: with etp = tp = 2 each rank keeps twice the sequence-parallel shard of them, with etp = 1 its
    own; the experts' ffn-wide tensors are alike either way."""
    from compiler.costmodel import activations as act

    p = mixtral()
    lay = layout_for(p, tp=2, ep=4, dp_shard=16, zero_stage=1, sequence_parallel=True)
    a, b = setup_for(p, lay, p.gpu_options[0]), setup_for(p, lay.with_(etp=1), p.gpu_options[0])
    dispatched = next(t for t in memory.setup_layer_terms(b, True) if t.name == "moe_dispatched_tokens")
    extra = memory.activation_bytes_per_layer_kind(a, moe_layer=True) - memory.activation_bytes_per_layer_kind(
        b, moe_layer=True)
    assert extra == pytest.approx(a.tokens_per_microbatch * dispatched.bytes_per_token / 2)
    assert act.with_expert_tp_gather(memory.setup_layer_terms(b, False), 2) == memory.setup_layer_terms(a, False)


def test_megatron_moe_with_tp_needs_sequence_parallel_whatever_ep():
    p = mixtral()
    found = rules.violations(p.facts, Knobs.of(layout_for(p, tp=2, ep=1, dp_shard=16, zero_stage=1)))
    assert [r.code for r in found] == [rules.FRAMEWORK_UNSUPPORTED] and "sequence parallelism" in found[0].message
    assert rules.violations(p.facts, Knobs.of(layout_for(p, tp=2, ep=1, dp_shard=16, zero_stage=1,
                                                         sequence_parallel=True))) == []


def test_an_estimate_says_it():
    p = mixtral()
    est = evaluate(p, layout_for(p, tp=2, ep=8, etp=1, dp_shard=16, zero_stage=1, sequence_parallel=True))
    assert isinstance(est, Estimate)
    assert any("expert tensor parallel = 1 (tp = 2)" in a for a in est.assumptions)
    assert any("experts over dp_shard x cp x tp / (ep x etp)" in a for a in est.assumptions)
    tp = next(c for c in est.comm if c.group == "tp")
    lay = layout_for(p, tp=2, ep=8, etp=1, dp_shard=16, zero_stage=1, sequence_parallel=True)
    msg, layers, micro = comm.activation_message_bytes(setup_for(p, lay, p.gpu_options[0])), 32, lay.grad_accum
    assert tp.bytes_per_gpu_per_step == pytest.approx(2 * msg * layers * micro)  # the attention's pair, each way
    default = next(c for c in evaluate(p, lay.with_(etp=None, ep=4, recompute="full")).comm if c.group == "tp")
    # the default etp = tp: the attention's message and the two routed copies of each token, each way
    assert default.bytes_per_gpu_per_step == pytest.approx(6 * msg * layers * micro)


def test_megatron_runs_biased_experts_only_at_etp_1():
    """megatron-core's TransformerConfig: 'Bias in Moe is only supported when ETP==1' (gpt-oss has biases)."""
    oss = load_catalog().models["gpt-oss-20b"].shape
    assert layout_model_unsupported(oss, Knobs(tp=2, etp=2))[0] == "etp"
    assert layout_model_unsupported(oss, Knobs(tp=2, etp=1)) is None
    assert layout_model_unsupported(oss, Knobs(tp=2)) is None  # etp not chosen: the search may choose 1
    assert layout_model_unsupported(load_catalog().models["mixtral-8x7b"].shape, Knobs(tp=2, etp=2)) is None


def _flags(plan, tmp_path: Path) -> list[str]:
    args = tmp_path / "megatron_args.sh"
    args.write_text(render_megatron(plan)["megatron_args.sh"])
    script = f'source {shlex.quote(str(args))}; printf "%s\\0" "${{MEGATRON_ARGS[@]}}"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True, timeout=30).stdout
    return [a.decode() for a in out.split(b"\0") if a]


@pytest.mark.slow
def test_megatrons_own_config_accepts_the_fold_and_refuses_what_dtc_refuses(tmp_path: Path):
    """argparse, validate_args and TransformerConfig on the sourced megatron_args.sh: gpt-oss at tp=2 with ep=8
    over dp=4 runs only with etp=1 (the fold and the biases); dtc renders that and refuses the default."""
    sys.path.insert(0, str(REPO / "tools" / "validators"))
    from megatron_check import validate_megatron_flags

    p = problem_for(spec_text("gpt-oss-20b", 8, 64))
    folded = layout_for(p, tp=2, ep=8, etp=1, dp_shard=4, zero_stage=1, sequence_parallel=True)
    assert rules.violations(p.facts, Knobs.of(folded)) == []
    flags = _flags(plan_for(p, folded), tmp_path)
    assert flags[flags.index("--expert-tensor-parallel-size") + 1] == "1"
    assert validate_megatron_flags(flags, 8) == []
    default = folded.with_(etp=None, ep=4)  # ep 4 divides dp x cp: only the biases stand in the way
    why = rules.violations(p.facts, Knobs.of(default))
    assert [r.code for r in why] == [rules.FRAMEWORK_UNSUPPORTED] and "ETP==1" in why[0].message
    flags = _flags(plan_for(p, folded.with_(ep=4), real_estimate=False), tmp_path)
    assert validate_megatron_flags(flags, 8) == []
    i = flags.index("--expert-tensor-parallel-size")
    del flags[i:i + 2]  # Megatron's default: etp = tp = 2
    assert any("ETP==1" in e for e in validate_megatron_flags(flags, 8))


def test_the_solver_may_fold_and_estimate_re_costs_it(tmp_path: Path):
    spec = tmp_path / "moe.yaml"
    spec.write_text(spec_text("mixtral-8x7b", 32, 256)
                    + "layout:\n  tensor_parallel: 4\n  pipeline_parallel: 2\n  expert_parallel: 8\n"
                      "  data_parallel: 4\n")
    out = tmp_path / "out"
    run_cli(["compile", str(spec), "--out", str(out)])
    text = (out / "moe" / "plan.json").read_text()
    from compiler.plan import Plan

    plan = Plan.from_json(text)
    assert plan.layout.etp == 1  # ep 8 over tp 4 x dp 4 x cp 1 only folds with etp 1
    assert "--expert-tensor-parallel-size 1" in (out / "moe" / "megatron_args.sh").read_text()
    report = (out / "moe" / "PLAN.md").read_text()
    assert "carved out of tp x dp x cp" in report and "- **etp=1**: the expert layers re-fold" in report
    again = run_cli(["estimate", "--plan", str(out / "moe" / "plan.json")])
    assert "plan.json's estimate: reproduced exactly." in again.stdout, again.stdout
    pinned = run_cli(["estimate", str(spec), "--etp", "4", "--micro-batch", "1", "--zero", "1"], exit_code=2)
    assert "ep_invalid" in pinned.stderr


def test_a_published_recipe_sets_etp_and_the_dispatcher():
    from compiler.calibration.bridge_recipes import recipe_for
    from compiler.calibration.runs import parse_row, read_rows

    rows = {r["row_id"]: r for r in read_rows(REPO / "benchmarks" / "data" / "published_runs_dev.csv")}
    run = parse_row(rows["392"])  # Qwen3-235B-A22B on 256 H100: tp 2, ep 32 over dp 16 (table), etp 1 (recipe)
    assert run.layout.etp == 1 and run.layout.ep == 32 and run.layout.dp == 16
    assert not run.framework.hierarchical_all_to_all  # the recipe's NCCL all-to-all (no flex backend)
    rec = recipe_for(software_version="NeMo 26.02 container", model="DeepSeek-V3", gpu_type="GB200", precision="fp8",
                     fp8_recipe="mxfp8", num_gpus=256, tp=1, pp=4, vp=4, cp=1, ep=64, micro_batch=1)
    assert rec is not None and rec.node_aware_dispatch and rec.etp == 1


def test_the_smoke_world_keeps_tp_for_a_fold():
    """dtc smoke keeps dp, then pp, then tp at degree 2; a plan whose experts fold tp away keeps tp before pp."""
    from compiler.smoke.scale import map_degrees

    p = mixtral()
    folded = layout_for(p, tp=4, pp=2, ep=8, etp=1, dp_shard=4, zero_stage=1, sequence_parallel=True)
    kept, _, _ = map_degrees(folded, device="cpu", max_ranks=4)
    assert (kept.tp, kept.pp, kept.dp_shard) == (2, 1, 2)
    default, _, _ = map_degrees(folded.with_(etp=None), device="cpu", max_ranks=4)
    assert (default.tp, default.pp, default.dp_shard) == (1, 2, 2)


def test_a_layout_pinned_whole_is_found_again():
    """dtc sweep re-solves each candidate with all its knobs pinned (Pins.of): an expert fold must survive that."""
    from compiler.problem import Pins
    from compiler.solver import solve

    p = mixtral()
    for etp in (1, None):  # ep 4 over dp 8: both the fold and the default are legal
        layout = layout_for(p, tp=2, pp=2, ep=4, etp=etp, dp_shard=8, zero_stage=1, micro_batch=1,
                            sequence_parallel=True, schedule="1f1b", recompute="full")
        assert Pins.of(layout).etp == layout.expert_tp
        plan = solve(dataclasses.replace(p, pins=Pins.of(layout), top_k=0))
        assert plan.layout.with_(split=None) == layout


def test_reviews_and_explanations_name_a_fold():
    """dtc diff's layout changes and the search's why-lost text say when the experts fold, and only then."""
    from compiler.review.plans import _layout_changes
    from compiler.solver.explain import layout_diff

    p = mixtral()
    default = layout_for(p, tp=2, ep=4, dp_shard=16, zero_stage=1, sequence_parallel=True)
    folded = default.with_(etp=1)
    a, b = plan_for(p, folded, real_estimate=False), plan_for(p, default, real_estimate=False)
    assert [(k.key, k.old, k.new) for k in _layout_changes(a, b)] == [("etp", "1", "2")]
    assert layout_diff(folded, default) == "etp=1 vs tp"
    tp1 = default.with_(tp=1, sequence_parallel=False)  # tp=1: its experts are whole too, nothing to say
    assert "etp" not in layout_diff(folded, tp1)
    assert [k.key for k in _layout_changes(b, plan_for(p, default.with_(tp=4), real_estimate=False))] == ["tp"]


def test_the_routed_copies_cross_the_expert_tp_group_only_where_the_dispatcher_gathers_them():
    """Megatron-Core's dispatcher gathers what the all-to-all brought, top_k copies of each token, over the expert
    TP group (token_dispatcher.py dispatch_postprocess); a framework whose expert path is a dense MLP under tp
    (CostProfile.moe_tp_gathers_copies False) moves one hidden state, as a dense layer. DeepSeek-V3's shared expert
    keeps its own message over tp either way."""
    p = mixtral()
    a = setup_for(p, layout_for(p, tp=2, ep=4, dp_shard=16, zero_stage=1, sequence_parallel=True), p.gpu_options[0])
    assert a.framework.moe_tp_gathers_copies  # the megatron target's profile
    dense_mlp = dataclasses.replace(a, framework=dataclasses.replace(a.framework, moe_tp_gathers_copies=False))
    assert comm.moe_layer_tp_messages(dense_mlp) == (2.0, 0.0) and not comm.moe_tp_differs(dense_mlp)
    dsv3 = problem_for(spec_text("deepseek-v3", 1024, 2048))
    d = setup_for(dsv3, layout_for(dsv3, tp=2, pp=16, ep=8, dp_shard=32, zero_stage=1, sequence_parallel=True),
                  dsv3.gpu_options[0])
    assert comm.moe_layer_tp_messages(d) == (2.0, 8.0)  # attention + shared expert over tp; 8 routed copies
    assert comm.moe_layer_tp_messages(setup_for(dsv3, d.layout.with_(etp=1), dsv3.gpu_options[0])) == (2.0, 0.0)
