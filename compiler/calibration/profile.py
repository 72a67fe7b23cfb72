"""Cluster profiles: the fitted constants refitted on one cluster's measured runs, with provenance.

    fit_profile(runs, name=..., base=load_efficiency()) -> ClusterProfile (compiler/calibration/profile_fit.py)
    ClusterProfile.to_yaml() / load_profile(path) -> ClusterProfile (errors with file:line:column)
    profile.efficiency(base) -> Efficiency (the shipped physics with the profile's constants)

This module is the profile and its file; the fit lives in profile_fit.py, so that reading a spec's
cluster.profile (compiler/problem.py) does not import the cost model it calibrates.

What is fitted: the constants of compiler/costmodel/efficiency.py FIT_PARAMETERS (sustained
GEMM/attention fraction, memory-bound traffic, kernel launch time, exposed tensor-parallel
communication, per-step overhead, straggler spread) and PROFILE_PARAMETERS (this cluster's fp8
and grouped-GEMM rates, attention rate and its scaling with sequence length, MoE token-dispatch
rate, inter-node bandwidth), each clipped to the physical range named there with its source. A
profile describes one cluster, so its GPU's GEMM and attention efficiency is its
``compute_scale``. What stays unexplained within one (source, GPU) group of the calibration set
after a profile (benchmarks/calibrate_halves.py): software releases (NeMo 25.09 .. 26.08 run the
same Qwen3-30B layout 1.75x apart) and llm-foundry's FSDP runs of 30B+ models on a few nodes
(10-25% slower than the model); no cluster constant expresses either.

A profile's own leave-one-out residuals (``loo_log_errors``, kept in the spec's plan with the
profile reference) give the 80% band of every estimate costed with it
(compiler/costmodel/bands.py ``profile_band``).

Not over-fitting a handful of runs:

* only constants the runs inform are fitted. One that no run's time depends on (the fp8 GEMM rate
  of bf16 runs, the all-to-all of dense models) keeps the global value (``fitted: false``). Of the
  rest, the runs tell a constant apart when their information about it beyond the constants
  before it they tell apart (ALL_PARAMETERS order: the global fit's constants, then the profile's
  multipliers; sum_i J_ik^2 less what those columns explain, J = d log pred / d log c at the global
  fit) is worth MIN_INFORMATION_RUNS = 0.25 runs whose throughput moves one-for-one with it
  (profile_fit.py ``informed_constants``). Runs that do not vary what a constant describes cannot
  tell it apart from those before it (all-fp8 runs: fp8_gemm_scale from compute_scale); fitted
  anyway, it moves along a direction only the prior pins. A profile fits either the constants its
  runs tell apart or every constant some run depends on, whichever its leave-one-out error prefers;
* a MAP fit in log space: sum_i huber(log(pred_i / measured_i), delta) + 0.5 * prior_strength *
  sum_k (log c_k - log g_k)^2, where g is the global fit (compiler/data/efficiency.yaml); a
  strength of s runs weighs the global fit as much as s runs whose throughput moves one-for-one
  with the constant: a constant the runs barely move stays at the global value, one that n runs
  pin moves n/(n+s) of the way to what they say. With MIN_RUNS_TO_CHOOSE (4) or more runs, the
  strength (PRIOR_CHOICES: 3, 1, 0.3, 0.1, 0.03, 0.01 runs), the Huber delta (HUBER_CHOICES: 5%,
  2.5%) and the set of constants are the ones whose leave-one-out median |error| on those runs is
  lowest (ties keep the smaller set, the larger delta, the stronger pull): the runs themselves
  say how far the cluster is from the global fit and how far to trust their typical run; no
  held-out data chooses. With fewer runs: the constants told apart, PRIOR_RUNS (0.5) and
  PROFILE_HUBER_DELTA (5%). The strengths reach 0.01 because the earlier grid (3 .. 0.25) had
  its weakest end chosen by most groups of the calibration set: their own leave-one-out asked for
  less pull than it offered. The loss is near-L1 beyond delta: one cluster's runs mix software
  releases (the calibration set's NeMo 25.09 .. 26.08 containers run the same Qwen3-30B layout
  1.75x apart) and a profile should follow its typical run, not be dragged by the release that
  differs. The choice compares leave-one-out errors costed as the fit costs (linear pipeline p2p,
  compiler/calibration/fit.py); the chosen fit's are then costed exactly;
* ``data_weight`` per fitted constant = I_k / (I_k + prior_strength), I_k = sum_i h_i J_ik^2 the
  runs' information about it (J at the fit, h: the Huber weight); a constant is ``identified``
  when the runs tell it apart (``information``, above) and outweigh the prior (data_weight >= 0.5):
  a constant fitted with others it cannot be told apart from moves with them, however weak the
  prior, and the profile says so;
* the profile's own leave-one-out error: each run predicted with the constants refitted without
  it (one Gauss-Newton step from the full fit on the other runs' residuals and Jacobian, each
  constant clipped to its range; the run itself costed exactly).

benchmarks/calibrate_halves.py (calibrate on half of each (source, GPU) group with 10+ runs,
predict the other half; 136 held-out runs of 10 groups), with the global constants of the MoE-recount and
Blackwell-power fit: median |error| 8.0% before -> 4.3% after (the grid of 3 .. 0.25 runs with delta 5%
alone, on the previous fit: 5.4%); halves swapped 7.5% -> 4.0% (4.7%); as for an unseen source 8.8% ->
4.3% (6.3%); each group's profile on all its runs, leave-one-out 4.0% (4.7%); 79-81% of the held-out runs
inside the half-profiles' 80% bands (77-79%).
"""
from __future__ import annotations

