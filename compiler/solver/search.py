"""solve(problem) -> Plan: an exhaustive branch-and-bound search over the layout space.

The space (``candidates.Space``) is a list of shapes (GPU type, tp, pp, cp, dp, ep), each
holding a product of independent inner choices, so every count is exact without
enumerating. The search

1. tallies, per shape, the layouts no target framework can run (``compiler.targets.support``, cached per
   ``support_key_of``) and the interleaved schedules whose micro-batch count is not a multiple
   of pp; bounds every shape from below (``bounds``: GPU-seconds per token at the best the
   cost model allows, times the smallest pipeline bubble) and visits shapes best bound first (a heap);
   a shape is skipped when that bound, the same with each vpp's bottleneck stage (``stages_lb``)
   or the best of its groups that can fit in memory and within the budget (``groups_lb``) cannot
   win (its layouts count as pruned by bound); a shape whose tighter bound is above another shape's
   goes back into the heap with it, so the shapes are explored in the order of their tightest bound:
   the best layouts are found early and the threshold falls fast;
2. inside a shape, bounds each group (schedule, micro-batch, recompute) by a step-time
   bound and a memory bound, and visits groups best bound first;
3. inside a group, bounds each layout (sequence parallel x ZeRO/HSDP/offload) by its memory, then
   by its step time with its sharding terms and its own sequence parallelism, and only then calls
   the cost model.

A shape, group or layout is skipped only when its lower bound proves it cannot enter the
top k+1 (the plan and its k alternatives): ``num_pruned_by_bound`` counts those layouts.
Layouts proven infeasible by a bound (memory above usable HBM, cost above the budget,
time past the deadline) are rejections under the codes the cost model or the budget
check would give. Every layout of the space is accounted for exactly once:
``num_considered == num_pruned_by_bound + sum(layout rejections) + num_feasible``
(``batch_not_divisible`` counts parallel shapes outside the space).

Under ``cheapest`` the tie band (objective.ranked) orders by time: once k+1 layouts are certain to
stay in the final band, a slower layout can only matter as the cheapest one itself
(``threshold_for``). A pick in a thin regime is followed by a second search of the same problem
that costs only well-calibrated layouts (``thin_regime_note``): it shares the first one's bounds,
leaves the thin choices out of its options (so shapes with none left are skipped) and starts from
the first search's well-calibrated layouts.

When nothing is feasible, ``InfeasibleError`` carries the tally, an example per code and
the closest misses; a budget or deadline that rules everything out is explained by
solving again without it (the cheapest / the fastest layout, and by how much it misses).
"""
from __future__ import annotations

import bisect
import heapq
import math
import operator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Generator, Iterator

from compiler import units
from compiler.costmodel.bands import MEMORY_MARGIN, scale_bucket, shape_floor
from compiler.estimate import Estimate, Rejection
from compiler.targets.support import framework_notes, support_key_of, unsupported_reasons
from compiler.rules import Knobs
from compiler.layout import Layout
from compiler.plan import as_in_plan, Candidate, ClosestMiss, Plan, SearchSummary, TargetEstimate, make_plan
from compiler.problem import Problem
from compiler.solver import feasibility as F
from compiler.solver.bounds import Bounds, FamilyMemory, coarse_micro_batch
from compiler.solver.candidates import RECOMPUTE_MODES, Sharding, Shape, Space
from compiler.solver.explain import cheapest_tie_note, infeasible_error, plan_notes, why_lost
from compiler.solver.objective import (CHEAPEST_TIE, Pricing, band_key, can_prune, in_tie_band,
                                       key_lb_from_gpu_s_per_token, key_lb_from_step, objective_key, rank_key,
                                       ranked, ranked_cost_usd, ranked_time_s)
from compiler.solver.tally import MAX_MISSES, Tally, closest_miss

if TYPE_CHECKING:
    from compiler.costmodel.evaluation import TargetEstimates

Evaluator = Callable[[Problem, Layout], "Estimate | Rejection"]
FinalEvaluator = Callable[[Problem, Layout], "TargetEstimates"]  # the chosen layout, costed for every target


def solve(problem: Problem, *, top_k: int | None = None, evaluator: Evaluator | None = None) -> Plan:
    """The best layout of ``problem`` and its ``top_k`` runners-up (default: the spec's search.top_k).

    Raises InfeasibleError (with the tally of reasons and the closest misses) when no
    layout is feasible. ``evaluator`` replaces the cost model (tests only).
    """
    return search(problem, top_k=top_k, evaluator=evaluator).plan


@dataclass(frozen=True)
class SearchResult:
    plan: Plan
    examples: dict[str, str]  # reason code -> one message (what `dtc plan` shows next to the tally)


def search(problem: Problem, *, top_k: int | None = None, evaluator: Evaluator | None = None) -> SearchResult:
    """``solve``, plus an example message for each rejection code."""
    final: Evaluator | FinalEvaluator
    if evaluator is None:
        evaluator, final = _search_evaluate, _plan_evaluate
    else:
        final = evaluator
    k = problem.top_k if top_k is None else top_k
    s = _Search(problem, max(0, k), evaluator)
    s.run()
    s.tally.finish_examples()
    return SearchResult(s.result(final), dict(sorted(s.tally.examples.items())))


def _search_evaluate(problem: Problem, layout: Layout) -> Estimate | Rejection:
    """The cost model as the search calls it: no pipeline event list (speed). A layout is costed for each
    framework target of the problem and must fit under each: the binding (rejecting, else slowest) target's
    estimate is the layout's."""
    from compiler.costmodel.evaluation import evaluate_targets

    return evaluate_targets(problem, layout, pipeline_events=False).result


def _calibrated_evaluate(problem: Problem, layout: Layout) -> Estimate | Rejection:
    """``_search_evaluate`` that turns away the layouts of thin regimes (uncalibrated, or few published runs
    behind their band): the search for the best well-calibrated alternative. The binding target's band is
    one of the targets' bands: a layout whose every target's band is thin is turned away without costing."""
    from compiler.costmodel.bands import layout_band
    from compiler.costmodel.frameworks import costed_targets

    gpu = next(o for o in problem.gpu_options if o.name == layout.gpu)
    if all(layout_band(problem, layout, t, gpu).thin for t in costed_targets(problem.targets)):
        return Rejection(THIN_REGIME, "thin regime", {})
    result = _search_evaluate(problem, layout)
    if isinstance(result, Estimate) and result.band is not None and result.band.thin:
        return Rejection(THIN_REGIME, f"thin regime: {result.band.describe()}", {})
    return result


THIN_REGIME = "thin_regime"  # only in the search for a well-calibrated alternative (never in a plan's tally)
# how much worse (on the objective at the spec's confidence) a well-calibrated alternative to a thin-regime pick may
# be and still be named in its note (search.thin_regime_note)
SAFETY_REACH = 0.25
# ... and how much of the space it explores: this many times the parallel shapes the search for the pick explored,
# at least SAFETY_MIN_SHAPES (the specs of specs/ and docs/specs explore at most 10 for their notes)
SAFETY_SHAPES = 1
SAFETY_MIN_SHAPES = 32


def _plan_evaluate(problem: Problem, layout: Layout) -> "TargetEstimates":
    """The chosen layout again, with the simulated pipeline schedule for the report, for every target."""
    from compiler.costmodel.evaluation import evaluate_targets

    return evaluate_targets(problem, layout)


@dataclass(order=True)
class _Entry:
    key: tuple
    layout: Layout = field(compare=False)
    estimate: Estimate = field(compare=False)


