"""What a practitioner would object to in a plan (issue #15), as checks a test can run on any plan.

Each check returns a sentence naming the objection, or None. They are properties, not numbers: a
cost-model change may move a plan, but a plan that splits its batch over 31 ranks, runs 977
sequences per micro-batch on a 47B model, leaves data parallelism at 1 on hundreds of GPUs or
offloads the optimizer to the CPU while it fits in HBM is wrong whatever the constants are.
"""
from __future__ import annotations

from typing import Callable

from compiler.arith import twos
from compiler.plan import Plan
from compiler.problem import Problem

MAX_ODD_PART = 15  # 2^k x m with m <= 15 splits over 2, 4, 8, ... and a few odd factors; 977 or 31 do not
BIG_MODEL_PARAMS = 10e9  # a model this big runs micro-batches of at most 16 sequences (Megatron, Llama runs: 1-16)
MAX_MICRO_BATCH_BIG = 16
LARGE_SCALE_GPUS = 256  # at this scale data parallelism of 1 means every GPU holds a slice of one replica


def odd_part(n: int) -> int:
    return n >> twos(n)


def batch_split(problem: Problem, plan: Plan) -> str | None:
    lay = plan.layout
    for what, n in (("global batch", lay.global_batch), ("dp", lay.dp)):
        if odd_part(n) > MAX_ODD_PART:
            return (f"odd batch split: {what} {n} = {odd_part(n)} x 2^{twos(n)} "
                    f"({lay.global_batch} = micro {lay.micro_batch} x accumulation {lay.grad_accum} x dp {lay.dp})")
    return None


def micro_batch(problem: Problem, plan: Plan) -> str | None:
    if problem.num_params >= BIG_MODEL_PARAMS and plan.layout.micro_batch > MAX_MICRO_BATCH_BIG:
        return (f"micro-batch {plan.layout.micro_batch} on a {problem.num_params / 1e9:.0f}B model "
                f"(more than {MAX_MICRO_BATCH_BIG} sequences per GPU per micro-step)")
    return None


def data_parallel(problem: Problem, plan: Plan) -> str | None:
    lay = plan.layout
    if lay.world_size >= LARGE_SCALE_GPUS and lay.dp == 1:
        return f"dp=1 on {lay.world_size} GPUs ({lay.describe()})"
    return None


def needless_offload(problem: Problem, plan: Plan) -> str | None:
    """Offload is only worth its PCIe traffic when the layout does not fit without it."""
    from compiler.costmodel.evaluation import evaluate
    from compiler.estimate import Estimate

    lay = plan.layout
    if lay.offload_optimizer == "none" and lay.offload_params == "none":
        return None
    without = evaluate(problem, lay.with_(offload_optimizer="none", offload_params="none"), pipeline_events=False)
    if isinstance(without, Estimate):
        return (f"offload ({lay.offload_optimizer}/{lay.offload_params}) while the layout fits without it "
                f"({without.memory.total_bytes_per_gpu / 2**30:.1f} of "
                f"{without.memory.usable_bytes_per_gpu / 2**30:.1f} GiB)")
    return None


CHECKS: tuple[Callable[[Problem, Plan], str | None], ...] = (batch_split, micro_batch, data_parallel,
                                                             needless_offload)


def objections(problem: Problem, plan: Plan) -> list[str]:
    return [why for check in CHECKS if (why := check(problem, plan)) is not None]
