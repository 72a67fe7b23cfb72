"""Spec loading: structured errors, presets, derived shapes, batch conversion."""
from __future__ import annotations

import textwrap

import pytest

from compiler.errors import SpecError
from compiler.model import count_params
from compiler.problem import lower
from compiler.spec.load import load_spec_text

BASE = """
name: t
model:
  preset: llama3-70b
training:
  tokens: 15T
  sequence_length: 8192
  global_batch: 16M tokens
cluster:
  gpu: h100
  num_gpus: 1024
"""


def problem(text: str = BASE):
    return lower(load_spec_text(textwrap.dedent(text), "t.yaml"))


def test_preset_and_units_resolve():
    p = problem()
    assert p.shape.num_layers == 80 and p.shape.num_kv_heads == 8
    assert p.tokens == 15 * 10**12
    # 16e6 / 8192 = 1953.1 (3^2 x 7 x 31: splits over 31 ranks, not 32): a token batch is a target, and the
    # count within 5% with the most factors of two is 2048 = 16Mi tokens, Llama 3's batch; the note says so
    assert p.global_batch == 2048
    assert p.batch_note.startswith("16M tokens / 8192 tokens per sequence = 1953.1 sequences; chose 2048 = 2^11 "
                                   "(16.78M tokens, +4.9%)")
    assert "'global_batch: 1953'" in p.batch_note
    assert p.gpu_options[0].name == "h100-sxm"  # alias


def test_params_only_derives_a_dense_shape_within_3_percent():
    p = problem(BASE.replace("preset: llama3-70b", "params: 70B"))
    assert abs(p.params.total - 70e9) / 70e9 < 0.03
    assert p.shape.num_attention_heads % 8 == 0 and p.shape.num_kv_heads == 8
    assert p.model_name.startswith("derived")


@pytest.mark.parametrize("size", ["1B", "7B", "13B", "34B", "70B", "175B", "405B", "1T"])
def test_derived_shapes_land_near_the_size(size):
    from compiler.model import derive_dense_shape
    from compiler.units import parse_count

    n = parse_count(size)
    shape = derive_dense_shape(n)
    assert abs(count_params(shape).total - n) / n < 0.03
    assert shape.hidden_size % shape.num_attention_heads == 0


def test_preset_override_and_explicit_shape():
    p = problem(BASE.replace("preset: llama3-70b", "preset: llama3-70b\n  vocab_size: 32000"))
    assert p.shape.vocab_size == 32000 and "modified" in p.model_name


def test_errors_are_collected_with_locations():
    text = BASE.replace("gpu: h100", "gpu: h101").replace("preset: llama3-70b", "preset: llama9")
    with pytest.raises(SpecError) as exc:
        problem(text)
    locs = [(d.location.line, d.summary.split(",")[0]) for d in exc.value.diagnostics]
    assert locs == [(4, "unknown model preset"), (10, "unknown GPU type")]


def test_pydantic_errors_map_to_lines():
    text = BASE + "layout:\n  tensor_parallel: 3\n  micro_batch_size: 0\n"
    with pytest.raises(SpecError) as exc:
        problem(text)
    assert [d.location.line for d in exc.value.diagnostics] == [14]
    with pytest.raises(SpecError) as exc:
        problem(BASE + "layout:\n  tensor_parallel: 3\n")
    assert exc.value.diagnostics[0].location.line == 13
    assert "must divide num_attention_heads (64), got tp=3" in exc.value.diagnostics[0].summary
    assert exc.value.diagnostics[0].code == "tp_not_divisor"


def test_custom_gpu():
    text = BASE.replace("gpu: h100\n", textwrap.dedent("""\
        gpu:
            name: my-accel
            generation: hopper
            bf16_flops: 900TFLOPS
            hbm: 96GiB
            hbm_bandwidth: 4TB/s
            intra_node_bandwidth: 450GB/s
            inter_node_bandwidth: 400Gb/s
            price_per_gpu_hour: $2
        """).replace("\n", "\n  ").rstrip() + "\n")
    p = problem(text)
    g = p.gpu_options[0]
    assert g.spec.hbm_bytes == 96 * 2**30 and g.inter_node_bandwidth_bytes_per_s == 50e9
    assert g.spec.peak_flops_for("bf16") == 900e12
    with pytest.raises(KeyError, match="no fp4 tensor cores"):
        g.spec.peak_flops_for("nvfp4")
    fp4 = problem(text.replace("bf16_flops: 900TFLOPS", "bf16_flops: 900TFLOPS\n      fp4_flops: 9PFLOPS"))
    assert fp4.gpu_options[0].spec.peak_flops_for("nvfp4") == 9e15


