"""`dtc plan SPEC [--top N] [--json]`."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

from helpers import run_cli

SPEC = """\
name: plan-cli
model: {preset: llama3-8b}
training: {tokens: 100B, sequence_length: 4096, global_batch: 64}
cluster: {gpu: h100-sxm, num_gpus: 16}
targets: [megatron, slurm]
"""


def _spec(tmp_path: Path, text: str = SPEC) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


def test_plan_prints_header_table_tally_and_summary(tmp_path: Path) -> None:
    out = run_cli(["plan", _spec(tmp_path), "--top", "2"]).stdout
    assert "plan-cli: llama3-8b" in out
    assert "global batch 64 = micro " in out and " x accumulation " in out and " x dp " in out
    header = next(line for line in out.splitlines() if line.startswith("rank"))
    for col in ("layout", "GPUs", "memory/GPU", "step", "MFU", "time", "cost", "why lost"):
        assert col in header
    rows = [line for line in out.splitlines() if line[:2] in ("1 ", "2 ", "3 ")]
    assert len(rows) == 3 and "(chosen)" in rows[0]
    assert "rejected" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("Plan: tp=") and "on 16 x h100-sxm" in last and "searched" in last and "feasible" in last


def test_plan_json(tmp_path: Path) -> None:
    data = json.loads(run_cli(["plan", _spec(tmp_path), "--json", "--top", "1"]).stdout)
    assert set(data) >= {"plan", "table", "summary", "batch", "rejection_examples"}
    assert len(data["table"]) == 2 and data["table"][0]["rank"] == 1
    assert data["plan"]["search"]["num_considered"] > 0
    assert data["summary"].startswith("Plan: ")


def test_plan_infeasible_exits_2_with_the_closest_misses(tmp_path: Path) -> None:
    text = SPEC.replace("llama3-8b", "llama3.1-405b").replace("num_gpus: 16", "num_gpus: 8")
    result = run_cli(["plan", _spec(tmp_path, text)], exit_code=2)
    err = result.stderr
    assert "no layout fits llama3.1-405b on 8 x h100-sxm" in err
    assert "out_of_memory" in err and "closest misses" in err and "hint:" in err
