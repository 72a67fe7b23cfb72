"""Builders for the cost-model tests: Problems from spec text, Layouts with defaults."""
from __future__ import annotations

import textwrap
from typing import Any

from compiler.layout import Layout
from compiler.problem import Problem, lower
from compiler.spec.load import load_spec_text


def make_problem(preset: str = "llama3-8b", *, gpu: str = "h100-sxm", num_gpus: int = 8, seq: int = 4096,
                 gbs: int = 64, precision: str = "bf16", tokens: str = "1T", extra: str = "",
                 targets: str = "[megatron]") -> Problem:
    """A Problem costed for ``targets`` (default Megatron: the cost profile these tests were written
    against; compiler/targets/megatron/cost.py) unless ``extra`` names its own."""
    if "targets:" in extra:
        targets = ""
    text = textwrap.dedent(f"""
        name: cm-test
        model:
          preset: {preset}
        training:
          tokens: {tokens}
          sequence_length: {seq}
          global_batch: {gbs}
          precision: {precision}
        cluster:
          gpu: {gpu}
          num_gpus: {num_gpus}
    """) + (f"targets: {targets}\n" if targets else "") + textwrap.dedent(extra)
    return lower(load_spec_text(text, "cm-test.yaml"))


def make_layout(problem: Problem, **kw: Any) -> Layout:
    option = problem.gpu_options[0]
    values: dict[str, Any] = dict(gpu=option.name, gpus_per_node=option.gpus_per_node, tp=1, pp=1, cp=1, ep=1,
                                  dp_replicate=1, dp_shard=1, zero_stage=0, micro_batch=1)
    values.update(kw)
    if "grad_accum" not in values:
        dp = values["dp_replicate"] * values["dp_shard"]
        values["grad_accum"] = max(1, problem.global_batch // (values["micro_batch"] * dp))
    return Layout(**values)
