"""The search's bookkeeping of rejections: counts per reason code, an example of each, the closest misses."""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable

from compiler import units
from compiler.estimate import Estimate, Rejection
from compiler.layout import Layout
from compiler.plan import ClosestMiss
from compiler.problem import Problem
from compiler.solver import feasibility as F

MAX_MISSES = 3
_KEPT_MISSES = 4 * MAX_MISSES  # candidates kept while searching (some are duplicates or turn out feasible)


@dataclass(order=True)
class Miss:
    distance: float  # how far over the limit, relative (0.1 = 10% over)
    tag: str
    layout: Layout = field(compare=False)
    rejection: Rejection | None = field(compare=False)  # None: proven by a bound, not costed yet


class Tally:
    def __init__(self, problem: Problem):
        self.problem = problem
        self.counts: dict[str, int] = {}
        self.examples: dict[str, str] = {}
        self.misses: list[Miss] = []
        self._bound_min: dict[str, float] = {}
        self._closest_over: dict[str, tuple[float, str]] = {}
        self._oom_distance = float("inf")  # how far over usable HBM the out_of_memory example is

    def __getitem__(self, code: str) -> int:
        return self.counts.get(code, 0)

    def add(self, code: str, n: int) -> None:
        self.counts[code] = self.counts.get(code, 0) + n

    def reject(self, code: str, n: int, message: str) -> None:
        self.add(code, n)
        self.examples.setdefault(code, message)

    def reject_by_bound(self, code: str, n: int, value: float) -> None:
        """Layouts whose cost (or time) lower bound already breaks the budget (or deadline)."""
        self.add(code, n)
        if value < self._bound_min.get(code, float("inf")):
            self._bound_min[code] = value

    def reject_memory_bound(self, make_layout: Callable[[], Layout], mem: float, usable: float, n: int) -> None:
        """Layouts whose memory lower bound exceeds usable HBM (the layout is built only if it is shown)."""
        self.add(F.OUT_OF_MEMORY, n)
        distance = (mem - usable) / max(usable, 1.0)
        nearer = self._nearer_oom(distance)
        if nearer or self.would_keep(distance):
            layout = make_layout()
            if nearer:
                self._oom_example(distance, f"{layout.describe()}: needs at least {units.format_bytes(mem)} per GPU "
                                            f"(a lower bound) of {units.format_bytes(usable)} usable")
            self.note_miss(distance, layout, None)

    def _nearer_oom(self, distance: float) -> bool:
        """Whether a layout this far over usable HBM is to be the out_of_memory example: the first one, or one nearer
        to fitting than the example (a costed rejection without sizes is infinitely far)."""
        return distance < self._oom_distance or F.OUT_OF_MEMORY not in self.examples

    def _oom_example(self, distance: float, message: str) -> None:
        """The out_of_memory example is the layout nearest to fitting (whatever order the search takes)."""
        self._oom_distance = distance
        self.examples[F.OUT_OF_MEMORY] = message

    def reject_costed(self, layout: Layout, rej: Rejection) -> None:
        """A layout the cost model rejected, or that broke the budget/deadline once costed."""
        self.add(rej.code, 1)
        if rej.code in (F.OVER_BUDGET, F.OVER_DEADLINE):
            distance = over_distance(rej)
            if distance < self._closest_over.get(rej.code, (float("inf"), ""))[0]:
                self._closest_over[rej.code] = (distance, f"{layout.describe()}: {rej.message}")
            self.note_miss(distance, layout, rej)
            return
        if rej.code == F.OUT_OF_MEMORY:
            distance = memory_distance(rej)
            if self._nearer_oom(distance):
                self._oom_example(distance, f"{layout.describe()}: {rej.message}")
            self.note_miss(distance, layout, rej)
            return
        self.examples.setdefault(rej.code, f"{layout.describe()}: {rej.message}")

    def would_keep(self, distance: float) -> bool:
        return len(self.misses) < _KEPT_MISSES or distance < self.misses[-1].distance

    def note_miss(self, distance: float, layout: Layout, rejection: Rejection | None) -> None:
        if self.would_keep(distance):
            bisect.insort(self.misses, Miss(distance, layout.tag, layout, rejection))
            del self.misses[_KEPT_MISSES:]

    def finish_examples(self) -> None:
        """Budget/deadline examples: the closest costed miss, else the smallest bound."""
        p = self.problem
        for code, value in self._bound_min.items():
            if code in self._closest_over:
                continue
            if code == F.OVER_BUDGET and p.max_cost_usd is not None:
                self.examples[code] = (f"each costs at least {units.format_money(value)} (lower bounds; the smallest "
                                       f"shown), over the budget of {units.format_money(p.max_cost_usd)}")
            elif code == F.OVER_DEADLINE and p.deadline_s is not None:
                self.examples[code] = (f"each takes at least {units.format_seconds(value)} (lower bounds; the "
                                       f"smallest shown), past the deadline of {units.format_seconds(p.deadline_s)}")
        for code, (_, message) in self._closest_over.items():
            self.examples[code] = message

    def closest_misses(self, evaluate: Callable[[Problem, Layout], "Estimate | Rejection"]
                       ) -> tuple[ClosestMiss, ...]:
        """The nearest misses as data; a miss proven by a bound is costed now, for the cost model's words."""
        out, seen = [], set()
        for miss in self.misses:
            if miss.tag in seen:
                continue
            seen.add(miss.tag)
            rej = miss.rejection
            if rej is None:
                got = evaluate(self.problem, miss.layout)
                rej = got if isinstance(got, Rejection) else F.check_estimate(self.problem, got)
                if rej is None:
                    continue
            out.append(closest_miss(miss.layout, rej, rej.message, miss.distance))
            if len(out) == MAX_MISSES:
                break
        return tuple(out)


def closest_miss(layout: Layout, rej: Rejection, message: str, distance: float) -> ClosestMiss:
    fix = rej.fix
    if rej.code == F.OUT_OF_MEMORY and " usable)" in fix:
        # what this one layout would need; the remedies on it (recompute, ZeRO-3, ...) are other layouts the
        # search has already tried, so the spec-level hint says what is left
        fix = fix[:fix.index(" usable)") + len(" usable)")]
    return ClosestMiss(layout=layout.tag, description=layout.describe(), code=rej.code, message=message,
                       fix=fix, over_by=round(distance, 4), gpus=f"{layout.world_size} x {layout.gpu}")


def memory_distance(r: Rejection) -> float:
    d = r.details
    total = d.get("needed_bytes") or d.get("total_bytes_per_gpu")
    usable = d.get("usable_bytes") or d.get("usable_bytes_per_gpu")
    if total and usable:
        return (float(total) - float(usable)) / float(usable)
    return float("inf")


def over_distance(r: Rejection) -> float:
    d = r.details
    if "over_by_usd" in d:
        return float(d["over_by_usd"]) / float(d["max_cost_usd"])
    if "over_by_s" in d:
        return float(d["over_by_s"]) / float(d["deadline_s"])
    return float("inf")
