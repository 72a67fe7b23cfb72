"""Integer arithmetic the search space is built from: divisors, GPU counts, batch splits.

The pipeline split (which layers each stage holds) is Megatron's, in compiler.split.
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
    if tolerance <= 0:
        per_step = dp * micro_batch
        return global_batch // per_step if global_batch % per_step == 0 else None
    got = grad_accums_for(global_batch, tolerance, dp, range(micro_batch, micro_batch + 1))
    return got[0][1] if got else None


def grad_accums_for(global_batch: int, tolerance: float, dp: int, micro_batches: range) -> list[tuple[int, int]]:
    """(micro_batch, grad_accum_for(global_batch, tolerance, dp, micro_batch)) for each micro-batch that has
    one, with the tolerance's range computed once (the solver asks for hundreds per dp)."""
    if tolerance <= 0:
        return [(mb, ga) for mb in micro_batches if (ga := grad_accum_for(global_batch, 0.0, dp, mb)) is not None]
    lo, hi = batch_range(global_batch, tolerance)
    g = global_batch
    # the solver asks for a million (dp, micro_batch) rows. While dp x micro_batch (per_step) is at most
    # g - lo + 1 and hi - g, both floor(g / per_step) and one more reach the range: the nearer wins, the floor on a
    # tie (the loop below, in one expression)
    easy = micro_batches[:len(range(micro_batches.start, min(g - lo + 1, hi - g) // dp + 1, micro_batches.step))]
    out = [(mb, q + (r + r > p)) for mb in easy for p in (dp * mb,) for q, r in (divmod(g, p),)]
    for mb in micro_batches[len(easy):]:
        # the grad_accum whose batch is in [lo, hi] and closest to global_batch (the smaller on a tie):
        # floor(global_batch / per_step) (at least 1) or one more
        per_step = dp * mb
        ga = g // per_step or 1
        b = ga * per_step
        up = b + per_step
        if lo <= b <= hi:
            if up <= hi and up - g < abs(b - g):
                ga += 1
        elif lo <= up <= hi:
            ga += 1
        else:
            continue
        out.append((mb, ga))
    return out


def batch_range(global_batch: int, tolerance: float) -> tuple[int, int]:
    """The smallest and largest realised global batch (sequences) the spec allows."""
    if tolerance <= 0:
        return global_batch, global_batch
    return (max(1, math.ceil(global_batch * (1 - tolerance) - 1e-9)),
            math.floor(global_batch * (1 + tolerance) + 1e-9))


def twos(n: int) -> int:
    """The exponent of the largest power of two dividing ``n`` (n >= 1)."""
    return (n & -n).bit_length() - 1


def well_dividing_count(target: float, tolerance: float) -> int:
    """The whole count within ``tolerance`` (relative) of ``target`` that splits best: the multiple of the
    largest power of two in the range, the nearest to ``target`` among those (the smaller on a tie).

    A batch of 2^k x m sequences splits evenly over any power-of-two data-parallel degree and micro-batch
    up to 2^k; 1953 (3^2 x 7 x 31) splits only over 3, 7, 9, 21, 31, ... ranks."""
    lo = max(1, math.ceil(target * (1 - tolerance) - 1e-9))
    hi = math.floor(target * (1 + tolerance) + 1e-9)
    if hi < lo:  # no whole count within the tolerance: the nearest one
        return max(1, round(target))
    k = hi.bit_length()
    while k > 0 and -(-lo // (1 << k)) * (1 << k) > hi:
        k -= 1
    step = 1 << k
    first = -(-lo // step) * step
    return min(range(first, hi + 1, step), key=lambda c: (abs(c - target), c))


def power_of_two_form(n: int) -> str:
    """'2^11', '3 x 2^13', '977' (odd): how many times a count halves."""
    k = twos(n)
    if k == 0:
        return str(n)
    odd = n >> k
    return f"2^{k}" if odd == 1 else f"{odd} x 2^{k}"
