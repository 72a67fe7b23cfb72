"""The objective, its lower bounds and the deterministic ranking of candidates.

* ``fastest``: least ``time_to_train_s``, subject to ``cost_usd <= max_cost`` and
  ``time_to_train_s <= deadline`` when given;
* ``cheapest``: least ``cost_usd``, subject to the same limits;
* ``throughput``: most ``tokens_per_s_per_gpu`` (the key is its inverse, GPU-seconds
  per token, so that every key is minimised), on the fixed or the largest GPU count.

Every key is taken at the spec's confidence (``budget.confidence``, default p80): the estimate's time or
cost times its error band's factor (compiler/costmodel/bands.py), so a layout in a regime no published
run covers (a wide band) must beat a well-calibrated one by more than its uncertainty. Band factors
are >= 1, so the lower bounds below (from the point estimate's own functions) stay lower bounds.

Ranking: the objective key rounded to 9 significant digits (equal within ~1e-9
relative), then fewer parallel dimensions, then less communication (bytes per GPU per
step over all collectives), then the layout tag. Rounding keeps the order transitive;
pruning compares bounds with a margin wider than the rounding, so that no layout that
could tie with the k-th best is ever pruned.

``cheapest`` treats costs within CHEAPEST_TIE of the cheapest feasible layout as ties and
ranks those by time to train first (``ranked``): saving 0.03% of the cost at 4x the
wall-clock time is not what anyone asks for, and the cost model's own error is far larger
than 1%. The band is relative to the cheapest layout (not pairwise), so the order stays
total; the search keeps every layout of the band (``search._Search.offer``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.estimate import Estimate
from compiler.layout import Layout
from compiler.problem import Problem

TIE_DIGITS = 9
CHEAPEST_TIE = 0.01  # 'cheapest': costs within 1% of the cheapest are ties, and the faster of them wins
PRUNE_MARGIN = 1e-7  # relative; wider than the 1e-9 tie rounding


def objective_key(problem: Problem, est: Estimate, *, factor: float | None = None) -> float:
    """The minimised key, at the spec's confidence (budget.confidence): the point estimate's time, cost or
    GPU-seconds per token times the estimate's band factor (1 for 'expected', >= 1 otherwise); ``factor``
    replaces that factor (1: the point estimate's key)."""
    f = est.time_factor(problem.confidence) if factor is None else factor
    if problem.objective == "cheapest":
        return est.cost_usd * f
    if problem.objective == "throughput":
        return f / est.tokens_per_s_per_gpu if est.tokens_per_s_per_gpu > 0 else math.inf
    return est.time_to_train_s * f


def ranked_cost_usd(problem: Problem, est: Estimate) -> float:
    """The cost the 'cheapest' tie band compares: at the spec's confidence, as the objective."""
    return est.cost_usd * est.time_factor(problem.confidence)


def ranked_time_s(problem: Problem, est: Estimate) -> float:
    """The time to train the 'cheapest' tie band orders by: at the spec's confidence."""
    return est.time_to_train_s * est.time_factor(problem.confidence)


def round_key(x: float) -> float:
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.{TIE_DIGITS}g}")


def communication_bytes(est: Estimate) -> float:
    return float(sum(c.bytes_per_gpu_per_step for c in est.comm))


def rank_key(problem: Problem, layout: Layout, est: Estimate) -> tuple:
    return (round_key(objective_key(problem, est)), layout.num_parallel_dims, round_key(communication_bytes(est)),
            layout.tag)


def can_prune(lower_bound: float, threshold: float) -> bool:
    """True when every layout with this objective lower bound ranks after the threshold key."""
    return lower_bound > threshold * (1 + PRUNE_MARGIN)


@dataclass(frozen=True)
class Pricing:
    """What turns a step time into the objective and the budget/deadline quantities."""

    tokens: int
    seq_len: int
    price_per_gpu_hour_usd: float

    def num_steps(self, global_batch: int) -> int:
        return -(-self.tokens // (global_batch * self.seq_len))

    def time_to_train_s(self, step_s: float, global_batch: int) -> float:
        return self.num_steps(global_batch) * step_s

    def cost_usd(self, step_s: float, global_batch: int, num_gpus: int) -> float:
        return self.time_to_train_s(step_s, global_batch) * num_gpus * self.price_per_gpu_hour_usd / 3600.0

    # Lower bounds from GPU-seconds per token (shape level, batch not fixed yet):
    # num_steps x tokens_per_step >= tokens, so time >= tokens x g / N.
    def time_lb_from_gpu_s_per_token(self, g: float, num_gpus: int) -> float:
        return self.tokens * g / num_gpus

    def cost_lb_from_gpu_s_per_token(self, g: float) -> float:
        return self.tokens * g * self.price_per_gpu_hour_usd / 3600.0


def key_lb_from_step(problem: Problem, pricing: Pricing, step_s: float, global_batch: int, num_gpus: int) -> float:
    """Objective key lower bound from a step-time lower bound (batch and GPU count known)."""
    if problem.objective == "cheapest":
        return pricing.cost_usd(step_s, global_batch, num_gpus)
    if problem.objective == "throughput":
        return step_s * num_gpus / (global_batch * pricing.seq_len)
    return pricing.time_to_train_s(step_s, global_batch)


def key_lb_from_gpu_s_per_token(problem: Problem, pricing: Pricing, g: float, num_gpus: int) -> float:
    if problem.objective == "cheapest":
        return pricing.cost_lb_from_gpu_s_per_token(g)
    if problem.objective == "throughput":
        return g
    return pricing.time_lb_from_gpu_s_per_token(g, num_gpus)


def in_tie_band(cost_usd: float, cheapest_usd: float) -> bool:
    """Whether a cost ties with the cheapest under ``cheapest`` (within CHEAPEST_TIE)."""
    return cost_usd <= cheapest_usd * (1 + CHEAPEST_TIE)


def band_key(problem: Problem, layout: Layout, est: Estimate) -> tuple:
    """The order inside the 'cheapest' tie band: the faster first, then the usual ranking."""
    return (round_key(ranked_time_s(problem, est)),) + rank_key(problem, layout, est)


def ranked(problem: Problem, entries: "list[tuple[Layout, Estimate]]") -> "list[tuple[Layout, Estimate]]":
    """Feasible (layout, estimate) pairs best first: by ``rank_key``; under ``cheapest``, the layouts whose
    cost ties with the cheapest (``in_tie_band``) first, fastest first, then the rest by cost."""
    items = sorted(entries, key=lambda e: rank_key(problem, *e))
    if problem.objective != "cheapest" or not items:
        return items
    cheapest = min(ranked_cost_usd(problem, est) for _, est in items)
    band = sorted((e for e in items if in_tie_band(ranked_cost_usd(problem, e[1]), cheapest)),
                  key=lambda e: band_key(problem, *e))
    return band + [e for e in items if not in_tie_band(ranked_cost_usd(problem, e[1]), cheapest)]
