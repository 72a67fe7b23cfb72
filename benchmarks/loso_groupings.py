#!/usr/bin/env python3
"""How much the leave-one-source-out figure depends on what a "source" is.

    python benchmarks/loso_groupings.py [--json]

benchmarks/accuracy.py's headline leaves out one ``source_id`` of the calibration set at a time
(the curators' grouping: Megatron-Bridge's performance summary is one source of 166 modelled runs
over nine container releases, while NeMo 2.0's releases are three sources). This script refits the
constants (compiler/calibration/fit.py, the same fit as benchmarks/fit.py) under two other
definitions and prints the same figures for each, so a reader can judge the choice:

* ``release``: every Megatron-Bridge / NeMo container release is its own source (a publication:
  its own section of the summary, its own container, its own measurements);
* ``release, configurations withheld``: as ``release``, but a held-out release's configurations
  (model, GPU, GPU count, layout, precision) are also removed from the refit wherever another
  release measured them again, so that no measurement of the same configuration is fitted on.

Nothing is written; it takes a few minutes (one refit per held-out group).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from compiler.calibration.fit import fit_constants, predict  # noqa: E402
from compiler.calibration.runs import PublishedRun, load_runs, read_rows  # noqa: E402
from compiler.costmodel.efficiency import load_efficiency, prior_efficiency  # noqa: E402

CSV = ROOT / "benchmarks" / "data" / "published_runs_dev.csv"


def release_of(row: dict) -> str:
    """The source, split by container release for NVIDIA's performance summaries ('megatron_bridge_perf@26.04')."""
    source = row.get("source_id", "")
    m = re.search(r"NeMo (\d\d\.\d\d(?:\.\d+)?)", row.get("software_version", ""))
    return f"{source}@{m.group(1)}" if m and source.startswith(("megatron_bridge", "nemo")) else source


def configuration(run: PublishedRun) -> tuple:
    return (run.model, run.gpu.name, run.layout.world_size, run.layout.tag, run.problem.precision,
            run.problem.fp8_recipe)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def loso(runs: list[PublishedRun], group: dict[str, str], *, withhold_configs: bool,
         progress=None) -> dict[str, float]:
    base = prior_efficiency()
    start = dict(load_efficiency().fitted)
    errors: list[float] = []
    groups = sorted({group[r.row_id] for r in runs})
    for g in groups:
        held = [r for r in runs if group[r.row_id] == g]
        configs = {configuration(r) for r in held}
        rest = [r for r in runs if group[r.row_id] != g and not (withhold_configs and configuration(r) in configs)]
        if progress:
            progress(f"  leave out {g}: {len(held)} runs, refit on {len(rest)}")
        eff = base.with_fitted(fit_constants(rest, start=start, base=base))
        errs = [predict(r, eff).tokens_per_s_per_gpu / r.measured_tokens_per_s_per_gpu - 1.0 for r in held]
        errors += errs
    a = [abs(e) for e in errors]
    return {"groups": len(groups), "rows": len(errors), "median_abs_error": _pct(a, 0.5),
            "p90_abs_error": _pct(a, 0.9)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    progress = None if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    runs, _ = load_runs(CSV)
    rows = {r["row_id"]: r for r in read_rows(CSV)}
    by_source = {r.row_id: r.source_id for r in runs}
    by_release = {r.row_id: release_of(rows[r.row_id]) for r in runs}
    out = {}
    for name, group, withhold in (("source_id", by_source, False), ("release", by_release, False),
                                  ("release, configurations withheld", by_release, True)):
        if progress:
            progress(f"{name}:")
        out[name] = loso(runs, group, withhold_configs=withhold, progress=progress)
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    for name, r in out.items():
        print(f"leave-one-out by {name}: {r['groups']} groups, {r['rows']} rows, median |error| "
              f"{r['median_abs_error']:.1%}, p90 |error| {r['p90_abs_error']:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
