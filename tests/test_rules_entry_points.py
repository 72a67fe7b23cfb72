"""One truth: validate, plan, compile, estimate and smoke give the same verdict on a layout, with the same
code and message (compiler/rules.py is the only place a layout rule is stated).

Each illegal layout is pinned in a spec (validate, plan, compile and estimate all refuse it at the pinned
line), passed to `dtc estimate` as options on a spec without the pin, and written into a compiled
plan.json that `dtc smoke` is asked to run: every entry point reports error[<code>] with the same message.
Legal layouts that the entry points used to disagree on (pp x vpp above the layer count, an uneven pp) are
accepted by all of them.
"""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from compiler.rules import SPEC_KEYS
from compiler.split import PipelineSplit
from helpers import refresh_manifest, run_cli

SPEC = """\
name: rules-test
model:
  num_layers: 14
  hidden_size: 512
  ffn_hidden_size: 1376
  num_attention_heads: 8
  num_kv_heads: 8
  vocab_size: 32000
training:
  tokens: 1B
  sequence_length: 4096
  global_batch: 32
cluster:
  gpu: h100-sxm
  num_gpus: 16
targets: {targets}
"""


def spec(tmp_path: Path, layout: str = "", *, targets: str = "[megatron]", name: str = "spec.yaml") -> str:
    text = SPEC.format(targets=targets)
    if layout:
        text += "layout:\n" + textwrap.indent(textwrap.dedent(layout).strip() + "\n", "  ")
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# (pins, estimate options for the same layout, targets, code, message)
ILLEGAL = [
    ("tensor_parallel: 3", ["--tp", "3"], "[megatron]", "tp_not_divisor",
     "tensor_parallel must divide num_attention_heads (8), got tp=3"),
    ("pipeline_parallel: 17", ["--pp", "17"], "[megatron]", "pp_split_invalid",
     "pipeline_parallel x virtual_pipeline_stages have no Megatron split of the 14 layers, got pp=17 x vpp=1"),
    ("context_parallel: 3", ["--cp", "3"], "[megatron]", "cp_not_divisor",
     "2 x context_parallel must divide sequence_length (4096), got cp=3"),
    ("expert_parallel: 2", ["--ep", "2"], "[megatron]", "ep_invalid",
     "expert_parallel needs an MoE model, got ep=2"),
    ("tensor_parallel: 1\nsequence_parallel: true", ["--tp", "1", "--sequence-parallel"], "[megatron]",
     "sp_invalid", "sequence_parallel needs tensor_parallel > 1, got tp=1"),
    ("pipeline_parallel: 2\nvirtual_pipeline_stages: 2\npipeline_schedule: 1f1b",
     ["--pp", "2", "--vpp", "2", "--schedule", "1f1b"], "[megatron]", "schedule_invalid",
     "virtual stages run only with the interleaved_1f1b schedule, got vpp=2 with 1f1b"),
    ("zero_stage: 1\noffload_params: cpu", ["--zero", "1", "--offload-params", "cpu"], "[megatron]",
     "offload_invalid", "offload_params needs zero_stage 3, got zero_stage 1"),
    ("context_parallel: 2", ["--cp", "2"], "[deepspeed]", "framework_unsupported",
     "DeepSpeed: context parallel (cp=2) is not available"),
]
BASE_OPTIONS = {"--tp": "1", "--pp": "1", "--zero": "1", "--micro-batch": "1"}


def _codes(text: str) -> list[tuple[str, str]]:
    return re.findall(r"error\[(\w+)\]: (.*)", text)


def _estimate_args(path: str, options: list[str]) -> list[str]:
    given = dict(BASE_OPTIONS)
    flags = []
    it = iter(options)
    for opt in it:
        if opt == "--sequence-parallel":
            flags.append(opt)
        else:
            given[opt] = next(it)
    return ["estimate", path, *[x for kv in given.items() for x in kv], *flags]


@pytest.mark.parametrize("pins,options,targets,code,message", ILLEGAL,
                         ids=[f"{c[3]}-{i}" for i, c in enumerate(ILLEGAL)])
