"""`dtc estimate --plan` re-costs every committed plan from plan.json alone and reproduces its estimate
exactly; `dtc estimate SPEC` accepts the layout the solver chose for that spec (whatever its split)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from compiler.plan import Plan, as_in_plan, plan_data
from compiler.recost import recost
from helpers import REPO, run_cli

PLANS = sorted(p.parent.name for p in (REPO / "generated").glob("*/plan.json"))


def _plan(name: str) -> Plan:
    return Plan.from_json((REPO / "generated" / name / "plan.json").read_text())


@pytest.mark.parametrize("name", PLANS)
def test_recost_reproduces_the_committed_estimate(name: str) -> None:
    plan = _plan(name)
    _, estimate = recost(plan)
    assert plan_data(as_in_plan(estimate)) == plan.to_dict()["estimate"]


@pytest.mark.parametrize("name", PLANS)
def test_cli_estimate_plan(name: str) -> None:
    path = f"generated/{name}/plan.json"
    out = json.loads(run_cli(["estimate", "--plan", str(REPO / path), "--json"]).stdout)
    want = json.loads((REPO / path).read_text())["estimate"]
    assert out["reproduces_plan"] is True
    for key in ("step_time_s", "tokens_per_s_per_gpu", "mfu", "time_to_train_s", "gpu_hours", "cost_usd", "num_steps"):
        assert out[key] == want[key], key
    assert out["memory"]["total_bytes_per_gpu"] == want["memory"]["total_bytes_per_gpu"]
    assert [i["bytes"] for i in out["memory"]["items"]] == [int(i["value"]) for i in want["memory"]["items"]]
    text = run_cli(["estimate", "--plan", str(REPO / path)]).stdout
    assert text.rstrip().endswith("plan.json's estimate: reproduced exactly.")


def _layout_options(plan: Plan) -> list[str]:
    lay = plan.layout
    return ["--tp", str(lay.tp), "--pp", str(lay.pp), "--vpp", str(lay.vpp), "--cp", str(lay.cp), "--ep", str(lay.ep),
            "--dp", str(lay.dp), "--dp-shard", str(lay.dp_shard), "--zero", str(lay.zero_stage),
            "--micro-batch", str(lay.micro_batch), "--recompute", lay.recompute, "--schedule", lay.schedule,
            "--sequence-parallel" if lay.sequence_parallel else "--no-sequence-parallel",
            "--offload-optimizer", lay.offload_optimizer, "--offload-params", lay.offload_params, "--gpu", lay.gpu]


@pytest.mark.parametrize("name", PLANS)
def test_estimate_accepts_the_layout_the_solver_chose(name: str) -> None:
    """The chosen layout given to `dtc estimate SPEC` as options: the same split, the same numbers."""
    plan = _plan(name)
    out = json.loads(run_cli(["estimate", str(REPO / plan.provenance.spec_path), "--json", *_layout_options(plan)])
                     .stdout)
    assert out["layout"]["split"] == plan.to_dict()["layout"]["split"]
    assert out["layout"]["grad_accum"] == plan.layout.grad_accum
    est = plan.to_dict()["estimate"]
    assert round(out["step_time_s"], 3) == pytest.approx(est["step_time_s"], rel=1e-3)
    assert out["memory"]["total_bytes_per_gpu"] == est["memory"]["total_bytes_per_gpu"]


def test_plan_or_spec_not_both(tmp_path: Path) -> None:
    res = run_cli(["estimate", "specs/7b.yaml", "--plan", "generated/llama2-7b-8xh100/plan.json"], exit_code=2)
    assert "one of them" in res.output
    res = run_cli(["estimate", "--plan", "generated/llama2-7b-8xh100/plan.json", "--tp", "2"], exit_code=2)
    assert "layout options do not apply" in res.output


def test_bad_plans_are_refused_with_the_reason(tmp_path: Path) -> None:
    data = json.loads((REPO / "generated/llama2-7b-8xh100/plan.json").read_text())
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**data, "schema_version": 1}))
    assert "schema_version 1" in run_cli(["estimate", "--plan", str(path)], exit_code=2).stderr
    data["layout"]["tp"] = "8"
    path.write_text(json.dumps(data))
    assert "plan.layout.tp must be an integer" in run_cli(["estimate", "--plan", str(path)], exit_code=2).stderr
    data["layout"]["tp"] = 3  # a layout rule, with the code validate and plan give
    path.write_text(json.dumps(data))
    err = run_cli(["estimate", "--plan", str(path)], exit_code=2).stderr
    assert "error[tp_not_divisor]: tensor_parallel must divide num_attention_heads (32), got tp=3" in err
    # a layer count beyond the spec's cap was costed: the per-layer walks never returned (found by mutating every
    # field of a plan.json); a model holds 1 to MAX_LAYERS layers wherever it comes from
    data["layout"]["tp"] = 1
    for layers in (10**30, 0):
        data["model"]["shape"]["num_layers"] = layers
        with pytest.raises(ValueError, match=f"num_layers must be 1 to 1024, got {layers}"):
            Plan.from_json(json.dumps(data))


@pytest.mark.parametrize("section, field, value, why", [
    ("cluster", "inter_node_bandwidth_bytes_per_s", 0, "greater than or equal to 1000000"),
    ("cluster", "intra_node_bandwidth_bytes_per_s", 0, "greater than or equal to 1000000"),
    ("cluster", "memory_headroom", 1e308, "less than or equal to 0.5"),
    ("training", "seq_len", 0, "greater than or equal to 1"),
    ("targets", 0, "x", "'deepspeed', 'fsdp', 'megatron' or 'slurm'"),
    ("model.shape", "num_attention_heads", 0, "greater than or equal to 1"),
    ("model.shape.moe", "layer_freq", 0, "greater than or equal to 1"),
    ("model.shape.moe", "num_experts", 0, "greater than or equal to 1"),
])
def test_a_plan_value_outside_the_specs_limits_is_refused_not_divided_by(section, field, value, why) -> None:
    """Mutating every field of a plan.json found values of the right type that no spec can give (a zero bandwidth
    or sequence length, a headroom of 1e308, a target dtc does not have): `dtc estimate --plan` ended in an internal
    error (ZeroDivisionError, OverflowError, KeyError), as did zero heads, experts or MoE layer frequency. The plan's
    spec-given values now take the spec's own types (the MoE section its MoESpec, top_k <= num_experts too)."""
    data = json.loads((REPO / f"generated/{'mixtral-8x7b' if 'moe' in section else 'llama3-70b'}/plan.json").read_text())
    where = data
    for key in section.split("."):
        where = where[key]
    where[field] = value
    with pytest.raises(ValueError, match=f"plan.{section}(.{field})? is not what a spec accepts .*{why}.*, got "
                                         f"{re.escape(repr(value))}"):
        Plan.from_dict(data)


def test_a_bad_field_deep_in_a_plan_is_named_by_its_path() -> None:
    """plan.json paths are built only for an error: a field inside a list of a section still reads as one path."""
    from compiler.plan import Plan

    data = json.loads((REPO / "generated/llama3-405b/plan.json").read_text())
    data["estimate"]["pipeline"][17]["end_s"] = "x"
    with pytest.raises(ValueError, match=r"plan\.json: plan\.estimate\.pipeline\[17\]\.end_s must be a number"):
        Plan.from_dict(data)
    data = json.loads((REPO / "generated/llama3-405b/plan.json").read_text())
    data["alternatives"][2]["layout"]["schedule"] = "zigzag"
    with pytest.raises(ValueError, match=r"plan\.json: plan\.alternatives\[2\]\.layout\.schedule must be one of"):
        Plan.from_dict(data)
