"""`dtc sweep SPEC --top N -o DIR` and `dtc calibrate --sweep DIR`: measure the few candidates the model
cannot decide between, then refit and re-solve.

``render_sweep`` solves the spec with a wider runner-up list, picks N candidates (``pick_candidates``:
the pick, then one of each other layout family, then those closest to the pick's predicted step),
compiles each into DIR/candidates/NN/ (its own plan.json and generated launchers) and writes ONE
SLURM job array, DIR/sweep.sbatch: task NN runs candidate NN's generated ``train_<target>.sbatch``
(with bash, inside the task's allocation) as a short benchmark -- warm-up, then K timed steps on
synthetic data, no checkpoints -- writing DIR/logs/NN.log and DIR/logs/NN.status (its exit code).
All candidates have the pick's GPU count, so one allocation shape serves the whole array. The
target is the spec's first whose launcher takes a benchmark override (``bench_kind``): dtc's
trainers read DTC_SMOKE_*; train_megatron.sbatch reads DTC_BENCH_STEPS and runs Megatron-LM's
pretrain_gpt.py for that many iterations on mock data with no checkpoint loaded or saved.

``--local-cpu`` scales each candidate down to this machine's CPUs exactly as ``dtc smoke`` does
(compiler/smoke/scale.py: gloo, a reduced model of the same family; for Megatron the smoke's scaled
megatron_args.sh and its worker as pretrain_gpt.py, megatron.training.pretrain from the installed
megatron-core) and runs the array on a local SLURM node one task at a time: it tests the machinery;
its timings describe no GPU.

``ingest_sweep`` reads the finished array: each candidate's log (compiler/calibration/logs.py),
costed on its plan (GPU runs) or on its scaled setup (--local-cpu), fits a cluster profile
(compiler/calibration/profile.py), re-solves the spec with it and writes DIR/profile.yaml and
DIR/PLAN.md: the re-solved plan's PLAN.md with a section of measured vs predicted per candidate
and the measured best.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from compiler.errors import Diagnostic, DtcError, Location
from compiler.layout import Layout

if TYPE_CHECKING:
    from compiler.calibration.runs import PublishedRun

SWEEP_FILE = "sweep.json"
SWEEP_SCHEMA_VERSION = 1
ARRAY_SCRIPT = "sweep.sbatch"
DEFAULT_STEPS = 5
WARMUP_STEPS = 1  # the first logged step is never timed (compiler/calibration/logs.py)
SEARCH_WIDTH = 4  # runners-up the re-solve keeps per swept candidate to choose from
LOCAL_CPU_RANKS = 2


def family(layout: Layout) -> tuple:
    """A layout's family: which parallelisms and memory savers it uses (not their degrees)."""
    return (layout.tp > 1, layout.pp > 1, layout.cp > 1, layout.ep > 1, layout.zero_stage,
            layout.offload_optimizer != "none" or layout.offload_params != "none", layout.recompute)


def pick_candidates(pick: Any, alternatives: Sequence[Any], n: int) -> list[Any]:
    """The pick, then the best of each other family (in rank order), then the closest to the pick's step time."""
    out, seen = [pick], {family(pick.layout)}
    same_size = [c for c in alternatives if c.layout.world_size == pick.layout.world_size
                 and c.layout.gpu == pick.layout.gpu]
    for c in same_size:
        if len(out) >= n:
            break
        if family(c.layout) not in seen:
            out.append(c)
            seen.add(family(c.layout))
    rest = sorted((c for c in same_size if c not in out),
                  key=lambda c: (abs(c.estimate.step_time_s / pick.estimate.step_time_s - 1.0), c.rank))
    out += rest[:max(0, n - len(out))]
    return out


def bench_kind(target: str) -> str | None:
    """How ``target``'s generated SLURM launcher runs a short benchmark, or None if it cannot: "smoke-env" (dtc's
    trainers read steps, synthetic data and no checkpoints from DTC_SMOKE_*, the same rule as `dtc smoke --slurm`,
    compiler/smoke/slurm.py) or "bench-steps" (train_megatron.sbatch reads the iteration count from
    DTC_BENCH_STEPS and overrides Megatron's arguments itself: compiler/targets/megatron/render.py)."""
    from compiler.smoke.targets import hooks
    from compiler.targets import registry

    t = registry.get(target)
    if t.slurm is None or t.cost is None or t.smoke is None:
        return None
    if hooks(target).entry is not None:
        return "smoke-env"
    return "bench-steps" if t.slurm.bench_steps_env is not None else None


