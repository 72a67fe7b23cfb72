"""Error bands: how far measured step times fall from the cost model's, in the layout's regime (issue #12).

    band_for(framework=..., gpu_generation=..., precision=..., fp8_recipe=..., layout=..., shape=...) -> ErrorBand

A band is read from the cost model's leave-one-source-out (LOSO) residuals of the published runs
(compiler/data/residuals.json, written by benchmarks/fit.py): each run predicted with the constants
fitted WITHOUT its source, so a residual is the error on a source the fit never saw -- what a user's
cluster is to dtc. The residual is ``r = log(predicted tokens/s / measured)``, i.e. the log of
(measured step time / predicted step time); a band multiplies the predicted step time by
``exp(quantile of r)``.

The rule (the numbers below are its only parameters; benchmarks/accuracy.py checks the result):

* **Regime.** A layout's regime is its framework family (``FAMILIES``) x GPU generation (kernel
  family) x precision and fp8 recipe x the features it uses (pipeline and interleaved pipeline,
  context parallel, expert parallel, FSDP / ZeRO-3, offload) x scale (GPU-count bucket,
  ``scale_bucket``).
* **Nearest regime.** ``LEVELS`` go from that full regime to coarser ones (scale dropped, then the
  fp8 recipe and interleaving, then the GPU generation, then the precision; the framework family and
  whether the layout pipelines, splits the context, the experts or the states, or offloads, always
  match: those change what the model must get right); the band
  comes from the first level holding at least ``MIN_RUNS`` runs from at least ``MIN_SOURCES``
  sources (one source's runs share a harness and a bias: they do not tell how a new cluster errs).
* **Band.** The 10th and 90th percentiles of the level's residuals, each at least as far from the
  level's median as the framework family's own 10th/90th percentile is from the family's median,
  widened about the median by sqrt(1 + 1/n) (the factor of a normal prediction interval for one new
  observation from n), and stretched to include the point estimate (0): the 80% band. The level's
  runs say where the model errs in that regime (the median); how far a new cluster scatters about it
  is never taken as narrower than the family's spread, because a few sources' runs in one regime
  understate how sources differ: with the level's own spread only, 65% of the calibrated rows fell
  inside their leave-one-source-out band (benchmarks/accuracy.py), 82% with the family's as the
  floor. ``p80`` is the 80th percentile of the level's residuals widened the same way (not floored by
  the family's spread: already 91% of the calibrated rows' leave-one-source-out errors lie at or below
  it, and the solver ranks by it), but never below the 80th percentile of every residual of the
  framework family (the calibration set's own spread for that family), and the upper end never below
  ``p80``: a regime
  where the model happens to be pessimistic is not ranked as surer than the model is for that
  family as a whole (without the floor, ranking at p80 drew 4 of the 6 example specs to one coarse
  fp8 PP+CP regime whose 21 runs the model over-predicts, p80 x1.02, and Mixtral off expert parallelism).
* **Uncalibrated.** No level with enough runs: the 10th/90th percentiles of every run's residual,
  widened in log space by the factor residuals.json records (``uncalibrated_widening``), and labelled
  "uncalibrated". benchmarks/fit.py chooses that factor as a conformal calibration on the calibration
  set itself (``calibrate_widening``): the smallest, in steps of 0.05 from 1, at which 80% of the runs
  whose leave-one-source-out band is uncalibrated fall inside it (each run's band made from the other
  sources' residuals, as ``coverage`` does). A regime nobody measured errs more than the model does on
  the whole set, and by how much is measured, not assumed (a flat doubling held 96% of those runs).
  The other runs' coverage, and held-out runs, are the checks it does not choose.
* **Thin.** Uncalibrated, or fewer than ``THIN_RUNS`` runs behind the band: PLAN.md says so and
  names the best layout with a well-calibrated band.
* **Attention no kernel benchmark describes** (sliding windows, learnable sinks: ``unsourced_attention``).
  The calibration set's residuals say nothing of how wrong the model is for such a model; the published
  runs of that kind, kept out of the fit (residuals.json ``unsourced_rows``, each predicted with the
  constants fitted without its source), do. Its estimates take their bands from those runs alone, by the
  same rule (``table_for``); from one source they give an uncalibrated band, widened from their own
  errors, that says how many runs it comes from (gpt-oss-120b's 31 Megatron-Bridge runs: the step time
  1.0-2.0x the prediction).

A calibrated cluster (``cluster.profile``, written by ``dtc calibrate``): the profile's own
leave-one-out residuals (each of its runs predicted with the profile refitted without it:
compiler/calibration/profile.py) are that cluster's errors, so its estimates take their band from
them on the same rule (10th/90th percentiles widened by sqrt(1 + 1/n), stretched to include the
point estimate; p80 the 80th percentile, not floored by the published runs' spread: the cluster's
own runs say how sure the model is there), with the number of runs behind it. A profile with fewer
than ``PROFILE_MIN_RUNS`` runs keeps the published runs' band and says so (``profile_fallback``).
The profile's band applies to every layout the spec costs (its runs are the only evidence about
that cluster; a layout far from them is still better told by them than by other clusters' runs).

Memory (the upper end only; feasibility uses it): the calibration set publishes no peak memory per
GPU (benchmarks/accuracy.py counts the rows that do: 0 of the modelled rows), so the only
measurements are the reduced-model smoke runs of ``dtc smoke`` (benchmarks/smoke_memory.py,
issue #6): model states measured / predicted 0.89-1.07. That is weak evidence (CPU ranks, small
models, activations not covered at scale), so the band's upper end is the predicted total plus a
stated margin, ``MEMORY_MARGIN`` (7%: the largest model-state excess the smoke runs measured),
on top of the allowances the memory model already adds (fragmentation, CUDA context, NCCL).

Lookups are cheap: the table is read once per process and each regime's band is memoised.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from compiler.costmodel.context import fp8_recipe_of
from compiler.costmodel.frameworks import profile_of
from compiler.estimate import ErrorBand
from compiler.layout import Layout
from compiler.model import ModelShape
from compiler.problem import GpuOption, Problem
from compiler.profile_ref import ProfileRef
from compiler.stats import percentile

RESIDUALS = Path(__file__).resolve().parents[1] / "data" / "residuals.json"

COVERAGE = 0.8  # the band's nominal coverage
Q_LOW, Q_HIGH = 0.1, 0.9  # its percentiles
MIN_RUNS = 8  # runs a level needs to give a band
MIN_SOURCES = 2  # ... from this many sources
THIN_RUNS = 20  # fewer runs than this behind a band: PLAN.md names the best well-calibrated alternative
WIDENING_STEP = 0.05  # the grid calibrate_widening searches (from 1.0) ...
MAX_WIDENING = 4.0  # ... up to this
PROFILE_MIN_RUNS = MIN_RUNS  # runs a cluster profile needs for a band of its own (as a published regime does)
MEMORY_MARGIN = 0.07  # upper end of the memory band: predicted total x (1 + margin); see the module docstring
MEMORY_MARGIN_SOURCE = ("no published run of the calibration set gives its peak memory; the dtc smoke runs "
                        "(benchmarks/smoke_memory.py, issue #6) measured model states at 0.89-1.07x the prediction: "
                        "the upper end adds 7% (weak evidence, a stated margin)")

# The quantile the solver ranks by (budget.confidence): None = the point estimate.
QUANTILES: Mapping[str, float | None] = {"expected": None, "p80": 0.8, "p90": 0.9}

# Framework family of each cost profile: dtc's targets and the frameworks of published runs
# (compiler/calibration/frameworks.py). Residuals of a family speak for every framework in it.
FAMILIES: Mapping[str, str] = {
    "megatron": "megatron", "megatron_bridge": "megatron", "nemo_2407": "megatron",
    "megatron_lm_2021": "megatron", "llama3_meta": "megatron",
    "fsdp": "torch_fsdp", "torchtitan": "torch_fsdp", "llm_foundry": "torch_fsdp",
    "deepspeed": "deepspeed", "deepspeed_defaults": "deepspeed",
    "deepseek_v3": "deepseek_v3",
}

FEATURES = ("pp", "vpp", "cp", "ep", "zero3_fsdp", "offload")
# Coarsening levels: the regime keys each level matches on, finest first.
LEVELS: tuple[tuple[str, ...], ...] = (
    ("family", "gpu_generation", "precision", "fp8_recipe") + FEATURES + ("scale",),
    ("family", "gpu_generation", "precision", "fp8_recipe") + FEATURES,
    ("family", "gpu_generation", "precision", "pp", "cp", "ep", "zero3_fsdp", "offload"),
    ("family", "precision", "pp", "cp", "ep", "zero3_fsdp", "offload"),
    ("family", "pp", "cp", "ep", "zero3_fsdp", "offload"),
)
REGIME_KEYS = LEVELS[0]
FEATURE_LABELS = {"pp": "PP", "vpp": "VPP", "cp": "CP", "ep": "EP", "zero3_fsdp": "FSDP/ZeRO-3", "offload": "offload"}


def family_of(framework: str) -> str:
    """The framework family of a cost profile's name (a published run's 'megatron_bridge+...' too); a profile
    outside ``FAMILIES`` is its own family, with no published runs: uncalibrated."""
    name = framework.split("+")[0]
    return FAMILIES.get(name, name)


def scale_bucket(n: int) -> str:
    """GPU-count bucket of a regime."""
    return "<=8" if n <= 8 else "9-64" if n <= 64 else "65-512" if n <= 512 else "513-2048" if n <= 2048 else ">2048"


def layout_features(layout: Layout) -> dict[str, Any]:
    """The regime features a layout uses (the calibration runs' features are made by this same function)."""
    return features_of(pp=layout.pp, vpp=layout.vpp, cp=layout.cp, ep=layout.ep, zero_stage=layout.zero_stage,
                       offload_optimizer=layout.offload_optimizer, offload_params=layout.offload_params,
                       world=layout.world_size)


def features_of(*, pp: int, vpp: int, cp: int, ep: int, zero_stage: int, offload_optimizer: str,
                offload_params: str, world: int) -> dict[str, Any]:
    """layout_features from the degrees and choices alone (the solver asks it without building a Layout)."""
    return {"pp": pp > 1, "vpp": vpp > 1, "cp": cp > 1, "ep": ep > 1, "zero3_fsdp": zero_stage == 3,
            "offload": offload_optimizer != "none" or offload_params != "none", "scale": scale_bucket(world)}


def regime_of(features: Mapping[str, Any]) -> tuple:
    """The full regime key of a features dict (residuals.json's row features, or ``regime_features``)."""
    f = dict(features)
    f.setdefault("family", family_of(str(f.get("framework", ""))))
    return tuple(f.get(k) if k != "fp8_recipe" else (f.get(k) or "") for k in REGIME_KEYS)


def regime_features(*, framework: str, gpu_generation: str, precision: str, fp8_recipe: str,
                    layout: Layout) -> dict[str, Any]:
    return {"framework": framework, "family": family_of(framework), "gpu_generation": gpu_generation,
            "precision": precision, "fp8_recipe": fp8_recipe if precision == "fp8" else "",
            **layout_features(layout)}


def describe_regime(key: tuple, level: tuple[str, ...]) -> str:
    """'megatron, hopper, fp8 (fp8_tensorwise_current), PP, EP, 65-512 GPUs' for the keys a level matches."""
    f = dict(zip(REGIME_KEYS, key))
    parts = [str(f["family"])]
    if "gpu_generation" in level:
        parts.append(str(f["gpu_generation"]))
    if "precision" in level:
        recipe = f["fp8_recipe"] if "fp8_recipe" in level and f["fp8_recipe"] else ""
        parts.append(f"{f['precision']} ({recipe})" if recipe else str(f["precision"]))
    if any(k in level for k in FEATURES):
        used = [FEATURE_LABELS[k] for k in FEATURES if k in level and f[k]]
        if "vpp" in level and f["pp"] and not f["vpp"]:
            used.insert(used.index("PP") + 1, "no VPP")
        parts.append(", ".join(used) if used else "no PP/CP/EP/FSDP/offload")
    if "scale" in level:
        parts.append(f"{f['scale']} GPUs")
    return ", ".join(parts)


@dataclass(frozen=True)
class Residual:
    """One published run's LOSO residual: log(predicted / measured tokens/s), its source and regime."""

    log_error: float
    source: str
    regime: tuple


class BandTable:
    """The bands of every regime, from a set of residuals (the committed ones, or a synthetic set in tests,
    or all but one source's for leave-one-source-out coverage)."""

    def __init__(self, residuals: Iterable[Residual], *, widening: float | None = None, label: str | None = None):
        """``widening``: of an uncalibrated band (module docstring); None: the committed one. ``label``: what the
        residuals are, when they are not the calibration set's (an uncalibrated band then counts them and says
        so: unsourced_table)."""
        self.residuals = tuple(residuals)
        self.label = label
        widening = committed_widening() if widening is None else widening
        if not self.residuals:
            raise ValueError("a band table needs at least one residual")
        errors = [r.log_error for r in self.residuals]
        family = REGIME_KEYS.index("family")
        by_family: dict[Any, list[float]] = {}
        for r in self.residuals:
            by_family.setdefault(r.regime[family], []).append(r.log_error)
        # each family's own spread: the floor of a calibrated band's p80, and of its percentiles' distances from
        # the regime's median (module docstring)
        self._p80_floor = {f: max(0.0, percentile(e, 0.8)) for f, e in by_family.items()}
        self._spread = {f: spread_of(e) for f, e in by_family.items()}
        self._wide = (min(0.0, widening * percentile(errors, Q_LOW)),
                      max(0.0, widening * percentile(errors, 0.8)),
                      max(0.0, widening * percentile(errors, Q_HIGH)))
        self._levels: dict[int, tuple[list[int], dict[tuple, list[Residual]]]] = {}
        self.band = functools.lru_cache(maxsize=4096)(self._band)

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], *, exclude_source: str | None = None,
                  widening: float | None = None, label: str | None = None) -> "BandTable":
        """From residuals.json rows (``log_error_loso`` and ``features``), leaving ``exclude_source`` out."""
        return cls((Residual(float(r["log_error_loso"]), str(r["features"]["source"]), regime_of(r["features"]))
                    for r in rows if r["features"]["source"] != exclude_source), widening=widening, label=label)

    def _level_index(self, n: int) -> tuple[list[int], dict[tuple, list[Residual]]]:
        """The residuals of LEVELS[n] by the regime fields it compares (in the table's order), built once."""
        got = self._levels.get(n)
        if got is None:
            idx = [REGIME_KEYS.index(k) for k in LEVELS[n]]
            groups: dict[tuple, list[Residual]] = {}
            for r in self.residuals:
                groups.setdefault(tuple(r.regime[i] for i in idx), []).append(r)
            got = self._levels[n] = (idx, groups)
        return got

    def _band(self, key: tuple) -> ErrorBand:
        for n, level in enumerate(LEVELS):
            idx, groups = self._level_index(n)
            match = groups.get(tuple(key[i] for i in idx), [])
            sources = len({r.source for r in match})
            if len(match) >= MIN_RUNS and sources >= MIN_SOURCES:
                family = key[REGIME_KEYS.index("family")]
                low, p80, high = residual_band([r.log_error for r in match], p80_floor=self._p80_floor[family],
                                               spread=self._spread[family])
                return ErrorBand(low=low, p80=p80, high=high, runs=len(match), sources=sources,
                                 regime=describe_regime(key, level), calibrated=True,
                                 thin=len(match) < THIN_RUNS, memory_high=1.0 + MEMORY_MARGIN)
        lo, p80, hi = self._wide
        regime = describe_regime(key, LEVELS[0])
        runs = sources = 0
        if self.label is not None:  # the table's own runs, too few sources for a calibrated band: counted
            runs, sources, regime = len(self.residuals), len({r.source for r in self.residuals}), \
                f"{self.label}, for {regime}"
        return ErrorBand(low=math.exp(lo), p80=math.exp(p80), high=math.exp(hi), runs=runs, sources=sources,
                         regime=regime, calibrated=False, thin=True, memory_high=1.0 + MEMORY_MARGIN)

    def band_of(self, features: Mapping[str, Any]) -> ErrorBand:
        return self.band(regime_of(features))


