"""Megatron's arguments carry the catalog's hyperparameters (issue 13): rope base, Llama 3.1 scaling,
norm epsilon, init std, and the spec's data and tokenizer instead of mock data."""
from __future__ import annotations

import shlex

import pytest
from helpers import REPO
from plan_fixtures import layout_for, plan_for, problem_for

from compiler.targets.megatron.render import render_megatron


def _flags(folder: str) -> dict[str, str]:
    words = shlex.split((REPO / "generated" / folder / "megatron_args.sh").read_text(), comments=True)
    return {w: (words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else "")
            for i, w in enumerate(words) if w.startswith("--")}


@pytest.mark.parametrize("folder,base,scaling", [("llama3-70b", "500000", False), ("llama3-405b", "500000", True),
                                                 ("llama2-7b-8xh100", "10000", False),
                                                 ("mixtral-8x7b", "1000000", False)])
def test_rotary_base_of_the_generated_examples(folder, base, scaling):
    flags = _flags(folder)
    assert flags["--rotary-base"] == base
    assert ("--use-rope-scaling" in flags) == scaling
    assert "--norm-epsilon" in flags and "--init-method-std" in flags


def test_data_section_replaces_mock_data():
    spec = """
name: data-test
model: {preset: llama3-8b}
training: {tokens: 1B, sequence_length: 4096, global_batch: 64}
data:
  tokenizer: /data/llama3-tokenizer
  datasets:
    - {path: /data/web_text_document, weight: 0.7}
    - {path: /data/code_text_document, weight: 0.3}
cluster: {gpu: h100-sxm, num_gpus: 8}
targets: [megatron]
"""
    problem = problem_for(spec)
    text = render_megatron(plan_for(problem, layout_for(problem, dp_shard=8, zero_stage=1, recompute="full")))["megatron_args.sh"]
    words = shlex.split(text, comments=True)
    assert "--mock-data" not in words and "NullTokenizer" not in words
    i = words.index("--data-path")
    assert words[i + 1:i + 5] == ["0.7", "/data/web_text_document", "0.3", "/data/code_text_document"]
    assert words[words.index("--tokenizer-type") + 1] == "HuggingFaceTokenizer"
    assert words[words.index("--tokenizer-model") + 1] == "/data/llama3-tokenizer"


def test_data_flags_pass_megatrons_parser():
    import sys

    sys.path.insert(0, str(REPO / "tools" / "validators"))
    import subprocess

    from megatron_check import validate_megatron_flags

    args_file = shlex.quote(str(REPO / "generated/llama3-405b/megatron_args.sh"))
    script = f'source {args_file}; printf "%s\\0" "${{MEGATRON_ARGS[@]}}"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True, timeout=30).stdout
    flags = [a.decode() for a in out.split(b"\0") if a]
    start = flags.index("--tokenizer-type")
    end = flags.index("--make-vocab-size-divisible-by")
    flags[start:end] = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "/tok"]
    flags.remove("--mock-data")
    flags += ["--data-path", "0.7", "/d/a", "0.3", "/d/b"]
    assert validate_megatron_flags(flags, 16384) == []
