"""`dtc estimate`: tables, --json, option overrides, missing knobs and rejections exit 2."""
from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

from compiler.commands.estimate import estimate_command, estimate_layout, format_estimate_text
from compiler.pinned import build_layout
from compiler.errors import DtcError, SpecError

from cm_helpers import make_problem

SPEC = textwrap.dedent("""
    name: est-test
    model:
      preset: llama3-8b
    training:
      tokens: 100B
      sequence_length: 4096
      global_batch: 64
    cluster:
      gpu: h100-sxm
      num_gpus: 16
    layout:
      tensor_parallel: 2
      pipeline_parallel: 2
      zero_stage: 1
      micro_batch_size: 1
      recompute: selective
      sequence_parallel: true
    targets: [megatron]
""")


@pytest.fixture
def spec_path(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return str(path)


def invoke(*args):
    return CliRunner().invoke(estimate_command, list(args), catch_exceptions=True)


def test_text_output_has_both_breakdowns(spec_path):
    res = invoke(spec_path)
    assert res.exit_code == 0, res.output
    out = res.output
    for word in ("memory per GPU", "weights", "activations", "step time", "forward_compute", "pp_bubble",
                 "MFU", "time to train", "GPU-hours", "source:"):
        assert word in out
    assert out.rstrip().splitlines()[-1].startswith("Estimate: ")


def test_json_output(spec_path):
    res = invoke(spec_path, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    for key in ("step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "time_to_train_s", "gpu_hours",
                "cost_usd"):
        assert data[key] > 0
    items = data["memory"]["items"]
    assert {i["name"] for i in items} >= {"weights", "gradients", "master_weights", "optimizer_states", "activations"}
    assert data["memory"]["total_bytes_per_gpu"] == sum(i["bytes"] for i in items) or \
        abs(data["memory"]["total_bytes_per_gpu"] - sum(i["bytes"] for i in items)) <= len(items)
    assert data["layout"]["tp"] == 2 and data["layout"]["dp_shard"] == 4 and data["layout"]["grad_accum"] == 16


def test_options_override_pins(spec_path):
    data = json.loads(invoke(spec_path, "--json", "--tp", "4", "--pp", "1", "--zero", "3").output)
    assert (data["layout"]["tp"], data["layout"]["pp"], data["layout"]["zero_stage"]) == (4, 1, 3)


def test_missing_knobs_list_what_to_pin(tmp_path):
    path = tmp_path / "bare.yaml"
    path.write_text(SPEC.split("layout:")[0])
    res = invoke(str(path))
    assert res.exit_code != 0
    assert isinstance(res.exception, SpecError)
    text = res.exception.render()
    assert "tensor_parallel (--tp)" in text and "micro_batch_size (--micro-batch)" in text and "dtc plan" in text


def test_batch_must_divide(spec_path):
    with pytest.raises(DtcError) as exc:
        build_layout(make_problem("llama3-8b", num_gpus=16, gbs=64, extra="targets: [megatron]\n"),
                     dict(tp=2, pp=1, zero_stage=1, micro_batch=3))
    assert [d.code for d in exc.value.diagnostics] == ["batch_not_divisible"]
    assert "must be the global batch (64 sequences)" in exc.value.render()


def test_rejection_prints_reason_and_fix(spec_path):
    res = invoke(spec_path, "--tp", "1", "--pp", "1", "--zero", "0", "--no-sequence-parallel", "--micro-batch", "4")
    assert res.exit_code != 0
    assert "out_of_memory" in res.exception.render() and "hint: needs" in res.exception.render()
    res = invoke(spec_path, "--json", "--tp", "1", "--pp", "1", "--zero", "0", "--no-sequence-parallel",
                 "--micro-batch", "4")
    assert res.exit_code == 2 and json.loads(res.output)["rejection"]["code"] == "out_of_memory"


def test_format_estimate_text_is_reusable():
    p = make_problem("llama3-8b", num_gpus=16, gbs=64, extra="targets: [megatron]\n")
    lay = build_layout(p, dict(tp=2, pp=2, zero_stage=1, micro_batch=1))
    text = format_estimate_text(p, lay, estimate_layout(p, lay))
    assert "layout  tp=2 pp=2" in text