import hashlib
import io
import math
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError

from compiler.costmodel.efficiency import FIT_PARAMETERS, PROFILE_PARAMETERS, Efficiency
from compiler.errors import Diagnostic, DtcError, Location
from compiler.profile_ref import ProfileRef
from compiler.stats import percentile

PROFILE_SCHEMA_VERSION = 2  # 2: all_to_all_scale and long_sequence_attention_scale
PROFILE_KIND = "dtc-cluster-profile"
PRIOR_RUNS = 0.5  # the global fit weighs as much as this many runs (see the module docstring)
PRIOR_CHOICES = (3.0, 1.0, 0.3, 0.1, 0.03, 0.01)  # the strengths a profile chooses from by its leave-one-out error
PROFILE_HUBER_DELTA = 0.05  # |log error| beyond which one run's pull on a profile stops growing (module docstring)
HUBER_CHOICES = (0.05, 0.025)  # the deltas a profile chooses from, with its prior strength, by the same leave-one-out
MIN_RUNS_TO_CHOOSE = 4  # fewer runs: PRIOR_RUNS and PROFILE_HUBER_DELTA (a median of 1-3 errors chooses nothing)
IDENTIFIED = 0.5  # data_weight at or above which a constant counts as identified by the runs
# the runs tell a constant apart when their information about it, beyond what the constants before it explain, is
# worth this many runs whose throughput moves one-for-one with it (profile_fit.py informed_constants): its
# standard error is then at most twice the runs' scatter (1 / sqrt(0.25)); below, the prior would place it
MIN_INFORMATION_RUNS = 0.25
ALL_PARAMETERS = FIT_PARAMETERS + PROFILE_PARAMETERS
PARAMS = {p.name: p for p in ALL_PARAMETERS}


@dataclass(frozen=True)
class ProfileConstant:
    value: float
    global_value: float
    data_weight: float
    fitted: bool = True  # False: the runs do not inform it (profile_fit.py informed_constants), the global value
    # the runs' information about it beyond the constants before it (profile_fit.py informed_constants); None: not
    # recorded (a profile written before it was)
    information: float | None = None

    @property
    def told_apart(self) -> bool:
        """The runs tell it apart from the constants before it (not only move it together with them)."""
        return self.information is None or self.information >= MIN_INFORMATION_RUNS

    @property
    def identified(self) -> bool:
        """Fitted, told apart, and weighed more by the runs than by the prior."""
        return self.fitted and self.told_apart and self.data_weight >= IDENTIFIED


@dataclass(frozen=True)
class ProfileRun:
    id: str
    source: str
    model: str
    gpu: str
    num_gpus: int
    layout: str
    framework: str
    measured_tokens_per_s_per_gpu: float
    error_before: float  # global constants: predicted / measured - 1
    error_after: float  # the profile's constants
    error_loo: float  # the profile refitted without this run


