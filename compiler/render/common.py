"""Plan arithmetic more than one target renders (kept here so targets do not import each other)."""
from __future__ import annotations

import math

from compiler.plan import Plan


def lr_schedule_steps(plan: Plan) -> tuple[int, int]:
    """(warmup steps, total steps): warmup_tokens rounded up to whole steps, at least 1, at most all."""
    total = int(plan.training.num_steps)
    warmup = math.ceil(int(plan.training.warmup_tokens) / int(plan.training.tokens_per_step))
    return max(1, min(warmup, total)), total
