#!/usr/bin/env python3
"""Regenerate the cost model's fitted constants from the vendored calibration set.

    python benchmarks/fit.py [--check]

The ONE place fitted constants come from. Reads benchmarks/data/published_runs_dev.csv (the
calibration set; see benchmarks/data/PROVENANCE.md), compiler/data/physics.yaml (the
sourced physics) and compiler/data/bridge_perf_recipes.csv (the launch settings of the
Megatron-Bridge rows, benchmarks/bridge_recipes.py), fits
compiler.costmodel.efficiency.FIT_PARAMETERS on every modellable run
(compiler/calibration/fit.py), refits once per left-out source, and writes

* compiler/data/efficiency.yaml: the fitted constants, one set per left-out source, and the
  provenance (input sha256s, rows, in-sample and leave-one-source-out accuracy);
* compiler/data/residuals.json: every run's in-sample and leave-one-source-out residual with its
  regime features (framework, GPU generation, precision / fp8 recipe, PP/VPP, CP, EP,
  FSDP/ZeRO-3, offload, scale, sequence length), from which error bands are derived, and the
  widening of an uncalibrated band at which 80% of the runs whose leave-one-source-out band is
  uncalibrated fall inside it (compiler/costmodel/bands.py calibrate_widening); and the same residuals of
  the runs of architectures kept out of the fit (``unsourced_rows``: compiler/calibration/runs.py
  UNSOURCED_ATTENTION), which give the bands of plans of such models and nothing else.

``--check`` writes nothing and exits 1 if either file differs from what it would write.
The output is deterministic: the same inputs give the same bytes. It takes minutes (every run
is re-costed a few hundred times); tests/unit/calibration/test_fit_files.py checks the inputs'
hashes quickly and the whole refit in a slow test.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ruamel.yaml import YAML  # noqa: E402

from compiler.calibration.fit import RIDGE, fit_with_loso, predict  # noqa: E402
from compiler.calibration.runs import UNSOURCED_ATTENTION, load_runs  # noqa: E402
from compiler.costmodel.bands import calibrate_widening, unsourced_attention  # noqa: E402
from compiler.costmodel.efficiency import FIT_PARAMETERS, HUBER_DELTA, prior_efficiency  # noqa: E402
from compiler.stats import percentile  # noqa: E402

CSV = ROOT / "benchmarks" / "data" / "published_runs_dev.csv"
PHYSICS = ROOT / "compiler" / "data" / "physics.yaml"
BRIDGE_RECIPES = ROOT / "compiler" / "data" / "bridge_perf_recipes.csv"  # how Megatron-Bridge rows were launched
EFFICIENCY = ROOT / "compiler" / "data" / "efficiency.yaml"
RESIDUALS = ROOT / "compiler" / "data" / "residuals.json"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def parameters_digest() -> str:
    """The definition of the fitted constants (names, priors, ranges): part of the fit's inputs."""
    text = json.dumps([[p.name, p.prior, p.lower, p.upper] for p in FIT_PARAMETERS])
    return hashlib.sha256(text.encode()).hexdigest()


def input_digests() -> dict[str, str]:
    return {"calibration_sha256": sha256(CSV), "physics_sha256": sha256(PHYSICS),
            "bridge_recipes_sha256": sha256(BRIDGE_RECIPES), "fit_parameters_sha256": parameters_digest()}


def _r4(x: float) -> float:
    return float(f"{x:.4g}")


