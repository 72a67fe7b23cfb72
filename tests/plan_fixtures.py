"""Build Plans for renderer tests from a spec text and an explicit layout.

``plan_for`` costs the layout with the real cost model when it is available
(compiler.costmodel.evaluation.evaluate); renderer unit tests that only need the layout can
pass ``real_estimate=False`` to get an estimate whose numbers are zero (the
DeepSpeed/FSDP/Megatron/SLURM renderers do not read the estimate).
"""
from __future__ import annotations

import textwrap
from typing import Any

from compiler.estimate import Estimate, MemoryBreakdown, TimeBreakdown
from compiler.layout import Layout
from compiler.plan import SearchSummary, make_plan
from compiler.problem import Problem, lower
from compiler.spec.load import load_spec_text

BASE_SPEC = """
name: {name}
model:
  preset: {preset}
training:
  tokens: 1T
  sequence_length: {seq}
  global_batch: {gbs}
cluster:
  gpu: {gpu}
  num_gpus: {num_gpus}
"""


def problem_for(text: str | None = None, **fmt: Any) -> Problem:
    if text is None:
        values = dict(name="test", preset="llama3-8b", seq=4096, gbs=64, gpu="h100-sxm", num_gpus=8)
        values.update(fmt)
        text = BASE_SPEC.format(**values)
    return lower(load_spec_text(textwrap.dedent(text), "test.yaml"))


def zero_estimate(layout: Layout, hbm_bytes: int = 80 * 2**30) -> Estimate:
    return Estimate(
        memory=MemoryBreakdown(items=(), total_bytes_per_gpu=0, hbm_bytes_per_gpu=hbm_bytes,
                               usable_bytes_per_gpu=hbm_bytes),
        time=TimeBreakdown(items=(), step_time_s=0.0), comm=(), pipeline=(), step_time_s=0.0,
        tokens_per_step=0, tokens_per_s=0.0, tokens_per_s_per_gpu=0.0, model_flops_per_token=0.0,
        model_flops_per_step=0.0, hardware_flops_per_step=0.0, model_tflops_per_gpu=0.0, mfu=0.0, hfu=0.0,
        pipeline_bubble_fraction=0.0, num_steps=0, time_to_train_s=0.0, gpu_hours=0.0, cost_usd=0.0,
        num_gpus=layout.world_size)


def layout_for(problem: Problem, **kw: Any) -> Layout:
    option = problem.gpu_options[0]
    values: dict[str, Any] = dict(gpu=option.name, gpus_per_node=option.gpus_per_node, tp=1, pp=1, cp=1, ep=1,
                                  dp_replicate=1, dp_shard=1, zero_stage=0, micro_batch=1, grad_accum=1)
    values.update(kw)
    dp = values["dp_replicate"] * values["dp_shard"]
    if "grad_accum" not in kw:
        values["grad_accum"] = max(1, problem.global_batch // (values["micro_batch"] * dp))
    return Layout(**values)


def plan_for(problem: Problem, layout: Layout, *, real_estimate: bool = True):
    if real_estimate:
        from compiler.costmodel.evaluation import evaluate

        est = evaluate(problem, layout)
        assert isinstance(est, Estimate), f"layout rejected by the cost model: {est}"
    else:
        est = zero_estimate(layout)
    summary = SearchSummary(num_considered=1, num_evaluated=1, num_feasible=1, num_pruned_by_bound=0,
                            rejections_by_code={})
    return make_plan(problem, layout, est, alternatives=(), search=summary)
