"""Against published numbers: the accuracy benchmark (regression guard) and time to train.

* benchmarks/accuracy.py on shared/calibration/published_runs_dev.csv: the goal is median |error|
  <= 10% and p90 <= 25% (a benchmark figure); this test only guards against a collapse.
* DeepSeek-V3 (arXiv:2412.19437, Table 1: 2.788M H800 GPU-hours for 14.8T tokens) and Llama 3 405B
  (arXiv:2407.21783 Table 4 layout; 30.84M H100 GPU-hours, Llama 3.1 model card) within 20% from
  their published layouts.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CSV = Path("/work/shared/calibration/published_runs_dev.csv")
sys.path.insert(0, str(ROOT / "benchmarks"))

import accuracy  # noqa: E402
import time_to_train  # noqa: E402


@pytest.mark.skipif(not CSV.exists(), reason="calibration set not available")
def test_accuracy_does_not_collapse():
    report = accuracy.run(CSV)
    overall = report.overall()
    assert overall["rows"] >= 150
    assert overall["median_abs_error"] < 0.20
    assert overall["p90_abs_error"] < 0.60
    assert accuracy.format_report(report).splitlines()[-1].startswith(f"overall: {overall['rows']} rows, median")


@pytest.mark.parametrize("case", time_to_train.CASES, ids=lambda c: c.name)
def test_time_to_train_within_20_percent(case):
    est = time_to_train.estimate_case(case)
    assert est.gpu_hours == pytest.approx(case.published_gpu_hours, rel=0.20)


def test_benchmark_skips_what_it_cannot_model_with_a_reason(tmp_path):
    lines = CSV.read_text().splitlines()[:1] if CSV.exists() else []
    if not lines:
        pytest.skip("calibration set not available")
    header = lines[0]
    path = tmp_path / "one.csv"
    path.write_text(header + "\n" + ",".join("" for _ in header.split(",")) + "\n")
    report = accuracy.run(path)
    assert not report.results and sum(report.skipped.values()) == 1