class _Search:
    def __init__(self, problem: Problem, k: int, evaluator: Evaluator, *, like: "_Search | None" = None,
                 ceiling: float = float("inf"), max_explored: int | None = None, ruled_out_by: str | None = None):
        """``like``: a search of the same problem but for top_k, whose space and bounds (and their caches) this
        one shares: neither reads top_k. ``ceiling``: an objective key no layout of interest reaches (the search
        prunes every layout whose bound is above it, and finds the best exactly when that one is below it).
        ``max_explored``: stop after exploring this many shapes (``stopped`` then says so); None: no limit.
        ``ruled_out_by``: a target not among the problem's; the search keeps only the layouts it cannot run
        (target_costs: what that target rules out), counting the rest as framework_unsupported."""
        self.problem = problem
        self.k = k
        self.ceiling = ceiling
        self.ruled_out_by = ruled_out_by
        self.max_explored = max_explored
        self.num_explored = 0
        self.stopped = False
        self._like = like
        self.evaluate = evaluator
        if like is not None:
            assert replace(like.problem, top_k=problem.top_k) == problem, "a shared search must be of the same problem"
        self.space: Space = like.space if like is not None else Space(problem)
        self.bounds: Bounds = like.bounds if like is not None else Bounds(problem)
        # shape -> (groups_lb's value, whether it is the exact minimum or a stop above a threshold): shared too
        self._groups: dict[Shape, tuple[float, bool]] = like._groups if like is not None else {}
        # shape -> groups_lb's walk, stopped short of the exact minimum (not shared: it reads this search's options)
        self._group_walks: dict[Shape, Generator[tuple[float, bool], tuple[float, float], None]] = {}
        # shape -> the largest stages_lb value found for it (a lower bound whatever the threshold was; kept by the
        # searches over every option): shared too
        self._stages: dict[Shape, float] = like._stages if like is not None else {}
        # shape -> its vpps by their key at the largest micro-batch (_vpp_fastest; not shared: which vpps have
        # options differs in the well-calibrated search)
        self._fastest: dict[Shape, list] = {}
        # (keyed by the pipeline classes with options, so shared)
        self._vpp_busy: dict[tuple, tuple[float, ...]] = like._vpp_busy if like is not None else {}
        self._class_order: dict[int, tuple[tuple[tuple[str, bool], int], ...]] = \
            like._class_order if like is not None else {}
        self._pipes_by_vpp: dict[tuple, tuple[tuple[int, tuple[tuple[str, int], ...]], ...]] = \
            like._pipes_by_vpp if like is not None else {}
        self._vpp_bubbles: dict[tuple, tuple[float, ...]] = like._vpp_bubbles if like is not None else {}
        self.top: list[_Entry] = []  # sorted, at most k + 1
        # 'cheapest': every feasible layout whose cost ties with the cheapest so far (objective.ranked), sorted
        # by band_key; it only shrinks as the cheapest falls
        self.ties = problem.objective == "cheapest"
        self.band: list[_Entry] = []
        self.calibrated_seen: list[_Entry] = []  # every feasible layout offered whose band is not thin
        self.cheapest = float("inf")
        self.cost_floor = 0.0  # 'cheapest': the bound of the shape being searched (run), below every layout left
        self._band_t: tuple[float, float] | None = None  # (cost_floor, _band_time_threshold) since the last offer
        self.fastest_gpus: int | None = None  # infeasible: the GPUs of the fastest layout, deadline aside
        self.tally = Tally(problem)
        # feasibility checks the upper end of the memory band (compiler/costmodel/bands.py): the memory lower
        # bounds are scaled by it too (a stand-in evaluator's estimates carry no band)
        self.banded = evaluator in (_search_evaluate, _calibrated_evaluate)
        self.calibrated = evaluator is _calibrated_evaluate  # the search for the best well-calibrated alternative
        self.memory_factor = 1.0 + MEMORY_MARGIN if self.banded else 1.0
        self.num_considered = 0
        self.num_evaluated = 0
        self.num_feasible = 0
        self.num_pruned = 0
        self.largest_gpus = 0
        self._support: dict[tuple, bool] = {}
        self._options: dict[tuple, tuple] = {}
        self._num_options: dict[tuple, int] = {}
        self._class_weights: dict[tuple, tuple[int, ...]] = {}  # num_options: sp choices running each class
        self._class_support: dict[tuple, dict[int, bool]] = {}  # _class_verdicts: verdicts by sharding class number
        self._pipe_classes: dict[int, tuple] = {}
        self._thin: dict[tuple, bool] = {}  # choice_thin's verdicts
        self._floors: dict[tuple, float] = {}
        self._bad_batches: dict[tuple[int, int], int] = {}
        self._counts: dict[tuple, tuple[int, int, int]] = {}  # shape_counts
        self._class_options: dict[tuple, dict[tuple[str, bool], int]] = {}  # shape_counts: num_options by class
        self._queue0: tuple[tuple, ...] | None = None  # the heap _initial_queue built, before the first pop
        # shape -> its GPU-seconds per token bound (run): reads only the bounds, shared too
        self._shape_g: dict[Shape, float] = like._shape_g if like is not None else {}
        # shape_bubble's and _micro_batches' values: they read only the space, shared too
        self._bubble: dict[tuple, float] = like._bubble if like is not None else {}
        self._mb_gas: dict[tuple[int, int], tuple[list[int], dict[int, tuple[int, ...]], tuple[int, ...]]] = \
            like._mb_gas if like is not None else {}
        self._pricing = {i: Pricing(problem.tokens, problem.seq_len, o.price_per_gpu_hour_usd)
                         for i, o in enumerate(problem.gpu_options)}

    # ------------------------------------------------------------------ bookkeeping
    @property
    def threshold(self) -> float:
        """The objective key a layout must beat to enter the top k+1 (inf until it is full)."""
        if len(self.top) <= self.k:
            return self.ceiling
        if self.ties:  # a layout that might tie with the cheapest is never pruned
            return min(self.ceiling, max(self.top[-1].key[0], self.cheapest * (1 + CHEAPEST_TIE)))
        return min(self.ceiling, self.top[-1].key[0])

    def threshold_for(self, shape: Shape) -> float:
        """The objective key a layout of ``shape`` must beat to matter: ``threshold``, and under 'cheapest' also
        the tie band's time order. Once k+1 layouts are certain to stay in the final tie band, a layout slower
        than the (k+1)-th of them can only matter as the cheapest layout itself (what the tie note names), so
        its key must beat the cheapest. A shape's time and cost are proportional (cost = time x GPUs x price),
        so that time bound is a cost bound of the shape, and every bound of the search applies it unchanged."""
        threshold = self.threshold
        if not self.ties:
            return threshold
        t = self._band_time_threshold()
        if t == float("inf"):
            return threshold
        per_s = shape.world * self._pricing[shape.option].price_per_gpu_hour_usd / 3600.0
        return min(threshold, max(self.cheapest, t * per_s))

    def _band_time_threshold(self) -> float:
        """Under 'cheapest': the ranked time of the (k+1)-th fastest layout certain to stay in the final tie band
        (inf when fewer are certain). The final cheapest cost is at least the cheapest so far or the bound of the
        shape being searched, whichever is lower (shapes are visited in ascending bound, and a layout's cost is
        at least its shape's bound), so a layout of the band within CHEAPEST_TIE of that stays in the band
        whatever the search finds later."""
        got = self._band_t
        if got is not None and got[0] == self.cost_floor:
            return got[1]
        floor = min(self.cheapest, self.cost_floor)
        times = []
        for e in self.band:  # fastest first (band_key)
            if in_tie_band(ranked_cost_usd(self.problem, e.estimate), floor):
                times.append(ranked_time_s(self.problem, e.estimate))
                if len(times) == self.k + 1:
                    break
        t = max(times) if len(times) == self.k + 1 else float("inf")
        self._band_t = (self.cost_floor, t)
        return t

    def offer(self, layout: Layout, est: Estimate) -> None:
        entry = _Entry(rank_key(self.problem, layout, est), layout, est)
        if est.band is not None and not est.band.thin:
            self.calibrated_seen.append(entry)
        if len(self.top) <= self.k or entry.key < self.top[-1].key:
            bisect.insort(self.top, entry)
            if len(self.top) > self.k + 1:
                self.top.pop()
        if self.ties:
            self._band_t = None
            cost = ranked_cost_usd(self.problem, est)
            if cost < self.cheapest:
                self.cheapest = cost
                self.band = [e for e in self.band if in_tie_band(ranked_cost_usd(self.problem, e.estimate),
                                                                 self.cheapest)]
            if in_tie_band(cost, self.cheapest):
                bisect.insort(self.band, _Entry(band_key(self.problem, layout, est), layout, est))

    def best_first(self) -> list[_Entry]:
        """The kept layouts in the final order (objective.ranked), at most k + 1."""
        if not self.ties:
            return self.top[:self.k + 1]
        by_tag = {e.layout.tag: e for e in self.top + self.band}
        order = ranked(self.problem, [(e.layout, e.estimate) for e in by_tag.values()])
        return [by_tag[layout.tag] for layout, _ in order[:self.k + 1]]

    # ------------------------------------------------------------------ the search
    def options(self, shape: Shape, sched: str, vpp: int) -> tuple[tuple[bool, Sharding], ...]:
        """The (sequence parallel, sharding) choices every target can run, for this shape and schedule.

        Support depends only on ``compiler.targets.support.support_key_of``, so the lists are cached per
        class; the unsupported rest is tallied once per shape as ``framework_unsupported``.
        """
        sps = self.space.sp_choices(shape.tp, shape.cp)  # (sequence parallel's legality depends on tp x cp)
        key = self._options_key(shape, sched, vpp, sps)
        got = self._options.get(key)
        if got is not None:
            return got
        ok: list[tuple[bool, Sharding]] = []
        for sp in sps:
            verdicts = self._class_verdicts(shape, sched, vpp, sp)
            for cid, sh in self.space.choice_classes(shape.dp):
                supported = verdicts.get(cid)
                if supported is None:
                    supported = self._ask_class(verdicts, cid, shape, sched, vpp, sp, sh)
                if supported:
                    ok.append((sp, sh))
        # the choices whose every target's band is thin would be turned away when costed (a shape left with none is
        # skipped before any bound; this search's tally, which no report shows, counts them as unsupported)
        if self.calibrated:
            ok = [(sp, sh) for sp, sh in ok if not self.choice_thin(shape, sched, vpp, sp, sh)]
        result = tuple(ok)
        self._options[key] = result
        return result

    def _options_key(self, shape: Shape, sched: str, vpp: int, sps: tuple) -> tuple:
        """What options() depends on: support (compiler.targets.support.support_key_of reads the degrees only as
        > 1, and dp for its sharding choices); in the search for a well-calibrated alternative also the band's
        GPU and scale."""
        key: tuple = (shape.tp > 1, shape.pp > 1, shape.cp > 1, shape.ep > 1, shape.etp is not None, shape.dp, sched, vpp > 1,
                      sps)
        return key + (shape.option, scale_bucket(shape.world)) if self.calibrated else key

    def choice_thin(self, shape: Shape, sched: str, vpp: int, sp: bool, sh: Sharding) -> bool:
        """Whether every framework target's band of the layouts of this choice is thin (_calibrated_evaluate turns
        them away), cached by what a band reads of a layout (bands.features_of)."""
        from compiler.costmodel.bands import features_of, layout_band
        from compiler.costmodel.frameworks import costed_targets

        features = features_of(pp=shape.pp, vpp=vpp, cp=shape.cp, ep=shape.ep, zero_stage=sh.zero_stage,
                               offload_optimizer=sh.offload_optimizer, offload_params=sh.offload_params,
                               world=shape.world)
        key = (shape.option, tuple(features.values()))
        got = self._thin.get(key)
        if got is None:
            gpu = self.problem.gpu_options[shape.option]
            layout = self.space.layout(shape, sched, vpp, sh, 1, 1, "none", sp)
            got = self._thin[key] = all(layout_band(self.problem, layout, t, gpu).thin
                                        for t in costed_targets(self.problem.targets))
        return got

    def num_options(self, shape: Shape, sched: str, vpp: int) -> int:
        """len(self.options(shape, sched, vpp)), counted per sharding class (Space.sharding_classes) without
        listing the choices: the search lists them only for the shapes it explores."""
        if F.FRAMEWORK_UNSUPPORTED not in self.tally.examples:  # options() picks the example
            return len(self.options(shape, sched, vpp))
        sps = self.space.sp_choices(shape.tp, shape.cp)
        key = self._options_key(shape, sched, vpp, sps)
        got = self._options.get(key)
        if got is not None:
            return len(got)
        n = self._num_options.get(key)
        if n is None and not self.calibrated:
            # by class weights (how many sp choices run each class), kept per the dp's classes: the counts of a dp
            # differ, its classes rarely (tens of thousands of dp on a large cluster, a few class sets)
            cids, counts = self.space.class_counts(shape.dp)
            wkey = (shape.tp > 1, shape.pp > 1, shape.cp > 1, shape.ep > 1, shape.etp is not None, sched, vpp > 1, sps, cids)
            weights = self._class_weights.get(wkey)
            if weights is None:
                weights = self._class_weights[wkey] = tuple(
                    sum(self._class_runs(shape, sched, vpp, sp, cid, sh) for sp in sps)
                    for cid, sh, _ in self.space.sharding_classes(shape.dp))
            n = self._num_options[key] = sum(map(operator.mul, counts, weights))
        elif n is None:
            n = 0
            classes = self.space.sharding_classes(shape.dp)
            for sp in sps:
                verdicts = self._class_verdicts(shape, sched, vpp, sp)
                for cid, sh, count in classes:
                    supported = verdicts.get(cid)
                    if supported is None:
                        supported = self._ask_class(verdicts, cid, shape, sched, vpp, sp, sh)
                    # (the well-calibrated search's options leave out thin choices: choice_thin reads the sharding's
                    # ZeRO stage and offloads, which its class holds)
                    if supported and not (self.calibrated and self.choice_thin(shape, sched, vpp, sp, sh)):
                        n += count
            self._num_options[key] = n
        return n

    def _class_runs(self, shape: Shape, sched: str, vpp: int, sp: bool, cid: int, sh: Sharding) -> bool:
        """Whether every target runs sharding class ``cid`` (``sh``, one of its choices) with ``sp``."""
        verdicts = self._class_verdicts(shape, sched, vpp, sp)
        supported = verdicts.get(cid)
        return self._ask_class(verdicts, cid, shape, sched, vpp, sp, sh) if supported is None else supported

    def _class_verdicts(self, shape: Shape, sched: str, vpp: int, sp: bool) -> dict[int, bool]:
        """Whether every target runs each sharding class asked so far (by Space.choice_classes' number), for the
        degrees as support_key_of reads them (> 1), the schedule and sequence parallelism (_ask_class fills it)."""
        vkey = (shape.tp > 1, shape.pp > 1, shape.cp > 1, shape.ep > 1, shape.etp is not None, sched, vpp > 1, sp)
        verdicts = self._class_support.get(vkey)
        if verdicts is None:
            verdicts = self._class_support[vkey] = {}
        return verdicts

    def _ask_class(self, verdicts: dict[int, bool], cid: int, shape: Shape, sched: str, vpp: int, sp: bool,
                   sh: Sharding) -> bool:
        """The targets' verdict on sharding class ``cid`` (``sh``, one of its choices), kept in ``verdicts``; the
        first choice no target runs becomes the framework_unsupported example."""
        supported = verdicts[cid] = self.choice_supported(shape, sched, vpp, sp, sh)
        if not supported and F.FRAMEWORK_UNSUPPORTED not in self.tally.examples:
            layout = self.space.layout(shape, sched, vpp, sh, 1, 1, "none", sp)
            r = F.check_framework(self.problem, layout)
            assert r is not None or self.ruled_out_by is not None
            why = r.message if r is not None else f"{self.ruled_out_by} runs it (the search keeps what it cannot run)"
            self.tally.examples[F.FRAMEWORK_UNSUPPORTED] = f"{layout.describe()}: {why}"
        return supported

    def pipeline_classes(self, pp: int) -> tuple[tuple[tuple[str, bool], int], ...]:
        """The pipeline choices of ``pp`` grouped by what framework support depends on."""
        got = self._pipe_classes.get(pp)
        if got is None:
            counts: dict[tuple[str, bool], int] = {}
            for sched, vpp in self.space.pipeline_choices(pp):
                counts[(sched, vpp > 1)] = counts.get((sched, vpp > 1), 0) + 1
            got = self._pipe_classes[pp] = tuple(sorted(counts.items()))
        return got

    def bad_interleave_batches(self, dp: int, pp: int) -> int:
        key = (dp, pp)
        got = self._bad_batches.get(key)
        if got is None:
            gas = self.space.grad_accums(dp)
            got = self._bad_batches[key] = len(gas) - [ga % pp for ga in gas].count(0)
        return got

    def run(self) -> None:
        problem = self.problem
        queue = self._initial_queue()
        while queue:
            entry = heapq.heappop(queue)
            lb, _, _, shape, n, g, done = entry
            if not done:
                pricing = self._pricing[shape.option]
                cost = pricing.cost_lb_from_gpu_s_per_token(g)
                if problem.max_cost_usd is not None and cost > problem.max_cost_usd:
                    self.tally.reject_by_bound(F.OVER_BUDGET, n, cost)
                    continue
                t = pricing.time_lb_from_gpu_s_per_token(g, shape.world)
                if problem.deadline_s is not None and t > problem.deadline_s:
                    self.tally.reject_by_bound(F.OVER_DEADLINE, n, t)
                    continue
            self.cost_floor = lb
            threshold = self.threshold_for(shape)
            if can_prune(lb, threshold):
                self.num_pruned += n
                continue
            if self._refine(queue, entry, threshold):
                if self.max_explored is None or self.has_options(shape):  # (a limit counts shapes with options)
                    if self.num_explored == self.max_explored:
                        self.stopped = True
                        return
                    self.num_explored += 1
                self.explore(shape)

    def _initial_queue(self) -> list[tuple]:
        """A heap of (key, parallel dims, order, shape, layouts, GPU-s per token bound, refinements taken), one
        entry per shape with layouts every target supports: a shape's key is first its GPU-seconds per token bound,
        then fastest_lb, stages_lb and groups_lb (each a lower bound of every layout of the shape, the later ones
        tighter and dearer: fastest_lb asks no memory, so a shape that stage times alone put behind others waits
        for a threshold before its memory is asked); a shape whose refined key is above another shape's key goes
        back into the heap, so shapes are explored in the order of their tightest bound and the best layouts are
        found (and the threshold falls) early. The key popped is below every layout left (cost_floor).

        The search for a well-calibrated alternative (``like`` the search for the pick, of the same problem but
        top_k) starts from the pick's heap as it was before the first pop: it takes the pick's counts
        (shape_counts), and a key reads neither top_k nor the thresholds (a 16K-GPU spec has 150,000 shapes). Its
        own tally, which no report shows, then counts only what it pops."""
        like = self._like
        if self.calibrated and like is not None:
            assert like._queue0 is not None, "the search for the pick runs first"
            self.num_considered, self.largest_gpus = like.num_considered, like.largest_gpus
            return list(like._queue0)
        problem, space, bounds = self.problem, self.space, self.bounds
        shape_space = space.shapes()
        for code, n in shape_space.rejected_shapes.items():
            self.tally.reject(code, n, shape_space.examples.get(code, ""))
        queue: list[tuple] = []
        for order, shape in enumerate(shape_space.shapes):
            total, supported, bad_interleave = self.shape_counts(shape)
            if total == 0:
                continue
            self.num_considered += total
            if supported < total:
                self.tally.add(F.FRAMEWORK_UNSUPPORTED, total - supported)
            if bad_interleave:
                self.tally.reject(F.MICROBATCHES_NOT_DIVISIBLE, bad_interleave,
                            f"interleaved 1F1B runs micro-batches in groups of pp (pp={shape.pp}); grad_accum must "
                            "be a multiple of pp")
            supported -= bad_interleave
            if supported == 0:
                continue
            self.largest_gpus = max(self.largest_gpus, shape.world)
            g = self._shape_g.get(shape)
            if g is None:
                mb_cap, most = space.batch_extremes(shape.dp)
                g = self._shape_g[shape] = (
                    bounds.gpu_s_per_token_lb(shape, space.sp_choices(shape.tp, shape.cp), coarse_micro_batch(mb_cap))
                    * self.shape_bubble(shape) + bounds.step_overhead_per_token_lb(shape, most * shape.dp))
            lb = key_lb_from_gpu_s_per_token(problem, self._pricing[shape.option], g, shape.world) \
                * self.shape_floor(shape)
            queue.append((lb, shape.num_parallel_dims, order, shape, supported, g, 0))
        heapq.heapify(queue)
        self._queue0 = tuple(queue)
        return queue

    def has_options(self, shape: Shape) -> bool:
        """Whether some pipeline choice of ``shape`` has a (sequence parallel, sharding) option this search costs."""
        return any(self.options(shape, sched, vpp) for sched, vpp in self.space.pipeline_choices(shape.pp))

    def _refine(self, queue: list, entry: tuple, threshold: float) -> bool:
        """Whether the shape of a popped heap ``entry`` is to be explored now: the bounds after the refinements it
        has taken (fastest_lb, stages_lb, then groups_lb) are asked in turn; a shape one of them prunes is counted
        as pruned, and one whose tighter bound is above the smallest key left goes back into the heap with it.
        groups_lb walks the shape's groups only until its bound passes that key (a 16K-GPU spec whose budget binds
        nothing asks it of thousands of shapes before any layout is found, ~25 groups each to the exact minimum):
        the shape goes back with the bound reached and its walk resumes when it comes back."""
        shape, n, done = entry[3], entry[4], entry[6]
        for step in range(done, 3):
            if step == 0:
                tighter, final = self.fastest_lb(shape, threshold), True
            elif step == 1:
                tighter, final = self.shape_stages_lb(shape, threshold), True
            else:  # groups_lb stops once its bound passes the next shape's key: asked again when that comes back
                tighter, final = self._groups_step(shape, threshold, queue[0][0] if queue else float("inf"))
            if can_prune(tighter, threshold):
                self.num_pruned += n
                return False
            if queue and tighter > queue[0][0]:
                heapq.heappush(queue, (tighter,) + entry[1:6] + (step + 1 if final else step,))
                return False
        return True

    def shape_counts(self, shape: Shape) -> tuple[int, int, int]:
        """(layouts of ``shape``, those every target supports, those of them interleaved 1F1B cannot batch), cached
        by what they depend on: the degrees as support_key_of reads them (> 1; the well-calibrated search's options
        also read the GPU and the scale), pp and dp whole, and the sequence-parallel choices. A large space repeats
        each key for many tp x cp. (The search for a well-calibrated alternative takes the pick's heap and counts,
        _initial_queue: a shape whose every choice is thin has no options when explored.)"""
        space = self.space
        sps = space.sp_choices(shape.tp, shape.cp)
        key: tuple = (shape.tp > 1, shape.cp > 1, shape.ep > 1, shape.etp is not None, shape.pp, shape.dp, sps)
        if self.calibrated:
            key += (shape.option, scale_bucket(shape.world))
        got = self._counts.get(key)
        if got is not None:
            return got
        total = space.inner_count(shape)
        supported = bad_interleave = 0
        if total:
            rc_n = len(space.recompute_choices())
            n_batches = len(space.batch_choices(shape.dp))
            # num_options of each pipeline class, kept per what it reads (_options_key: pp only as > 1)
            opts_key = (shape.tp > 1, shape.pp > 1, shape.cp > 1, shape.ep > 1, shape.etp is not None, shape.dp, sps) + key[7:]
            opts = self._class_options.get(opts_key)
            if opts is None:
                opts = self._class_options[opts_key] = {}
            for pipe, count in self.pipeline_classes(shape.pp):  # pipe: (schedule, interleaved)
                n_opts = opts.get(pipe)
                if n_opts is None:
                    n_opts = opts[pipe] = self.num_options(shape, pipe[0], 2 if pipe[1] else 1)
                supported += count * n_opts * n_batches * rc_n
                if pipe[1]:
                    bad_interleave += count * n_opts * rc_n * self.bad_interleave_batches(shape.dp, shape.pp)
        got = self._counts[key] = (total, supported, bad_interleave)
        return got

    def shape_stages_lb(self, shape: Shape, threshold: float) -> float:
        """stages_lb, kept per shape: a value found by an earlier search of the same problem (a larger option set,
        another threshold) is still a lower bound, asked first."""
        known = self._stages.get(shape)
        if known is not None and can_prune(known, threshold):
            return known
        got = self.stages_lb(shape, threshold)
        if not self.calibrated:  # (the well-calibrated search's fewer options bound only its own layouts)
            self._stages[shape] = max(got, known or 0.0)
        return got

    def stages_lb(self, shape: Shape, threshold: float = float("inf")) -> float:
        """The shape bound (run) with the bottleneck stage of each vpp instead of the whole model's mean, and that
        vpp's own smallest bubble (Bounds.stage_gpu_s_per_token_lb), band floor included. When the vpp's bound at
        the shape's largest micro-batch without recompute could win, it is taken per recompute mode at the
        largest micro-batch whose layouts may fit in memory (Bounds.family_memory_lb), leaving out a mode whose
        bound breaks the budget or the deadline or that fits no micro-batch (memory is not asked for a vpp whose
        bound is above ``threshold`` without it, nor for a vpp whose model states alone do not fit: none of its
        micro-batches does). The vpps are taken by that bound at the largest micro-batch (_vpp_fastest), and a vpp
        or mode whose bound there is not below the smallest found is passed over: it cannot lower the minimum. A
        mode whose bound at the largest micro-batch is above ``threshold`` gives that bound without asking memory:
        the value may then be below the exact minimum but is above ``threshold`` too, so a shape is pruned exactly
        when the exact minimum would prune it. A few stage times per shape, where groups_lb costs every group."""
        problem, space, bounds = self.problem, self.space, self.bounds
        pricing = self._pricing[shape.option]
        sps = space.sp_choices(shape.tp, shape.cp)
        mb_cap, most = space.batch_extremes(shape.dp)
        overhead = bounds.step_overhead_per_token_lb(shape, most * shape.dp)
        rcs = tuple(rc for rc in RECOMPUTE_MODES if rc in space.recompute_choices())
        mbs = self._micro_batches(shape.dp, 1)[0]
        usable = bounds.usable_bytes(shape)
        best = float("inf")
        floor = self.shape_floor(shape)

        def key_at(vpp: int, bubble: float, mb: int, rc: str) -> float:
            # (at a coarse micro-batch >= mb: the shapes of many dps share the stage costings)
            g = bounds.stage_gpu_s_per_token_lb(shape, vpp, sps, coarse_micro_batch(mb), rc) * bubble + overhead
            return key_lb_from_gpu_s_per_token(problem, pricing, g, shape.world)

        class_opts: dict[tuple[tuple[str, ...], bool], tuple] = {}  # the options read vpp only as > 1
        states_too_big: dict[tuple, bool] = {}  # by the vpp's stage compositions and options class
        # each vpp's bound is at least its key at the largest micro-batch without recompute (``fastest``): the vpps
        # are taken in that order, and once it reaches the smallest bound found the rest cannot lower it
        for fastest, vpp, pipes, bubble in self._vpp_fastest(shape):
            if fastest >= best:
                break
            # the memory is asked only when the best micro-batch without recompute could win
            if can_prune(fastest * floor, threshold):
                best = min(best, fastest)
                continue
            ckey = (tuple(sched for sched, _ in pipes), vpp > 1)
            with_opts = class_opts.get(ckey)
            if with_opts is None:
                with_opts = class_opts[ckey] = tuple((sched, self.options(shape, sched, v)) for sched, v in pipes)
            skey = (bounds.compositions(shape.pp, vpp), ckey)
            too_big = states_too_big.get(skey)
            if too_big is None:
                too_big = states_too_big[skey] = bounds.family_states_lb(shape, vpp, with_opts) * self.memory_factor \
                    > usable
            if too_big:
                continue  # the model states alone do not fit: no micro-batch or recompute mode does
            _, gas_ok, every_ga = self._micro_batches(shape.dp, shape.pp if pipes[0][0] == "interleaved_1f1b" else 1)
            if not every_ga:
                continue
            family = fewest = None  # (asked once a mode needs them)
            inflight: dict[int, tuple[float, ...]] = {}
            end = len(mbs)
            for rc in rcs:
                # the mode's bound at the largest micro-batch is its smallest: when it cannot win (nor lower the
                # bound found), no micro-batch of the mode can, whatever fits
                key = key_at(vpp, bubble, mbs[0], rc)
                if key >= best:
                    continue
                if can_prune(key * floor, threshold):
                    best = min(best, key)
                    continue
                # the largest micro-batch whose layouts may fit (time per token only falls with it); the scan starts
                # at the largest one whose memory bound with every grad_accum's in-flight count may fit: that bound
                # only grows with the micro-batch (one micro-batch's activations do) and is below each one's own;
                # the bisection looks above the previous mode's start only (more recompute lowers memory; were it
                # not so, the scan would merely start lower)
                if family is None or fewest is None:
                    family = bounds.family_memory(shape, vpp, with_opts)
                    fewest = bounds.family_inflight(shape, vpp, with_opts, every_ga)
                start = self._first_fitting(family, mbs, every_ga, rc, fewest, usable, end)
                end = start
                cap = None
                for mb in mbs[start:]:
                    mb_gas = gas_ok.get(mb)
                    if mb_gas is None:
                        continue
                    k = inflight.get(mb)
                    if k is None:
                        k = inflight[mb] = bounds.family_inflight(shape, vpp, with_opts, mb_gas)
                    if family.lb(mb, mb_gas, rc, k) * self.memory_factor <= usable:
                        cap = mb
                        break
                if cap is None:
                    continue
                g = bounds.stage_gpu_s_per_token_lb(shape, vpp, sps, coarse_micro_batch(cap), rc) * bubble + overhead
                if problem.max_cost_usd is not None \
                        and pricing.cost_lb_from_gpu_s_per_token(g) > problem.max_cost_usd:
                    continue  # (more recompute may fit a larger micro-batch)
                if problem.deadline_s is not None and pricing.time_lb_from_gpu_s_per_token(g, shape.world) \
                        > problem.deadline_s:
                    continue
                best = min(best, key_lb_from_gpu_s_per_token(problem, pricing, g, shape.world))
                if cap == mb_cap:
                    break  # more recompute only adds time at the same micro-batch
        return best * floor

    def fastest_lb(self, shape: Shape, threshold: float = float("inf")) -> float:
        """The first refinement of a shape's key: the least over its vpps of stages_lb's bound at the largest
        micro-batch without recompute (the bottleneck stage and the vpp's own bubble, memory not asked), band
        floor included; a vpp whose schedule cannot batch (interleaved 1F1B without a grad_accum that is a
        multiple of pp) has no layouts. stages_lb takes each vpp from there (its value is never below this)."""
        best = float("inf")
        for fastest, vpp, pipes, _ in self._vpp_fastest(shape):
            if self._micro_batches(shape.dp, shape.pp if pipes[0][0] == "interleaved_1f1b" else 1)[2]:
                best = fastest
                break
        return best * self.shape_floor(shape)

    def _vpp_fastest(self, shape: Shape) -> list[tuple[float, int, tuple[tuple[str, int], ...], float]]:
        """(key at the largest micro-batch without recompute, vpp, its pipeline choices with options, its bubble)
        for each vpp of ``shape``, smallest key first: kept for the shape between fastest_lb and stages_lb."""
        got = self._fastest.get(shape)
        if got is not None:
            return got
        problem, space, bounds = self.problem, self.space, self.bounds
        pricing = self._pricing[shape.option]
        sps = space.sp_choices(shape.tp, shape.cp)
        mb_cap, most = space.batch_extremes(shape.dp)
        overhead = bounds.step_overhead_per_token_lb(shape, most * shape.dp)
        # the pipeline classes (schedule, interleaved) with options: options read vpp only as > 1
        ok = tuple(pipe for pipe, vpp in self._pipeline_class_order(shape.pp) if self.num_options(shape, pipe[0], vpp))
        vpps = self._vpp_pipes(shape.pp, ok)
        mb = coarse_micro_batch(mb_cap)
        bkey = (shape.option, shape.tp, shape.cp, shape.experts, shape.pp, sps, mb, ok)  # (not dp: shared)
        busy = self._vpp_busy.get(bkey)
        if busy is None:
            busy = self._vpp_busy[bkey] = tuple(bounds.stage_per_token_busy_lb(shape, vpp, sps, mb, "none")
                                                for vpp, _ in vpps)
        wkey = (shape.pp, shape.dp, ok)  # (the bubbles read pp, dp and the pipeline choices)
        bubbles = self._vpp_bubbles.get(wkey)
        if bubbles is None:
            bubbles = self._vpp_bubbles[wkey] = tuple(self.shape_bubble(shape, pipes) for _, pipes in vpps)
        stretch = bounds.straggler_stretch(shape.world)
        got = []
        for (vpp, pipes), b, bubble in zip(vpps, busy, bubbles):
            g = b * stretch * bubble + overhead  # Bounds.stage_gpu_s_per_token_lb x bubble + overhead
            got.append((key_lb_from_gpu_s_per_token(problem, pricing, g, shape.world), vpp, pipes, bubble))
        got.sort(key=lambda x: x[:2])
        self._fastest[shape] = got
        return got

    def _pipeline_class_order(self, pp: int) -> tuple[tuple[tuple[str, bool], int], ...]:
        """The pipeline classes (schedule, interleaved) of pp in the order of their first choice, each with that
        choice's vpp (the order in which their options are first asked: the first unsupported one is the example)."""
        got = self._class_order.get(pp)
        if got is None:
            seen: dict[tuple[str, bool], int] = {}
            for sched, vpp in self.space.pipeline_choices(pp):
                seen.setdefault((sched, vpp > 1), vpp)
            got = self._class_order[pp] = tuple(seen.items())
        return got

    def _vpp_pipes(self, pp: int, ok: tuple[tuple[str, bool], ...]
                   ) -> tuple[tuple[int, tuple[tuple[str, int], ...]], ...]:
        """(vpp, its pipeline choices) for each vpp of pp with a choice in the classes ``ok``."""
        key = (pp, ok)
        got = self._pipes_by_vpp.get(key)
        if got is None:
            by_vpp: dict[int, list[tuple[str, int]]] = {}
            for sched, vpp in self.space.pipeline_choices(pp):
                if (sched, vpp > 1) in ok:
                    by_vpp.setdefault(vpp, []).append((sched, vpp))
            got = self._pipes_by_vpp[key] = tuple((vpp, tuple(pipes)) for vpp, pipes in by_vpp.items())
        return got

    def shape_bubble(self, shape: Shape, pipes: tuple[tuple[str, int], ...] | None = None) -> float:
        """Bounds.shape_bubble_factor of ``shape`` over ``pipes`` (None: every pipeline choice of its pp), kept per
        (pp, dp, pipes): it reads nothing else of the shape."""
        key = (shape.pp, shape.dp, pipes)
        got = self._bubble.get(key)
        if got is None:
            got = self._bubble[key] = self.bounds.shape_bubble_factor(
                shape, self.space.pipeline_choices(shape.pp) if pipes is None else pipes,
                self.space.batch_choices(shape.dp))
        return got

    def _micro_batches(self, dp: int, group: int) -> tuple[list[int], dict[int, tuple[int, ...]], tuple[int, ...]]:
        """(the micro-batches of batch_choices(dp), largest first; each one's grad_accums that are multiples of
        ``group`` (pp under interleaved 1F1B, else 1), for those that have any; all those grad_accums, sorted)."""
        key = (dp, group)
        got = self._mb_gas.get(key)
        if got is None:
            gas_of: dict[int, list[int]] = {}
            for mb, ga in self.space.batch_choices(dp):
                gas_of.setdefault(mb, []).append(ga)
            gas_ok = {mb: gas for mb, gas_all in gas_of.items() if (gas := tuple(ga for ga in gas_all if ga % group == 0))}
            got = self._mb_gas[key] = (sorted(gas_of, reverse=True), gas_ok,
                                       tuple(sorted({ga for gas in gas_ok.values() for ga in gas})))
        return got

    def groups_lb(self, shape: Shape, threshold: float = float("inf"), stop: float = float("inf")) -> float:
        """The smallest objective key (band floor included) a layout of ``shape`` can have by the bounds explore
        prunes with: over its groups (vpp, micro-batch, grad_accum, recompute) whose step bound keeps the budget
        and the deadline and whose memory bound (the smallest memory over its sequence-parallel and sharding
        choices) fits in usable HBM, the least layout bound (_layouts_key: each option's own memory bound and its
        sharding's ZeRO traffic, gradient reduce and optimizer step) of the options that fit. A shape none of
        whose layouts can win is skipped without exploring it: for a large model on few GPUs per replica, ZeRO-3
        is often the only sharding that fits, and its parameter gathers at a small micro-batch put every layout
        far above the group's step bound.

        The groups are taken best bound first (a heap): recompute only adds time (its bound is checked in
        tests/unit/solver/test_solver_bounds.py), so a group is first tried without recompute, then with the next
        recompute mode, whose memory is smaller (other options may fit, with less ZeRO traffic). GPipe and 1F1B
        have equal step bounds but not equal memory: such a group fits when either schedule's does (GPipe, which
        keeps every micro-batch's activations, is asked last). A group that fits goes back into the heap with its
        layouts' key; the search stops when such a key is the least left (the exact minimum), or once the least
        key left is above ``threshold`` (the shape is pruned) or above ``stop`` (the search's next shape key: the
        shape goes back into the search's heap and is asked again when it comes back). The walk is kept per shape
        and resumed by the next call, so a shape asked several times pops each group once. The value is kept per
        shape for a later call (a search sharing this one's caches): an exact minimum is final, a stop above a
        threshold or ``stop`` still bounds the minimum from below."""
        return self._groups_step(shape, threshold, stop)[0]

    def _groups_step(self, shape: Shape, threshold: float, stop: float) -> tuple[float, bool]:
        """groups_lb's value and whether it is the exact minimum (False: a stop above ``threshold`` or ``stop``)."""
        known = self._groups.get(shape)
        if known is not None and (known[1] or can_prune(known[0], threshold) or known[0] > stop):
            return known
        walk = self._group_walks.get(shape)
        if walk is None:
            walk = self._group_walks[shape] = self._groups_walk(shape)
            next(walk)
        got = walk.send((threshold, stop))
        if got[1]:
            del self._group_walks[shape]
        self._groups[shape] = got
        return got

    def _groups_walk(self, shape: Shape) -> Generator[tuple[float, bool], tuple[float, float], None]:
        """groups_lb's walk over the groups of ``shape``: sent (threshold, stop), it yields (the least key left,
        whether that is the exact minimum), its heap kept for the next send."""
        problem, space, bounds = self.problem, self.space, self.bounds
        pricing = self._pricing[shape.option]
        sps = space.sp_choices(shape.tp, shape.cp)
        rcs = tuple(rc for rc in RECOMPUTE_MODES if rc in space.recompute_choices())
        floor = self.shape_floor(shape)
        scheds: dict[int, list[str]] = {}  # vpp -> the schedules with supported options
        for sched, vpp in space.pipeline_choices(shape.pp):
            if self.num_options(shape, sched, vpp):
                scheds.setdefault(vpp, []).append(sched)
        heap: list[tuple[float, int, int, int, int, int, bool]] = []
        order = 0
        limited = problem.max_cost_usd is not None or problem.deadline_s is not None
        usable = bounds.usable_bytes(shape)
        caps = {vpp: self._fit_caps(shape, vpp, names, rcs, usable) for vpp, names in scheds.items()}

        def push(vpp: int, mb: int, ga: int, r: int) -> None:
            nonlocal order
            cap = caps[vpp]
            while r < len(rcs) and mb > cap[r]:  # no group of the micro-batch fits with that recompute mode
                r += 1
            if r == len(rcs):
                return
            step = bounds.group_step_lb(shape, scheds[vpp][0], vpp, mb, ga, rcs[r], sps)
            batch = mb * ga * shape.dp
            if limited and self._limits_broken(pricing, step, batch, shape.world):
                return  # with more recompute too: its step bound is larger
            key = key_lb_from_step(problem, pricing, step, batch, shape.world) * floor
            heapq.heappush(heap, (key, order, vpp, mb, ga, r, False))
            order += 1

        for vpp, names in scheds.items():
            for mb, ga in space.batch_choices(shape.dp):
                if names[0] == "interleaved_1f1b" and ga % shape.pp:
                    continue
                push(vpp, mb, ga, 0)
        threshold, stop = yield 0.0, False  # (primed: the first send brings the bounds)
        while heap:
            key, _, vpp, mb, ga, r, exact = heap[0]
            if exact or can_prune(key, threshold) or key > stop:
                threshold, stop = yield key, exact
                continue
            heapq.heappop(heap)
            if any(bounds.group_memory_lb(shape, sched, vpp, mb, ga, rcs[r], self.options(shape, sched, vpp))
                   * self.memory_factor <= usable for sched in sorted(scheds[vpp], key=lambda x: x == "gpipe")):
                # the group's own layouts: its key becomes theirs (at least its step bound's)
                layouts = self._layouts_key(shape, scheds[vpp], vpp, mb, ga, rcs[r], usable)
                if layouts < float("inf"):
                    heapq.heappush(heap, (layouts, order, vpp, mb, ga, r, True))
                    order += 1
            # more recompute: a larger step bound, but other options may fit (their ZeRO traffic can be smaller)
            if r + 1 < len(rcs):
                push(vpp, mb, ga, r + 1)
        while True:
            yield float("inf"), True

    def _layouts_key(self, shape: Shape, names: list[str], vpp: int, mb: int, ga: int, rc: str, usable: float
                     ) -> float:
        """The least key (band floor included) of the layouts of one group (vpp, micro-batch, grad_accum, recompute;
        schedules ``names``) that explore would cost: each option's memory bound fits and its step bound
        (Bounds.layout_step_lb: the sharding's ZeRO traffic, gradient reduce and optimizer step) keeps the budget and
        the deadline. inf: none. The options' step bounds are what explore prunes by; a group whose best option must
        gather ZeRO-3 parameters at a small micro-batch (a large model on few GPUs per replica) is far above its
        group step bound."""
        problem = self.problem
        pricing = self._pricing[shape.option]
        batch = mb * ga * shape.dp
        best = float("inf")
        for sched in names:
            for *_, step, _ in self._option_bounds(shape, sched, vpp, mb, ga, rc, self.options(shape, sched, vpp),
                                                   usable):
                if step is None or self._limits_broken(pricing, step, batch, shape.world):
                    continue
                best = min(best, key_lb_from_step(problem, pricing, step, batch, shape.world))
        return best * self.shape_floor(shape)

    def _option_bounds(self, shape: Shape, sched: str, vpp: int, mb: int, ga: int, rc: str, opts: tuple,
                       usable: float) -> Iterator[tuple[bool, Sharding, float, float | None, Callable[[], Layout]]]:
        """Per option of a group, in order: (sequence parallel, sharding, its memory bound with the search's
        margin, its step bound (Bounds.layout_step_lb, with the stages of its own sequence parallelism) or None
        when the memory bound exceeds ``usable``, a maker of the layout). The bounds explore prunes by and
        groups_lb prices a group with: the memory bound first, as in most groups most options cannot fit
        (ZeRO-0/1 of a large model) and it needs no Layout."""
        space, bounds = self.space, self.bounds
        for (sp, sh), mem in zip(opts, bounds.options_memory_lb(shape, sched, vpp, mb, ga, rc, opts)):
            mem *= self.memory_factor

            def make(sh: Sharding = sh, sp: bool = sp) -> Layout:
                return space.layout(shape, sched, vpp, sh, mb, ga, rc, sp)

            step = None if mem > usable else bounds.layout_step_lb(
                shape, sched, vpp, mb, ga, sh, bounds.group_stage_fb(shape, vpp, mb, rc, (sp,)), make)
            yield sp, sh, mem, step, make

    def _fit_caps(self, shape: Shape, vpp: int, names: list[str], rcs: tuple[str, ...], usable: float
                  ) -> tuple[int, ...]:
        """Per recompute mode of ``rcs``, the largest micro-batch of ``shape`` whose groups with this vpp (schedules
        ``names``) may fit in ``usable`` bytes (0: none): by bisection on the family's memory bound with every
        grad_accum's fewest in-flight micro-batches (Bounds.family_memory_lb), which grows with the micro-batch and
        is below each group's own (group_memory_lb, what groups_lb asks of the groups it pops). A group above its
        mode's cap is not pushed: on a 16K-GPU spec most of the micro-batches up to 256 do not fit."""
        bounds = self.bounds
        pipes = tuple((sched, self.options(shape, sched, vpp)) for sched in names)
        every_ga = self._micro_batches(shape.dp, shape.pp if names[0] == "interleaved_1f1b" else 1)[2]
        if not every_ga:
            return (0,) * len(rcs)
        family = bounds.family_memory(shape, vpp, pipes)
        fewest = bounds.family_inflight(shape, vpp, pipes, every_ga)
        mbs = self._micro_batches(shape.dp, 1)[0]  # largest first
        firsts = (self._first_fitting(family, mbs, every_ga, rc, fewest, usable, len(mbs)) for rc in rcs)
        return tuple(mbs[i] if i < len(mbs) else 0 for i in firsts)

    def _first_fitting(self, family: FamilyMemory, mbs: list[int], every_ga: tuple[int, ...], rc: str,
                       fewest: tuple[float, ...], usable: float, end: int) -> int:
        """The index in ``mbs`` (largest first) of the largest micro-batch among mbs[:end] whose family memory bound
        with ``rc`` and the fewest in-flight micro-batches of ``every_ga`` fits in ``usable`` bytes (``end``: none
        does), by bisection: that bound only grows with the micro-batch (one micro-batch's activations do). The
        bisection is pivoted at FamilyMemory.linear_fit's guess (the activations are proportional to the
        micro-batch in the cost model, so two checks there usually settle it); the checks, not the guess, decide."""
        def fits(i: int) -> bool:
            return family.lb(mbs[i], every_ga, rc, fewest) * self.memory_factor <= usable

        lo, hi = 0, end  # the answer is in [lo, hi]: mbs[lo - 1] does not fit (lo > 0), mbs[hi] fits (hi < end)
        if end:
            guess = family.linear_fit(usable / self.memory_factor, every_ga, rc, fewest)
            pivot = bisect.bisect_left(mbs, True, 0, end, key=lambda mb: mb <= guess)
            if pivot < end and not fits(pivot):
                lo = pivot + 1
            else:
                hi = pivot
                if pivot > 0 and fits(pivot - 1):
                    hi = pivot - 1
                else:
                    lo = pivot
        return bisect.bisect_left(range(lo, hi), True, key=fits) + lo

    def explore(self, shape: Shape) -> None:
        problem, space, bounds = self.problem, self.space, self.bounds
        pricing = self._pricing[shape.option]
        sps = space.sp_choices(shape.tp, shape.cp)
        floor = self.shape_floor(shape)
        groups = []
        order = 0
        class_opts: dict[tuple[str, bool], tuple] = {}
        for sched, vpp in space.pipeline_choices(shape.pp):
            opts = class_opts.get((sched, vpp > 1))
            if opts is None:
                opts = class_opts[(sched, vpp > 1)] = self.options(shape, sched, vpp)
            if not opts:
                continue
            for mb, ga in space.batch_choices(shape.dp):
                if sched == "interleaved_1f1b" and ga % shape.pp:
                    continue  # rejected (counted) in run()
                batch = mb * ga * shape.dp
                for rc in space.recompute_choices():
                    fbs = bounds.group_stage_fb(shape, vpp, mb, rc, sps)
                    step = bounds.group_step_lb(shape, sched, vpp, mb, ga, rc, sps, fbs)
                    lb = key_lb_from_step(problem, pricing, step, batch, shape.world) * floor
                    groups.append((lb, order, sched, vpp, mb, ga, rc, step, batch, opts, fbs))
                    order += 1
        groups.sort(key=lambda g: g[:2])
        usable = bounds.usable_bytes(shape)
        for lb, _, sched, vpp, mb, ga, rc, step, batch, opts, fbs in groups:
            n = len(opts)
            if self._bound_infeasible(pricing, step, batch, shape.world, n):
                continue
            if can_prune(lb, self.threshold_for(shape)):
                self.num_pruned += n
                continue
            mem = bounds.group_memory_lb(shape, sched, vpp, mb, ga, rc, opts) * self.memory_factor
            if mem > usable:
                sp, sh = opts[-1]
                self.tally.reject_memory_bound(lambda: space.layout(shape, sched, vpp, sh, mb, ga, rc, sp), mem,
                                               usable, n)
                continue
            cands = []
            for i, (sp, sh, mem, step_lb, make) in enumerate(self._option_bounds(shape, sched, vpp, mb, ga, rc, opts,
                                                                                  usable)):
                if step_lb is None:
                    self.tally.reject_memory_bound(make, mem, usable, 1)
                    continue
                cands.append((step_lb, i, sp, sh))
            cands.sort(key=lambda c: c[:2])
            for i, (layout_step, _, sp, sh) in enumerate(cands):
                # bounds ascend along cands: the first layout a bound rules out rules out the rest of the group
                # the same way (band factors are >= 1)
                rest = len(cands) - i
                if self._bound_infeasible(pricing, layout_step, batch, shape.world, rest):
                    break
                lb = key_lb_from_step(problem, pricing, layout_step, batch, shape.world)
                if can_prune(lb * floor, self.threshold_for(shape)):
                    self.num_pruned += rest
                    break
                self.visit(shape, sched, vpp, mb, ga, rc, sp, sh, lb)

    def _limits_broken(self, pricing: Pricing, step: float, batch: int, world: int) -> bool:
        """Whether a step-time lower bound already breaks the budget or the deadline (nothing tallied)."""
        problem = self.problem
        return ((problem.max_cost_usd is not None and pricing.cost_usd(step, batch, world) > problem.max_cost_usd)
                or (problem.deadline_s is not None and pricing.time_to_train_s(step, batch) > problem.deadline_s))

    def _bound_infeasible(self, pricing: Pricing, step: float, batch: int, world: int, n: int) -> bool:
        problem = self.problem
        if problem.max_cost_usd is not None:
            cost = pricing.cost_usd(step, batch, world)
            if cost > problem.max_cost_usd:
                self.tally.reject_by_bound(F.OVER_BUDGET, n, cost)
                return True
        if problem.deadline_s is not None:
            t = pricing.time_to_train_s(step, batch)
            if t > problem.deadline_s:
                self.tally.reject_by_bound(F.OVER_DEADLINE, n, t)
                return True
        return False

    def choice_supported(self, shape: Shape, sched: str, vpp: int, sp: bool, sh: Sharding) -> bool:
        """Whether every target runs the layouts of this (shape, schedule, sequence parallel, sharding) choice."""
        skey = support_key_of(tp=shape.tp, pp=shape.pp, cp=shape.cp, ep=shape.ep, sequence_parallel=sp,
                              zero_stage=sh.zero_stage, vpp=vpp, schedule=sched, dp_replicate=shape.dp // sh.dp_shard,
                              dp_shard=sh.dp_shard, offload_optimizer=sh.offload_optimizer,
                              offload_params=sh.offload_params, etp=shape.etp)
        supported = self._support.get(skey)
        if supported is None:
            supported = self.supported(self.space.layout(shape, sched, vpp, sh, 1, 1, "none", sp), skey)
        return supported

    def supported(self, layout: Layout, key: tuple) -> bool:
        ok = self._support.get(key)
        if ok is None:
            knobs = Knobs.of(layout)
            ok = not unsupported_reasons(self.problem.targets, self.problem.precision, knobs, self.problem.shape)[0]
            if ok and self.ruled_out_by is not None:
                ok = bool(unsupported_reasons((self.ruled_out_by,), self.problem.precision, knobs, self.problem.shape)[0])
            self._support[key] = ok
        return ok

    def visit(self, shape: Shape, sched: str, vpp: int, mb: int, ga: int, rc: str, sp: bool, sh: Sharding,
              lb: float) -> None:
        """One layout whose step-time and memory bounds could still win: the step bound at its band's factor,
        then the cost model."""
        problem = self.problem
        layout = self.space.layout(shape, sched, vpp, sh, mb, ga, rc, sp)
        floor = self.band_floor(layout, shape)
        threshold = self.threshold_for(shape)
        if floor > 1.0 and can_prune(lb * floor, threshold):
            self.num_pruned += 1
            return
        self.num_evaluated += 1
        result = self._evaluate(layout, threshold, floor)
        if result is None:  # one target's estimate already ranks after the top k+1: the binding one does too
            self.num_pruned += 1
            return
        if isinstance(result, Estimate):
            over = F.check_estimate(problem, result)
            if over is None:
                self.num_feasible += 1
                self.offer(layout, result)
                return
            result = over
        self.tally.reject_costed(layout, result)

    def shape_floor(self, shape: Shape) -> float:
        """The smallest band factor any layout of ``shape`` can carry (bands.shape_floor), cached by what it
        depends on; 1 under 'expected' or a stand-in evaluator."""
        if not self.banded or self.problem.confidence == "expected":
            return 1.0
        key = (shape.option, shape.pp > 1, shape.cp > 1, shape.ep > 1, scale_bucket(shape.world))
        got = self._floors.get(key)
        if got is None:
            from compiler.costmodel.frameworks import costed_targets

            got = self._floors[key] = shape_floor(
                self.problem, self.problem.gpu_options[shape.option], costed_targets(self.problem.targets),
                pp=shape.pp, cp=shape.cp, ep=shape.ep, world=shape.world, confidence=self.problem.confidence)
        return got

    def band_floor(self, layout: Layout, shape: Shape) -> float:
        """The smallest band factor (at the spec's confidence) any framework target's estimate of ``layout`` can
        carry: the binding target's is one of them. 1 under 'expected' or a stand-in evaluator."""
        if not self.banded or self.problem.confidence == "expected":
            return 1.0
        from compiler.costmodel.bands import layout_band
        from compiler.costmodel.frameworks import costed_targets

        gpu = self.problem.gpu_options[shape.option]
        return min(layout_band(self.problem, layout, t, gpu).time_factor(self.problem.confidence)
                   for t in costed_targets(self.problem.targets))

    def _evaluate(self, layout: Layout, threshold: float, floor: float = 1.0) -> Estimate | Rejection | None:
        """The cost model on ``layout`` for every framework target (the binding estimate), or None when the
        first target's estimate alone cannot enter the top k+1: a layout's estimate is its slowest target's,
        so the other targets are not costed (the per-target costing costs one target for most layouts)."""
        if self.evaluate is not _search_evaluate:
            return self.evaluate(self.problem, layout)
        from compiler.costmodel.evaluation import evaluate_targets_unless

        # the binding estimate is at least as slow as this one, and its band factor at least the floor
        targets = evaluate_targets_unless(
            self.problem, layout, lambda est: can_prune(objective_key(self.problem, est, factor=floor), threshold),
            pipeline_events=False)
        return None if targets is None else targets.result

    # ------------------------------------------------------------------ results
    def summary(self, misses: tuple = ()) -> SearchSummary:
        return SearchSummary(num_considered=self.num_considered, num_evaluated=self.num_evaluated,
                             num_feasible=self.num_feasible, num_pruned_by_bound=self.num_pruned,
                             rejections_by_code=dict(sorted(self.tally.counts.items())), closest_misses=misses)

    def relaxed_misses(self) -> tuple[ClosestMiss, ...]:
        """When the budget or the deadline is what rules layouts out: the best layout without that limit
        (the cheapest, or the fastest), and by how much it misses. When both are set and no layout meets the other
        one either, the best layout without both, and by how much it misses each."""
        problem, out = self.problem, []
        both = problem.max_cost_usd is not None and problem.deadline_s is not None
        if self.tally[F.OVER_BUDGET] and problem.max_cost_usd is not None:
            e, kept = self._relaxed_best(replace(problem, max_cost_usd=None, objective="cheapest"))
            over = None if e is None else F.check_budget(problem, e.estimate)
            if e is not None and over is not None:
                # the cheapest layout: fewer GPUs would not make it cheaper
                more = units.format_money(over.details["over_by_usd"])
                late = F.check_deadline(problem, e.estimate)
                message = "the cheapest layout " + ("within the deadline " if kept else "") + over.message
                if late is None:
                    fix = f"raise budget.max_cost by {more}, or choose cheaper GPUs"
                else:
                    message += f"; it also {late.message}"
                    fix = (f"raise budget.max_cost by {more} and extend budget.deadline by "
                           f"{units.format_seconds(late.details['over_by_s'])}, or choose cheaper GPUs")
                out.append(closest_miss(e.layout, replace(over, fix=fix), message,
                                        over.details["over_by_usd"] / problem.max_cost_usd))
        # (with a budget too, the layouts it ruled out were never checked against the deadline)
        if problem.deadline_s is not None and (self.tally[F.OVER_DEADLINE] or (both and self.tally[F.OVER_BUDGET])):
            e, kept = self._relaxed_best(replace(problem, deadline_s=None, objective="fastest"))
            over = None if e is None else F.check_deadline(problem, e.estimate)
            if e is not None and over is not None:
                extend = f"extend budget.deadline by {units.format_seconds(over.details['over_by_s'])}"
                broke = F.check_budget(problem, e.estimate)
                message = "the fastest layout " + ("within the budget " if kept else "") + over.message
                if broke is not None:
                    message += f"; it also {broke.message}"
                    extend += f" and raise budget.max_cost by {units.format_money(broke.details['over_by_usd'])}"
                n = self.fastest_gpus = e.estimate.num_gpus
                if n < problem.max_gpus:  # more GPUs are allowed, and the fastest layout does not use them
                    fix = (f"{extend}; the fastest layout uses {n:,} of the {problem.max_gpus:,} GPUs allowed, "
                           "so more GPUs would not help")
                elif problem.num_gpus is not None:
                    fix = f"{extend}, or use more GPUs (cluster.num_gpus)"
                else:
                    fix = f"{extend}, or allow more GPUs (cluster.max_gpus)"
                out.append(closest_miss(e.layout, replace(over, fix=fix), message,
                                        over.details["over_by_s"] / problem.deadline_s))
        return tuple(out)

    def _relaxed_best(self, relaxed: Problem) -> tuple[_Entry | None, bool]:
        """(the best layout of ``relaxed`` (this problem with a limit dropped), whether it meets the other limit
        ``relaxed`` keeps): when ``relaxed`` keeps one and has no layout, the best one without either; None when
        neither has one."""
        for problem in (relaxed, replace(relaxed, max_cost_usd=None, deadline_s=None)):
            search = _Search(problem, 0, self.evaluate)
            search.run()
            kept = problem.max_cost_usd is not None or problem.deadline_s is not None
            if search.top:
                return search.top[0], kept
            if not kept:
                break
        return None, False

    def batch_miss(self) -> tuple[ClosestMiss, str] | None:
        """When the global batch is what blocks the spec: (the plan a batch that splits better gets, the fix).

        Only asked when some parallel shapes failed the batch rule; the batch tried is the count within
        TOKEN_BATCH_ROUNDING of the spec's with the most factors of two (what a token batch gets)."""
        from compiler.arith import divisors, power_of_two_form, twos, well_dividing_count
        from compiler.problem import TOKEN_BATCH_ROUNDING
        from compiler.rules import some

        problem = self.problem
        batch = problem.global_batch
        better = well_dividing_count(batch, TOKEN_BATCH_ROUNDING)
        if not self.tally[F.BATCH_NOT_DIVISIBLE] or twos(better) <= twos(batch):
            return None
        relaxed = _Search(replace(problem, global_batch=better), 0, self.evaluate)
        relaxed.run()
        if not relaxed.top:
            return None
        e = relaxed.best_first()[0]
        splits = divisors(batch)
        form = power_of_two_form(batch)
        kind = "prime" if len(splits) == 2 else form
        tolerance = math.ceil(abs(better / batch - 1) * 100) / 100
        message = (f"the global batch is what blocks it: {batch} sequences ({kind}) split evenly only over dp = "
                   f"{some(splits, 8)}; {better} sequences ({power_of_two_form(better)}, {better / batch - 1:+.1%}) "
                   f"fit: "
                   f"{e.layout.describe()}, {units.format_seconds(e.estimate.time_to_train_s)}, "
                   f"{units.format_money(e.estimate.cost_usd)}")
        fix = (f"write training.global_batch: {better} (a token batch is rounded to such a count by itself), or "
               f"allow training.global_batch_tolerance: {tolerance:g}")
        miss = ClosestMiss(layout=e.layout.tag, description=e.layout.describe(), code=F.BATCH_NOT_DIVISIBLE,
                           message=message, fix=fix, over_by=0.0, gpus=f"{e.layout.world_size} x {e.layout.gpu}")
        return miss, fix

    def thin_regime_note(self, best: _Entry) -> str:
        """The pick lies in a thin regime: say so, and name the best layout whose band rests on enough published
        runs, with what choosing it costs (a search without the thin regimes)."""
        problem, est = self.problem, as_in_plan(best.estimate)  # the figures as plan.json and PLAN.md show them
        assert est.band is not None
        # an alternative is worth naming while its objective stays within SAFETY_REACH of the pick's, and the search
        # for it explores at most SAFETY_SHAPES x the shapes the search for the pick explored (SAFETY_MIN_SHAPES at
        # least): where no layout is well calibrated (a target without published runs near the spec's scale binds
        # every layout), proving it costs every shape the bounds cannot rule out (a 16K-GPU spec with a loose
        # batch: ~1,000 shapes, 13 s)
        safe = _Search(replace(problem, top_k=0), 0, _calibrated_evaluate, like=self,
                       ceiling=objective_key(problem, best.estimate) * (1 + SAFETY_REACH),
                       max_explored=max(SAFETY_MIN_SHAPES, SAFETY_SHAPES * self.num_explored))
        for e in self.calibrated_seen:  # the well-calibrated layouts this search found: a head start, not a shortcut
            safe.offer(e.layout, e.estimate)
        safe.run()
        head = (f"the pick lies in a thin regime ({est.band.describe()}): its 80% band is "
                f"{units.format_seconds_range(*est.step_time_band_s)} per step")
        stopped = (f" among the {safe.num_explored:,} most promising parallel shapes (the search stopped there)"
                   if safe.stopped else "")
        if not safe.top:
            return head + (f"; no layout of a well-calibrated regime is feasible for this spec within {SAFETY_REACH:.0%} "
                           f"of the pick's objective at {problem.confidence}{stopped}")
        alt = safe.best_first()[0]
        a = as_in_plan(alt.estimate)
        assert a.band is not None
        dt, dc = a.time_to_train_s / est.time_to_train_s - 1, a.cost_usd / est.cost_usd - 1
        ka, kb = objective_key(problem, a), objective_key(problem, est)
        return (head + f". The best well-calibrated alternative{stopped}: {alt.layout.describe()} on {a.num_gpus:,} x "
                f"{alt.layout.gpu}, {units.format_seconds(a.time_to_train_s)}, {units.format_money(a.cost_usd)} "
                f"({a.band.describe()}); the cost of safety: {dt:+.1%} time to train, {dc:+.1%} cost by the point "
                f"estimates ({ka / kb - 1:+.1%} on the objective at {problem.confidence})")

    def result(self, final: "Evaluator | FinalEvaluator") -> Plan:
        problem = self.problem
        if not self.top:
            batch = self.batch_miss()
            misses = (((batch[0],) if batch else ()) + self.relaxed_misses()
                      + self.tally.closest_misses(self.evaluate))[:MAX_MISSES]
            raise infeasible_error(problem, self.summary(misses), self.tally.examples, misses,
                                   batch_fix=batch[1] if batch else "", fastest_gpus=self.fastest_gpus)
        kept = self.best_first()
        best = kept[0]
        per_target: tuple[TargetEstimate, ...] = ()
        if final is not self.evaluate:  # the chosen layout again, with its simulated pipeline schedule
            targets = final(problem, best.layout)
            again = targets.result  # type: ignore[union-attr]
            assert isinstance(again, Estimate), f"the cost model changed its mind about {best.layout.tag}"
            best.estimate, per_target = again, targets.summaries()  # type: ignore[union-attr]
        alternatives = tuple(
            Candidate(layout=e.layout, estimate=e.estimate, rank=i + 2,
                      why_lost=why_lost(problem, e.layout, e.estimate, best.layout, best.estimate,
                                        cheapest_usd=self.cheapest if self.ties else None))
            for i, e in enumerate(kept[1:]))
        notes = plan_notes(problem, best.layout, largest_gpus=self.largest_gpus) + framework_notes(problem, best.layout)
        if final is not self.evaluate and best.estimate.band is not None and best.estimate.band.thin:
            notes = (self.thin_regime_note(best),) + notes
        if self.ties and self.top[0].layout.tag != best.layout.tag:
            notes = (cheapest_tie_note(problem, best.layout, best.estimate, self.top[0].layout,
                                       self.top[0].estimate),) + notes
        return make_plan(problem, best.layout, best.estimate, alternatives=alternatives,
                         search=self.summary(), notes=notes, target_estimates=per_target)