@functools.lru_cache(maxsize=1)
def committed_widening() -> float:
    """The uncalibrated bands' widening benchmarks/fit.py calibrated (compiler/data/residuals.json); 1 in a file
    from before it was calibrated, which the fit reads only for the bands of the estimates it does not use."""
    return float(_committed_residuals().get("uncalibrated_widening", 1.0))


@functools.lru_cache(maxsize=1)
def default_table() -> BandTable:
    """The bands of the committed residuals (compiler/data/residuals.json), read once."""
    return BandTable.from_rows(_committed_residuals()["rows"])


def unsourced_attention(shape: ModelShape) -> bool:
    """Whether the model's attention is of a kind no kernel benchmark describes (sliding windows, learnable sinks:
    compiler/calibration/runs.py keeps such published runs out of the fit, UNSOURCED_ATTENTION)."""
    return bool(shape.window_size or shape.attention_sinks)


@functools.lru_cache(maxsize=1)
def unsourced_table() -> BandTable | None:
    """The bands of the published runs kept out of the fit (residuals.json ``unsourced_rows``); None: none."""
    rows = _committed_residuals().get("unsourced_rows") or []
    if not rows:
        return None
    sources = len({r["features"]["source"] for r in rows})
    return BandTable.from_rows(rows, label=f"the {len(rows)} published runs of its attention kind (gpt-oss; "
                                           f"{sources} source{'s' if sources != 1 else ''}; kept out of the fit)")


