#!/usr/bin/env python3
"""Wall time of `dtc smoke GENERATED --target megatron` for every example (issue #17: < 3 min per spec
on 2 cores).

For each folder under generated/ (or the ones named), copy it to a temporary folder (smoke
writes smoke.json into the folder it runs) and run the real command line,
`dtc smoke DIR --target megatron --json`, timing it from the outside. Prints one row per spec:
wall seconds, status, losses first -> last, step time, the layout that ran and the skipped
parts; the bar is checked and stated, not asserted.

    python benchmarks/smoke_megatron_time.py [NAME ...] [--steps N] [--timeout S] [--json]

Exit status 1 when a smoke run failed or took longer than the bar, 0 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BAR_S = 180.0


def run_one(folder: Path, *, steps: int, timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="dtc-megatron-time-") as tmp:
        work = Path(tmp) / folder.name
        shutil.copytree(folder, work)
        dtc = Path(sys.executable).with_name("dtc")
        argv = ([str(dtc)] if dtc.is_file() else [sys.executable, "-m", "compiler"]) + [
            "smoke", str(work), "--target", "megatron", "--json", "--steps", str(steps), "--timeout", str(timeout_s)]
        start = time.monotonic()
        r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
        wall = time.monotonic() - start
    row = {"spec": folder.name, "wall_s": round(wall, 1), "exit": r.returncode}
    try:
        report = json.loads(r.stdout)
    except ValueError:
        row.update(status="error", reason=(r.stderr or r.stdout).strip()[-400:])
        return row
    t = report["targets"][0]
    row.update(status=t["status"], reason=t["reason"], first_loss=t["first_loss"], last_loss=t["last_loss"],
               step_time_s=t["step_time_s"], world=report["setup"]["world_size"],
               degrees=report["setup"]["degrees"],
               skipped_parts=[c["what"].split(": ", 1)[1] for c in t["changes"]
                              if c["what"].startswith("skipped part: ")])
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="folders under generated/ (default: every one with megatron_args.sh)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    folders = [ROOT / "generated" / n for n in opts.names] if opts.names else sorted(
        p.parent for p in (ROOT / "generated").glob("*/megatron_args.sh"))
    rows, ok = [], True
    print(f"cores available: {len(os.sched_getaffinity(0))}; bar {BAR_S:.0f} s per spec", file=sys.stderr)
    for folder in folders:
        row = run_one(folder, steps=opts.steps, timeout_s=opts.timeout)
        rows.append(row)
        ok &= row["status"] == "passed" and row["wall_s"] < BAR_S
        if not opts.json:
            loss = (f"loss {row['first_loss']:.4f} -> {row['last_loss']:.4f}" if row.get("first_loss") is not None
                    else "")
            d = row.get("degrees") or {}
            layout = " ".join(f"{k}={v}" for k, v in d.items() if v > 1) or "dp=1"
            skipped = f"  skipped: {', '.join(row['skipped_parts'])}" if row.get("skipped_parts") else ""
            print(f"{row['spec']:<20} {row['wall_s']:>6.1f} s  {'ok ' if row['wall_s'] < BAR_S else 'SLOW'} "
                  f"{row['status']:<7} {loss}  ({layout}){skipped}"
                  + (f"  why: {row['reason']}" if row["status"] != "passed" else ""), flush=True)
    if opts.json:
        print(json.dumps(rows, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
