"""The solver's choice is predicted at least as fast as published layouts (benchmarks/published_layouts.py)."""
from __future__ import annotations

import importlib.util
from pathlib import Path


REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "benchmarks" / "published_layouts.py"


def _bench():
    spec = importlib.util.spec_from_file_location("published_layouts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_choice_is_at_least_as_fast_as_narayanan_table_1() -> None:
    bench = _bench()
    rows = [r for r in bench.select_rows("narayanan2021") if int(r["num_gpus"]) <= 512]
    assert len(rows) >= 4
    for r in rows:
        res = bench.compare(r)
        assert res["not_in_space"] is None, res
        assert res["pred_dtc"] >= res["pred_pub"] * (1 - 1e-6), res
        assert res["measured"] > 0 and res["dtc_vs_measured"] > 0
