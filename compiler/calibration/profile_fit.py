"""Fit a cluster profile (compiler/calibration/profile.py) on one cluster's measured runs.

    fit_profile(runs, name=..., base=load_efficiency()) -> ClusterProfile

The method (a MAP fit towards the global constants, data weights, leave-one-out errors) is described in
compiler/calibration/profile.py's docstring, beside the profile it writes.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, Sequence

from compiler.calibration.fit import _huber_weight, _levenberg_marquardt, _Problem, _round, _solve, jacobian, \
    log_error, predict
from compiler.calibration.profile import ALL_PARAMETERS, HUBER_CHOICES, MIN_INFORMATION_RUNS, MIN_RUNS_TO_CHOOSE, \
    PARAMS, PRIOR_CHOICES, PRIOR_RUNS, PROFILE_HUBER_DELTA, ClusterProfile, ProfileConstant, ProfileRun, _r4, \
    error_summary
from compiler.calibration.runs import PublishedRun
from compiler.costmodel.efficiency import Efficiency
from compiler.costmodel.pp_schedule import linear_p2p_makespans
from compiler.errors import Diagnostic, DtcError, Location


def global_sha256(base: Efficiency) -> str:
    text = ",".join(f"{p.name}={global_value(base, p.name)!r}" for p in ALL_PARAMETERS)
    return hashlib.sha256(text.encode()).hexdigest()


def _problem(runs: Sequence[PublishedRun], base: Efficiency, prior_runs: float, huber_delta: float,
             names: Sequence[str] = tuple(PARAMS)) -> _Problem:
    """The MAP problem over the constants ``names`` (the others stay at ``base``'s values)."""
    params = [PARAMS[n] for n in names]
    return _Problem(runs, base, [1.0] * len(runs), names=tuple(names),
                    lo=tuple(math.log(p.lower) for p in params), hi=tuple(math.log(p.upper) for p in params),
                    z0=tuple(math.log(global_value(base, p.name)) for p in params), ridge=prior_runs,
                    huber_delta=huber_delta)


def informed_constants(runs: Sequence[PublishedRun], base: Efficiency) -> dict[str, float]:
    """What ``runs`` say about each constant some run depends on: {name: information}, in ALL_PARAMETERS order,
    each constant's information beyond the constants before it that they tell apart (sum_i J_ik^2 less what their
    columns explain; J: d log pred / d log c at the global fit). The runs tell a constant apart when that is at least
    MIN_INFORMATION_RUNS (``told_apart``). Runs that do not vary what a constant describes cannot tell it apart
    from those before it (all-fp8 runs: fp8_gemm_scale from compute_scale; one sequence length:
    long_sequence_attention_scale from attention_scale): fitted, it would move along a direction only the prior
    pins."""
    prob = _problem(runs, base, PRIOR_RUNS, PROFILE_HUBER_DELTA)
    z0 = list(prob.z0)
    with linear_p2p_makespans():
        cols = jacobian(prob, z0, prob.errors(z0))
    kept: list[int] = []
    info: dict[str, float] = {}
    for k, name in enumerate(prob.names):
        own = sum(c * c for c in cols[k])
        if own == 0.0:  # no run depends on it (fp8 GEMMs of bf16 runs, the all-to-all of dense models)
            continue
        if kept:
            cross = [sum(a * b for a, b in zip(cols[j], cols[k])) for j in kept]
            gram = [[sum(a * b for a, b in zip(cols[i], cols[j])) for j in kept] for i in kept]
            own -= sum(c * x for c, x in zip(cross, _solve(gram, cross)))
        info[name] = max(own, 0.0)
        if info[name] >= MIN_INFORMATION_RUNS:
            kept.append(k)
    return info


def told_apart(information: Mapping[str, float]) -> tuple[str, ...]:
    """The constants of ``informed_constants`` the runs tell apart (information at least MIN_INFORMATION_RUNS)."""
    return tuple(n for n, v in information.items() if v >= MIN_INFORMATION_RUNS)


def global_value(base: Efficiency, name: str) -> float:
    """The global fit's value of a constant (a profile-only multiplier: 1, the physics)."""
    return base.fitted[name] if name in base.fitted else base.profile_scale(name)


def fit_values(runs: Sequence[PublishedRun], base: Efficiency, *, prior_runs: float = PRIOR_RUNS,
               huber_delta: float = PROFILE_HUBER_DELTA, names: Sequence[str] | None = None) -> dict[str, float]:
    """The profile's constants for ``runs`` (MAP towards ``base``'s fitted constants), rounded as the global fit;
    only ``names`` are fitted (default: those the runs tell apart), the others keep the global value."""
    names = told_apart(informed_constants(runs, base)) if names is None else tuple(names)
    prob = _problem(runs, base, prior_runs, huber_delta, names)
    with linear_p2p_makespans():
        z = _levenberg_marquardt(prob, prob.clip(list(prob.z0))) if names else []
    fitted = {n: _round(math.exp(v)) for n, v in zip(prob.names, z)}
    return {p.name: fitted.get(p.name, global_value(base, p.name)) for p in ALL_PARAMETERS}


def fit_profile(runs: Sequence[PublishedRun], *, name: str, base: Efficiency, date: str | None = None,
                inputs: Sequence[Mapping[str, str]] = (), notes: Sequence[str] = (),
                prior_runs: float | None = None, huber_delta: float | None = None) -> ClusterProfile:
    """The profile of ``runs``. ``prior_runs`` / ``huber_delta`` None: with MIN_RUNS_TO_CHOOSE or more runs, the
    strength of PRIOR_CHOICES and the delta of HUBER_CHOICES whose leave-one-out median |error| is lowest (the
    larger delta first, strongest prior first within it, so a tie keeps the stronger pull and the gentler loss);
    with fewer, PRIOR_RUNS and PROFILE_HUBER_DELTA. A value given is used as it is."""
    if not runs:
        raise DtcError(Diagnostic(summary="no measured run to calibrate on",
                                  hint="give runs: a CSV, LOG:PLAN pairs, folders, or dtc smoke --json reports"))
    few = len(runs) < MIN_RUNS_TO_CHOOSE
    information = informed_constants(runs, base)
    informed, seen = told_apart(information), tuple(information)
    sets = (informed,) if few or informed == seen else (informed, seen)
    priors = (prior_runs,) if prior_runs is not None else (PRIOR_RUNS,) if few else PRIOR_CHOICES
    deltas = (huber_delta,) if huber_delta is not None else (PROFILE_HUBER_DELTA,) if few else HUBER_CHOICES
    best: _Candidate | None = None
    for names in sets:
        for delta in deltas:
            for strength in priors:
                c = _candidate(runs, base, prior_runs=strength, huber_delta=delta, names=names)
                if best is None or c.loo_median < best.loo_median:
                    best = c
    assert best is not None
    eff = base.with_fitted(best.values)
    out = []
    for r, loo_eff in zip(runs, best.loo_efficiencies):
        # each run costed exactly (the full pipeline simulation): before, after, and with the constants without it
        before = predict(r, base).tokens_per_s_per_gpu / r.measured_tokens_per_s_per_gpu - 1.0
        after = predict(r, eff).tokens_per_s_per_gpu / r.measured_tokens_per_s_per_gpu - 1.0
        loo = predict(r, loo_eff).tokens_per_s_per_gpu / r.measured_tokens_per_s_per_gpu - 1.0
        out.append(ProfileRun(id=r.row_id, source=r.source_id, model=r.model, gpu=r.gpu.name,
                              num_gpus=r.layout.world_size, layout=r.layout.describe(), framework=r.framework.name,
                              measured_tokens_per_s_per_gpu=_r4(r.measured_tokens_per_s_per_gpu),
                              error_before=_r4(before), error_after=_r4(after), error_loo=_r4(loo)))
    gpus = tuple(sorted({r.gpu.name for r in runs}))
    constants = {n: replace(c, information=_r4(information.get(n, 0.0))) for n, c in best.constants.items()}
    return ClusterProfile(name=name, date=date, gpus=gpus, constants=MappingProxyType(constants),
                          runs=tuple(out), inputs=tuple(inputs), global_sha256=global_sha256(base), notes=tuple(notes),
                          prior_runs=best.prior_runs, huber_delta=best.huber_delta)


@dataclass(frozen=True)
class _Candidate:
    """One fit of the choices fit_profile weighs: its constants, each run's constants refitted without it, and
    the median |error| of those leave-one-out predictions (costed as the fit costs: linear pipeline p2p)."""

    prior_runs: float
    huber_delta: float
    values: dict[str, float]
    constants: dict[str, ProfileConstant]
    loo_efficiencies: tuple[Efficiency, ...]
    loo_median: float


def _candidate(runs: Sequence[PublishedRun], base: Efficiency, *, prior_runs: float, huber_delta: float,
               names: Sequence[str]) -> _Candidate:
    values = fit_values(runs, base, prior_runs=prior_runs, huber_delta=huber_delta, names=names)
    prob = _problem(runs, base, prior_runs, huber_delta, names)
    z = [math.log(values[n]) for n in prob.names]
    with linear_p2p_makespans():
        errors = prob.errors(z)
        cols = jacobian(prob, z, errors) if z else []
        loo_z = _leave_one_out(prob, z, errors, cols)
    h = [_huber_weight(e, prob.huber_delta) for e in errors]
    info = {n: sum(h[i] * cols[j][i] ** 2 for i in range(len(runs))) for j, n in enumerate(prob.names)}
    constants = {p.name: ProfileConstant(values[p.name], global_value(base, p.name),
                                         info[p.name] / (info[p.name] + prior_runs) if p.name in info else 0.0,
                                         fitted=p.name in info)
                 for p in ALL_PARAMETERS}
    loo_effs = tuple(prob.eff(zi) for zi in loo_z)
    with linear_p2p_makespans():
        loo = [math.expm1(log_error(r, e)) for r, e in zip(runs, loo_effs)]
    return _Candidate(prior_runs, huber_delta, values, constants, loo_effs, error_summary(loo)["median_abs_error"])


def _leave_one_out(prob: _Problem, z: list[float], errors: list[float], cols: list[list[float]]) -> list[list[float]]:
    """Per run, the constants refitted without it: one Gauss-Newton step from ``z`` on the other runs."""
    k, n = len(z), len(errors)
    h = [w * _huber_weight(e, prob.huber_delta) for w, e in zip(prob.weights, errors)]
    jtj = [[sum(h[i] * cols[a][i] * cols[b][i] for i in range(n)) for b in range(k)] for a in range(k)]
    jtr = [sum(h[i] * cols[a][i] * errors[i] for i in range(n)) for a in range(k)]
    out = []
    for i in range(n):
        a = [[jtj[r][c] - h[i] * cols[r][i] * cols[c][i] + (prob.ridge if r == c else 0.0) for c in range(k)]
             for r in range(k)]
        b = [-(jtr[r] - h[i] * cols[r][i] * errors[i] + prob.ridge * (z[r] - prob.z0[r])) for r in range(k)]
        step = _solve(a, b)
        out.append(prob.clip([zi + si for zi, si in zip(z, step)]))
    return out


def format_profile(profile: ClusterProfile, output: str) -> str:
    """What `dtc calibrate` prints once ``output`` is written: the constants, the errors, the notes."""
    lines = [f"cluster profile {profile.name!r} on {len(profile.runs)} runs ({', '.join(profile.gpus)}), "
             f"date {profile.date or 'not given'}; the global fit weighs as much as {profile.prior_runs:g} runs, a "
             f"run's pull stops growing beyond {profile.huber_delta:.1%} error"]
    for name, c in profile.constants.items():
        mark = ("held at the global fit: the runs say too little about it beyond the constants above" if not c.fitted
                else "moved with the constants above: the runs cannot tell it apart from them" if not c.told_apart
                else "identified" if c.identified else "kept near the global fit")
        lines.append(f"  {name:<30} {c.value:<10.4g} (global {c.global_value:.4g}; data weight {c.data_weight:.2f}, "
                     f"{mark})")
    for which, label in (("before", "global constants"), ("after", "this profile"),
                         ("loo", "leave-one-out")):
        s = profile.summary(which)
        lines.append(f"  median |error| {s['median_abs_error']:.1%}, p90 {s['p90_abs_error']:.1%}  ({label})")
    from compiler.costmodel.bands import PROFILE_MIN_RUNS, profile_band

    band = profile_band(profile.ref(output, ""))
    if band is not None:
        lines.append(f"  80% band of every estimate a spec costs with it: x{band.low:.3f}-x{band.high:.3f} the predicted "
                     f"step time (its {band.runs} leave-one-out errors)")
    else:
        lines.append(f"  {len(profile.runs)} runs, fewer than {PROFILE_MIN_RUNS}: specs using it keep the published "
                     f"runs' 80% bands")
    lines.extend(f"  note: {n}" for n in profile.notes)
    lines.append(f"Calibrate: wrote {output}.")
    return "\n".join(lines)


def calibrate_runs(runs: Sequence[str], output: Path, *, name: str | None = None, date: str | None = None) -> str:
    """`dtc calibrate RUNS -o OUTPUT`: fit a profile on the measured runs, write it atomically to ``output``, and
    say what was written (``format_profile``). ``date``: when the runs were measured, if their logs do not say."""
    from compiler.artifacts import write_text_atomically
    from compiler.calibration.measured import load_measured
    from compiler.costmodel.efficiency import load_efficiency

    measured = load_measured(runs)
    notes = []
    if "cpu" in measured.devices:
        notes.append("some runs were measured on CPU (a test of the machinery): the cost model predicts GPUs, so "
                     "these constants describe no real cluster")
    if measured.skipped:
        notes.append("skipped rows: " + ", ".join(f"{v} {k}" for k, v in sorted(measured.skipped.items())))
    profile = fit_profile(measured.runs, name=name or output.stem, base=load_efficiency(),
                          date=date or measured.date,
                          inputs=[{"path": i.path, "kind": i.kind, "sha256": i.sha256} for i in measured.inputs],
                          notes=notes)
    try:
        write_text_atomically(output, profile.to_yaml())
    except OSError as exc:
        raise DtcError(Diagnostic(summary=f"cannot write {output}: {exc.strerror}", location=Location(str(output)),
                                  hint="choose a writable path")) from None
    return format_profile(profile, str(output))