@dataclass(frozen=True)
class ClusterProfile:
    name: str
    date: str | None
    gpus: tuple[str, ...]
    constants: Mapping[str, ProfileConstant]
    runs: tuple[ProfileRun, ...]
    inputs: tuple[Mapping[str, str], ...] = ()
    global_sha256: str = ""  # the global fit (compiler/data/efficiency.yaml fitted) it was shrunk towards
    notes: tuple[str, ...] = ()
    prior_runs: float = PRIOR_RUNS  # the prior strength the fit used (PRIOR_CHOICES: chosen by leave-one-out)
    huber_delta: float = PROFILE_HUBER_DELTA  # the Huber delta the fit used (HUBER_CHOICES: chosen with it)

    @property
    def values(self) -> dict[str, float]:
        return {k: c.value for k, c in self.constants.items()}

    def efficiency(self, base: Efficiency) -> Efficiency:
        """``base``'s physics with this profile's constants (for every source: no leave-one-source-out)."""
        from dataclasses import replace

        return replace(base.with_fitted(self.values), loso=MappingProxyType({}))

    def loo_log_errors(self) -> tuple[float, ...]:
        """Each run's leave-one-out residual as an error band reads it: log(predicted / measured tokens/s), i.e.
        log(measured / predicted step time)."""
        return tuple(_r4(math.log1p(r.error_loo)) for r in self.runs if r.error_loo > -1.0)

    def ref(self, path: str, sha256: str) -> ProfileRef:
        """What a spec's plan keeps of this profile (cluster.profile): name, path, sha256, constants and the
        leave-one-out residuals its error bands come from."""
        return ProfileRef(name=self.name, path=path, sha256=sha256, constants=self.values,
                          loo_log_errors=self.loo_log_errors())

    def summary(self, which: str) -> dict[str, float]:
        errors = [getattr(r, f"error_{which}") for r in self.runs]
        return error_summary(errors)

    def to_data(self) -> dict[str, Any]:
        return {
            "schema_version": PROFILE_SCHEMA_VERSION,
            "kind": PROFILE_KIND,
            "name": self.name,
            "date": self.date,
            "gpus": list(self.gpus),
            "constants": {k: {"value": c.value, "global": c.global_value, "lower": PARAMS[k].lower,
                              "upper": PARAMS[k].upper, "data_weight": _r4(c.data_weight),
                              "identified": c.identified, "fitted": c.fitted, "information": c.information}
                          for k, c in self.constants.items()},
            "fit": {"prior": "the global fit, compiler/data/efficiency.yaml", "prior_strength_runs": self.prior_runs,
                    "prior_strength_choice": f"of {', '.join(f'{c:g}' for c in PRIOR_CHOICES)} runs and Huber delta "
                                             f"{' or '.join(f'{d:g}' for d in HUBER_CHOICES)}, the pair whose "
                                             f"leave-one-out median |error| is lowest ({MIN_RUNS_TO_CHOOSE}+ runs; "
                                             f"else {PRIOR_RUNS:g} and {PROFILE_HUBER_DELTA:g})",
                    "huber_delta": self.huber_delta,
                    "objective": "sum_i huber(log(pred_i/measured_i)) + 0.5 x prior_strength_runs x "
                                 "sum_k (log(c_k/global_k))^2; each constant clipped to [lower, upper] "
                                 "(compiler/costmodel/efficiency.py FIT_PARAMETERS names each range's source)",
                    "leave_one_out": "one Gauss-Newton step from the fit without the run; the run costed exactly"},
            "residuals": {"error": "predicted tokens/s per GPU / measured - 1", "before": self.summary("before"),
                          "after": self.summary("after"), "leave_one_out": self.summary("loo")},
            "runs": [{"id": r.id, "source": r.source, "model": r.model, "gpu": r.gpu, "num_gpus": r.num_gpus,
                      "layout": r.layout, "framework": r.framework,
                      "measured_tokens_per_s_per_gpu": r.measured_tokens_per_s_per_gpu,
                      "error_before": r.error_before, "error_after": r.error_after,
                      "error_loo": r.error_loo} for r in self.runs],
            "provenance": {"inputs": [dict(i) for i in self.inputs], "global_fit_sha256": self.global_sha256,
                           "notes": list(self.notes)},
        }

    def to_yaml(self) -> str:
        yaml = YAML()
        yaml.default_flow_style = False
        yaml.width = 120
        buf = io.StringIO()
        yaml.dump(self.to_data(), buf)
        header = (f"# dtc cluster profile '{self.name}': written by `dtc calibrate`; use it in a spec with\n"
                  f"#   cluster:\n#     profile: <path to this file>\n")
        return header + buf.getvalue()


def _r4(x: float) -> float:
    return float(f"{x:.4g}")


def error_summary(errors: Sequence[float]) -> dict[str, float]:
    a = [abs(e) for e in errors]
    return {"runs": len(a), "median_abs_error": _r4(percentile(a, 0.5)), "p90_abs_error": _r4(percentile(a, 0.9)),
            "median_error": _r4(percentile(list(errors), 0.5))}


# --- reading a profile ------------------------------------------------------------------------------


def _err(path: str, node: Any, key: Any, summary: str, hint: str) -> DtcError:
    line = col = None
    lc = getattr(node, "lc", None)
    if lc is not None:
        try:
            if key is not None:
                line, col = lc.key(key) if hasattr(lc, "key") else (None, None)
            else:
                line, col = lc.line, lc.col
        except (KeyError, TypeError):
            line, col = lc.line, lc.col
    loc = Location(path, None if line is None else line + 1, None if col is None else col + 1)
    return DtcError(Diagnostic(summary=summary, location=loc, hint=hint))