def test_every_entry_point_gives_the_same_verdict(tmp_path: Path, pins: str, options: list[str], targets: str,
                                                   code: str, message: str) -> None:
    pinned = spec(tmp_path, pins, targets=targets)
    verdicts = {}
    for command in (["validate", pinned], ["plan", pinned], ["compile", pinned, "--out", str(tmp_path / "out")],
                    ["estimate", pinned, "--tp", "1", "--pp", "1", "--zero", "1", "--micro-batch", "1"]):
        pinned_knobs = {line.split(":")[0] for line in pins.splitlines()}
        if command[0] == "estimate":  # the options must not override the pins under test
            command = ["estimate", pinned] + [x for flag, value in BASE_OPTIONS.items()
                                              if {"--tp": "tensor_parallel", "--pp": "pipeline_parallel",
                                                  "--zero": "zero_stage"}.get(flag) not in pinned_knobs
                                              for x in (flag, value)]
        verdicts[command[0]] = _codes(run_cli(command, exit_code=2).stderr)
    # the same layout given to estimate as options, on a spec without the pin
    bare = spec(tmp_path, targets=targets, name="bare.yaml")
    verdicts["estimate (options)"] = _codes(run_cli(_estimate_args(bare, options), exit_code=2).stderr)
    for where, found in verdicts.items():
        assert found and found[0][0] == code and found[0][1].startswith(message), (where, found)
    first = verdicts["validate"][0]
    assert all(v[0] == first for v in verdicts.values()), verdicts


# illegal layouts written into a compiled plan.json: dtc smoke refuses them the same way validate does
SMOKE_EDITS = [
    (dict(tp=2, cp=3), "cp_not_divisor", "2 x context_parallel must divide sequence_length (4096), got cp=3"),
    (dict(pp=1, vpp=2, schedule="interleaved_1f1b"), "schedule_invalid",
     "virtual_pipeline_stages needs pipeline_parallel > 1, got pp=1 x vpp=2"),
]


@pytest.mark.parametrize("edit,code,message", SMOKE_EDITS)
def test_smoke_refuses_an_edited_plan_like_validate(tmp_path: Path, edit: dict, code: str, message: str) -> None:
    path = spec(tmp_path, "tensor_parallel: 1\npipeline_parallel: 1\nzero_stage: 3\n", targets="[fsdp]")
    run_cli(["compile", path, "--out", str(tmp_path / "out")])
    folder = tmp_path / "out" / "rules-test"
    plan = json.loads((folder / "plan.json").read_text())
    plan["layout"].update(edit)
    (folder / "plan.json").write_text(json.dumps(plan))
    refresh_manifest(folder)  # edited on purpose: past the manifest guard, the rules must still refuse it
    found = _codes(run_cli(["smoke", str(folder)], exit_code=2).stderr)
    assert any(c == code and m.startswith(message) for c, m in found), found
    # the same knobs pinned in a spec: validate says exactly the same
    pins = "\n".join(f"{SPEC_KEYS[k]}: {v}" for k, v in edit.items())
    validate = _codes(run_cli(["validate", spec(tmp_path, pins, targets="[fsdp]", name="pinned.yaml")],
                              exit_code=2).stderr)
    assert (code, next(m for c, m in found if c == code)) in validate, (validate, found)


LEGAL = [
    # 16 chunks on 14 layers: Megatron's --account-for-embedding/loss-in-pipeline-split, one unit per chunk
    ("pipeline_parallel: 16\ntensor_parallel: 1\nzero_stage: 0\nmicro_batch_size: 1", "account for embedding and loss"),
    ("pipeline_parallel: 4\nvirtual_pipeline_stages: 4\ntensor_parallel: 1\nzero_stage: 1\nmicro_batch_size: 1",
     "account for embedding and loss"),
    ("pipeline_parallel: 4\nvirtual_pipeline_stages: 1\ntensor_parallel: 1\nzero_stage: 1\nmicro_batch_size: 1",
     "account for embedding and loss"),
    ("pipeline_parallel: 4\nvirtual_pipeline_stages: 1\ntensor_parallel: 1\nzero_stage: 1\nmicro_batch_size: 1\n"
     "pipeline_split: {first: 2, last: 2}", "uneven: first 2, last 2"),
]


@pytest.mark.parametrize("pins,split", LEGAL)
def test_legal_layouts_pass_everywhere(tmp_path: Path, pins: str, split: str) -> None:
    path = spec(tmp_path, pins)
    run_cli(["validate", path])
    est = json.loads(run_cli(["estimate", path, "--json"]).stdout)
    plan = json.loads(run_cli(["plan", path, "--json"]).stdout)["plan"]
    assert (est["layout"]["pp"], est["layout"]["vpp"]) == (plan["layout"]["pp"], plan["layout"]["vpp"])
    assert est["layout"]["split"] == plan["layout"]["split"]
    got = est["layout"]["split"]
    assert PipelineSplit(**{**got, "chunks": tuple(got["chunks"])}).describe() == split
