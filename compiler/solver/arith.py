"""Integer arithmetic the search space is built from: divisors, stage splits, GPU counts.

The pipeline stage rule (Megatron's uneven first/last stages, the one
``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``
implement; megatron-core ``TransformerConfig.__post_init__``):

* ``pp == 1``: one stage holds every layer (``vpp`` must be 1).
* ``num_layers % (pp * vpp) == 0``: every stage holds ``num_layers / pp`` layers.
* otherwise the middle ``pp - 2`` stages hold ``m`` layers each and the first and last
  stages ``f`` and ``l`` (all multiples of vpp, ``vpp <= f, l <= m``: the first and last
  stages also carry the embedding and the output layer); among the splits that exist the
  most balanced one is used (least ``m - min(f, l)``, then the fuller last stage, then the
  fuller first), which is what compiler/render/megatron.py emits as
  --decoder-first/last-pipeline-num-layers (Llama 3 405B: 126 layers on pp=16 -> 7, 8 x 14, 7).
* no other split is generated (Megatron's --account-for-embedding/loss-in-pipeline-split and
  --pipeline-model-parallel-layout are not searched); ``stage_layers`` returns None then.
"""
from __future__ import annotations

import math
from functools import lru_cache


@lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    """The positive divisors of ``n``, ascending."""
    if n < 1:
        return ()
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return tuple(small + large[::-1])


@lru_cache(maxsize=8192)
def stage_layers(num_layers: int, pp: int, vpp: int = 1) -> tuple[int, ...] | None:
    """Layers per pipeline stage (pp entries, each a multiple of vpp), or None if no split exists."""
    if pp < 1 or vpp < 1 or pp * vpp > num_layers:
        return None
    if pp == 1:
        return (num_layers,) if vpp == 1 else None
    if num_layers % (pp * vpp) == 0:
        return (num_layers // pp,) * pp
    if num_layers % vpp:
        return None
    if pp == 2:
        first = num_layers // (2 * vpp) * vpp
        return (first, num_layers - first) if first >= vpp else None
    best: tuple[tuple[int, int, int], tuple[int, ...]] | None = None
    middle = -(-num_layers // (pp * vpp)) * vpp  # pp * middle >= num_layers, so first, last <= middle
    while num_layers - (pp - 2) * middle >= 2 * vpp:
        rest = num_layers - (pp - 2) * middle
        first = rest // (2 * vpp) * vpp
        last = rest - first
        key = (middle - first, -last, -first)
        if last <= middle and (best is None or key < best[0]):
            best = (key, (first,) + (middle,) * (pp - 2) + (last,))
        middle += vpp
    return None if best is None else best[1]


def allowed_gpu_counts(min_gpus: int, max_gpus: int, gpus_per_node: int, exact: int | None) -> "GpuCounts":
    return GpuCounts(min_gpus, max_gpus, gpus_per_node, exact)


class GpuCounts:
    """The GPU counts a layout may use: exactly ``exact``, or whole nodes in [min, max].

    Fewer GPUs than one node are allowed only when the spec asks for that (num_gpus or
    max_gpus below gpus_per_node); then every count in the range is allowed.
    """

    __slots__ = ("lo", "hi", "step", "exact")

    def __init__(self, min_gpus: int, max_gpus: int, gpus_per_node: int, exact: int | None):
        self.exact = exact
        if exact is not None:
            self.lo = self.hi = exact
            self.step = 1
        elif max_gpus < gpus_per_node:
            self.lo, self.hi, self.step = max(1, min_gpus), max_gpus, 1
        else:
            self.step = gpus_per_node
            self.lo = max(gpus_per_node, -(-min_gpus // gpus_per_node) * gpus_per_node)
            self.hi = max_gpus // gpus_per_node * gpus_per_node

    def __contains__(self, n: int) -> bool:
        return self.lo <= n <= self.hi and n % self.step == 0

    @property
    def largest(self) -> int | None:
        return self.hi if self.hi >= self.lo else None

    def multiples_of(self, p: int) -> tuple[int, int, int]:
        """(first, last, step) of the allowed counts divisible by ``p`` (first > last when none)."""
        step = self.step * p // math.gcd(self.step, p)
        first = -(-self.lo // step) * step
        last = self.hi // step * step
        return first, last, step

    def count_multiples_of(self, p: int) -> int:
        first, last, step = self.multiples_of(p)
        return 0 if first > last else (last - first) // step + 1

    def describe(self) -> str:
        if self.exact is not None:
            return str(self.exact)
        if self.step == 1:
            return f"{self.lo}-{self.hi}"
        return f"{self.lo}-{self.hi} in steps of {self.step}"


def grad_accum_for(global_batch: int, tolerance: float, dp: int, micro_batch: int) -> int | None:
    """grad_accum for (dp, micro_batch): exact, or the one closest to the batch within tolerance."""
    per_step = dp * micro_batch
    if tolerance <= 0:
        return global_batch // per_step if global_batch % per_step == 0 else None
    lo = math.ceil(global_batch * (1 - tolerance) - 1e-9)
    hi = math.floor(global_batch * (1 + tolerance) + 1e-9)
    below = max(1, global_batch // per_step)
    best = None
    for ga in (below, below + 1):
        b = ga * per_step
        if lo <= b <= hi and (best is None or abs(b - global_batch) < abs(best * per_step - global_batch)):
            best = ga
    return best


def batch_range(global_batch: int, tolerance: float) -> tuple[int, int]:
    """The smallest and largest realised global batch (sequences) the spec allows."""
    if tolerance <= 0:
        return global_batch, global_batch
    return (max(1, math.ceil(global_batch * (1 - tolerance) - 1e-9)),
            math.floor(global_batch * (1 + tolerance) + 1e-9))
