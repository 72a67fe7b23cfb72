#!/usr/bin/env python3
"""Time the full layout search (issue #4, item 6), on one core.

Cases: every spec under specs/, GPT-3 175B on 1024 A100-80GB with global batch 1536,
Llama 3 405B on up to 16,384 H100s with every dimension free, and a 14B model at 32K tokens for
three framework targets (with the time of `dtc plan`'s extra search without each target). For each: CPU
seconds of ``solve`` (process time, so other jobs on the machine count less), how many
layouts the space holds, how many were costed by the model, found feasible, pruned by
a bound or rejected by a rule, and the chosen layout.

Goals: under 1 s for the 405B case and under 0.5 s for GPT-3 175B; issue #14: under 1 s for
specs/budget-70b.yaml with objective: cheapest on up to 4096 GPUs, and under 8 s for
tests/cases/hostile/batch-tolerance-16k-gpus.yaml (its test allows 10 CPU-s, start-up and rendering included).

    python benchmarks/solver_speed.py [--repeat N] [--json] [--only NAME]

Exit status 1 when a goal is missed (so CI can run it), 0 otherwise.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compiler.errors import DtcError  # noqa: E402
from compiler.problem import lower  # noqa: E402
from compiler.spec.load import load_spec, load_spec_text  # noqa: E402

GPT3_1024_A100 = """
name: gpt3-175b-1024xa100
model:
  preset: gpt3-175b
training:
  tokens: 300B
  sequence_length: 2048
  global_batch: 1536
cluster:
  gpu: a100-80gb
  num_gpus: 1024
budget:
  objective: throughput
targets: [megatron, slurm]
"""

LLAMA3_405B_FREE = """
name: llama3-405b-free
model:
  preset: llama3.1-405b
training:
  tokens: 15.6T
  sequence_length: 8192
  global_batch: 2048
cluster:
  gpu: h100-sxm
  max_gpus: 16384
budget:
  objective: fastest
targets: [megatron, slurm]
"""

# several framework targets: the search bounds with the slowest one; `dtc plan` also searches once more without each
# target (search.target_costs: "target X ruled out a better layout"), which took 18 s here while bounded with the first
THREE_TARGETS_14B_32K = """
name: three-targets-14b-32k
model:
  params: 14B
training:
  tokens: 3T
  sequence_length: 32768
  global_batch: 8M tokens
cluster:
  gpu: h200
  max_gpus: 512
budget:
  deadline: 60d
  objective: cheapest
targets: [megatron, fsdp, deepspeed, slurm]
"""

# issue #14: specs/budget-70b.yaml as it was (max_gpus 4096) with objective: cheapest, where every GPU count
# costs about the same, so thousands of shapes come within the tie band; and the hostile case on 16,384 GPUs
# with a 50% batch tolerance (tests/test_fuzz_specs.py runs it under RLIMIT_CPU = 10 s, start-up included)
GOALS_S = {"gpt3-175b-1024xa100": 0.5, "llama3-405b-free": 1.0, "budget-70b-cheapest-4096": 1.0,
           "hostile/batch-tolerance-16k-gpus": 8.0}


def _budget_70b_cheapest() -> str:
    text = (ROOT / "specs/budget-70b.yaml").read_text()
    return text.replace("max_gpus: 2048", "max_gpus: 4096").replace("objective: fastest", "objective: cheapest")


def cases() -> list[tuple[str, object]]:
    hostile = ROOT / "tests/cases/hostile/batch-tolerance-16k-gpus.yaml"
    out: list[tuple[str, object]] = [
        ("gpt3-175b-1024xa100", load_spec_text(GPT3_1024_A100, "benchmarks/gpt3-175b-1024xa100.yaml")),
        ("llama3-405b-free", load_spec_text(LLAMA3_405B_FREE, "benchmarks/llama3-405b-free.yaml")),
        ("budget-70b-cheapest-4096", load_spec_text(_budget_70b_cheapest(), "benchmarks/budget-70b-cheapest.yaml")),
        ("hostile/batch-tolerance-16k-gpus", load_spec(hostile)),
        ("three-targets-14b-32k", load_spec_text(THREE_TARGETS_14B_32K, "benchmarks/three-targets-14b-32k.yaml")),
    ]
    for path in sorted((ROOT / "specs").glob("*.yaml")):
        out.append((f"specs/{path.name}", load_spec(path)))
    return out


def run_case(name: str, loaded, repeat: int) -> dict:
    from compiler.costmodel.frameworks import costed_targets
    from compiler.solver import solve
    from compiler.solver.search import target_costs

    problem = lower(loaded)
    best = float("inf")
    plan, error = None, None
    for _ in range(repeat):
        t0 = time.process_time()
        try:
            plan = solve(problem)
        except DtcError as exc:
            error = exc
        best = min(best, time.process_time() - t0)
    row: dict = {"case": name, "cpu_s": round(best, 3), "goal_s": GOALS_S.get(name)}
    if plan is not None and len(costed_targets(problem.targets)) > 1:  # what `dtc plan` adds: a search per target
        t0 = time.process_time()
        target_costs(problem, plan)
        row["target_notes_cpu_s"] = round(time.process_time() - t0, 3)
    summary = plan.search if plan is not None else getattr(error, "summary", None)
    if summary is not None:
        row.update(considered=summary.num_considered, evaluated=summary.num_evaluated,
                   feasible=summary.num_feasible, pruned_by_bound=summary.num_pruned_by_bound,
                   rejected=dict(summary.rejections_by_code))
    if plan is not None:
        e = plan.estimate
        row.update(layout=plan.layout.describe(), gpus=e.num_gpus, mfu=round(e.mfu, 3),
                   step_time_s=round(e.step_time_s, 3), days=round(e.time_to_train_s / 86400, 1),
                   cost_usd=round(e.cost_usd))
    else:
        row["infeasible"] = error.diagnostics[0].summary if error else "?"
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="runs per case; the fastest is reported")
    ap.add_argument("--json", action="store_true", help="print JSON lines")
    ap.add_argument("--only", help="run only cases whose name contains this")
    args = ap.parse_args(argv)
    missed = []
    for name, loaded in cases():
        if args.only and args.only not in name:
            continue
        row = run_case(name, loaded, args.repeat)
        goal = row["goal_s"]
        if goal is not None and row["cpu_s"] > goal:
            missed.append(name)
        if args.json:
            print(json.dumps(row, sort_keys=True))
            continue
        verdict = "" if goal is None else (" (goal < %.1f s: %s)" % (goal, "met" if row["cpu_s"] <= goal else "MISSED"))
        notes = (f"; dtc plan's searches without each target: {row['target_notes_cpu_s']:.3f} s"
                 if "target_notes_cpu_s" in row else "")
        print(f"{name}: {row['cpu_s']:.3f} s CPU{verdict}{notes}")
        if "considered" in row:
            print(f"  searched {row['considered']:,} layouts: {row['evaluated']:,} evaluated, {row['feasible']:,} "
                  f"feasible, {row['pruned_by_bound']:,} pruned by bound; rejected: "
                  + ", ".join(f"{k} {v:,}" for k, v in sorted(row["rejected"].items())))
        if "layout" in row:
            print(f"  chose {row['layout']} on {row['gpus']} GPUs: MFU {row['mfu']:.1%}, step {row['step_time_s']} s, "
                  f"{row['days']} d, ${row['cost_usd']:,}")
        else:
            print(f"  infeasible: {row['infeasible']}")
    if missed:
        print(f"goal missed: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
