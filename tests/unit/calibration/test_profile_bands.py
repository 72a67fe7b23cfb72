"""A calibrated cluster narrows the bands (issue #12): a spec that uses ``cluster.profile`` takes its
estimates' 80% bands from the profile's own leave-one-out residuals, with the runs behind them,
and falls back to the published runs' band (saying so) when the profile has too few runs."""
from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from compiler.calibration.profile import load_profile
from compiler.calibration.profile_fit import fit_profile
from compiler.calibration.runs import load_runs
from compiler.costmodel.bands import PROFILE_MIN_RUNS, band_for, profile_band, with_profile
from compiler.costmodel.efficiency import load_efficiency
from compiler.layout import Layout
from compiler.model import ModelShape
from compiler.profile_ref import ProfileRef

ROOT = Path(__file__).resolve().parents[3]
CSV = ROOT / "benchmarks" / "data" / "published_runs_dev.csv"
LAYOUT = Layout(gpu="h100-sxm", gpus_per_node=8, tp=1, pp=1, cp=1, ep=1, dp_replicate=1, dp_shard=16, zero_stage=3,
                micro_batch=2, grad_accum=32)
SHAPE = ModelShape(num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32, num_kv_heads=8,
                   vocab_size=128256)


def ref(errors: list[float], name: str = "ours") -> ProfileRef:
    return ProfileRef(name=name, path=f"../profiles/{name}.yaml", sha256="0" * 64, constants={},
                      loo_log_errors=tuple(errors))


def published() -> object:
    return band_for(framework="fsdp", gpu_generation="hopper", precision="bf16", fp8_recipe="", layout=LAYOUT,
                    shape=SHAPE)


def test_profile_band_from_its_own_leave_one_out_residuals():
    errors = [(-1) ** i * 0.005 * (i % 5) for i in range(12)]  # a cluster the profile predicts within 2%
    band = band_for(framework="fsdp", gpu_generation="hopper", precision="bf16", fp8_recipe="", layout=LAYOUT,
                    shape=SHAPE, profile=ref(errors))
    glob = published()
    assert band.profile == "ours" and band.runs == 12 and band.calibrated and band.profile_fallback is None
    assert band.high / band.low < glob.high / glob.low  # narrower than the published runs' band
    assert band.low <= 1.0 <= band.high and band.low >= math.exp(-0.03) and band.high <= math.exp(0.03)
    assert band.low <= 1.0 <= band.p80 <= band.high
    assert "leave-one-out errors of the 12 runs" in band.describe() and "'ours'" in band.describe()
    # a profile that errs widely gets a wide band: the band follows its residuals, it is not a fixed narrowing
    wide = profile_band(ref([(-1) ** i * 0.04 * i for i in range(12)], "noisy"))
    assert wide is not None and wide.high / wide.low > band.high / band.low


def test_profile_with_too_few_runs_keeps_the_published_band_and_says_so():
    few = ref([0.01] * (PROFILE_MIN_RUNS - 1), "few")
    glob = published()
    band = with_profile(glob, few)
    assert profile_band(few) is None
    assert (band.low, band.p80, band.high, band.runs) == (glob.low, glob.p80, glob.high, glob.runs)
    assert band.profile is None and f"fewer than {PROFILE_MIN_RUNS}" in (band.profile_fallback or "")
    assert band.describe().startswith(glob.describe()) and "cluster profile 'few' has 7 runs" in band.describe()
    assert with_profile(glob, None) is glob


def dtc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compiler", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def write_csv(path: Path, n: int) -> Path:
    rows = list(csv.DictReader(CSV.open(newline="", encoding="utf-8")))
    keep = [r for r in rows if r["source_id"] == "mosaic_llmfoundry" and r["gpu_type"].lower().startswith("h100")][:n]
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(keep)
    return path


@pytest.mark.parametrize("n", [14, 5])
def test_spec_with_a_profile_carries_its_band_into_plan_and_estimate(tmp_path, n):
    csv_path = write_csv(tmp_path / "h100.csv", n)
    runs, _ = load_runs(csv_path)
    assert len(runs) == n
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    out = profiles / "h100.yaml"
    out.write_text(fit_profile(runs, name="h100", base=load_efficiency()).to_yaml())
    profile, _ = load_profile(out)
    spec = (ROOT / "specs" / "1b-fsdp.yaml").read_text().replace("gpu: a100-80gb", "gpu: h100-sxm")
    (tmp_path / "specs").mkdir()
    used = tmp_path / "specs" / "used.yaml"
    used.write_text(spec.replace("  num_gpus: 16\n", "  num_gpus: 16\n  profile: ../profiles/h100.yaml\n"))
    from compiler.pipeline import plan_spec
    from compiler.plan import Plan
    from compiler.render.report import render_report

    problem, plan = plan_spec(used)
    assert problem.profile is not None and problem.profile.loo_log_errors == profile.loo_log_errors()
    band = plan.estimate.band
    assert band is not None
    report = render_report(plan)["PLAN.md"]
    if n >= PROFILE_MIN_RUNS:
        assert band.profile == "h100" and band.runs == n and band.profile_fallback is None
        loo = sorted(math.log1p(r.error_loo) for r in profile.runs)
        assert math.log(band.low) <= min(0.0, loo[len(loo) // 2]) and math.log(band.high) >= 0.0
        assert f"leave-one-out errors of the {n} runs" in report and "cluster profile 'h100'" in report
    else:
        assert band.profile is None and band.runs != n
        assert f"the cluster profile 'h100' has {n} runs, fewer than {PROFILE_MIN_RUNS}" in report
    # plan.json keeps the residuals: `dtc estimate --plan` re-costs with the same band, and says which it is
    back = Plan.from_json(plan.to_json())
    assert back.cluster.profile == plan.cluster.profile and back.estimate.band == band
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.to_json())
    r = dtc("estimate", "--plan", str(plan_file), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    got = data["band"] if "band" in data else data["estimate"]["band"]
    assert got["basis"] == ("cluster_profile" if n >= PROFILE_MIN_RUNS else "published_runs")
    assert got["runs"] == band.runs and (got["profile_fallback"] is None) == (n >= PROFILE_MIN_RUNS)
