"""gpt-oss's attention and MLP: sliding-window layers, learnable sinks and the clamped quick-GEGLU, from the
catalog through the cost model, the layout rules and the Megatron arguments to the calibration harness."""
from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, run_cli
from plan_fixtures import layout_for, plan_for, problem_for

from compiler import rules
from compiler.catalog import load_catalog
from compiler.costmodel.compute import (attention_core_flops_per_token_forward, mean_keys_per_query,
                                        window_keys_per_query)
from compiler.costmodel.evaluation import evaluate
from compiler.estimate import Rejection
from compiler.model import ModelShape, count_params
from compiler.targets.megatron.render import render_megatron

GPT_OSS = load_catalog().models["gpt-oss-120b"].shape
SPEC = """
name: oss
model:
  preset: {preset}
training:
  tokens: 1T
  sequence_length: {seq}
  global_batch: 1280
cluster:
  gpu: b200
  num_gpus: 64
targets: [megatron, slurm]
"""


@pytest.mark.parametrize("window,every,layers", [(128, 2, 36), (128, 0, 8), (64, 3, 10), (0, 0, 4), (4096, 4, 9)])
def test_window_layers_are_megatrons(window, every, layers):
    from megatron.core.transformer.utils import is_layer_window_attention

    shape = dataclasses.replace(GPT_OSS, num_layers=layers, window_size=window, full_attention_every=every)
    megatron = [is_layer_window_attention((window, 0) if window else None, every or None, i + 1)
                for i in range(layers)]
    assert [shape.is_window_layer(i) for i in range(layers)] == megatron
    assert shape.num_window_layers == sum(megatron)


def test_gpt_oss_alternates_starting_windowed():
    # openai/gpt-oss-120b config.json layer_types: sliding_attention, full_attention, ... (36 layers)
    assert [GPT_OSS.is_window_layer(i) for i in range(4)] == [True, False, True, False]
    assert GPT_OSS.num_window_layers == 18


def test_window_keys():
    # a query sees itself and the 128 keys before it, fewer in the first 128 positions of a sequence
    assert window_keys_per_query(128, 4096) == pytest.approx((sum(range(1, 129)) + (4096 - 128) * 129) / 4096)
    assert window_keys_per_query(4096, 4096) == 2048  # a window that spans the sequence is causal attention
    plain = dataclasses.replace(GPT_OSS, window_size=0, full_attention_every=0)
    assert mean_keys_per_query(plain, 4096) == 2048
    assert mean_keys_per_query(GPT_OSS, 4096) == pytest.approx((2048 + window_keys_per_query(128, 4096)) / 2)
    assert attention_core_flops_per_token_forward(GPT_OSS, 4096) < 0.54 * attention_core_flops_per_token_forward(
        plain, 4096)


def test_sinks_are_one_parameter_per_head():
    without = dataclasses.replace(GPT_OSS, attention_sinks=False)
    assert count_params(GPT_OSS).total - count_params(without).total == 36 * 64


def _estimate(preset: str = "gpt-oss-20b", seq: int = 4096, **shape_changes):
    problem = problem_for(SPEC.format(preset=preset, seq=seq))
    if shape_changes:
        problem = dataclasses.replace(problem, shape=dataclasses.replace(problem.shape, **shape_changes))
    est = evaluate(problem, layout_for(problem, ep=8, dp_shard=64, zero_stage=1, micro_batch=1, recompute="full"))
    assert not isinstance(est, Rejection), est
    return est


def test_windowed_layers_cost_less_attention_time():
    windowed, full = _estimate(seq=32768), _estimate(seq=32768, window_size=0, full_attention_every=0)
    assert windowed.step_time_s < 0.85 * full.step_time_s
    assert windowed.model_flops_per_token < full.model_flops_per_token


def test_a_window_spanning_the_sequence_costs_as_causal_attention():
    spanning, full = _estimate(window_size=4096), _estimate(window_size=0, full_attention_every=0)
    assert spanning.step_time_s == full.step_time_s and spanning.model_flops_per_token == full.model_flops_per_token


def test_the_estimate_says_how_windows_and_sinks_are_costed():
    notes = [a for a in _estimate().assumptions if a.startswith("Attention:")]
    assert len(notes) == 1 and "12 of 24 layers" in notes[0] and "sink" in notes[0] and "--unsourced" in notes[0]
    plain = _estimate(window_size=0, full_attention_every=0, attention_sinks=False)
    assert not [a for a in plain.assumptions if a.startswith("Attention:")]


def test_context_parallel_refuses_learnable_sinks():
    problem = problem_for(SPEC.format(preset="gpt-oss-20b", seq=4096))
    knobs = rules.Knobs.partial(cp=2)
    got = rules.violations(problem.facts, knobs)
    assert [r.code for r in got] == [rules.CP_UNSUPPORTED]
    assert "2541" in got[0].fix
    plain = dataclasses.replace(problem.facts, shape=dataclasses.replace(problem.shape, attention_sinks=False))
    assert rules.violations(plain, knobs) == []


def _megatron_flags(preset: str) -> list[str]:
    problem = problem_for(SPEC.format(preset=preset, seq=4096))
    plan = plan_for(problem, layout_for(problem, ep=8, dp_shard=64, zero_stage=1, micro_batch=1))
    return shlex.split(render_megatron(plan)["megatron_args.sh"], comments=True)


