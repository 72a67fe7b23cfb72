"""compiler/data/efficiency.yaml and residuals.json are benchmarks/fit.py's output for the vendored data.

The fast tests check that the committed files were produced from the current inputs (the vendored
calibration CSV, compiler/data/physics.yaml and the definition of the fitted constants, by sha256)
and are well formed; the slow test reruns the whole fit (about a minute) and compares bytes.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from compiler.calibration.fit import fit_constants
from compiler.calibration.runs import load_runs
from compiler.costmodel.efficiency import FIT_PARAMETERS, load_efficiency

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import fit  # noqa: E402


def test_vendored_calibration_set_is_the_one_its_provenance_names():
    provenance = (ROOT / "benchmarks" / "data" / "PROVENANCE.md").read_text()
    digest = hashlib.sha256((ROOT / "benchmarks" / "data" / "published_runs_dev.csv").read_bytes()).hexdigest()
    assert digest in provenance


def test_committed_fit_was_made_from_the_current_inputs():
    doc = YAML(typ="safe").load((ROOT / "compiler" / "data" / "efficiency.yaml").read_text())
    assert {k: doc["provenance"][k] for k in fit.input_digests()} == fit.input_digests(), (
        "compiler/data/efficiency.yaml is stale: its inputs changed; run python benchmarks/fit.py")
    residuals = json.loads((ROOT / "compiler" / "data" / "residuals.json").read_text())
    assert {k: residuals[k] for k in fit.input_digests()} == fit.input_digests(), "run python benchmarks/fit.py"
    assert len(residuals["rows"]) == doc["provenance"]["rows"]


def test_fitted_constants_are_within_their_physical_ranges_and_loaded():
    eff = load_efficiency()
    for p in FIT_PARAMETERS:
        assert p.lower <= eff.fit(p.name) <= p.upper, p.name
        for source, values in eff.loso.items():
            assert p.lower <= values[p.name] <= p.upper, (source, p.name)
    assert set(eff.loso) == set(YAML(typ="safe").load(
        (ROOT / "compiler" / "data" / "efficiency.yaml").read_text())["provenance"]["rows_by_source"])


def test_residuals_carry_the_regime_features_error_bands_group_by():
    rows = json.loads((ROOT / "compiler" / "data" / "residuals.json").read_text())["rows"]
    needed = {"framework", "gpu_generation", "precision", "fp8_recipe", "pp", "vpp", "cp", "ep", "zero3_fsdp",
              "offload", "scale", "seq", "moe"}
    assert rows and all(needed <= set(r["features"]) for r in rows)
    assert all(isinstance(r["error_loso"], float) and isinstance(r["error_in_sample"], float) for r in rows)


@pytest.mark.slow  # a refit / solve of several seconds: the full run keeps it, the fast tier does not
def test_the_fit_is_deterministic_on_a_subset():
    runs, _ = load_runs(ROOT / "benchmarks" / "data" / "published_runs_dev.csv")
    subset = [r for r in runs if r.source_id in ("korthikanti2022", "nemo2_2504", "torchtitan_a100")]
    assert fit_constants(subset) == fit_constants(subset)


@pytest.mark.slow
def test_committed_files_are_the_scripts_output():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fit.py"), "--check", "--quiet"],
                            capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr + result.stdout