@dataclass(frozen=True)
class TargetCost:
    """What a target's support rules cost the plan: the best plan without that target, if it is better."""

    target: str
    layout: Layout
    estimate: Estimate
    reason: str  # why the target cannot run that layout (its support rules)
    better_by: float  # relative improvement of the objective key (0.12 = 12% faster / cheaper)

    def describe(self, problem: Problem, plan: Plan) -> str:
        from compiler.targets import registry

        name = registry.get(self.target).display_name
        e, p = self.estimate, plan.estimate
        at = "" if problem.confidence == "expected" else f" at {problem.confidence}"  # better_by compares the keys
        if problem.objective == "cheapest":
            what = (f"{units.format_money(e.cost_usd)} instead of {units.format_money(p.cost_usd)} "
                    f"({self.better_by:.1%} cheaper{at})")
        elif problem.objective == "throughput":
            what = (f"{e.tokens_per_s_per_gpu:,.0f} instead of {p.tokens_per_s_per_gpu:,.0f} tokens/s per GPU "
                    f"({self.better_by:.1%} more{at})")
        else:
            what = (f"{units.format_seconds(e.time_to_train_s)} instead of {units.format_seconds(p.time_to_train_s)} "
                    f"({self.better_by:.1%} faster{at})")
        return (f"target {self.target} ruled out a better layout: {self.layout.describe()} on {e.num_gpus:,} x "
                f"{self.layout.gpu} trains in {what}, but {name} cannot run it ({self.reason})")


