"""Fit a cluster profile (compiler/calibration/profile.py) on one cluster's measured runs.

    fit_profile(runs, name=..., base=load_efficiency()) -> ClusterProfile

The method (a MAP fit towards the global constants, data weights, leave-one-out errors) is described in
compiler/calibration/profile.py's docstring, beside the profile it writes.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, Sequence

from compiler.calibration.fit import _huber_weight, _levenberg_marquardt, _Problem, _round, _solve, jacobian, predict
from compiler.calibration.profile import ALL_PARAMETERS, MIN_RUNS_TO_CHOOSE, PARAMS, PRIOR_CHOICES, PRIOR_RUNS, \
    PROFILE_HUBER_DELTA, ClusterProfile, ProfileConstant, ProfileRun, _r4
from compiler.calibration.runs import PublishedRun
from compiler.costmodel.efficiency import Efficiency
from compiler.costmodel.pp_schedule import linear_p2p_makespans
from compiler.errors import Diagnostic, DtcError, Location


def global_sha256(base: Efficiency) -> str:
    text = ",".join(f"{p.name}={global_value(base, p.name)!r}" for p in ALL_PARAMETERS)
    return hashlib.sha256(text.encode()).hexdigest()


def _problem(runs: Sequence[PublishedRun], base: Efficiency, prior_runs: float) -> _Problem:
    return _Problem(runs, base, [1.0] * len(runs), names=tuple(PARAMS),
                    lo=tuple(math.log(p.lower) for p in ALL_PARAMETERS),
                    hi=tuple(math.log(p.upper) for p in ALL_PARAMETERS),
                    z0=tuple(math.log(global_value(base, p.name)) for p in ALL_PARAMETERS), ridge=prior_runs,
                    huber_delta=PROFILE_HUBER_DELTA)


def global_value(base: Efficiency, name: str) -> float:
    """The global fit's value of a constant (a profile-only multiplier: 1, the physics)."""
    return base.fitted[name] if name in base.fitted else base.profile_scale(name)


def fit_values(runs: Sequence[PublishedRun], base: Efficiency, *, prior_runs: float = PRIOR_RUNS) -> dict[str, float]:
    """The profile's constants for ``runs`` (MAP towards ``base``'s fitted constants), rounded as the global fit."""
    prob = _problem(runs, base, prior_runs)
    with linear_p2p_makespans():
        z = _levenberg_marquardt(prob, prob.clip(list(prob.z0)))
    return {n: _round(math.exp(v)) for n, v in zip(prob.names, z)}


def fit_profile(runs: Sequence[PublishedRun], *, name: str, base: Efficiency, date: str | None = None,
                inputs: Sequence[Mapping[str, str]] = (), notes: Sequence[str] = (),
                prior_runs: float | None = None) -> ClusterProfile:
    """The profile of ``runs``; ``prior_runs`` None: the strength of PRIOR_CHOICES whose leave-one-out median
    |error| is lowest (strongest first, so a tie keeps the stronger pull), PRIOR_RUNS under MIN_RUNS_TO_CHOOSE
    runs."""
    if not runs:
        raise DtcError(Diagnostic(summary="no measured run to calibrate on",
                                  hint="give runs: a CSV, LOG:PLAN pairs, folders, or dtc smoke --json reports"))
    if prior_runs is not None:
        return _fit_profile(runs, name=name, base=base, date=date, inputs=inputs, notes=notes, prior_runs=prior_runs)
    if len(runs) < MIN_RUNS_TO_CHOOSE:
        return _fit_profile(runs, name=name, base=base, date=date, inputs=inputs, notes=notes, prior_runs=PRIOR_RUNS)
    best: ClusterProfile | None = None
    for strength in PRIOR_CHOICES:
        p = _fit_profile(runs, name=name, base=base, date=date, inputs=inputs, notes=notes, prior_runs=strength)
        if best is None or p.summary("loo")["median_abs_error"] < best.summary("loo")["median_abs_error"]:
            best = p
    assert best is not None
    return best


def _fit_profile(runs: Sequence[PublishedRun], *, name: str, base: Efficiency, date: str | None,
                 inputs: Sequence[Mapping[str, str]], notes: Sequence[str], prior_runs: float) -> ClusterProfile:
    values = fit_values(runs, base, prior_runs=prior_runs)
    prob = _problem(runs, base, prior_runs)
    z = [math.log(values[n]) for n in prob.names]
    with linear_p2p_makespans():
        errors = prob.errors(z)
        cols = jacobian(prob, z, errors)
        loo_z = _leave_one_out(prob, z, errors, cols)
    h = [_huber_weight(e, prob.huber_delta) for e in errors]
    k = len(z)
    info = [sum(h[i] * cols[j][i] ** 2 for i in range(len(runs))) for j in range(k)]
    constants = {n: ProfileConstant(values[n], global_value(base, n), info[j] / (info[j] + prior_runs))
                 for j, n in enumerate(prob.names)}
    eff = base.with_fitted(values)
    out = []
    for i, r in enumerate(runs):
        before = predict(r, base).tokens_per_s_per_gpu / r.measured_tokens_per_s_per_gpu - 1.0
        after = predict(r, eff).tokens_per_s_per_gpu / r.measured_tokens_per_s_per_gpu - 1.0
        loo = predict(r, prob.eff(loo_z[i])).tokens_per_s_per_gpu / r.measured_tokens_per_s_per_gpu - 1.0
        out.append(ProfileRun(id=r.row_id, source=r.source_id, model=r.model, gpu=r.gpu.name,
                              num_gpus=r.layout.world_size, layout=r.layout.describe(), framework=r.framework.name,
                              measured_tokens_per_s_per_gpu=_r4(r.measured_tokens_per_s_per_gpu),
                              error_before=_r4(before), error_after=_r4(after), error_loo=_r4(loo)))
    gpus = tuple(sorted({r.gpu.name for r in runs}))
    return ClusterProfile(name=name, date=date, gpus=gpus, constants=MappingProxyType(constants), runs=tuple(out),
                          inputs=tuple(inputs), global_sha256=global_sha256(base), notes=tuple(notes),
                          prior_runs=prior_runs)


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
             f"date {profile.date or 'not given'}; the global fit weighs as much as {profile.prior_runs:g} runs"]
    for name, c in profile.constants.items():
        mark = "identified" if c.identified else "kept near the global fit"
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
