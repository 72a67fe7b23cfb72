"""The learning-rate schedule, as Megatron-LM's OptimizerParamScheduler computes it.

``lr_at(step)`` for optimizer step ``step`` (1-based): linear warm-up from 0 to the peak over
``warmup_steps`` (step k of the warm-up runs at peak x k / warmup_steps), then decay to ``min_lr``
at ``decay_steps`` (Megatron: ``decay_ratio = (step - warmup) / (decay_steps - warmup)``; cosine
``min + (peak - min) x 0.5 x (1 + cos(pi x ratio))``, linear ``min + (peak - min) x (1 - ratio)``,
constant ``peak``), ``min_lr`` after. It is a pure function of the step, so a resumed run needs only
the step to continue the schedule exactly; the checkpoint stores the schedule too, and a resume
with a different one is refused.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

DECAY_STYLES = ("cosine", "linear", "constant")


@dataclass(frozen=True)
class LRSchedule:
    peak_lr: float
    min_lr: float
    warmup_steps: int
    decay_steps: int  # the step at which the decay reaches min_lr (usually the run's last step)
    style: str = "cosine"

    def __post_init__(self) -> None:
        if self.style not in DECAY_STYLES:
            raise ValueError(f"lr decay style must be one of {', '.join(DECAY_STYLES)}, got {self.style!r}")
        if self.min_lr > self.peak_lr or self.peak_lr <= 0 or self.min_lr < 0:
            raise ValueError(f"need 0 <= min_lr <= peak_lr and peak_lr > 0, got {self.min_lr}, {self.peak_lr}")
        if self.warmup_steps < 0 or self.decay_steps < 1:
            raise ValueError("warmup_steps must be >= 0 and decay_steps >= 1")

    def lr_at(self, step: int) -> float:
        if self.warmup_steps > 0 and step <= self.warmup_steps:
            return self.peak_lr * step / self.warmup_steps
        if self.style == "constant":
            return self.peak_lr
        if step >= self.decay_steps:
            return self.min_lr
        span = self.decay_steps - self.warmup_steps
        ratio = (step - self.warmup_steps) / span if span > 0 else 1.0
        if self.style == "linear":
            coeff = 1.0 - ratio
        else:
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + coeff * (self.peak_lr - self.min_lr)

    def fitted(self, steps: int) -> "LRSchedule":
        """The same shape over a run of ``steps`` steps (a shortened smoke run): the warm-up keeps its
        fraction of the decay (at least one step when there was one)."""
        if steps >= self.decay_steps:
            return self
        warmup = round(self.warmup_steps * steps / self.decay_steps)
        if self.warmup_steps and not warmup:
            warmup = 1
        return LRSchedule(self.peak_lr, self.min_lr, min(warmup, steps), steps, self.style)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LRSchedule":
        return cls(**dict(data))


__all__ = ["LRSchedule", "DECAY_STYLES"]
