#!/usr/bin/env python3
"""Accuracy of the cost model against published training runs: generalisation, not fit.

    python benchmarks/accuracy.py [CSV] [--json] [--refit] [--profile FILE] [--unsourced]

CSV: any file with the columns of benchmarks/data/published_runs_dev.csv (default: that file,
the vendored calibration set), in any order, extra columns ignored; a CSV without a column the
parser reads is refused with their names (exit 2), not read as blank cells. Each row is parsed by compiler/calibration/runs.py into the
model, layout, framework and precision of the published run (rows it cannot model are skipped
and the reasons counted), costed with compiler.costmodel.evaluation.evaluate for the framework that ran
it, and compared in tokens/s per GPU with what it measured (rows that give only TFLOP/s or MFU
are converted with their own FLOP convention).

Two predictions per row:

* in-sample: the committed constants (compiler/data/efficiency.yaml, fitted on the whole
  calibration set by benchmarks/fit.py);
* leave-one-source-out (LOSO): the constants refitted without the row's source
  (efficiency.yaml leave_one_source_out, written by the same script; ``--refit`` recomputes
  them from the vendored calibration set). A row whose source is not in the calibration set
  (another CSV) is predicted with the committed constants: it was never seen either way.

It prints the LOSO and in-sample figures per source, the signed median error per group
(framework, GPU, precision, scale, sequence length, dense/MoE; groups of 10+ rows beyond +-5%
are flagged), how many published runs the memory model puts over their HBM, peak-memory
ratios where a source published them, the coverage of the 80% error bands (each row's band made from
the other sources' residuals only, compiler/costmodel/bands.py):

    band coverage: X% of N rows inside the 80% band

and ends with the LOSO figure:

    overall: N rows, median |error| X%, p90 |error| Y%

``--json`` prints every row's in-sample and LOSO prediction with its regime features and its 80% band
(``predicted_low``, ``predicted_high``: tokens/s per GPU about the LOSO prediction).
``--profile FILE`` costs every row with a cluster profile's constants (`dtc calibrate`), both
columns alike: a profile has no leave-one-source-out refits. ``--unsourced`` also predicts the rows of
architectures whose distinctive kernel no benchmark describes (compiler.costmodel.bands.unsourced_attention: gpt-oss's
sink attention), which the fit and the default figures leave out.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from compiler.calibration.fit import fit_with_loso, predict  # noqa: E402
from compiler.calibration.runs import NotACalibrationCsv, PublishedRun, load_runs  # noqa: E402
from compiler.costmodel.bands import RESIDUALS, BandTable  # noqa: E402
from compiler.costmodel.efficiency import Efficiency, load_efficiency  # noqa: E402
from compiler.stats import percentile  # noqa: E402

CALIBRATION_CSV = ROOT / "benchmarks" / "data" / "published_runs_dev.csv"
GROUP_KEYS = ("framework", "gpu_generation", "precision", "fp8_recipe", "scale", "seq", "moe", "pp", "cp", "ep",
              "zero3_fsdp", "recompute")
FLAG_ROWS, FLAG_BIAS = 10, 0.05


@dataclass
class RowResult:
    row_id: str
    source_id: str
    model: str
    gpu: str
    layout: str
    framework: str
    measured_tokens_per_s_per_gpu: float
    measured_from: str
    predicted_tokens_per_s_per_gpu: float  # in-sample
    predicted_loso_tokens_per_s_per_gpu: float
    error: float  # in-sample: predicted / measured - 1
    loso_error: float
    predicted_tflops_row_convention: float | None
    memory_fits: bool
    memory_total_gib: float
    hbm_gib: float
    measured_peak_memory_gib: float | None
    features: dict[str, Any] = field(default_factory=dict)
    step_time_s: float = 0.0
    mfu: float = 0.0
    # the 80% band of the LOSO prediction, from the other sources' residuals (compiler/costmodel/bands.py)
    predicted_low: float = 0.0  # tokens/s per GPU
    predicted_high: float = 0.0
    in_band: bool = False
    band_runs: int = 0
    band_calibrated: bool = False
    band_regime: str = ""


def evaluate_run(run: PublishedRun, eff: Efficiency, loso_eff: Efficiency, bands: BandTable | None = None
                 ) -> RowResult:
    """One row's predictions; ``bands``: the band table without the row's source (its 80% band)."""
    from dataclasses import replace as _replace

    est = predict(run, eff)
    mem = est.memory if run.memory_layout is None else predict(_replace(run, layout=run.memory_layout), eff).memory
    loso = est if loso_eff is eff else predict(run, loso_eff)
    fpt = run.convention_flops_per_token
    pred, meas = est.tokens_per_s_per_gpu, run.measured_tokens_per_s_per_gpu
    return RowResult(
        row_id=run.row_id, source_id=run.source_id, model=run.model, gpu=run.gpu.name, layout=run.layout.describe(),
        framework=run.framework.name, measured_tokens_per_s_per_gpu=meas, measured_from=run.measured_from,
        predicted_tokens_per_s_per_gpu=pred, predicted_loso_tokens_per_s_per_gpu=loso.tokens_per_s_per_gpu,
        error=pred / meas - 1.0, loso_error=loso.tokens_per_s_per_gpu / meas - 1.0,
        predicted_tflops_row_convention=(pred * fpt / 1e12) if fpt else None,
        memory_fits=mem.total_bytes_per_gpu <= mem.usable_bytes_per_gpu,
        memory_total_gib=mem.total_bytes_per_gpu / 2**30, hbm_gib=run.gpu.spec.hbm_bytes / 2**30,
        measured_peak_memory_gib=run.measured_peak_memory_gib, features=dict(run.features),
        step_time_s=est.step_time_s, mfu=est.mfu, **_band_fields(run, loso.tokens_per_s_per_gpu, bands))


def _band_fields(run: PublishedRun, predicted: float, bands: BandTable | None) -> dict[str, Any]:
    if bands is None:
        return {}
    band = bands.band_of(run.features)
    low, high = predicted / band.high, predicted / band.low
    return {"predicted_low": low, "predicted_high": high,
            "in_band": band.contains(math.log(predicted / run.measured_tokens_per_s_per_gpu)),
            "band_runs": band.runs, "band_calibrated": band.calibrated, "band_regime": band.regime}


@dataclass
class Report:
    results: list[RowResult]
    skipped: Counter
    loso_from: str  # "committed" or "refit"

    def overall(self, loso: bool = True) -> dict[str, float]:
        return stats([r.loso_error if loso else r.error for r in self.results])

    def groups(self, key: str, loso: bool = True) -> dict[str, dict[str, float]]:
        out: dict[str, list[float]] = defaultdict(list)
        for r in self.results:
            value = r.source_id if key == "source" else r.features.get(key)
            out[str(value)].append(r.loso_error if loso else r.error)
        return {k: stats(v) for k, v in sorted(out.items())}

    def repeat_spread(self) -> dict[str, float]:
        """The calibration set's own noise: rows that repeat another row's configuration (model, GPU,
        precision, fp8 recipe, sequence, layout, framework; typically the same recipe in another release),
        each compared with the median of its repeats. A deterministic model cannot be closer to both."""
        by: dict[tuple, list[float]] = defaultdict(list)
        for r in self.results:
            f = r.features
            by[(r.model, r.gpu, f.get("precision"), f.get("fp8_recipe"), f.get("seq_len"), r.layout,
                r.framework)].append(r.measured_tokens_per_s_per_gpu)
        errors, groups = [], 0
        for values in by.values():
            if len(values) < 2:
                continue
            groups += 1
            for i, v in enumerate(values):
                others = sorted(values[:i] + values[i + 1:])
                errors.append(percentile(others, 0.5) / v - 1.0)
        out = stats(errors) if errors else {"rows": 0, "median_abs_error": 0.0, "p90_abs_error": 0.0,
                                             "median_error": 0.0}
        return dict(out, groups=groups)

    def band_coverage(self) -> dict[str, Any]:
        """How many rows' measurements lie inside their 80% band (leave-one-source-out), overall and split by
        calibrated / uncalibrated bands."""
        def share(rs: list[RowResult]) -> dict[str, Any]:
            inside = sum(r.in_band for r in rs)
            return {"rows": len(rs), "inside": inside, "coverage": inside / len(rs) if rs else math.nan}
        return {**share(self.results), "calibrated": share([r for r in self.results if r.band_calibrated]),
                "uncalibrated": share([r for r in self.results if not r.band_calibrated])}

    def flagged_groups(self) -> list[tuple[str, str, dict[str, float]]]:
        flagged = []
        for key in ("source",) + GROUP_KEYS:
            for name, s in self.groups(key).items():
                if s["rows"] >= FLAG_ROWS and abs(s["median_error"]) > FLAG_BIAS:
                    flagged.append((key, name, s))
        return flagged


def stats(errors: list[float]) -> dict[str, float]:
    absolute = [abs(e) for e in errors]
    return {"rows": len(errors), "median_abs_error": percentile(absolute, 0.5),
            "p90_abs_error": percentile(absolute, 0.9), "median_error": percentile(errors, 0.5)}


def run(csv_path: str | Path = CALIBRATION_CSV, *, refit: bool = False, efficiency: Efficiency | None = None,
        unsourced: bool = False) -> Report:
    eff = efficiency or load_efficiency()
    runs, skipped = load_runs(csv_path, unsourced=unsourced)
    loso_from = "committed"
    if refit:
        calibration = runs if Path(csv_path).resolve() == CALIBRATION_CSV.resolve() else load_runs(CALIBRATION_CSV)[0]
        fitted = fit_with_loso(calibration, base=eff, progress=lambda m: print(m, file=sys.stderr))
        eff = eff.with_fitted(fitted.fitted)
        from dataclasses import replace as _replace
        eff = _replace(eff, loso={k: v for k, v in fitted.loso.items()})
        loso_from = "refit"
    tables = loso_band_tables({r.source_id for r in runs})
    results = [evaluate_run(r, eff, eff.left_out(r.source_id), tables[r.source_id]) for r in runs]
    return Report(results, skipped, loso_from)


def loso_band_tables(sources: set[str]) -> dict[str, BandTable]:
    """Per source, the bands made from the committed residuals (compiler/data/residuals.json) of every OTHER
    source: a row's band never sees its own source's errors (a source outside the calibration set is
    left out already)."""
    rows = json.loads(RESIDUALS.read_text(encoding="utf-8"))["rows"]
    return {s: BandTable.from_rows(rows, exclude_source=s) for s in sorted(sources)}


def _fmt(s: dict[str, float]) -> str:
    return (f"{s['rows']:>5} {s['median_abs_error']:>11.1%} {s['p90_abs_error']:>9.1%} "
            f"{s['median_error']:>+11.1%}")


def format_report(report: Report) -> str:
    lines = [f"{'source':<28} {'rows':>5} {'LOSO med':>11} {'LOSO p90':>9} {'LOSO signed':>11}   "
             f"{'in-sample med':>13} {'p90':>7} {'signed':>7}"]
    loso, ins = report.groups("source"), report.groups("source", loso=False)
    for name in loso:
        a, b = loso[name], ins[name]
        lines.append(f"{name:<28} {_fmt(a)}   {b['median_abs_error']:>13.1%} {b['p90_abs_error']:>7.1%} "
                     f"{b['median_error']:>+7.1%}")
    lines.append("")
    lines.append(f"signed median error by group, leave-one-source-out (rows; median / p90 |error|); '!' = "
                 f"{FLAG_ROWS}+ rows beyond +-{FLAG_BIAS:.0%}")
    for key in GROUP_KEYS:
        parts = []
        for name, s in report.groups(key).items():
            flag = "!" if s["rows"] >= FLAG_ROWS and abs(s["median_error"]) > FLAG_BIAS else ""
            parts.append(f"{name or 'none'} {s['median_error']:+.1%} ({s['rows']}; |e| {s['median_abs_error']:.0%}/"
                         f"{s['p90_abs_error']:.0%}){flag}")
        lines.append(f"  {key:<15} " + ", ".join(parts))
    flagged = report.flagged_groups()
    lines.append(f"groups of {FLAG_ROWS}+ rows with |signed median| > {FLAG_BIAS:.0%}: "
                 + (", ".join(f"{k}={n} {s['median_error']:+.1%} ({s['rows']})" for k, n, s in flagged) or "none"))
    lines.append("")
    misfit = [r for r in report.results if not r.memory_fits]
    lines.append(f"published runs the memory model says do not fit in HBM: {len(misfit)} of {len(report.results)}"
                 + (" (" + ", ".join(f"row {r.row_id} {r.memory_total_gib:.0f}/{r.hbm_gib:.0f} GiB"
                                     for r in misfit[:8]) + (", ..." if len(misfit) > 8 else "") + ")" if misfit else ""))
    mem = [r for r in report.results if r.measured_peak_memory_gib]
    if mem:
        ratios = sorted(r.memory_total_gib / r.measured_peak_memory_gib for r in mem)
        lines.append(f"predicted / published peak memory: {len(mem)} rows, min {ratios[0]:.2f}, median "
                     f"{percentile(ratios, 0.5):.2f}, max {ratios[-1]:.2f}")
    else:
        lines.append("predicted / published peak memory: no row publishes a peak memory")
    lines.append("skipped: " + (", ".join(f"{v} {k}" for k, v in report.skipped.most_common()) or "none"))
    rep = report.repeat_spread()
    lines.append(f"the same configuration measured again ({rep['rows']} rows in {rep['groups']} repeated configurations): "
                 f"other measurements' median vs this one, median |difference| {rep['median_abs_error']:.1%}, p90 "
                 f"{rep['p90_abs_error']:.1%} (the calibration set's own noise)")
    ins_o = report.overall(loso=False)
    lines.append(f"in-sample: {ins_o['rows']} rows, median |error| {ins_o['median_abs_error']:.1%}, "
                 f"p90 |error| {ins_o['p90_abs_error']:.1%} (constants of "
                 f"{report.loso_from if report.loso_from.startswith('profile') else 'compiler/data/efficiency.yaml'})")
    cov = report.band_coverage()
    cal, unc = cov["calibrated"], cov["uncalibrated"]
    lines.append(f"80% bands from the other sources' residuals: {cal['rows']} rows in calibrated regimes "
                 f"({cal['coverage']:.0%} inside), {unc['rows']} uncalibrated ({unc['coverage']:.0%} inside)")
    lines.append(f"band coverage: {cov['coverage']:.1%} of {cov['rows']} rows inside the 80% band")
    o = report.overall()
    lines.append(f"leave-one-source-out constants: {report.loso_from}")
    lines.append(f"overall: {o['rows']} rows, median |error| {o['median_abs_error']:.1%}, "
                 f"p90 |error| {o['p90_abs_error']:.1%}")
    return "\n".join(lines)


def to_json(report: Report) -> dict[str, Any]:
    return {"overall": report.overall(), "overall_in_sample": report.overall(loso=False),
            "by_source": report.groups("source"), "by_source_in_sample": report.groups("source", loso=False),
            "groups": {k: report.groups(k) for k in GROUP_KEYS},
            "flagged_groups": [{"key": k, "group": n, **s} for k, n, s in report.flagged_groups()],
            "skipped": dict(report.skipped), "loso_from": report.loso_from, "repeat_spread": report.repeat_spread(),
            "band_coverage": report.band_coverage(),
            "rows": [r.__dict__ for r in report.results]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="?", default=str(CALIBRATION_CSV),
                        help="published runs CSV (columns of benchmarks/data/published_runs_dev.csv)")
    parser.add_argument("--json", action="store_true", help="machine-readable output with per-row predictions")
    parser.add_argument("--refit", action="store_true",
                        help="refit the constants and the leave-one-source-out refits now (minutes) instead of "
                             "reading them from compiler/data/efficiency.yaml")
    parser.add_argument("--unsourced", action="store_true",
                        help="also predict the rows of architectures whose distinctive kernel has no benchmark "
                             "(compiler.costmodel.bands.unsourced_attention: gpt-oss); never fitted")
    parser.add_argument("--profile", metavar="FILE", default=None,
                        help="cost with this cluster profile's constants (written by dtc calibrate)")
    args = parser.parse_args(argv)
    if not Path(args.csv).is_file():
        print(f"error: no such file: {args.csv}", file=sys.stderr)
        return 2
    efficiency = None
    if args.profile is not None:
        from compiler.calibration.profile import load_profile
        from compiler.errors import DtcError

        try:
            profile, _ = load_profile(args.profile)
        except DtcError as exc:
            print(exc.render(), file=sys.stderr)
            return 2
        if args.refit:
            print("error: --profile and --refit exclude each other", file=sys.stderr)
            return 2
        efficiency = profile.efficiency(load_efficiency())
    try:
        report = run(args.csv, refit=args.refit, efficiency=efficiency, unsourced=args.unsourced)
    except NotACalibrationCsv as exc:
        print(f"error: {exc}\n  hint: give every column of {CALIBRATION_CSV.relative_to(ROOT)} (extra columns and "
              "their order do not matter; benchmarks/data/CALIBRATION_README.md describes them)", file=sys.stderr)
        return 2
    if args.profile is not None:
        report.loso_from = f"profile {args.profile}"
    if args.json:
        print(json.dumps(to_json(report), indent=2, sort_keys=True))
    else:
        print(format_report(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