def test_megatron_builds_gpt_oss_as_published():
    words = _megatron_flags("gpt-oss-120b")

    def value(flag: str) -> str:
        return words[words.index(flag) + 1]

    # Megatron-Bridge's GPTOSSProvider: window (128, 0), skip freq 2, learnable softmax, quick_gelu with
    # glu_linear_offset 1.0 and clamp 7.0, yarn 32 over 4096, no rounding of the correction range, biases on
    assert value("--window-size") == "128,0" and value("--window-attn-skip-freq") == "2"
    assert value("--softmax-type") == "learnable"
    assert "--quick-geglu" in words and "--swiglu" not in words
    assert value("--glu-linear-offset") == "1.0" and value("--activation-func-clamp-value") == "7.0"
    assert value("--position-embedding-type") == "yarn" and value("--rotary-scaling-factor") == "32.0"
    assert value("--rotary-base") == "150000" and value("--yarn-original-max-position-embeddings") == "4096"
    assert "--no-yarn-correction-range-round-to-int" in words and "--disable-bias-linear" not in words
    assert value("--kv-channels") == "64" and value("--num-experts") == "128"


def test_megatrons_own_config_accepts_gpt_oss(tmp_path: Path):
    """argparse, validate_args and core_transformer_config_from_args (TransformerConfig's own checks of the
    window, the softmax type and the clamped quick-GEGLU) on the sourced megatron_args.sh."""
    sys.path.insert(0, str(REPO / "tools" / "validators"))
    from megatron_check import validate_megatron_flags

    problem = problem_for(SPEC.format(preset="gpt-oss-20b", seq=4096))
    plan = plan_for(problem, layout_for(problem, ep=8, dp_shard=64, zero_stage=1, micro_batch=1))
    args = tmp_path / "megatron_args.sh"
    args.write_text(render_megatron(plan)["megatron_args.sh"])
    script = f'source {shlex.quote(str(args))}; printf "%s\\0" "${{MEGATRON_ARGS[@]}}"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True, timeout=30).stdout
    flags = [a.decode() for a in out.split(b"\0") if a]
    assert "--window-size" in flags and validate_megatron_flags(flags, 64) == []


@pytest.mark.parametrize("model_field, target, where, why", [
    ("window_size: 256", "fsdp", "swa.yaml:6:1: error[framework_unsupported]",
     "FSDP2: sliding-window attention (use the megatron target)"),
    ("full_attention_every: 2", "megatron", "swa.yaml:3:31: error", "full_attention_every needs a sliding window"),
    # megatron-core fuses the clamped quick-GEGLU in expert layers only (mlp.py raises for a dense layer)
    ("mlp: quick_geglu", "megatron", "swa.yaml:2:1: error[framework_unsupported]: no target can build this model",
     "Megatron: the quick_geglu MLP in a dense layer"),
])
def test_a_spec_says_what_of_the_attention_it_cannot_have(tmp_path: Path, model_field, target, where, why):
    spec = tmp_path / "swa.yaml"
    spec.write_text(f"""name: swa
model: {{num_layers: 8, hidden_size: 1024, ffn_hidden_size: 2816, num_attention_heads: 8, vocab_size: 32000,
        {model_field}}}
training: {{tokens: 1B, sequence_length: 2048, global_batch: 64}}
cluster: {{gpu: h100-sxm, num_gpus: 8}}
targets: [{target}]
""")
    got = run_cli(["validate", str(spec)], exit_code=2)
    assert where in got.output and why in got.output, got.output


def test_calibration_keeps_gpt_oss_out_of_the_fit_and_shows_it_on_request():
    from compiler.calibration.runs import UNSOURCED_ATTENTION, load_runs

    csv = REPO / "benchmarks" / "data" / "published_runs_dev.csv"
    runs, skipped = load_runs(csv)
    assert not [r for r in runs if "oss" in r.model.lower()]
    assert skipped[UNSOURCED_ATTENTION] == 31
    with_oss, _ = load_runs(csv, unsourced=True)
    oss = [r for r in with_oss if "oss" in r.model.lower()]
    assert len(oss) == 31 and all(r.problem.shape == GPT_OSS for r in oss)
    assert len(with_oss) == len(runs) + 31


def test_a_windowed_custom_model_is_a_shape_field(tmp_path: Path):
    problem = problem_for("""
name: swa
model: {num_layers: 8, hidden_size: 1024, ffn_hidden_size: 2816, num_attention_heads: 8, vocab_size: 32000,
        window_size: 256, full_attention_every: 4, attention_sinks: true}
training: {tokens: 1B, sequence_length: 2048, global_batch: 64}
cluster: {gpu: h100-sxm, num_gpus: 8}
targets: [megatron]
""")
    assert (problem.shape.window_size, problem.shape.full_attention_every, problem.shape.num_window_layers) == (256, 4, 6)
    assert problem.shape.attention_sinks and problem.shape.gated_mlp
    assert isinstance(problem.shape, ModelShape)


def test_a_gpt_oss_plan_takes_its_band_from_the_gpt_oss_runs():
    """Its runs were kept out of the fit: the calibration set's bands would claim a certainty the gpt-oss runs
    contradict (they measure a median 0.71x the predicted throughput), so its band comes from them."""
    from compiler.costmodel.bands import default_table, table_for, unsourced_table

    band = _estimate(preset="gpt-oss-120b").band
    assert band is not None and not band.calibrated and band.runs == 31 and band.sources == 1
    assert band.low == 1.0 and band.high > 1.5 and band.p80 > 1.4
    assert "31 published runs of its attention kind" in band.describe()
    assert table_for(GPT_OSS) is unsourced_table()
    assert table_for(dataclasses.replace(GPT_OSS, window_size=0, full_attention_every=0,
                                         attention_sinks=False)) is default_table()
