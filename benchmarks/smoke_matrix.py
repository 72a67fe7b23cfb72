#!/usr/bin/env python3
"""dtc smoke over a matrix of pinned layouts: every framework target x ZeRO stage x recompute x tp, plus
offload and pipeline cases, each compiled with `dtc compile` and run with `dtc smoke` on this machine.

    python benchmarks/smoke_matrix.py [--only SUBSTRING] [--json] [--keep DIR]

Each case pins a layout of Llama 3 8B on 8 H100s (the smoke reduces the model and the world as it does for
any plan) and prints the measured / predicted ratio of model states, saved activations and the total, or why
it did not compile (a support rule: the line names it) or failed. The last lines count the runs and give the
range of each ratio over the runs that ran:

    N cases: N refused by dtc compile (a support rule), N ran, N passed; model states xA-xB, activations xA-xB

A pinned layout a target cannot run is an error of `dtc compile` (exit 2, the rule's reason): that is counted,
not a failure. Exit status 1 when a run that compiled failed.

This is how the DeepSpeed ZeRO-0 rule, the DeepSpeed offload gradient partition, the AutoTP vocabulary, the
BF16_Optimizer's doubled gradients, the rotary table under partition_activations and FSDP2 ZeRO-0's unsharded
parameters were found, and then FSDP2's bf16-cast rotary table, op-level SAC's whole row-parallel outputs under
sequence parallel, DeepSpeed's partitioned checkpoint inputs and Megatron's dataloader attention mask (docs: each
commit says what the matrix measured). Takes ~15-25 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SPEC = """name: {name}
model:
  preset: llama3-8b
training:
  tokens: 1B
  sequence_length: 4096
  global_batch: 64
cluster:
  gpu: h100-sxm
  num_gpus: 8
layout:
{layout}
budget:
  objective: fastest
targets: [{target}, slurm]
"""


def cases() -> list[tuple[str, str, dict[str, object]]]:
    out = []
    for target in ("deepspeed", "fsdp", "megatron"):
        for zero in (0, 1, 2, 3):
            for recompute in ("none", "selective", "full"):
                for tp in (1, 2):
                    out.append((target, f"z{zero}-{recompute}-tp{tp}",
                                {"zero_stage": zero, "recompute": recompute, "tensor_parallel": tp}))
        out.append((target, "z3-offload", {"zero_stage": 3, "offload_optimizer": "cpu", "offload_params": "cpu"}))
        out.append((target, "z1-offload", {"zero_stage": 1, "offload_optimizer": "cpu"}))
        out.append((target, "pp2-z1", {"pipeline_parallel": 2, "zero_stage": 1}))
    return [(t, f"{t}-{n}", lay) for t, n, lay in out]


def dtc(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compiler", *args], cwd=cwd, capture_output=True, text=True)


def run_case(target: str, name: str, layout: dict[str, object], work: Path) -> dict:
    spec = work / f"{name}.yaml"
    spec.write_text(SPEC.format(name=name, target=target,
                                layout="\n".join(f"  {k}: {v}" for k, v in layout.items())))
    got = dtc("compile", str(spec), "--out", str(work / "out"), cwd=ROOT)
    if got.returncode != 0:
        first = (got.stderr.strip().splitlines() or ["?"])[0]
        return {"case": name, "compiled": False, "exit": got.returncode, "why": first.split("error", 1)[-1][:160]}
    got = dtc("smoke", str(work / "out" / name), "--target", target, "--json", cwd=ROOT)
    try:
        report = json.loads(got.stdout)
    except ValueError:
        return {"case": name, "compiled": True, "status": "no report", "why": got.stderr.strip()[-300:]}
    t = report["targets"][0]
    ratios = {c["name"]: c["ratio"] for c in t.get("comparisons", [])}
    return {"case": name, "compiled": True, "layout": report["setup"].get("layout_tag"), "status": t["status"],
            "ratios": ratios, "why": (t.get("error") or t.get("reason") or "")[:160]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="run the cases whose name contains this")
    ap.add_argument("--json", action="store_true", help="one JSON object per case, then the summary")
    ap.add_argument("--keep", type=Path, help="compile into this folder (kept) instead of a temporary one")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="dtc-smoke-matrix-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for target, name, layout in cases():
            if args.only and args.only not in name:
                continue
            r = run_case(target, name, layout, work)
            results.append(r)
            if args.json:
                print(json.dumps(r), flush=True)
            elif not r["compiled"]:
                print(f"{name:<32} not compiled (exit {r['exit']}): {r['why']}", flush=True)
            else:
                ratios = "  ".join(f"{k} x{v:.2f}" for k, v in r.get("ratios", {}).items() if v is not None)
                print(f"{name:<32} {r.get('layout', ''):<34} {r['status']:<7} {ratios} {r['why']}", flush=True)
    ran = [r for r in results if r["compiled"]]
    passed = [r for r in ran if r.get("status") == "passed"]

    def span(what: str) -> str:
        values = [r["ratios"][what] for r in ran if r.get("ratios", {}).get(what) is not None]
        return f"x{min(values):.2f}-x{max(values):.2f}" if values else "-"

    print(f"{len(results)} cases: {len(results) - len(ran)} refused by dtc compile (a support rule), {len(ran)} ran, "
          f"{len(passed)} passed; model states {span('model_states')}, activations {span('activations')}")
    return 0 if len(passed) == len(ran) else 1


if __name__ == "__main__":
    sys.exit(main())