def build(progress=None) -> tuple[str, str]:
    """(efficiency.yaml text, residuals.json text)."""
    # the runs of a model whose attention no kernel benchmark describes are kept out of the fit: their residuals give
    # the bands of plans of such models (compiler/costmodel/bands.py table_for), never the fit or the other bands;
    # read once, with them, and parted by the rule parse_row applies (runs.py UNSOURCED_ATTENTION)
    every, skipped = load_runs(CSV, unsourced=True)
    runs = [r for r in every if not unsourced_attention(r.problem.shape)]
    unsourced_runs = [r for r in every if unsourced_attention(r.problem.shape)]
    if unsourced_runs:
        skipped[UNSOURCED_ATTENTION] += len(unsourced_runs)
    base = prior_efficiency()
    result = fit_with_loso(runs, base=base, progress=progress)
    eff = base.with_fitted(result.fitted)
    def residual_rows(of: list) -> tuple[list[dict], list[float], list[float]]:
        out, ins, loso = [], [], []
        for r in sorted(of, key=lambda r: (int(r.row_id) if r.row_id.isdigit() else 0, r.row_id)):
            e_in = predict(r, eff).tokens_per_s_per_gpu / r.measured_tokens_per_s_per_gpu - 1.0
            e_lo = predict(r, base.with_fitted(result.loso.get(r.source_id, result.fitted))).tokens_per_s_per_gpu \
                / r.measured_tokens_per_s_per_gpu - 1.0
            ins.append(e_in)
            loso.append(e_lo)
            out.append({"row_id": r.row_id, "measured_tokens_per_s_per_gpu": _r4(r.measured_tokens_per_s_per_gpu),
                        "error_in_sample": _r4(e_in), "error_loso": _r4(e_lo),
                        "log_error_loso": _r4(math.log1p(e_lo)), "layout": r.layout.describe(),
                        "model": r.model, "features": r.features})
        return out, ins, loso

    rows, ins, loso = residual_rows(runs)
    unsourced = residual_rows(unsourced_runs)[0]

    def summary(errors: list[float]) -> dict[str, float]:
        a = [abs(e) for e in errors]
        return {"median_abs_error": _r4(percentile(a, 0.5)), "p90_abs_error": _r4(percentile(a, 0.9))}

    digests = input_digests()
    doc = {
        "schema_version": 2,
        "fitted": dict(result.fitted),
        "leave_one_source_out": {k: dict(v) for k, v in sorted(result.loso.items())},
        "provenance": {
            **digests,
            "command": "python benchmarks/fit.py",
            "rows": result.rows,
            "rows_by_source": dict(sorted(result.sources.items())),
            "skipped": dict(sorted(skipped.items())),
            "objective": f"sum over runs of w * huber(log(pred/measured), {HUBER_DELTA}) with w = 1/sqrt(rows of its "
                         f"source), + {RIDGE} x sum (log(c/prior))^2; Levenberg-Marquardt in log space",
            "in_sample": summary(ins),
            "leave_one_source_out": summary(loso),
        },
    }
    header = (
        "# GENERATED by benchmarks/fit.py from benchmarks/data/published_runs_dev.csv and\n"
        "# compiler/data/physics.yaml -- do not edit; rerun the script (tests check it is current).\n"
        "# The constants the cost model fits (their meaning, prior and allowed range:\n"
        "# compiler/costmodel/efficiency.py FIT_PARAMETERS); everything else is sourced physics.\n"
        "# leave_one_source_out: the same fit without each source's runs (benchmarks/accuracy.py\n"
        "# predicts a source's runs with the constants fitted without it).\n")
    for p in FIT_PARAMETERS:
        header += f"#   {p.name} (prior {p.prior:g}, range {p.lower:g}-{p.upper:g}): {p.meaning}\n"
    buf = io.StringIO()
    yaml = YAML()
    yaml.default_flow_style = False
    yaml.width = 120
    yaml.dump(doc, buf)
    residuals = {"schema_version": 1, "generated_by": "python benchmarks/fit.py", **digests,
                 "error": "predicted tokens/s per GPU / measured - 1", "rows": rows,
                 "uncalibrated_widening": calibrate_widening(rows), "unsourced_rows": unsourced}
    return header + buf.getvalue(), json.dumps(residuals, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed files are not current")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    progress = None if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    eff_text, res_text = build(progress)
    if args.check:
        stale = [p.name for p, text in ((EFFICIENCY, eff_text), (RESIDUALS, res_text))
                 if not p.exists() or p.read_text(encoding="utf-8") != text]
        if stale:
            print(f"stale: {', '.join(stale)}; run: python benchmarks/fit.py", file=sys.stderr)
            return 1
        print("compiler/data/efficiency.yaml and residuals.json are current")
        return 0
    EFFICIENCY.write_text(eff_text, encoding="utf-8")
    RESIDUALS.write_text(res_text, encoding="utf-8")
    print(f"wrote {EFFICIENCY.relative_to(ROOT)} and {RESIDUALS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