def table_for(shape: ModelShape) -> BandTable:
    """The residuals a model's estimates take their bands from: its own kind's runs where the model's attention
    has no kernel source (unsourced_attention: the calibration set's runs say nothing of how wrong the model is
    there; those runs do), else the calibration set's."""
    if unsourced_attention(shape):
        table = unsourced_table()
        if table is not None:
            return table
    return default_table()


@functools.lru_cache(maxsize=1)
def _committed_residuals() -> dict[str, Any]:
    """compiler/data/residuals.json, read once for its rows and its widening."""
    return json.loads(RESIDUALS.read_text(encoding="utf-8"))


def spread_of(errors: Sequence[float]) -> tuple[float, float]:
    """The distances of the 10th and 90th percentiles (Q_LOW, Q_HIGH) of ``errors`` from their median."""
    med = percentile(errors, 0.5)
    return percentile(errors, Q_LOW) - med, percentile(errors, Q_HIGH) - med


def residual_band(errors: Sequence[float], *, p80_floor: float = 0.0,
                  spread: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float, float]:
    """(low, p80, high) step-time factors of a set of residuals log(measured / predicted step time): the module
    docstring's rule (percentiles widened about the median by sqrt(1 + 1/n), the 10th and 90th at least
    ``spread`` (spread_of's distances) from it, the band stretched to include the point estimate, p80 at least
    ``p80_floor`` in log space and the upper end at least p80)."""
    med, widen = percentile(errors, 0.5), math.sqrt(1 + 1 / len(errors))

    def q(p: float) -> float:
        return med + (percentile(errors, p) - med) * widen

    low, high = min(q(Q_LOW), med + spread[0] * widen), max(q(Q_HIGH), med + spread[1] * widen)
    p80 = max(p80_floor, q(0.8))
    return math.exp(min(0.0, low)), math.exp(p80), math.exp(max(p80, high))


