#!/usr/bin/env python3
"""Does a cluster profile learn a cluster? Calibrate on half of a group's runs, predict the other half.

    python benchmarks/calibrate_halves.py [CSV] [--min-runs 10] [--json]

For each (source, GPU) group of the calibration set (default benchmarks/data/published_runs_dev.csv)
with --min-runs or more modellable runs: the runs sorted by row id, every other run (1st, 3rd, ...)
calibrates a profile (compiler/calibration/profile_fit.py fit_profile: the same fit `dtc calibrate`
runs, shrunk towards the global fit, each constant in its physical range) and the other half is
predicted with it. Prints, per group and overall (the held-out runs of every group together), the
median |error| of tokens/s per GPU on the held-out half before (the global constants of
compiler/data/efficiency.yaml) and after (the profile's). Goal after: <= 5%.

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
from compiler.calibration.profile import PRIOR_RUNS  # noqa: E402
from compiler.calibration.profile_fit import fit_values  # noqa: E402
from compiler.calibration.runs import load_runs  # noqa: E402
from compiler.costmodel.efficiency import load_efficiency  # noqa: E402

CSV = ROOT / "benchmarks" / "data" / "published_runs_dev.csv"


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return math.nan if not n else (xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2]))


def _key(row_id: str) -> tuple[int, str]:
    return (int(row_id) if row_id.isdigit() else 0, row_id)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="?", default=str(CSV))
    parser.add_argument("--min-runs", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    base = load_efficiency()
    runs, _ = load_runs(args.csv)
    groups = defaultdict(list)
    for r in runs:
        groups[(r.source_id, r.gpu.name)].append(r)
    rows, all_before, all_after = [], [], []
    for (source, gpu), members in sorted(groups.items()):
        if len(members) < args.min_runs:
            continue
        members.sort(key=lambda r: _key(r.row_id))
        fit_half, test_half = members[0::2], members[1::2]
        values = fit_values(fit_half, base)
        eff = base.with_fitted(values)
        before = [abs(predict(r, base).tokens_per_s_per_gpu / r.measured_tokens_per_s_per_gpu - 1) for r in test_half]
        after = [abs(predict(r, eff).tokens_per_s_per_gpu / r.measured_tokens_per_s_per_gpu - 1) for r in test_half]
        all_before += before
        all_after += after
        rows.append({"source": source, "gpu": gpu, "runs": len(members), "calibrated_on": len(fit_half),
                     "predicted": len(test_half), "median_abs_error_before": _median(before),
                     "median_abs_error_after": _median(after), "constants": values})
        if not args.json:
            print(f"{source:<22} {gpu:<10} {len(fit_half):>3} fit / {len(test_half):>3} held out: median |error| "
                  f"{_median(before):6.1%} -> {_median(after):6.1%}", flush=True)
    overall = {"groups": len(rows), "predicted": len(all_before), "median_abs_error_before": _median(all_before),
               "median_abs_error_after": _median(all_after), "prior_strength_runs": PRIOR_RUNS}
    if args.json:
        print(json.dumps({"groups": rows, "overall": overall}, indent=2, sort_keys=True))
    else:
        print(f"overall: {len(rows)} groups, {len(all_before)} held-out runs, median |error| "
              f"{overall['median_abs_error_before']:.1%} before -> {overall['median_abs_error_after']:.1%} after "
              f"(goal <= 5%; prior strength {PRIOR_RUNS:g} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
