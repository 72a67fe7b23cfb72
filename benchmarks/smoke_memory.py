#!/usr/bin/env python3
"""Measured vs predicted memory of the reduced models, over the example specs (issue #6).

For every spec under specs/ (or --specs DIR: docs/specs holds the realistic ones): solve it, render
it, run `dtc smoke` on the generated folder (CPU: 2-4 gloo ranks; GPUs: every GPU) and collect, per
target, the ratio measured / predicted of the model states (parameters + gradients + optimizer
states), of the saved activations and of the total, with the wall time of the launch. Every target
runs here (Megatron through megatron-core's own training loop on CPU); a spec whose targets hold no
framework is solved again with targets fsdp, deepspeed and slurm, and marked so.

    python benchmarks/smoke_memory.py [--specs DIR] [--only NAME] [--steps N] [--timeout S] [--json]

Exit status 1 when a smoke run failed, 0 otherwise.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compiler.artifacts import write_artifacts  # noqa: E402
from compiler.errors import DtcError  # noqa: E402
from compiler.problem import lower  # noqa: E402
from compiler.render.all_targets import render  # noqa: E402
from compiler.smoke import run_smoke  # noqa: E402
from compiler.smoke.targets import available_targets  # noqa: E402
from compiler.solver import solve  # noqa: E402
from compiler.spec.load import load_spec  # noqa: E402

RUNNABLE_HERE = ("fsdp", "deepspeed", "megatron")
FALLBACK_TARGETS = ["fsdp", "deepspeed", "slurm"]


def generate(spec_path: Path, out: Path) -> tuple[Path, str]:
    """(generated folder, note): the spec as written, or re-targeted when nothing in it runs here."""
    loaded = load_spec(spec_path)
    note = ""
    if not any(t in RUNNABLE_HERE for t in loaded.spec.targets):
        note = f"re-solved with targets {','.join(FALLBACK_TARGETS)} (spec: {','.join(loaded.spec.targets)})"
        loaded = dataclasses.replace(loaded, spec=loaded.spec.model_copy(update={"targets": FALLBACK_TARGETS}))
    plan = solve(lower(loaded))
    folder = out / plan.name
    write_artifacts(render(plan, targets=plan.targets), folder)
    return folder, note


def bench_spec(spec_path: Path, out: Path, *, steps: int, timeout_s: float) -> list[dict]:
    rows = []
    try:
        folder, note = generate(spec_path, out)
    except DtcError as exc:
        # only a re-targeted spec can fail here (the examples compile as written): nothing runs here
        return [{"spec": spec_path.name, "target": "-", "status": "skipped",
                 "note": f"no fsdp/deepspeed layout: {exc.diagnostics[0].summary}"}]
    if not available_targets(folder):
        return [{"spec": spec_path.name, "target": "-", "status": "skipped", "note": "no framework artifacts"}]
    t0 = time.monotonic()
    try:
        report = run_smoke(folder, steps=steps, timeout_s=timeout_s)
    except DtcError as exc:
        return [{"spec": spec_path.name, "target": "-", "status": "error", "note": exc.diagnostics[0].summary}]
    wall = time.monotonic() - t0
    for t in report.targets:
        ratios = {c.name: c.ratio for c in t.comparisons}
        rows.append({
            "spec": spec_path.name, "plan": report.plan_layout, "smoke": report.setup["layout_tag"],
            "world": report.setup["world_size"], "target": t.target, "status": t.status,
            "loss": [t.first_loss, t.last_loss], "launch_s": t.wall_s, "spec_wall_s": wall,
            "model_states_ratio": ratios.get("model_states"), "activations_ratio": ratios.get("activations"),
            "total_ratio": ratios.get("total"), "note": "; ".join(x for x in (note, t.reason) if x),
            "comparisons": [c.to_dict() for c in t.comparisons],
        })
    return rows


def _f(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", default=str(ROOT / "specs"), help="the folder of specs (default specs/)")
    ap.add_argument("--only", default=None, help="run only specs whose file name contains this")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    specs = sorted(Path(args.specs).glob("*.yaml"))
    if args.only:
        specs = [s for s in specs if args.only in s.name]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="dtc-smoke-bench-") as tmp:
        for spec in specs:
            rows += bench_spec(spec, Path(tmp), steps=args.steps, timeout_s=args.timeout)
            if not args.json:
                print(f"done {spec.name}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
    else:
        head = f"{'spec':<22} {'target':<10} {'status':<8} {'world':>5} {'states':>7} {'acts':>6} {'total':>6} " \
               f"{'launch':>7}  smoke layout / note"
        print(head)
        for r in rows:
            launch = "-" if r.get("launch_s") is None else f"{r['launch_s']:.0f}s"
            print(f"{r['spec']:<22} {r['target']:<10} {r['status']:<8} {r.get('world', '-'):>5} "
                  f"{_f(r.get('model_states_ratio')):>7} {_f(r.get('activations_ratio')):>6} "
                  f"{_f(r.get('total_ratio')):>6} {launch:>7}  {r.get('smoke', '')} {r.get('note', '')}")
        per_spec = {}
        for r in rows:
            per_spec[r["spec"]] = r.get("spec_wall_s")
        print("wall per spec: " + ", ".join(f"{k} {v:.0f}s" for k, v in per_spec.items() if v is not None))
    return 1 if any(r["status"] in ("failed", "error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