@functools.lru_cache(maxsize=64)
def profile_band(profile: ProfileRef) -> ErrorBand | None:
    """The band of every estimate costed with a cluster profile: from the profile's own leave-one-out residuals;
    None when it has fewer than PROFILE_MIN_RUNS runs."""
    errors = profile.loo_log_errors
    if len(errors) < PROFILE_MIN_RUNS:
        return None
    low, p80, high = residual_band(errors)
    return ErrorBand(low=low, p80=p80, high=high, runs=len(errors), sources=1,
                     regime=f"cluster profile {profile.name}", calibrated=True, thin=len(errors) < THIN_RUNS,
                     memory_high=1.0 + MEMORY_MARGIN, profile=profile.name)


def with_profile(band: ErrorBand, profile: ProfileRef | None) -> ErrorBand:
    """``band`` (the published runs') for an estimate costed with ``profile``: the profile's own band when it has
    the runs for one, else ``band`` saying why the profile's runs were not enough."""
    if profile is None:
        return band
    own = profile_band(profile)
    if own is not None:
        return own
    n = len(profile.loo_log_errors)
    return replace(band, profile_fallback=f"the cluster profile '{profile.name}' has {n} run{'s' if n != 1 else ''}, "
                                          f"fewer than {PROFILE_MIN_RUNS} for a band of its own")


