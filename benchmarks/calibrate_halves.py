#!/usr/bin/env python3
"""Does a cluster profile learn a cluster? Calibrate on half of a group's runs, predict the other half.

    python benchmarks/calibrate_halves.py [CSV] [--min-runs 10] [--json]

For each (source, GPU) group of the calibration set (default benchmarks/data/published_runs_dev.csv)
with --min-runs or more modellable runs: the runs sorted by row id, every other run (1st, 3rd, ...)
calibrates a profile (compiler/calibration/profile_fit.py fit_profile: the same fit `dtc calibrate`
runs, shrunk towards the global fit, each constant in its physical range) and the other half is
predicted with it. Prints, per group and overall (the held-out runs of every group together), the
median and 90th-percentile |error| of tokens/s per GPU on the held-out half before (the global
constants of compiler/data/efficiency.yaml) and after (the profile's). Goal after: <= 5% median.
Then the same with the halves swapped (calibrate on the 2nd, 4th, ... run), a check that the
figure is not one split's luck; then as for an unseen source (the profile shrunk towards, and
"before" measured with, the global constants refitted without the group's source), and with --loo
each group's profile fitted on all its runs with its own leave-one-out error (what `dtc calibrate`
reports and a calibrated band is made of). Each profile chooses its prior strength, Huber delta and
which constants it fits by its own leave-one-out error on the runs it is fitted on
(compiler/calibration/profile.py); the JSON output says what each chose.

Note: the global constants were fitted on this same set, so "before" is in-sample for them; the
profile's "after" is fitted on the calibration half only.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from compiler.calibration.fit import predict  # noqa: E402
from compiler.calibration.profile import HUBER_CHOICES, PRIOR_CHOICES  # noqa: E402
from compiler.calibration.profile_fit import fit_profile  # noqa: E402
from compiler.calibration.runs import load_runs  # noqa: E402
from compiler.costmodel.bands import default_table, profile_band  # noqa: E402
from compiler.costmodel.efficiency import load_efficiency  # noqa: E402
from compiler.stats import percentile  # noqa: E402

CSV = ROOT / "benchmarks" / "data" / "published_runs_dev.csv"


def _median(xs: list[float]) -> float:
    return percentile(xs, 0.5)


def _key(row_id: str) -> tuple[int, str]:
    return (int(row_id) if row_id.isdigit() else 0, row_id)


def _abs_errors(runs, eff) -> list[float]:
    return [abs(predict(r, eff).tokens_per_s_per_gpu / r.measured_tokens_per_s_per_gpu - 1) for r in runs]


def halves(groups, shipped, *, swap: bool, quiet: bool, unseen: bool = False) -> tuple[list[dict], dict]:
    rows, all_before, all_after = [], [], []
    inside = banded = 0
    widths: list[float] = []
    global_widths: list[float] = []  # the published runs' bands of the same held-out runs
    for (source, gpu), members in groups:
        # unseen: the global constants refitted without this source (compiler/data/efficiency.yaml's
        # leave-one-source-out refit), as for a cluster dtc was never fitted on
        base = shipped.left_out(source) if unseen else shipped
        fit_half, test_half = (members[1::2], members[0::2]) if swap else (members[0::2], members[1::2])
        profile = fit_profile(fit_half, name=f"{source}-{gpu}", base=base)
        values = profile.values
        eff = base.with_fitted(values)
        before, after = _abs_errors(test_half, base), _abs_errors(test_half, eff)
        # the band a spec using this profile gets (its own leave-one-out residuals), checked on the held-out half
        band = profile_band(profile.ref("", ""))
        if band is not None:
            for r in test_half:
                inside += band.contains(math.log(predict(r, eff).tokens_per_s_per_gpu / r.measured_tokens_per_s_per_gpu))
                banded += 1
            widths.append(band.high / band.low)
            for r in test_half:
                g = default_table().band_of(r.features)
                global_widths.append(g.high / g.low)
        all_before += before
        all_after += after
        rows.append({"source": source, "gpu": gpu, "runs": len(members), "calibrated_on": len(fit_half),
                     "prior_strength_runs": profile.prior_runs, "huber_delta": profile.huber_delta,
                     "held_at_global": sorted(k for k, c in profile.constants.items() if not c.fitted),
                     "predicted": len(test_half), "median_abs_error_before": _median(before),
                     "median_abs_error_after": _median(after), "p90_abs_error_before": percentile(before, 0.9),
                     "p90_abs_error_after": percentile(after, 0.9), "constants": values})
        if not quiet:
            print(f"{source:<22} {gpu:<10} {len(fit_half):>3} fit / {len(test_half):>3} held out: median |error| "
                  f"{_median(before):6.1%} -> {_median(after):6.1%}, p90 {percentile(before, 0.9):6.1%} -> "
                  f"{percentile(after, 0.9):6.1%} (prior {profile.prior_runs:g} runs, Huber delta {profile.huber_delta:g})",
                  flush=True)
    overall = {"groups": len(rows), "predicted": len(all_before), "median_abs_error_before": _median(all_before),
               "median_abs_error_after": _median(all_after), "p90_abs_error_before": percentile(all_before, 0.9),
               "p90_abs_error_after": percentile(all_after, 0.9),
               "profile_band_coverage": inside / banded if banded else math.nan, "profile_banded_runs": banded,
               "profile_band_median_width": _median(widths),
               "published_band_median_width": _median(global_widths)}
    return rows, overall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="?", default=str(CSV))
    parser.add_argument("--min-runs", type=int, default=10)
    parser.add_argument("--loo", action="store_true", help="also each group's profile on all its runs, with its "
                                                          "leave-one-out error")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    base = load_efficiency()
    runs, _ = load_runs(args.csv)
    by: dict[tuple[str, str], list] = defaultdict(list)
    for r in runs:
        by[(r.source_id, r.gpu.name)].append(r)
    groups = [(k, sorted(v, key=lambda r: _key(r.row_id))) for k, v in sorted(by.items()) if len(v) >= args.min_runs]
    out: dict = {"prior_strength_choices": list(PRIOR_CHOICES), "huber_delta_choices": list(HUBER_CHOICES)}
    for mode in ("halves", "swapped", "unseen"):
        swap, unseen = mode == "swapped", mode == "unseen"
        if not args.json:
            print({"halves": "calibrate on the 1st, 3rd, ... run",
                   "swapped": "calibrate on the 2nd, 4th, ... run (swapped halves)",
                   "unseen": "calibrate on the 1st, 3rd, ... run, the global constants fitted without the group's "
                             "source (an unseen source)"}[mode])
        rows, overall = halves(groups, base, swap=swap, unseen=unseen, quiet=args.json)
        out[mode] = {"groups": rows, "overall": overall}
        if not args.json:
            print(f"overall: {overall['groups']} groups, {overall['predicted']} held-out runs, median |error| "
                  f"{overall['median_abs_error_before']:.1%} before -> {overall['median_abs_error_after']:.1%} after, "
                  f"p90 {overall['p90_abs_error_before']:.1%} -> {overall['p90_abs_error_after']:.1%} (goal <= 5% "
                  f"median; prior strength and Huber delta chosen by each profile's leave-one-out)",
                  flush=True)
            print(f"profile bands (from the calibration half's leave-one-out residuals): "
                  f"{overall['profile_band_coverage']:.1%} of {overall['profile_banded_runs']} held-out runs inside "
                  f"the 80% band; median band width x{overall['profile_band_median_width']:.3f} "
                  f"(high / low step time; the published runs' bands of the same runs x"
                  f"{overall['published_band_median_width']:.3f})", flush=True)
    if args.loo:
        loo_rows, all_loo = [], []
        for (source, gpu), members in groups:
            profile = fit_profile(members, name=f"{source}-{gpu}", base=base)
            s = profile.summary("loo")
            all_loo += [abs(r.error_loo) for r in profile.runs]
            loo_rows.append({"source": source, "gpu": gpu, **s})
            if not args.json:
                print(f"profile of {source:<22} {gpu:<10} on {len(members):>3} runs: leave-one-out median |error| "
                      f"{s['median_abs_error']:6.1%}, p90 {s['p90_abs_error']:6.1%}", flush=True)
        out["profile_loo"] = {"groups": loo_rows, "overall": {"runs": len(all_loo), "median_abs_error": _median(all_loo),
                                                              "p90_abs_error": percentile(all_loo, 0.9)}}
        if not args.json:
            o = out["profile_loo"]["overall"]
            print(f"profile leave-one-out overall: {o['runs']} runs, median |error| {o['median_abs_error']:.1%}, "
                  f"p90 {o['p90_abs_error']:.1%}")
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
