"""How dtc words an estimate's error band (compiler/costmodel/bands.py): one phrasing for `dtc estimate`,
`dtc plan`, PLAN.md and `dtc diff`, and the band as data for ``--json``."""
from __future__ import annotations

from typing import Any

from compiler import units
from compiler.costmodel.bands import COVERAGE
from compiler.estimate import Estimate


def band_source(est: Estimate) -> str:
    """'from 37 similar published runs (megatron, hopper, bf16, PP)' or the uncalibrated note."""
    return est.band.describe() if est.band is not None else "no error band (a stand-in cost model)"


def step_text(est: Estimate) -> str:
    """'6.40 s per step, 80% band 5.90-7.10 s, from 37 similar published runs (...)'."""
    head = f"{units.format_seconds(est.step_time_s)} per step"
    if est.band is None:
        return head
    return f"{head}, 80% band {units.format_seconds_range(*est.step_time_band_s)}, {band_source(est)}"


def time_to_train_text(est: Estimate) -> str:
    """'11.3 d (80% band 7.6-19.1 d)'."""
    if est.band is None:
        return units.format_seconds(est.time_to_train_s)
    band = units.format_seconds_range(*est.time_to_train_band_s)
    return f"{units.format_seconds(est.time_to_train_s)} (80% band {band})"


def cost_text(est: Estimate) -> str:
    """'$7.74K (80% band $5.23K-$13.10K)'."""
    if est.band is None:
        return units.format_money(est.cost_usd)
    return f"{units.format_money(est.cost_usd)} (80% band {units.format_money_range(*est.cost_band_usd)})"


def tokens_text(est: Estimate) -> str:
    """'9,288 per GPU (80% band 7,900-10,300)'."""
    lo, hi = est.tokens_per_s_per_gpu_band
    head = f"{est.tokens_per_s_per_gpu:,.0f} per GPU"
    return head if est.band is None else f"{head} (80% band {lo:,.0f}-{hi:,.0f})"


def memory_text(est: Estimate) -> str:
    """'up to 50.3 GiB at the upper end of the memory band (+7%): fits'."""
    m = est.memory
    if est.band is None:
        return ""
    high = est.memory_high_bytes_per_gpu
    fits = "fits" if high <= m.usable_bytes_per_gpu else "DOES NOT FIT"
    return (f"up to {units.format_bytes(high)} at the upper end of the memory band "
            f"(+{est.band.memory_high - 1:.0%}, a stated margin: no published peak memory to fit): {fits}")


def band_data(est: Estimate) -> dict[str, Any] | None:
    """The band as data (``dtc estimate --json``): each output's 80% range, the quantiles the solver ranks by,
    the memory band's upper end and what the band rests on."""
    b = est.band
    if b is None:
        return None
    return {
        "coverage": COVERAGE, "step_time_s": list(est.step_time_band_s),
        "tokens_per_s_per_gpu": list(est.tokens_per_s_per_gpu_band),
        "time_to_train_s": list(est.time_to_train_band_s), "cost_usd": list(est.cost_band_usd),
        "step_time_p80_s": est.step_time_s * b.p80, "step_time_p90_s": est.step_time_s * b.high,
        "memory_high_bytes_per_gpu": est.memory_high_bytes_per_gpu,
        "factors": {"low": b.low, "p80": b.p80, "high": b.high, "memory_high": b.memory_high},
        "runs": b.runs, "sources": b.sources, "regime": b.regime, "calibrated": b.calibrated, "thin": b.thin,
        "basis": "cluster_profile" if b.profile is not None else "published_runs", "profile": b.profile,
        "profile_fallback": b.profile_fallback, "source": band_source(est),
    }