def band_for(*, framework: str, gpu_generation: str, precision: str, fp8_recipe: str, layout: Layout,
             shape: ModelShape, profile: ProfileRef | None = None) -> ErrorBand:
    """The 80% band of a layout of ``shape`` costed for ``framework`` (a cost profile's name) on a GPU generation
    (table_for), with the constants of ``profile`` when the spec uses one (``with_profile``)."""
    return with_profile(table_for(shape).band(regime_of(regime_features(
        framework=framework, gpu_generation=gpu_generation, precision=precision, fp8_recipe=fp8_recipe,
        layout=layout))), profile)


def layout_band(problem: Problem, layout: Layout, target: str, gpu: GpuOption) -> ErrorBand:
    """The band an estimate of ``layout`` costed for ``target`` on ``gpu`` carries, without costing it (the
    solver's bounds multiply by it)."""
    framework = profile_of(target)
    return band_for(framework=framework.name, gpu_generation=gpu.spec.kernel_family, precision=problem.precision,
                    fp8_recipe=fp8_recipe_of(problem, framework, gpu), layout=layout, shape=problem.shape,
                    profile=problem.profile)


def shape_floor(problem: Problem, gpu: GpuOption, targets: Sequence[str], *, pp: int, cp: int, ep: int,
                world: int, confidence: str) -> float:
    """The smallest factor (at ``confidence``) any layout of a parallel shape can carry, over the features its
    inner choices leave open (interleaving, FSDP/ZeRO-3, offload) and the targets: the solver multiplies a
    shape's or a group's lower bound by it."""
    if QUANTILES[confidence] is None:
        return 1.0
    own = profile_band(problem.profile) if problem.profile is not None else None
    if own is not None:  # every layout costed with this profile carries its band
        return own.time_factor(confidence)
    out = math.inf
    table = table_for(problem.shape)
    for target in targets:
        framework = profile_of(target)
        base = {"framework": framework.name, "gpu_generation": gpu.spec.kernel_family,
                "precision": problem.precision,
                "fp8_recipe": fp8_recipe_of(problem, framework, gpu), "pp": pp > 1, "cp": cp > 1, "ep": ep > 1,
                "scale": scale_bucket(world)}
        for vpp in ((False, True) if pp > 1 else (False,)):
            for zero3 in (False, True):
                for offload in (False, True):
                    band = table.band_of({**base, "vpp": vpp, "zero3_fsdp": zero3, "offload": offload})
                    out = min(out, band.time_factor(confidence))
    return out


