"""Pipeline schedules as a discrete-event simulation: GPipe, 1F1B and interleaved 1F1B.

Each stage runs its operations in the order its schedule prescribes (the Megatron-LM
orders: ``megatron/core/pipeline_parallel/schedules.py``); an operation starts when
its stage is free and its input has arrived from the neighbouring (virtual) stage,
plus the point-to-point latency when it crosses stages. The makespan of one step is
the critical path; the bubble is the idle share of it.

Times are normalised: one stage's forward of one micro-batch takes 1 unit (a chunk of
an interleaved stage 1/v), its backward ``backward_ratio`` units, and a p2p transfer
``p2p_ratio`` units. Results are cached on those (rounded) numbers, so the solver's
thousands of calls simulate each distinct schedule once; the step time in
compiler/costmodel/step.py is this simulated makespan times the forward time.

Textbook checks (tests/unit/costmodel/test_cm_pp_schedule.py): with no p2p cost the
bubble fraction is (p-1)/(m+p-1) for GPipe and 1F1B (Narayanan et al. 2021, sec. 2.2),
and interleaving with v chunks divides the bubble time by v: (p-1)/(v*m) of the ideal time.

Cost bounded by construction (issue #16): a step of m micro-batches has 2*pp*v*m operations,
and gradient accumulation can make m a million. No function here costs more with m:

- GPipe's makespan is a closed form, exact for every m (each stage runs its forwards, then
  its backwards, back to back): (m + p - 1)(1 + r) + 2(p - 1) x.
- 1F1B and interleaved 1F1B are simulated whole up to EXACT_MICROBATCHES micro-batches, or up
  to MAX_SIMULATED_OPS operations (every layout the goldens use). Beyond, a step is warm-up, a
  steady state that repeats every pp micro-batches (a max-plus linear recurrence, so
  eventually periodic: the makespan grows by the same amount every c periods) and the drain:
  the makespan is simulated at ``window_sizes`` (m's residue modulo pp, one period apart),
  the cycle c found where the differences repeat (``steady_cycle``), and extrapolated within
  m's residue class modulo c periods. Exact once the schedule is periodic inside the window:
  1F1B always was in tests/unit/costmodel/test_cm_pp_schedule.py; interleaved 1F1B within 1%.
  The work is at most MAX_SIMULATED_OPS operations (plus pp**2 * v for pipelines too deep
  for that, at most MAX_PIPELINE_PARALLEL stages: a linear fit over two sizes).
- the in-flight micro-batches (activation memory) are the closed form of the warm-up.
- the simulated events (for PLAN.md's picture) are kept only for steps of at most
  MAX_PIPELINE_EVENTS operations; larger steps carry none (the report says so).
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

from compiler.estimate import PipelineEvent

Op = tuple[str, int, int]  # (kind "F"/"B", chunk, microbatch)


# --- the operation order of each stage ----------------------------------------------------------


def gpipe_order(stage: int, pp: int, m: int) -> list[Op]:
    """All forwards, then all backwards (Huang et al. 2019, GPipe)."""
    return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]


def warmup_forwards(schedule: str, stage: int, pp: int, m: int, v: int) -> int:
    """The forwards a stage runs before its first backward under 1F1B (pp - stage - 1) or interleaved 1F1B
    ((pp - stage - 1) x 2 + (v - 1) x pp, every one when m == pp), at most all of them."""
    if schedule == "interleaved_1f1b" and v > 1:
        return m * v if m == pp else min(m * v, (pp - stage - 1) * 2 + (v - 1) * pp)
    return min(pp - stage - 1, m)


def one_f_one_b_order(stage: int, pp: int, m: int) -> list[Op]:
    """PipeDream-Flush 1F1B: pp-stage-1 warm-up forwards, then one forward one backward
    (Narayanan et al. 2021, sec. 2.2.1)."""
    warmup = warmup_forwards("1f1b", stage, pp, m, 1)
    ops: list[Op] = [("F", 0, i) for i in range(warmup)]
    f, b = warmup, 0
    while f < m:
        ops.append(("F", 0, f))
        f += 1
        ops.append(("B", 0, b))
        b += 1
    ops += [("B", 0, i) for i in range(b, m)]
    return ops


def _interleaved_chunk(k: int, pp: int, v: int, forward: bool) -> tuple[int, int]:
    """Megatron's mapping of the k-th forward/backward on a rank to (chunk, microbatch)."""
    group, within = divmod(k, pp * v)
    chunk = within // pp
    if not forward:
        chunk = v - 1 - chunk
    return chunk, group * pp + within % pp


