#!/usr/bin/env python3
"""The solver's choice next to published layouts (issue #4, "Checked against").

For each model and GPU count in benchmarks/data/published_runs_dev.csv (the vendored calibration set) from
Narayanan et al. 2021 Table 1 (Megatron-LM on A100) and the NeMo / Megatron-Bridge
performance tables: solve the same model, GPU type, GPU count, sequence length, global
batch and precision (objective: throughput, target: megatron), cost the published
layout with the same cost model, and print both side by side:

* ``pred(pub)``   tokens/s per GPU the cost model predicts for the published layout;
* ``pred(dtc)``   ... for the solver's choice; it must be >= pred(pub) whenever the
                  published layout is in dtc's search space (else the reason is shown);
* ``measured``    tokens/s per GPU the source measured for the published layout
                  (Narayanan: from its TFLOP/s and its FLOP formula, 96BslhÂ²(...));
* ``dtc/meas``    pred(dtc) / measured. A choice predicted far faster than the fastest
                  published measurement of the same setup is a red flag for the cost
                  model, not a win: rows above ``--flag`` (default 1.25) are marked "!".

One row per (model, GPU type, GPU count, precision): the latest software version. NVL72
systems allow tensor parallel across the 4-GPU trays (the NVLink domain is the rack).

    python benchmarks/published_layouts.py [--source narayanan2021] [--limit N] [--json] [--flag 1.25]
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compiler.errors import DtcError  # noqa: E402
from compiler.estimate import Estimate  # noqa: E402
from compiler.layout import Layout  # noqa: E402
from compiler.problem import lower  # noqa: E402
from compiler.solver import feasibility as F  # noqa: E402
from compiler.spec.load import load_spec_text  # noqa: E402

CSV = ROOT / "benchmarks" / "data" / "published_runs_dev.csv"
SOURCES = ("narayanan2021", "megatron_bridge_perf", "nemo_2407", "nemo2_2502", "nemo2_2504", "nemo2_2507")

PRESETS = {
    "llama 3.1 405b": "llama3.1-405b", "llama3-405b": "llama3.1-405b", "llama3.1-405b": "llama3.1-405b",
    "llama 3 70b": "llama3-70b", "llama3-70b": "llama3-70b", "llama 3 8b": "llama3-8b", "llama3-8b": "llama3-8b",
    "llama2-7b": "llama2-7b", "llama2-13b": "llama2-13b", "llama2-70b": "llama2-70b", "gpt3-175b": "gpt3-175b",
    "mixtral-8x7b": "mixtral-8x7b", "mixtral-8x22b": "mixtral-8x22b", "nemotron-340b": "nemotron-4-340b",
    "deepseek-v3": "deepseek-v3",
    "gpt (1.7b)": "gpt-1.7b", "gpt (3.6b)": "gpt-3.6b", "gpt (7.5b)": "gpt-7.5b", "gpt (18.4b)": "gpt-18.4b",
    "gpt (39.1b)": "gpt-39.1b", "gpt (76.1b)": "gpt-76.1b", "gpt (145.6b)": "gpt-145.6b",
    "gpt (310.1b)": "gpt-310.1b", "gpt (529.6b)": "gpt-529.6b", "gpt (1008.0b)": "gpt-1t",
}
GPUS = {"A100-SXM-80GB": "a100-80gb", "A100-SXM-40GB": "a100-40gb", "H100-SXM-80GB": "h100-sxm",
        "B200 (DGX-B200)": "b200", "B300 (DGX-B300)": "b300", "GB200 (NVL72)": "gb200", "GB300 (NVL72)": "gb300"}


def _int(x: str, default: int | None = None) -> int | None:
    try:
        return int(float(x))
    except (TypeError, ValueError):
        return default


def precision_of(text: str) -> str | None:
    t = text.lower()
    if "nvfp4" in t:
        return "nvfp4"
    if "fp4" in t:
        return None
    if "fp8" in t:
        return "fp8"
    return "bf16"


def select_rows(source: str | None) -> list[dict]:
    rows = [r for r in csv.DictReader(CSV.open(encoding="utf-8")) if r["source_id"] in SOURCES]
    if source:
        rows = [r for r in rows if r["source_id"] == source]
    picked: dict[tuple, dict] = {}
    for r in rows:
        if r["source_id"] == "narayanan2021" and "Table 1" not in r["source_location"]:
            continue
        preset = PRESETS.get(r["model"].strip().lower())
        gpu = GPUS.get(r["gpu_type"])
        prec = precision_of(r["precision"])
        if not (preset and gpu and prec and _int(r["num_gpus"]) and _int(r["tp"]) and _int(r["pp"])):
            continue
        picked[(preset, r["gpu_type"], r["num_gpus"], prec)] = {**r, "_preset": preset, "_gpu": gpu, "_prec": prec}
    return list(picked.values())


def spec_text(r: dict) -> str:
    cross = "true" if "NVL72" in r["gpu_type"] else "false"
    return textwrap.dedent(f"""\
        name: pub-{r['row_id']}
        model: {{preset: {r['_preset']}}}
        training: {{tokens: 1T, sequence_length: {r['seq_len']}, global_batch: {r['global_batch_size']},
                   precision: {r['_prec']}}}
        cluster: {{gpu: {r['_gpu']}, num_gpus: {r['num_gpus']}}}
        budget: {{objective: throughput}}
        search: {{allow_cross_node_tp: {cross}, top_k: 1}}
        targets: [megatron]
        """)


def published_layout(r: dict, gpus_per_node: int) -> Layout | str:
    n = _int(r["num_gpus"])
    tp, pp = _int(r["tp"]), _int(r["pp"])
    cp, ep, vp = _int(r["cp"], 1) or 1, _int(r["ep"], 1) or 1, _int(r["vp"], 1) or 1
    if n % (tp * pp * cp):
        return f"tp x pp x cp = {tp * pp * cp} does not divide {n}"
    dp = n // (tp * pp * cp)
    zf = r["zero_fsdp"].lower()
    zero, dp_shard = 1, dp
    if zf.startswith("none"):
        zero, dp_shard = 0, 1
    elif "fsdp" in zf and "ddp" not in zf:
        zero = 3
        group = _int(zf.split("group")[-1].strip(" )")) if "group" in zf else None
        dp_shard = group if group and dp % group == 0 else dp
    if dp_shard == 1:
        zero = 0  # nothing to shard over: the same layout as plain replication
    mb = _int(r["micro_batch_size"], 1) or 1
    gb = _int(r["global_batch_size"])
    if gb % (mb * dp):
        return f"global batch {gb} is not micro {mb} x dp {dp} x an integer"
    rc = r["activation_recompute"].lower()
    recompute = "full" if rc.startswith("full") else "selective" if rc.startswith("selective") else "none"
    sp = {"yes": True, "no": False}.get(r["sequence_parallel"].strip().lower(), tp > 1) and tp > 1
    if (dp * cp) % ep:
        return f"ep={ep} does not divide dp x cp = {dp * cp} (expert tensor parallel layouts are not modelled)"
    return Layout(gpu=GPUS[r["gpu_type"]], gpus_per_node=gpus_per_node, tp=tp, pp=pp, cp=cp, ep=ep,
                  dp_replicate=dp // dp_shard, dp_shard=dp_shard, zero_stage=zero, micro_batch=mb,
                  grad_accum=gb // (mb * dp), vpp=vp, schedule="interleaved_1f1b" if vp > 1 else "1f1b",
                  recompute=recompute, sequence_parallel=sp)


def measured_tokens_per_s(r: dict) -> float | None:
    if _int(r["tokens_per_sec_per_gpu"]):
        return float(r["tokens_per_sec_per_gpu"])
    tflops = r["tflops_per_gpu"]
    if r["source_id"] == "narayanan2021" and tflops:
        l, h, s, v = (_int(r[k]) for k in ("num_layers", "hidden_size", "seq_len", "vocab_size"))
        per_token = 96 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))  # Narayanan 2021 eq. (3), per token
        return float(tflops) * 1e12 / per_token
    return None


def compare(r: dict) -> dict:
    from compiler.costmodel.evaluation import evaluate
    from compiler.solver import solve

    problem = lower(load_spec_text(spec_text(r), f"pub-{r['row_id']}.yaml"))
    out: dict = {"row": r["row_id"], "source": r["source_id"], "model": r["_preset"], "gpu": r["gpu_type"],
                 "num_gpus": int(r["num_gpus"]), "precision": r["_prec"], "measured": measured_tokens_per_s(r)}
    pub = published_layout(r, problem.gpu_options[0].gpus_per_node)
    out["published"] = pub.describe() if isinstance(pub, Layout) else f"({pub})"
    in_space = None
    if isinstance(pub, Layout):
        est = evaluate(problem, pub, pipeline_events=False)
        if isinstance(est, Estimate):
            out["pred_pub"] = est.tokens_per_s_per_gpu
            out["pred_pub_mfu"] = est.mfu
        else:
            out["pub_rejected"] = f"{est.code}: {est.message}"
        bad = F.check_structure(problem, pub) or F.check_framework(problem, pub)
        in_space = None if bad is None else f"{bad.code}: {bad.message}"
    out["not_in_space"] = in_space
    try:
        plan = solve(problem, top_k=0)
    except DtcError as exc:
        out["dtc"] = f"(infeasible: {exc.diagnostics[0].summary})"
        return out
    out["dtc"] = plan.layout.describe()
    out["pred_dtc"] = plan.estimate.tokens_per_s_per_gpu
    out["pred_dtc_mfu"] = plan.estimate.mfu
    if out.get("pred_pub"):
        out["dtc_vs_pub"] = out["pred_dtc"] / out["pred_pub"]
    if out["measured"]:
        out["dtc_vs_measured"] = out["pred_dtc"] / out["measured"]
        if out.get("pred_pub"):
            out["pub_pred_vs_measured"] = out["pred_pub"] / out["measured"]
    return out


def fmt(x, spec: str = ".0f", dash: str = "-") -> str:
    return dash if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", choices=SOURCES, help="only rows of this source")
    ap.add_argument("--limit", type=int, default=0, help="at most N rows")
    ap.add_argument("--flag", type=float, default=1.25, help="mark rows with pred(dtc)/measured above this")
    ap.add_argument("--json", action="store_true", help="one JSON object per row")
    args = ap.parse_args(argv)
    rows = select_rows(args.source)
    if args.limit:
        rows = rows[:args.limit]
    results, worse, flagged = [], 0, 0
    for r in rows:
        res = compare(r)
        results.append(res)
        if args.json:
            print(json.dumps(res, sort_keys=True))
            continue
        ok = ""
        if res.get("pred_pub") and res.get("pred_dtc"):
            if res["pred_dtc"] < res["pred_pub"] * (1 - 1e-6):
                ok = "WORSE" + (" (published layout not in space)" if res["not_in_space"] else "")
                worse += not res["not_in_space"]
        flag = "!" if (res.get("dtc_vs_measured") or 0) > args.flag else " "
        flagged += flag == "!"
        print(f"{flag} row {res['row']:>4} {res['model']:<15} {res['num_gpus']:>5} x {res['gpu']:<16} "
              f"{res['precision']:<4} "
              f"measured {fmt(res['measured']):>6}  pred(pub) {fmt(res.get('pred_pub')):>6}  "
              f"pred(dtc) {fmt(res.get('pred_dtc')):>6}  dtc/pub {fmt(res.get('dtc_vs_pub'), '.2f'):>5}  "
              f"dtc/meas {fmt(res.get('dtc_vs_measured'), '.2f'):>5}  pub-pred/meas "
              f"{fmt(res.get('pub_pred_vs_measured'), '.2f'):>5} {ok}")
        print(f"      published: {res['published']}"
              + (f"  [cost model: {res['pub_rejected']}]" if res.get("pub_rejected") else "")
              + (f"  [not in dtc's space: {res['not_in_space']}]" if res["not_in_space"] else ""))
        print(f"      dtc:       {res['dtc']}")
    if not args.json:
        ratios = sorted(r["dtc_vs_measured"] for r in results if r.get("dtc_vs_measured"))
        med = ratios[len(ratios) // 2] if ratios else float("nan")
        print(f"\n{len(results)} rows; dtc's choice predicted slower than the published layout in {worse} rows where "
              f"that layout is in dtc's space; median pred(dtc)/measured {med:.2f}; {flagged} rows above {args.flag} "
              "(red flags for the cost model)")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