def parse_profile(text: str, path: str) -> ClusterProfile:
    """A profile from its YAML text; DtcError with file:line:column for anything that is not one."""
    yaml = YAML()  # round-trip: keeps line and column of every key
    try:
        data = yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark
        raise DtcError(Diagnostic(summary=f"not YAML: {exc.problem}",
                                  location=Location(path, mark.line + 1 if mark else None,
                                                    mark.column + 1 if mark else None),
                                  hint="write it with dtc calibrate")) from None
    hint = "write it with: dtc calibrate RUNS... -o profiles/NAME.yaml"
    if not isinstance(data, dict):
        raise DtcError(Diagnostic(summary="a cluster profile must be a mapping", location=Location(path, 1, 1),
                                  hint=hint))
    if data.get("kind") != PROFILE_KIND:
        raise _err(path, data, "kind" if "kind" in data else None, f"not a dtc cluster profile (kind must be "
                   f"{PROFILE_KIND!r}, got {data.get('kind')!r})", hint)
    if data.get("schema_version") != PROFILE_SCHEMA_VERSION:
        raise _err(path, data, "schema_version" if "schema_version" in data else None,
                   f"schema_version must be {PROFILE_SCHEMA_VERSION}, got {data.get('schema_version')!r}",
                   "recalibrate with this dtc")
    allowed = {"schema_version", "kind", "name", "date", "gpus", "constants", "fit", "residuals", "runs", "provenance"}
    for key in data:
        if key not in allowed:
            raise _err(path, data, key, f"unknown key {key!r} in a cluster profile",
                       f"keys are {', '.join(sorted(allowed))}")
    consts = data.get("constants")
    if not isinstance(consts, dict):
        raise _err(path, data, "constants" if "constants" in data else None, "constants must be a mapping", hint)
    out = {}
    for key in consts:
        if key not in PARAMS:
            raise _err(path, consts, key, f"unknown constant {key!r}", f"the fitted constants are {', '.join(PARAMS)}")
    for p in ALL_PARAMETERS:
        if p.name not in consts:
            raise _err(path, consts, None, f"constant {p.name} is missing", hint)
        entry = consts[p.name]
        value = entry.get("value") if isinstance(entry, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (p.lower <= value <= p.upper):
            node, key = (entry, "value") if isinstance(entry, dict) and "value" in entry else (consts, p.name)
            raise _err(path, node, key,
                       f"{p.name} = {value!r} is outside its physical range [{p.lower:g}, {p.upper:g}]",
                       f"{p.name}: {p.meaning}")
        glob = entry.get("global", value)
        weight = entry.get("data_weight", 0.0)
        info = entry.get("information")
        out[p.name] = ProfileConstant(float(value), float(glob), float(weight), bool(entry.get("fitted", True)),
                                      float(info) if isinstance(info, (int, float)) and not isinstance(info, bool)
                                      else None)
    runs = []
    for r in data.get("runs") or []:
        try:
            runs.append(ProfileRun(id=str(r["id"]), source=str(r["source"]), model=str(r["model"]), gpu=str(r["gpu"]),
                                   num_gpus=int(r["num_gpus"]), layout=str(r["layout"]), framework=str(r["framework"]),
                                   measured_tokens_per_s_per_gpu=float(r["measured_tokens_per_s_per_gpu"]),
                                   error_before=float(r["error_before"]), error_after=float(r["error_after"]),
                                   error_loo=float(r["error_loo"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise _err(path, r, None, f"a run of the profile lacks a field or has a bad one ({exc})", hint) from None
    prov = data.get("provenance") or {}
    return ClusterProfile(name=str(data.get("name", "")), date=None if data.get("date") is None else str(data["date"]),
                          gpus=tuple(str(g) for g in data.get("gpus") or ()), constants=MappingProxyType(out),
                          runs=tuple(runs), inputs=tuple(dict(i) for i in prov.get("inputs") or ()),
                          global_sha256=str(prov.get("global_fit_sha256", "")),
                          prior_runs=_fit_number(data.get("fit"), "prior_strength_runs", PRIOR_RUNS),
                          huber_delta=_fit_number(data.get("fit"), "huber_delta", PROFILE_HUBER_DELTA),
                          notes=tuple(str(n) for n in prov.get("notes") or ()))


def _fit_number(fit: Any, key: str, default: float) -> float:
    """A number of the profile's fit section (what the fit used; provenance, not read by the cost model)."""
    value = fit.get(key) if isinstance(fit, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def load_profile(path: str | Path) -> tuple[ClusterProfile, str]:
    """(profile, sha256 of the file)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise DtcError(Diagnostic(summary=f"cannot read the cluster profile {path}: {exc.strerror}",
                                  location=Location(str(path)),
                                  hint="write one with: dtc calibrate RUNS... -o profiles/NAME.yaml")) from None
    return parse_profile(raw.decode("utf-8", errors="replace"), str(path)), hashlib.sha256(raw).hexdigest()
