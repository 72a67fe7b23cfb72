"""Fit the few fitted constants (compiler/costmodel/efficiency.py FIT_PARAMETERS) on published runs.

    fit_constants(runs) -> {name: value}
    fit_with_loso(runs) -> FitResult (the fit on every run, and one refit per left-out source)

Everything else the cost model uses is physics (compiler/data/physics.yaml). The fit minimises,
in log space of the constants (all positive),

    sum_i w_i huber(log(predicted_i / measured_i)) + ridge * sum_k (log(c_k / prior_k))^2

with w_i = 1 / sqrt(rows of row i's source) (every source counts, the big one does not drown the
rest), a Huber loss (delta 0.15: one badly transcribed row cannot drag a constant), a ridge
towards the physics-only priors, and each constant clipped to its physical range. The solver is
Levenberg-Marquardt with forward-difference Jacobians; it is deterministic (no random starts), so
the same data and physics give the same constants to the last digit. Leave-one-source-out refits
start from the full fit and drop one source's rows.

The predictions inside the fit use the linear-in-p2p pipeline makespan
(compiler/costmodel/pp_schedule.py linear_p2p_makespans), equal to the simulated one for p2p small
against a forward; reported accuracy always re-costs with the exact simulation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from compiler.calibration.runs import PublishedRun
from compiler.costmodel.evaluation import evaluate
from compiler.costmodel.efficiency import FIT_PARAMETERS, HUBER_DELTA, Efficiency, prior_efficiency
from compiler.costmodel.pp_schedule import linear_p2p_makespans
from compiler.estimate import Estimate

RIDGE = 0.02
STEP = 0.02  # forward-difference step in log space
MAX_ITERATIONS = 12
SIGNIFICANT = 3  # digits the committed constants are rounded to


def predict(run: PublishedRun, eff: Efficiency) -> Estimate:
    est = evaluate(run.problem, run.layout, gpu=run.gpu, target=run.framework,
                   pipeline_events=False, check_memory=False, efficiency=eff)
    if not isinstance(est, Estimate):
        raise ValueError(f"row {run.row_id}: the cost model rejects its layout ({est.code}: {est.message})")
    return est


def log_error(run: PublishedRun, eff: Efficiency) -> float:
    return math.log(predict(run, eff).tokens_per_s_per_gpu / run.measured_tokens_per_s_per_gpu)


def source_weights(runs: Sequence[PublishedRun]) -> list[float]:
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.source_id] = counts.get(r.source_id, 0) + 1
    return [1.0 / math.sqrt(counts[r.source_id]) for r in runs]


def _huber_weight(e: float, delta: float = HUBER_DELTA) -> float:
    return 1.0 if abs(e) <= delta else delta / abs(e)


def _round(x: float) -> float:
    return float(f"{x:.{SIGNIFICANT}g}")


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (small dense systems; no numpy dependency)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        if abs(m[c][c]) < 1e-300:
            continue
        for r in range(c + 1, n):
            f = m[r][c] / m[c][c]
            for k in range(c, n + 1):
                m[r][k] -= f * m[c][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        s = m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))
        x[r] = s / m[r][r] if abs(m[r][r]) > 1e-300 else 0.0
    return x


@dataclass
class _Problem:
    runs: Sequence[PublishedRun]
    base: Efficiency
    weights: list[float]
    names: tuple[str, ...] = tuple(p.name for p in FIT_PARAMETERS)
    lo: tuple[float, ...] = tuple(math.log(p.lower) for p in FIT_PARAMETERS)
    hi: tuple[float, ...] = tuple(math.log(p.upper) for p in FIT_PARAMETERS)
    z0: tuple[float, ...] = tuple(math.log(p.prior) for p in FIT_PARAMETERS)
    ridge: float = RIDGE  # weight of 0.5 x sum (z - z0)^2: the pull towards z0 (a cluster profile: its prior fit)
    huber_delta: float = HUBER_DELTA  # |log error| beyond which a run's pull stops growing

    def eff(self, z: Sequence[float]) -> Efficiency:
        return self.base.with_fitted({n: math.exp(v) for n, v in zip(self.names, z)})

    def errors(self, z: Sequence[float]) -> list[float]:
        eff = self.eff(z)
        return [log_error(r, eff) for r in self.runs]

    def objective(self, z: Sequence[float], errors: list[float] | None = None) -> float:
        errors = errors if errors is not None else self.errors(z)
        data, d = 0.0, self.huber_delta
        for w, e in zip(self.weights, errors):
            a = abs(e)
            data += w * (0.5 * e * e if a <= d else d * (a - 0.5 * d))
        return data + 0.5 * self.ridge * sum((zi - z0) ** 2 for zi, z0 in zip(z, self.z0))

    def clip(self, z: Sequence[float]) -> list[float]:
        return [min(max(v, lo), hi) for v, lo, hi in zip(z, self.lo, self.hi)]


def jacobian(prob: _Problem, z: Sequence[float], errors: Sequence[float]) -> list[list[float]]:
    """d log(pred_i / measured_i) / d log(c_j): one column per constant (forward differences, stepping back
    inside the upper bound)."""
    cols = []
    for j in range(len(z)):
        zj = list(z)
        zj[j] = zj[j] + STEP if zj[j] + STEP <= prob.hi[j] else zj[j] - STEP
        dz = zj[j] - z[j]
        ej = prob.errors(zj)
        cols.append([(a - b) / dz for a, b in zip(ej, errors)])
    return cols


def _levenberg_marquardt(prob: _Problem, z: list[float], progress: Callable[[str], None] | None = None
                         ) -> list[float]:
    errors = prob.errors(z)
    best = prob.objective(z, errors)
    mu = 1e-2
    k = len(z)
    for it in range(MAX_ITERATIONS):
        # Jacobian of the weighted residuals r_i = sqrt(w_i h_i) e_i (IRLS weights h_i of the Huber loss)
        scale = [math.sqrt(w * _huber_weight(e, prob.huber_delta)) for w, e in zip(prob.weights, errors)]
        cols = jacobian(prob, z, errors)
        jtj = [[sum(s * s * cols[a][i] * cols[b][i] for i, s in enumerate(scale)) for b in range(k)] for a in range(k)]
        jtr = [sum(s * s * cols[a][i] * errors[i] for i, s in enumerate(scale)) for a in range(k)]
        improved = False
        for _ in range(6):
            a = [[jtj[r][c] + (prob.ridge if r == c else 0.0) + (mu * (jtj[r][c] + 1e-9) if r == c else 0.0)
                  for c in range(k)] for r in range(k)]
            b = [-(jtr[r] + prob.ridge * (z[r] - prob.z0[r])) for r in range(k)]
            step = _solve(a, b)
            trial = prob.clip([zi + si for zi, si in zip(z, step)])
            trial_errors = prob.errors(trial)
            value = prob.objective(trial, trial_errors)
            if value < best - 1e-12:
                gain = best - value
                z, errors, best, mu = trial, trial_errors, value, max(mu / 3.0, 1e-6)
                improved = True
                break
            mu *= 4.0
        if progress:
            progress(f"  iteration {it + 1}: objective {best:.6f}")
        if not improved or gain < 1e-6:
            break
    return z


def fit_constants(runs: Sequence[PublishedRun], *, start: Mapping[str, float] | None = None,
                  base: Efficiency | None = None, progress: Callable[[str], None] | None = None) -> dict[str, float]:
    """The fitted constants for ``runs`` (rounded to SIGNIFICANT digits)."""
    base = base or prior_efficiency()
    prob = _Problem(runs, base, source_weights(runs))
    start = start or {p.name: p.prior for p in FIT_PARAMETERS}
    z = prob.clip([math.log(start[n]) for n in prob.names])
    with linear_p2p_makespans():
        z = _levenberg_marquardt(prob, z, progress)
    return {n: _round(math.exp(v)) for n, v in zip(prob.names, z)}


@dataclass
class FitResult:
    fitted: dict[str, float]
    loso: dict[str, dict[str, float]]
    rows: int
    sources: dict[str, int] = field(default_factory=dict)


def fit_with_loso(runs: Sequence[PublishedRun], *, base: Efficiency | None = None,
                  progress: Callable[[str], None] | None = None) -> FitResult:
    base = base or prior_efficiency()
    if progress:
        progress(f"fit on {len(runs)} runs")
    fitted = fit_constants(runs, base=base, progress=progress)
    sources: dict[str, int] = {}
    for r in runs:
        sources[r.source_id] = sources.get(r.source_id, 0) + 1
    loso = {}
    for source in sorted(sources):
        rest = [r for r in runs if r.source_id != source]
        if progress:
            progress(f"leave out {source} ({sources[source]} runs): refit on {len(rest)}")
        loso[source] = fit_constants(rest, start=fitted, base=base, progress=progress)
    return FitResult(fitted=fitted, loso=loso, rows=len(runs), sources=sources)