def calibrate_widening(rows: Sequence[Mapping[str, Any]]) -> float:
    """The smallest widening (WIDENING_STEP grid from 1) at which COVERAGE of the rows whose leave-one-source-out
    band is uncalibrated fall inside it (module docstring); 1.0 when no row's band is uncalibrated."""
    steps = round((MAX_WIDENING - 1.0) / WIDENING_STEP)
    for k in range(steps + 1):
        w = round(1.0 + k * WIDENING_STEP, 4)
        inside, n = coverage(rows, widening=w)[2].get("uncalibrated", (0, 0))
        if n == 0 or inside >= COVERAGE * n:
            return w
    return MAX_WIDENING


def coverage(rows: Sequence[Mapping[str, Any]], *, widening: float | None = None
             ) -> tuple[int, int, dict[str, tuple[int, int]]]:
    """Leave-one-source-out coverage of the bands on residuals.json-style rows: each row's band comes from
    the other sources' residuals only. (inside, rows, {level: (inside, rows)}) with level 'uncalibrated'
    or the number of runs bucket."""
    tables: dict[str, BandTable] = {}
    inside = 0
    by: dict[str, tuple[int, int]] = {}  # level -> (inside, rows)
    for r in rows:
        src = r["features"]["source"]
        table = tables.get(src) or tables.setdefault(src, BandTable.from_rows(rows, exclude_source=src,
                                                                              widening=widening))
        band = table.band_of(r["features"])
        ok = band.contains(float(r["log_error_loso"]))
        inside += ok
        label = "calibrated" if band.calibrated else "uncalibrated"
        a, n = by.get(label, (0, 0))
        by[label] = (a + ok, n + 1)
    return inside, len(rows), by