def sweep_target(targets: Sequence[str], local_cpu: bool) -> str:
    """The framework target the sweep runs: the first of the spec's targets whose generated launcher is a SLURM
    script that can run a short benchmark (``bench_kind``). Every candidate is a plan of the spec, runnable by
    each of its targets (compiler.rules: framework_unsupported), so one target serves the whole array."""
    usable = [t for t in targets if bench_kind(t) is not None]
    if "slurm" not in targets or not usable:
        raise DtcError(Diagnostic(
            summary="dtc sweep needs the slurm target and a framework target whose launcher runs a short "
                    "benchmark (fsdp, deepspeed or megatron)",
            hint="add them to the spec's targets, e.g. targets: [megatron, slurm]"))
    return usable[0]


def _task_env(setup, generated_dir: Path, target: str, steps: int, local_cpu: bool,
              job_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one array task: the benchmark settings the target's launcher reads and, with
    --local-cpu, the scaled-down run (the smoke's options; for Megatron the smoke's job files: ``job_env``)."""
    from compiler.targets import registry

    env: dict[str, str] = {}
    launch = registry.get(target).slurm
    if bench_kind(target) == "bench-steps" and launch is not None and launch.bench_steps_env is not None:
        env[launch.bench_steps_env] = str(steps)
        env["DTC_ARTIFACT_DIR"] = str(generated_dir)
        if local_cpu:
            assert job_env is not None, "a local Megatron candidate runs the smoke's job files"
            env.update(job_env)
            env.update({"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
        return env
    env.update({"DTC_SMOKE_STEPS": str(steps), "DTC_SMOKE_SYNTHETIC": "1", "DTC_SMOKE_NO_SAVE_AT_END": "1",
                "DTC_SMOKE_SAVE_INTERVAL": "0", "DTC_SMOKE_NO_RESUME": "1"})
    if local_cpu:
        from compiler.smoke.targets import as_env, smoke_options

        env.update(as_env(smoke_options(setup, target)))
        env.update({"DTC_NPROC_PER_NODE": str(setup.world_size), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    env["DTC_ARTIFACT_DIR"] = str(generated_dir)
    env["DTC_SMOKE_CHECKPOINT_DIR"] = str(generated_dir.parent.parent / "scratch" / generated_dir.name)
    return env


def _local_megatron_job(cplan, gen: Path, setup, scratch: Path) -> tuple[Any, dict[str, str]]:
    """(the layout that runs, the task's environment) of a --local-cpu Megatron candidate: the smoke's own job
    files (compiler/targets/megatron/smoke.py local_job_env: the scaled megatron_args.sh, the smoke worker as
    pretrain_gpt.py) for the candidate's generated train_megatron.sbatch."""
    import subprocess

    from compiler.smoke.targets import RunContext
    from compiler.targets.megatron.smoke import local_job_env

    scratch.mkdir(parents=True, exist_ok=True)
    ctx = RunContext(generated_dir=gen, plan=cplan, setup=setup, workdir=scratch, timeout_s=600)
    try:
        run, env = local_job_env(ctx, scratch)
    except (ValueError, OSError, subprocess.SubprocessError) as exc:
        raise DtcError(Diagnostic(summary=f"cannot prepare the scaled Megatron run of {gen}: {exc}",
                                  location=Location(str(gen)), hint="check the generated megatron_args.sh")) from None
    assert run.layout is not None, "megatron_smoke_args records the layout that runs"
    return run.layout, env


def array_script(name: str, n: int, plan, target: str, *, local_cpu: bool, cpus: int) -> str:
    """One SLURM job array over the candidates (the pick's allocation shape; --local-cpu: one local node, one
    task at a time so that the timings do not share the CPUs)."""
    from compiler.targets import registry

    launch = registry.get(target).slurm
    assert launch is not None, f"{target} is not launched by the slurm target (sweep_target picks one that is)"
    launcher = launch.script
    head = ["#!/bin/bash", f"#SBATCH --job-name={name}-sweep",
            f"#SBATCH --array=0-{n - 1}" + ("%1" if local_cpu else ""),
            "#SBATCH --output=logs/slurm-%A_%a.out", "#SBATCH --no-requeue"]
    if local_cpu:
        # one node; srun launchers start one task per rank, overcommitted onto its cores as dtc smoke --slurm does
        shape = ([f"#SBATCH --ntasks-per-node={cpus}", "#SBATCH --cpus-per-task=1", "#SBATCH --overcommit"]
                 if launch.launcher == "srun" else [f"#SBATCH --cpus-per-task={cpus}"])
        head += ["#SBATCH --nodes=1", *shape,
                 f"#SBATCH --partition={os.environ.get('SLURM_SMOKE_PARTITION') or 'debug'}", "#SBATCH --time=15"]
    else:
        s = plan.slurm
        # the tasks the launcher's srun starts: one per node (torchrun), one per GPU (srun launchers: Megatron)
        tasks = plan.layout.gpus_per_node if launch.launcher == "srun" else 1
        head += [f"#SBATCH --nodes={plan.layout.num_nodes}", f"#SBATCH --ntasks-per-node={tasks}",
                 f"#SBATCH --gpus-per-node={plan.layout.gpus_per_node}", "#SBATCH --exclusive", "#SBATCH --time=30"]
        if getattr(s, "partition", None):
            head.append(f"#SBATCH --partition={s.partition}")
        if getattr(s, "account", None):
            head.append(f"#SBATCH --account={s.account}")
    body = f"""
# Generated by dtc sweep: task N benchmarks candidates/NN (see sweep.json) through its own generated
# {launcher}: warm-up, then timed steps on synthetic data, no checkpoints.
set -uo pipefail
SWEEP_DIR="$(cd "${{DTC_SWEEP_DIR:-${{SLURM_SUBMIT_DIR:-$PWD}}}}" && pwd)"
id=$(printf '%02d' "$SLURM_ARRAY_TASK_ID")
set -a
# shellcheck source=/dev/null
. "$SWEEP_DIR/tasks/$id.env"
set +a
rm -f "$SWEEP_DIR/logs/$id.status"
bash "$SWEEP_DIR/candidates/$id/{launcher}" > "$SWEEP_DIR/logs/$id.log" 2>&1
status=$?
echo "$status" > "$SWEEP_DIR/logs/$id.status"
exit "$status"
"""
    return "\n".join(head) + "\n" + body


def render_sweep(spec_path: str | Path, out_dir: Path, *, top: int, steps: int = DEFAULT_STEPS,
                 local_cpu: bool = False) -> dict[str, Any]:
    """Write the sweep folder; return its manifest (sweep.json)."""
    from compiler.artifacts import write_artifacts
    from compiler.problem import Pins, lower
    from compiler.render.all_targets import render
    from compiler.solver import solve
    from compiler.spec.load import load_spec

    problem = lower(load_spec(spec_path))
    target = sweep_target(problem.targets, local_cpu)
    plan = solve(dataclasses.replace(problem, top_k=max(problem.top_k, SEARCH_WIDTH * top)))
    from compiler.plan import Candidate

    pick = Candidate(layout=plan.layout, estimate=plan.estimate, rank=1, why_lost="")
    chosen = pick_candidates(pick, [c for c in plan.alternatives if c.layout != plan.layout], top)
    out_dir.mkdir(parents=True, exist_ok=True)
    for sub in ("candidates", "logs", "tasks", "scratch"):
        (out_dir / sub).mkdir(exist_ok=True)
    entries = []
    for i, cand in enumerate(chosen):
        cid = f"{i:02d}"
        cplan = plan if i == 0 else solve(dataclasses.replace(problem, pins=Pins.of(cand.layout), top_k=0,
                                                               num_gpus=cand.layout.world_size,
                                                               min_gpus=cand.layout.world_size,
                                                               max_gpus=cand.layout.world_size))
        gen = out_dir / "candidates" / cid
        write_artifacts(render(cplan), gen, force=True)
        setup, job_env = None, None
        if local_cpu:
            from compiler.smoke.scale import scale_plan

            setup = scale_plan(cplan, device="cpu", max_ranks=LOCAL_CPU_RANKS, steps=steps + WARMUP_STEPS)
            if bench_kind(target) == "bench-steps":
                ran, job_env = _local_megatron_job(cplan, gen.resolve(), setup, (out_dir / "scratch" / cid).resolve())
                setup = dataclasses.replace(setup, layout=ran)  # what runs on CPU (the smoke's skipped parts)
        env = _task_env(setup, gen.resolve(), target, steps + WARMUP_STEPS, local_cpu, job_env)
        (out_dir / "tasks" / f"{cid}.env").write_text(
            "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(env.items())))
        entries.append({"id": cid, "layout": cplan.layout.describe(), "family": list(map(str, family(cplan.layout))),
                        "why": "the pick" if i == 0 else cand.why_lost or "runner-up",
                        "predicted_step_time_s": cplan.estimate.step_time_s,
                        "predicted_tokens_per_s_per_gpu": cplan.estimate.tokens_per_s_per_gpu,
                        "setup": None if setup is None else setup.to_dict()})
    cpus = LOCAL_CPU_RANKS
    (out_dir / ARRAY_SCRIPT).write_text(array_script(problem.name, len(entries), plan, target, local_cpu=local_cpu,
                                                     cpus=cpus))
    manifest = {"schema_version": SWEEP_SCHEMA_VERSION, "spec": str(Path(spec_path).resolve()), "name": problem.name,
                "target": target, "steps": steps, "warmup_steps": WARMUP_STEPS, "local_cpu": local_cpu,
                "candidates": entries}
    (out_dir / SWEEP_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def submit_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the array is submitted with: this Python first on PATH, a no-op `module` where the
    machine has none (compiler/smoke/slurm.py's rules), no stray SLURM_* of an enclosing job."""
    from compiler.smoke.slurm import _has_module_command, _search_path

    env = dict(os.environ if base is None else base)
    env["PATH"] = _search_path(env)
    if not _has_module_command(env):
        env["BASH_FUNC_module%%"] = "() {  echo \"dtc sweep: no environment modules here; skipped: module $*\" >&2\n}"
    for k in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) and k != "SLURM_CONF"]:
        del env[k]
    return env


def submit_sweep(out_dir: Path) -> int:
    """sbatch the array; its job id."""
    import re
    import subprocess

    env = submit_env()
    r = subprocess.run(["sbatch", "--parsable", ARRAY_SCRIPT], cwd=out_dir, env=env, capture_output=True, text=True,
                       timeout=60)
    m = re.match(r"\s*(\d+)", r.stdout)
    if r.returncode != 0 or not m:
        raise DtcError(Diagnostic(summary=f"sbatch refused the sweep array: {(r.stderr or r.stdout).strip()}",
                                  location=Location(str(out_dir / ARRAY_SCRIPT)),
                                  hint="check the partition and account in the spec's slurm section"))
    return int(m.group(1))


# ------------------------------------------------------------------------------------------- ingest
def _manifest(sweep_dir: Path) -> dict[str, Any]:
    path = sweep_dir / SWEEP_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DtcError(Diagnostic(summary=f"not a dtc sweep folder: cannot read {path} ({exc.strerror})",
                                  location=Location(str(path)), hint="write one with: dtc sweep SPEC --top N -o DIR"))
    except ValueError as exc:
        raise DtcError(Diagnostic(summary=f"{SWEEP_FILE} is not JSON: {exc}", location=Location(str(path)),
                                  hint="rewrite it with dtc sweep")) from None
    if not isinstance(data, dict) or data.get("schema_version") != SWEEP_SCHEMA_VERSION or "candidates" not in data:
        raise DtcError(Diagnostic(summary=f"{SWEEP_FILE} is not a dtc sweep manifest (schema {SWEEP_SCHEMA_VERSION})",
                                  location=Location(str(path)), hint="rewrite it with dtc sweep"))
    return data


def ingest_sweep(sweep_dir: Path, *, extra_runs: Sequence[str] = (), output: Path | None = None,
                 date: str | None = None, name: str | None = None) -> str:
    from compiler.calibration.logs import parse_log
    from compiler.calibration.measured import load_measured, run_of_log, run_of_setup, _load_plan
    from compiler.calibration.profile_fit import fit_profile
    from compiler.costmodel.efficiency import load_efficiency
    from compiler.artifacts import write_text_atomically
    from compiler.calibration.profile_fit import format_profile

    data = _manifest(sweep_dir)
    measured = load_measured(extra_runs) if extra_runs else None
    runs, missing, dates = [], [], [date] if date else []
    rows: list[tuple[Any, PublishedRun | None, str]] = []  # (candidate, its run, status)
    for c in data["candidates"]:
        cid = c["id"]
        status_path, log_path = sweep_dir / "logs" / f"{cid}.status", sweep_dir / "logs" / f"{cid}.log"
        if not status_path.is_file():
            missing.append(cid)
            continue
        status = status_path.read_text().strip()
        if status != "0":
            rows.append((c, None, f"failed (exit {status}; see logs/{cid}.log)"))
            continue
        log = parse_log(log_path.read_text(encoding="utf-8", errors="replace"), str(log_path))
        if log.date and not date:
            dates.append(log.date)
        plan_path = sweep_dir / "candidates" / cid / "plan.json"
        if data.get("local_cpu"):
            run = run_of_setup(c["setup"], data["name"], data["target"], log, row_id=f"{log_path}")
        else:
            run = run_of_log(log, _load_plan(plan_path), str(plan_path))
        runs.append(run)
        rows.append((c, run, "measured"))
    if missing:
        raise DtcError(Diagnostic(summary=f"the sweep array has not finished: no status for candidates "
                                          f"{', '.join(missing)}", location=Location(str(sweep_dir / "logs")),
                                  hint="wait for the job array (squeue), then rerun dtc calibrate --sweep"))
    if not runs:
        raise DtcError(Diagnostic(summary="no candidate of the sweep ran to the end", location=Location(str(sweep_dir)),
                                  hint="read logs/NN.log of the candidates"))
    all_runs = runs + (measured.runs if measured else [])
    if measured and not date:
        dates += measured.dates
    notes = ["measured by `dtc sweep --local-cpu` on CPU (a test of the machinery): the cost model predicts GPUs, so "
             "these constants describe no real cluster"] if data.get("local_cpu") else []
    base = load_efficiency()
    profile = fit_profile(all_runs, name=name or f"{data['name']}-sweep", base=base,
                          date=max(dates) if dates else None, notes=notes,
                          inputs=[{"path": str(sweep_dir / SWEEP_FILE), "kind": "sweep",
                                   "sha256": _sha(sweep_dir / SWEEP_FILE)}])
    out = output or sweep_dir / "profile.yaml"
    write_text_atomically(out, profile.to_yaml())
    plan_md, resolved = _resolve_with(data, out, profile)
    section = sweep_section(rows, profile, base, data) + f"\nRe-solved with the fitted profile: {resolved}.\n"
    write_text_atomically(sweep_dir / "PLAN.md", plan_md.rstrip("\n") + "\n\n" + section)
    return format_profile(profile, str(out)) + f"\nRe-solved with the profile: {resolved}\nTo plan with it, add to " \
        f"the spec: cluster.profile: <path of {out} relative to the spec>\nSweep: wrote " \
        f"{sweep_dir / 'PLAN.md'} ({len(runs)} of {len(data['candidates'])} candidates measured)."


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _resolve_with(data: dict[str, Any], profile_path: Path, profile) -> tuple[str, str]:
    """The spec re-solved with the fitted profile: (its PLAN.md text, a one-line summary)."""
    import hashlib

    from compiler.problem import lower
    from compiler.render.report import render_report
    from compiler.solver import solve
    from compiler.spec.load import load_spec

    problem = lower(load_spec(data["spec"]))
    ref = profile.ref(str(profile_path), hashlib.sha256(profile_path.read_bytes()).hexdigest())
    plan = solve(dataclasses.replace(problem, profile=ref))
    text = render_report(plan)["PLAN.md"]
    return text, f"{plan.layout.describe()}, step {plan.estimate.step_time_s:.4g} s"


def sweep_section(rows, profile, base, data) -> str:
    from compiler.calibration.fit import predict

    eff = profile.efficiency(base)
    lines = ["## Sweep: measured vs predicted", "",
             f"{len(rows)} candidates of `{data['name']}` ran as one SLURM job array ({data['target']}, "
             f"{data['warmup_steps']} warm-up + {data['steps']} timed steps, synthetic data, no checkpoints)"
             + (" scaled down to CPU with `--local-cpu`: the timings test the machinery and describe no GPU." if
                data.get("local_cpu") else "."), "",
             "| candidate | layout | ran as | measured step | predicted before | predicted after (profile) | status |",
             "|---|---|---|---:|---:|---:|---|"]
    best = None
    for c, run, status in rows:
        if run is None:
            lines.append(f"| {c['id']} | `{c['layout']}` | - | - | - | - | {status} |")
            continue
        tokens_per_step = run.problem.global_batch * run.problem.seq_len
        measured = tokens_per_step / (run.measured_tokens_per_s_per_gpu * run.layout.world_size)
        before = predict(run, base).step_time_s
        after = predict(run, eff).step_time_s
        ran = "the same" if run.layout.describe() == c["layout"] else f"`{run.layout.describe()}`"
        lines.append(f"| {c['id']} | `{c['layout']}` | {ran} | {measured:.4g} s | "
                     f"{before:.4g} s ({before / measured - 1:+.0%}) "
                     f"| {after:.4g} s ({after / measured - 1:+.0%}) | {status} |")
        if best is None or run.measured_tokens_per_s_per_gpu > best[1].measured_tokens_per_s_per_gpu:
            best = (c, run)
    lines.append("")
    if best is not None:
        lines.append(f"Measured best: candidate {best[0]['id']} (`{best[0]['layout']}`), "
                     f"{best[1].measured_tokens_per_s_per_gpu:.4g} tokens/s per GPU as it ran.")
    return "\n".join(lines) + "\n"
