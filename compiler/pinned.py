"""The layout a spec pins, with `dtc estimate`'s command-line overrides, completed with the obvious defaults.

Knobs that have an obvious default may be left out (cp=1, ep=1, vpp=1, the 1F1B schedule, no recompute,
no sequence parallelism, no offload, Megatron's most balanced split; dp = num_gpus / (tp x pp x cp);
dp_shard = dp when ZeRO shards; grad_accum = global batch / (micro-batch x dp), the nearest within the
batch tolerance); tp, pp, zero_stage and the micro-batch must be given. The layout rules (compiler.rules)
judge it exactly as `dtc validate` and `dtc plan` do, with the same codes and messages.
"""
from __future__ import annotations

from typing import Any

from compiler import rules
from compiler.arith import grad_accum_for
from compiler.costmodel.evaluation import find_gpu_option
from compiler.errors import Diagnostic, DtcError, SpecError
from compiler.estimate import Rejection
from compiler.layout import Layout, Offload, Recompute, Schedule
from compiler.problem import GpuOption, Problem
from compiler.split import default_split

REQUIRED_KNOBS = (("tp", "tensor_parallel", "--tp"), ("pp", "pipeline_parallel", "--pp"),
                  ("zero_stage", "zero_stage", "--zero"), ("micro_batch", "micro_batch_size", "--micro-batch"))


def _pick_gpu(problem: Problem, name: str | None) -> GpuOption:
    if name is None:
        if len(problem.gpu_options) == 1:
            return problem.gpu_options[0]
        names = ", ".join(o.name for o in problem.gpu_options)
        raise SpecError(f"the spec lists several GPUs ({names}); choose one, got none", hint="add --gpu NAME")
    option = find_gpu_option(problem, name)
    if option is None:
        names = ", ".join(o.name for o in problem.gpu_options)
        raise SpecError(f"--gpu must be one of the spec's GPUs ({names}), got {name!r}",
                        hint="add the GPU to cluster.gpu in the spec")
    return option


def rule_error(rejections: list[Rejection], context: str = "") -> DtcError:
    """The layout rules ``rejections`` broke, one diagnostic each, with their codes (compiler.rules)."""
    return DtcError([Diagnostic(summary=r.message + context, hint=r.fix, code=r.code) for r in rejections])


def build_layout(problem: Problem, overrides: dict[str, Any]) -> Layout:
    """The layout pinned by the spec and ``overrides`` (None: keep the pin), with the obvious defaults;
    SpecError when incomplete, DtcError (with the rules' codes) when a layout rule rejects it."""
    knobs = problem.pins.knobs()
    knobs.update({k: v for k, v in overrides.items() if v is not None and k != "gpu"})
    missing = [f"{spec_key} ({flag})" for key, spec_key, flag in REQUIRED_KNOBS if knobs[key] is None]
    num_gpus = problem.num_gpus
    if num_gpus is None and knobs["dp"] is None:
        missing.append("data_parallel (--dp) or cluster.num_gpus")
    if missing:
        raise SpecError(f"dtc estimate needs a fully pinned layout; missing {', '.join(missing)}",
                        hint="pin them under layout: in the spec or pass them as options, or let `dtc plan` solve")
    option = _pick_gpu(problem, overrides.get("gpu"))
    tp, pp, cp, ep, vpp, zero = (knobs["tp"], knobs["pp"], knobs["cp"] or 1, knobs["ep"] or 1, knobs["vpp"] or 1,
                                 knobs["zero_stage"])
    dp = knobs["dp"]
    if dp is None and num_gpus is not None and num_gpus % (tp * pp * cp) == 0:
        dp = num_gpus // (tp * pp * cp)
    dp_shard = knobs["dp_shard"] or ((dp or 1) if zero > 0 else 1)
    mb = knobs["micro_batch"]
    grad_accum = grad_accum_for(problem.global_batch, problem.global_batch_tolerance, dp, mb) if dp else None
    schedule: Schedule = knobs["schedule"] or ("interleaved_1f1b" if vpp > 1 else "1f1b")
    recompute: Recompute = knobs["recompute"] or "none"
    offload_optimizer: Offload = knobs["offload_optimizer"] or "none"
    offload_params: Offload = knobs["offload_params"] or "none"
    sp = bool(knobs["sequence_parallel"]) if knobs["sequence_parallel"] is not None else False
    full = rules.Knobs(gpu=option.name, gpus_per_node=option.gpus_per_node, tp=tp, pp=pp, vpp=vpp, schedule=schedule,
                       cp=cp, ep=ep, etp=knobs["etp"] or tp, dp=dp, dp_shard=dp_shard if dp else None, zero_stage=zero,
                       micro_batch=mb, grad_accum=grad_accum, recompute=recompute, sequence_parallel=sp,
                       offload_optimizer=offload_optimizer, offload_params=offload_params, split=knobs["split"])
    bad = rules.violations(problem.facts, full)
    if not bad and dp is None:
        bad = [rules.reject(rules.GPU_COUNT_NOT_ALLOWED, "dp", f"tp x pp x cp = {tp} x {pp} x {cp} = {tp * pp * cp} "
                            f"must divide num_gpus ({num_gpus}) so that dp can be derived",
                            "choose tp, pp and cp whose product divides num_gpus, or pass --dp")]
    if bad:
        raise rule_error(bad)
    assert dp is not None and grad_accum is not None  # the GPU count and batch rules passed
    split = full.split or default_split(problem.shape.num_layers, pp, vpp)
    return Layout(gpu=option.name, gpus_per_node=option.gpus_per_node, tp=tp, pp=pp, cp=cp, ep=ep, etp=knobs["etp"],
                  dp_replicate=dp // dp_shard, dp_shard=dp_shard, zero_stage=zero, micro_batch=mb,
                  grad_accum=grad_accum, vpp=vpp, schedule=schedule, recompute=recompute,
                  sequence_parallel=sp, offload_optimizer=offload_optimizer, offload_params=offload_params, split=split)