def interleaved_order(stage: int, pp: int, m: int, v: int) -> list[Op]:
    """Interleaved 1F1B (Narayanan et al. 2021, sec. 2.2.2; Megatron-LM
    forward_backward_pipelining_with_interleaving): micro-batches go through the v chunks in
    groups of pp; warm-up (pp - stage - 1) * 2 + (v - 1) * pp forwards. Needs m % pp == 0."""
    total = m * v
    warmup = warmup_forwards("interleaved_1f1b", stage, pp, m, v)
    ops: list[Op] = []
    for k in range(warmup):
        c, i = _interleaved_chunk(k, pp, v, True)
        ops.append(("F", c, i))
    f, b = warmup, 0
    while f < total:
        c, i = _interleaved_chunk(f, pp, v, True)
        ops.append(("F", c, i))
        f += 1
        c, i = _interleaved_chunk(b, pp, v, False)
        ops.append(("B", c, i))
        b += 1
    while b < total:
        c, i = _interleaved_chunk(b, pp, v, False)
        ops.append(("B", c, i))
        b += 1
    return ops


def stage_order(schedule: str, stage: int, pp: int, m: int, v: int) -> list[Op]:
    if schedule == "gpipe":
        return gpipe_order(stage, pp, m)
    if schedule == "interleaved_1f1b" and v > 1:
        return interleaved_order(stage, pp, m, v)
    return one_f_one_b_order(stage, pp, m)


# --- in-flight micro-batches (activation memory) -----------------------------------------------


@functools.lru_cache(maxsize=4096)
def peak_inflight_chunks(schedule: str, stage: int, pp: int, m: int, v: int) -> int:
    """Most (chunk, micro-batch) activations a stage holds at once: forwards done whose
    backward has not run yet. 1F1B stage 0: min(pp, m); GPipe: m; interleaved stage 0:
    (pp - 1) * 2 + (v - 1) * pp + 1 chunks, i.e. about pp + (pp - 1)/v micro-batches of the
    whole stage (Korthikanti et al. 2022, sec. 4.2.3)."""
    if schedule == "gpipe":
        return m * v  # every forward before the first backward
    total = m * v
    warmup = warmup_forwards(schedule, stage, pp, m, v)
    # warm-up forwards, then one forward (live + 1) and one backward (live - 1) in turn
    return total if warmup >= total else warmup + 1


def peak_inflight_chunks_by_walk(schedule: str, stage: int, pp: int, m: int, v: int) -> int:
    """``peak_inflight_chunks`` by walking the stage's operation order (O(m); for tests)."""
    live = peak = 0
    for kind, _, _ in stage_order(schedule, stage, pp, m, v):
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


def inflight_microbatches(schedule: str, stage: int, pp: int, m: int, v: int) -> float:
    """Peak in-flight activations of a stage in units of one micro-batch through all its chunks."""
    if pp == 1:
        return 1.0
    return peak_inflight_chunks(schedule, stage, pp, m, v) / v


# --- simulation ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Simulation:
    makespan: float  # normalised units (stage forward of one micro-batch = 1)
    busy: float  # per stage: m * (1 + backward_ratio)
    events: tuple[tuple[int, int, int, str, float, float], ...]  # (stage, chunk, mb, kind, start, end)

    @property
    def bubble_fraction(self) -> float:
        return 0.0 if self.makespan <= 0 else (self.makespan - self.busy) / self.makespan