def test_at_most_max_aliases():
    """README: at most 100 aliases. The count used to sit in a branch that never ran (500 passed)."""
    from compiler.spec.load import MAX_ALIASES

    head = "name: t\nx: &v 1\n"
    with pytest.raises(SpecError) as err:  # 100 aliases pass the YAML guard; y is then an unknown key
        load_spec_text(head + "y: [" + ", ".join(["*v"] * MAX_ALIASES) + "]\n")
    assert "aliases" not in err.value.render()
    with pytest.raises(SpecError) as err:
        load_spec_text(head + "y: [" + ", ".join(["*v"] * (MAX_ALIASES + 1)) + "]\n")
    assert f"more than {MAX_ALIASES} aliases" in err.value.render()
    with pytest.raises(SpecError, match=f"more than {MAX_ALIASES} aliases"):  # merge keys are aliases too
        load_spec_text("a: &a {k: 1}\n" + "".join(f"m{i}: {{<<: *a}}\n" for i in range(MAX_ALIASES + 1)))


def test_problem_from_data_is_the_problem_of_the_same_yaml():
    """A Problem built from data (no YAML) equals the one lowered from the file text, and a bad field is a
    SpecError naming it."""
    from compiler.problem import problem_from_data

    data = {"name": "d", "model": {"preset": "llama3-8b"},
            "training": {"tokens": "1T", "sequence_length": 4096, "global_batch": 64},
            "cluster": {"gpu": "h100-sxm", "num_gpus": 16}, "layout": {"pipeline_parallel": 2},
            "targets": ["megatron"]}
    text = ("name: d\nmodel: {preset: llama3-8b}\ntraining: {tokens: 1T, sequence_length: 4096, global_batch: 64}\n"
            "cluster: {gpu: h100-sxm, num_gpus: 16}\nlayout: {pipeline_parallel: 2}\ntargets: [megatron]\n")
    a, b = problem_from_data(data, path="d.yaml"), problem(text)
    assert (a.shape, a.global_batch, a.pins, a.gpu_options, a.targets) == (b.shape, b.global_batch, b.pins,
                                                                           b.gpu_options, b.targets)
    with pytest.raises(SpecError) as exc:
        problem_from_data({**data, "layout": {"tensor_parallel": 3}})
    assert exc.value.diagnostics[0].code == "tp_not_divisor"


@pytest.mark.parametrize("batch,seq,want", [
    ("16M tokens", 8192, 2048), ("4M tokens", 4096, 1024), ("4Mi tokens", 4096, 1024), ("16Mi tokens", 8192, 2048),
    ("100M tokens", 4096, 24576), ("3M tokens", 8192, 384), ("2048 sequences", 8192, 2048), (977, 4096, 977),
    ("'977'", 4096, 977), ("1.5Mi tokens", 2048, 768)])
def test_token_batches_choose_a_count_that_splits(batch, seq, want):
    p = problem(BASE.replace("global_batch: 16M tokens", f"global_batch: {batch}")
                .replace("sequence_length: 8192", f"sequence_length: {seq}"))
    assert p.global_batch == want
    if "token" in str(batch):
        assert "tokens / " in p.batch_note


@pytest.mark.parametrize("batch", ["4M", "2K", "1.5Mi", "16M seqs x"])
def test_a_batch_with_a_suffix_needs_a_unit(batch):
    with pytest.raises(SpecError) as info:
        problem(BASE.replace("global_batch: 16M tokens", f"global_batch: {batch}"))
    text = info.value.render()
    assert "t.yaml:8:17: error: training.global_batch" in text
    if batch != "16M seqs x":
        assert f"'{batch} tokens' or '{batch} sequences'" in text


@pytest.mark.parametrize("limit,seconds", [("48:00:00", 172800), ("2-00:00:00", 172800), ("2-12", 216000),
                                           ("2-12:30", 217800), ("90:30", 5430), ("4d", 345600), ("36h", 129600),
                                           ("90.2s", 91)])
def test_slurm_time_limit_forms(limit, seconds):
    p = problem(BASE + f"slurm:\n  time_limit: {limit}\n")
    assert p.slurm.time_limit == seconds


@pytest.mark.parametrize("limit", ["2880", "'60'", "1-25:00:00", "10:61"])
def test_ambiguous_or_bad_time_limits_are_refused(limit):
    with pytest.raises(SpecError) as info:
        problem(BASE + f"slurm:\n  time_limit: {limit}\n")
    text = info.value.render()
    assert "slurm.time_limit" in text and "48:00:00" in text
    if limit in ("2880", "'60'"):
        assert "SLURM reads a bare number as minutes" in text


def test_a_spec_without_any_limit_is_refused():
    """Issue #15: with no GPU cap, budget or deadline an 8B spec planned 4,096 H100 for 73 minutes."""
    text = BASE.replace("  num_gpus: 1024\n", "")
    with pytest.raises(SpecError) as info:
        problem(text)
    out = info.value.render()
    assert "t.yaml:9:1: error: cluster needs a GPU limit" in out and "max_gpus: 512" in out
    for limit in ("cluster:\n  gpu: h100\n  max_gpus: 64", "cluster:\n  gpu: h100\nbudget: {max_cost: $1M}",
                  "cluster:\n  gpu: h100\nbudget: {deadline: 30d}"):
        assert problem(text.replace("cluster:\n  gpu: h100", limit)).max_gpus in (64, 16384)