def target_costs(problem: Problem, plan: Plan, *, min_gain: float = 0.005) -> tuple[TargetCost, ...]:
    """For each framework target of ``problem``: the best of the layouts that target cannot run, costed without
    it, when it beats ``plan`` on the objective by more than ``min_gain``. A plan must run under every target it
    is rendered for, so each target can only narrow the layouts; this says what it costs. (The layouts it runs
    were the plan's search's: the relaxed search leaves them out, which on a large space is most of it.)"""
    from compiler.solver.objective import objective_key
    from compiler.targets import registry
    from compiler.targets.support import target_reason

    frameworks = [t for t in problem.targets if registry.get(t).support]
    out = []
    base = objective_key(problem, plan.estimate)
    # only a layout more than min_gain better than the plan is reported: the relaxed search prunes the rest. Under
    # 'cheapest' the layout reported is the fastest of those tying with the cheapest (within CHEAPEST_TIE): when the
    # cheapest is below the line, all of them are below the line raised by the tie band, and when it is not, none is
    # reported whatever the search keeps
    ceiling = base * (1 - min_gain) * (1 + CHEAPEST_TIE if problem.objective == "cheapest" else 1)
    for target in frameworks:
        others = tuple(t for t in problem.targets if t != target)
        relaxed = _Search(replace(problem, targets=others, top_k=0), 0, _search_evaluate, ceiling=ceiling,
                          ruled_out_by=target)
        relaxed.run()
        if not relaxed.top:
            continue
        e = relaxed.best_first()[0]
        key = objective_key(problem, e.estimate)
        gain = 1 - key / base if base > 0 else 0.0
        hit = target_reason(target, Knobs.of(e.layout), problem.precision, problem.shape)
        if gain > min_gain and hit is not None:
            out.append(TargetCost(target, e.layout, e.estimate, hit[1], gain))
    return tuple(out)