def simulate(schedule: str, pp: int, m: int, v: int, backward_ratio: float, p2p_ratio: float,
             *, keep_events: bool = False) -> Simulation:
    """Run one step: every stage executes its order; returns the makespan in units (and every operation's
    (stage, chunk, micro-batch, kind, start, end) with ``keep_events``)."""
    events: list[tuple[int, int, int, str, float, float]] | None = [] if keep_events else None
    makespan = _run(_step_plan(schedule, pp, m, v), pp, m, v, backward_ratio, p2p_ratio, events)
    return Simulation(makespan, m * (1.0 + backward_ratio), tuple(events or ()))


@functools.lru_cache(maxsize=16)
def _step_plan(schedule: str, pp: int, m: int, v: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Per stage, the simulation's operations in its order as four parallel tuples: own slot, dependency slot
    (-1: none), whether the dependency crosses stages (1/0), forward (1) or backward (0). An operation's slot is
    ((kind == "B") x pp v + virtual stage) x m + micro-batch. A forward needs the forward of the virtual stage
    before it (none on the first), a backward the backward of the virtual stage after it (the last one's own
    forward). They do not depend on the durations, so the solver's many ratios of one schedule share them."""
    if schedule != "gpipe" and v == 1:
        return tuple(_one_f_one_b_plan(s, pp, m) for s in range(pp))
    if schedule == "interleaved_1f1b":
        return tuple(_interleaved_plan(s, pp, m, v) for s in range(pp))
    return _listed_plan(schedule, pp, m, v)


def _listed_plan(schedule: str, pp: int, m: int, v: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """_step_plan from each stage's operation list (stage_order)."""
    n_virtual = pp * v
    last = n_virtual - 1
    out = []
    for s in range(pp):
        own, deps, cross, fwd = [], [], [], []
        for kind, chunk, mb in stage_order(schedule, s, pp, m, v):
            vs = chunk * pp + s  # the virtual stage
            if kind == "F":
                own.append(vs * m + mb)
                deps.append(-1 if vs == 0 else (vs - 1) * m + mb)  # the forward of the virtual stage before
                cross.append(int(vs != 0 and (vs - 1) % pp != s))
                fwd.append(1)
            else:
                own.append((n_virtual + vs) * m + mb)
                if vs == last:  # the last virtual stage's own forward
                    deps.append(vs * m + mb)
                    cross.append(0)
                else:  # the backward of the virtual stage after
                    deps.append((n_virtual + vs + 1) * m + mb)
                    cross.append(int((vs + 1) % pp != s))
                fwd.append(0)
        out.append((tuple(own), tuple(deps), tuple(cross), tuple(fwd)))
    return tuple(out)


def _one_f_one_b_plan(s: int, pp: int, m: int) -> tuple[tuple[int, ...], ...]:
    """_step_plan's tuples of stage ``s`` under 1F1B (one_f_one_b_order, v = 1), built from the order's three runs
    (warm-up forwards, forward-backward pairs, the last backwards) without its operation list
    (tests/unit/costmodel/test_cm_pp_schedule.py checks them against it)."""
    w = warmup_forwards("1f1b", s, pp, m, 1)
    f0, b0 = s * m, (pp + s) * m  # the slots of forward 0 and backward 0 (every forward slot is below b0)
    own = [f0 + i for i in range(w)] + [x for j in range(m - w) for x in (f0 + w + j, b0 + j)] \
        + [b0 + i for i in range(m - w, m)]
    # a forward needs the previous stage's (none on the first), a backward the next stage's backward, the last
    # stage's its own forward
    b_dep = -pp * m if s == pp - 1 else m
    deps = [(-1 if s == 0 else x - m) if x < b0 else x + b_dep for x in own]
    fwd = [1] * w + [1, 0] * (m - w) + [0] * w
    f_cross, b_cross = int(s != 0), int(s != pp - 1)
    return tuple(own), tuple(deps), tuple(f_cross if f else b_cross for f in fwd), tuple(fwd)


def _interleaved_plan(s: int, pp: int, m: int, v: int) -> tuple[tuple[int, ...], ...]:
    """_step_plan's tuples of stage ``s`` under interleaved 1F1B (interleaved_order, v > 1), without the operation
    list: the k-th forward and backward's (chunk, micro-batch) as _interleaved_chunk maps them (its arithmetic
    inline: calling it per operation is as slow as the list), in the order's three runs
    (tests/unit/costmodel/test_cm_pp_schedule.py checks them against the list)."""
    total, group = m * v, pp * v  # (pp x v virtual stages, as micro-batches go in groups of pp through v chunks)
    last = group - 1
    cross = int(pp > 1)  # a neighbouring virtual stage is on another rank unless there is one rank
    warmup = warmup_forwards("interleaved_1f1b", s, pp, m, v)
    own: list[int] = []
    deps: list[int] = []
    crosses: list[int] = []

    def forward(k: int) -> None:  # needs the forward of the virtual stage before (none on the first)
        vs, mb = (k % group) // pp * pp + s, (k // group) * pp + k % pp
        own.append(vs * m + mb)
        deps.append(-1 if vs == 0 else (vs - 1) * m + mb)
        crosses.append(0 if vs == 0 else cross)

    def backward(k: int) -> None:  # needs the backward of the virtual stage after (the last one: its own forward)
        vs, mb = (v - 1 - (k % group) // pp) * pp + s, (k // group) * pp + k % pp
        own.append((group + vs) * m + mb)
        deps.append(vs * m + mb if vs == last else (group + vs + 1) * m + mb)
        crosses.append(0 if vs == last else cross)

    for k in range(warmup):
        forward(k)
    for j in range(total - warmup):
        forward(warmup + j)
        backward(j)
    for j in range(total - warmup, total):
        backward(j)
    fwd = [1] * warmup + [1, 0] * (total - warmup) + [0] * warmup
    return tuple(own), tuple(deps), tuple(crosses), tuple(fwd)


def _run(plans: tuple[tuple[tuple[int, ...], ...], ...], pp: int, m: int, v: int, backward_ratio: float,
         p2p_ratio: float, events: list[tuple[int, int, int, str, float, float]] | None) -> float:
    """Every stage runs its plan (_step_plan): an operation starts when its stage is free and its input has
    arrived (+ p2p when it crosses stages). Returns the makespan; appends each operation to ``events``."""
    n_virtual = pp * v
    lengths = (backward_ratio / v, 1.0 / v)  # indexed by 'is a forward'
    finish = [-1.0] * (2 * n_virtual * m)  # every finish time is > 0
    pos = [0] * pp
    free = [0.0] * pp
    remaining = sum(len(p[0]) for p in plans)
    while remaining:
        progressed = False
        for s in range(pp):
            own, deps, cross, fwd = plans[s]
            i = start = pos[s]
            t = free[s]
            n = len(own)
            while i < n:
                dep = deps[i]
                if dep >= 0:
                    end = finish[dep]
                    if end < 0.0:
                        break
                    if cross[i]:
                        end = end + p2p_ratio
                    if end > t:
                        t = end
                length = lengths[fwd[i]]
                if events is not None:
                    k, mb = divmod(own[i], m)
                    events.append((s, (k % n_virtual) // pp, mb, "F" if fwd[i] else "B", t, t + length))
                t += length
                finish[own[i]] = t
                i += 1
            if i != start:
                remaining -= i - start
                pos[s], free[s] = i, t
                progressed = True
        assert progressed, "pipeline schedule deadlocked (internal error)"
    return max(free)


def round_ratio(x: float) -> float:
    """Cache key rounding (3 significant digits); the step time uses the rounded value too."""
    if x <= 0:
        return 0.0
    return float(f"{x:.3g}")


EXACT_MICROBATCHES = 256  # steps of at most this many micro-batches are always simulated whole
MAX_SIMULATED_OPS = 2**20  # beyond that, operations simulated for one makespan (about 1 CPU-s)
WINDOW_MIN_MICROBATCHES = 128  # the extrapolation's windows start at least this far in ...
WINDOW_PERIODS = 8  # ... and at least this many periods (of pp micro-batches) in
MAX_CYCLE = 6  # the longest steady-state cycle looked for, in periods
CONFIRM = 3  # a cycle counts once it repeated over this many more steps
MAX_PIPELINE_EVENTS = 10_000  # events kept for the report (plan.json); larger steps keep none


_LINEAR_P2P = {"on": False}


@contextlib.contextmanager
def linear_p2p_makespans():
    """Within this context the makespan is the textbook closed form + c x p2p, c the critical path's p2p
    count of the schedule, simulated once per (schedule, pp, m, v) at a small p2p. The simulated makespan
    is exactly that for p2p small against a forward (tests/unit/costmodel/test_cm_pp_schedule.py): the fit
    (compiler/calibration/fit.py) re-costs every published run dozens of times and uses it so that it does
    not re-simulate long interleaved schedules for every trial constant."""
    before = _LINEAR_P2P["on"]
    _LINEAR_P2P["on"] = True
    try:
        yield
    finally:
        _LINEAR_P2P["on"] = before


@functools.lru_cache(maxsize=4096)
def p2p_critical_path_count(schedule: str, pp: int, m: int, v: int) -> float:
    """p2p transfers on the critical path: the makespan's slope in the p2p time for small p2p."""
    x = 1e-3
    return (_makespan_units(schedule, pp, m, v, 2.0, x) - textbook_makespan_units(schedule, pp, m, v, 2.0)) / x


def makespan_units(schedule: str, pp: int, m: int, v: int, backward_ratio: float, p2p_ratio: float) -> float:
    """Cached makespan of one step, in stage-forward units (ratios pre-rounded); its cost does not
    grow with m (see the module docstring). Inside ``linear_p2p_makespans`` the closed form + c x p2p."""
    if _LINEAR_P2P["on"] and pp > 1:
        return (textbook_makespan_units(schedule, pp, m, v, backward_ratio)
                + p2p_critical_path_count(schedule, pp, m, v) * p2p_ratio)
    return _makespan_units(schedule, pp, m, v, backward_ratio, p2p_ratio)


@functools.lru_cache(maxsize=8192)
def _makespan_units(schedule: str, pp: int, m: int, v: int, backward_ratio: float, p2p_ratio: float) -> float:
    if pp == 1:
        return m * (1.0 + backward_ratio)
    if schedule == "gpipe" and v == 1:
        return gpipe_makespan_units(pp, m, backward_ratio, p2p_ratio)
    if m <= EXACT_MICROBATCHES or 2 * pp * v * m <= MAX_SIMULATED_OPS:
        return simulate(schedule, pp, m, v, backward_ratio, p2p_ratio).makespan
    sizes = window_sizes(pp, m, v)
    if sizes[-1] >= m:
        return simulate(schedule, pp, m, v, backward_ratio, p2p_ratio).makespan
    return _extrapolated_makespan(schedule, pp, m, v, backward_ratio, p2p_ratio, sizes)


def gpipe_makespan_units(pp: int, m: int, backward_ratio: float, p2p_ratio: float) -> float:
    """GPipe in closed form: stage s finishes forward i at s(1 + x) + i + 1; the last stage runs its
    m backwards right after, and each earlier stage one backward and one transfer later."""
    return (m + pp - 1) * (1.0 + backward_ratio) + 2 * (pp - 1) * p2p_ratio


def window_sizes(pp: int, m: int, v: int = 1) -> tuple[int, ...]:
    """Step sizes the extrapolation may simulate, in m's residue class modulo pp and one period
    apart: from WINDOW_PERIODS periods (and WINDOW_MIN_MICROBATCHES) in, enough to confirm a cycle
    of MAX_CYCLE periods (see ``steady_cycle``); nearer the start when that would simulate more
    than MAX_SIMULATED_OPS operations; for the deepest pipelines two sizes (a linear fit)."""
    rest = m % pp
    ops = 2 * pp * v
    for periods in (max(WINDOW_PERIODS, -(-WINDOW_MIN_MICROBATCHES // pp)), 4, 2):
        sizes = tuple(pp * (periods + k) + rest for k in range(2 * MAX_CYCLE + CONFIRM))
        if ops * sum(sizes) <= MAX_SIMULATED_OPS:
            return sizes
    return (2 * pp + rest, 3 * pp + rest)


def steady_cycle(points: list[float]) -> int | None:
    """The smallest c such that points[i + c] - points[i] is the same for the last c + CONFIRM
    values of i (a whole cycle and then some, so that a transient that repeats by chance for a
    step or two is not taken for the steady state)."""
    for c in range(1, MAX_CYCLE + 1):
        need = c + CONFIRM
        if len(points) - c < need:
            return None
        diffs = [points[i + c] - points[i] for i in range(len(points) - c - need, len(points) - c)]
        scale = max(1.0, max(abs(d) for d in diffs))
        if max(diffs) - min(diffs) <= 1e-9 * scale:
            return c
    return None


def _extrapolated_makespan(schedule: str, pp: int, m: int, v: int, backward_ratio: float, p2p_ratio: float,
                           sizes: tuple[int, ...]) -> float:
    points: list[float] = []
    cycle = None
    for size in sizes:
        points.append(simulate(schedule, pp, size, v, backward_ratio, p2p_ratio).makespan)
        cycle = steady_cycle(points)
        if cycle is not None:
            break
    last = len(points) - 1
    if cycle is None:  # no cycle of at most MAX_CYCLE periods in the window: its average growth
        return points[last] + (m - sizes[last]) / pp * (points[last] - points[0]) / last
    k = (m - sizes[0]) // pp  # m is sizes[0] + k periods
    anchor = last - (last - k) % cycle  # a simulated size in m's residue class modulo cycle periods
    per_cycle = points[anchor] - points[anchor - cycle]
    return points[anchor] + (k - anchor) // cycle * per_cycle


def textbook_makespan_units(schedule: str, pp: int, m: int, v: int, backward_ratio: float) -> float:
    """Closed form with no p2p cost: (m + p - 1)(1 + r); interleaved (m + (p - 1)/v)(1 + r)
    (Narayanan et al. 2021, sec. 2.2). Equal to the simulation for uniform stages."""
    if pp == 1:
        return m * (1.0 + backward_ratio)
    fill = (pp - 1) / v if schedule == "interleaved_1f1b" and v > 1 else pp - 1
    return (m + fill) * (1.0 + backward_ratio)


def textbook_bubble_fraction(schedule: str, pp: int, m: int, v: int = 1) -> float:
    """Closed form with no p2p cost: (p-1)/(m+p-1); interleaved: (p-1)/(v*m + p-1)."""
    if schedule == "interleaved_1f1b" and v > 1:
        return (pp - 1) / (v * m + pp - 1)
    return (pp - 1) / (m + pp - 1)


@functools.lru_cache(maxsize=64)
def _simulated_events(schedule: str, pp: int, m: int, v: int, backward_ratio: float, p2p_ratio: float):
    return simulate(schedule, pp, m, v, backward_ratio, p2p_ratio, keep_events=True).events


def pipeline_events(schedule: str, pp: int, m: int, v: int, forward_s: float, backward_s: float,
                    p2p_s: float) -> tuple[PipelineEvent, ...]:
    """The simulated schedule of one step in seconds, for reports (empty when pp == 1, or when the
    step has more than MAX_PIPELINE_EVENTS operations)."""
    if pp == 1 or 2 * pp * v * m > MAX_PIPELINE_EVENTS:
        return ()
    r = round_ratio(backward_s / forward_s)
    x = round_ratio(p2p_s / forward_s)
    return tuple(PipelineEvent(stage=s, chunk=c, microbatch=i, kind=k, start_s=a * forward_s, end_s=b * forward_s)
                 for s, c, i, k, a, b in _simulated_events(schedule, pp, m, v, r, x))
