"""`dtc smoke`: execute the generated configs for real, at the scale this machine allows.

    run_smoke(generated_dir, targets=..., steps=..., slurm=False, timeout_s=...) -> SmokeReport

Modules:

* ``scale``    plan -> SmokeSetup (pure): the reduced world, degrees, batch, model and precision,
               with every change stated
* ``launch``   process management: own session, three clocks, no orphans, the failing rank's error;
               DeepSpeed's persistent JIT cache and its stale locks
* ``targets``  one launch per target (fsdp_train.py, ds_train.py) with the scripts' own
               options, and reading back their summaries (losses, per-rank memory)
Each target's own runner is its ``SmokeHooks`` (compiler/targets/<name>/smoke.py): e.g. Megatron's
megatron_args.sh scaled, through Megatron-LM's own training loop (``pretrain``, the worker; ``cpu``,
its CUDA-to-CPU layer).
* ``predict``  the cost model's prediction for the same reduced model and world
* ``slurm``    the --slurm path: the generated sbatch script, rewritten for a local cluster
* ``report``   SmokeReport, text / JSON, smoke.json
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from compiler.errors import Diagnostic, Location, SmokeError
from compiler.plan import Plan
from compiler.smoke.report import SmokeReport, TargetResult, plan_sha256, write_smoke_json
from compiler.smoke.scale import DEFAULT_STEPS, local_world, scale_plan
from compiler.targets import registry
from compiler.targets.base import load

ALL_TARGETS = tuple(t.name for t in registry.targets() if t.smoke is not None)
DEFAULT_TIMEOUT_S = 600.0

__all__ = ["run_smoke", "load_plan", "resolve_targets", "ALL_TARGETS", "DEFAULT_TIMEOUT_S"]


def load_plan(generated_dir: Path) -> tuple[Plan, str]:
    path = generated_dir / "plan.json"
    if not generated_dir.is_dir():
        raise SmokeError(Diagnostic(summary=f"{generated_dir} is not a folder", location=Location(str(generated_dir)),
                                    hint="pass the folder `dtc compile` wrote, e.g. generated/<name>/"))
    from compiler.artifacts import read_regular_file

    try:
        data = read_regular_file(path)  # never a link's target, never a FIFO that blocks
        if data is None:
            if not path.exists() and not path.is_symlink():
                raise FileNotFoundError(path)
            raise SmokeError(Diagnostic(summary=f"{path} is not a regular file (a link, a FIFO?); dtc does not "
                                                "follow or read it", location=Location(str(path)),
                                        hint="recompile the spec"))
        text = data.decode("utf-8", errors="replace")
        return Plan.from_json(text), text
    except FileNotFoundError:
        raise SmokeError(Diagnostic(summary=f"no plan.json in {generated_dir}", location=Location(str(path)),
                                    hint="run `dtc compile SPEC` first; smoke runs a generated folder")) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise SmokeError(Diagnostic(summary=f"plan.json is not a dtc plan: {exc}", location=Location(str(path)),
                                    hint="recompile the spec")) from None
    except OSError as exc:  # a link, a FIFO, a name too long
        raise SmokeError(Diagnostic(summary=f"cannot read plan.json: {exc.strerror or exc}",
                                    location=Location(str(path)), hint="recompile the spec")) from None


def resolve_targets(generated_dir: Path, requested: str) -> tuple[list[str], bool]:
    """(targets to report, explicitly named?). "all": what the folder holds; a named target must exist."""
    from compiler.smoke.targets import available_targets

    present = available_targets(generated_dir)
    if "," in requested:  # a list: each must be present
        names = [n.strip() for n in requested.split(",") if n.strip()]
        for n in names:
            resolve_targets(generated_dir, n)
        return names, True
    if requested == "all":
        if not present:
            raise SmokeError(Diagnostic(summary=f"{generated_dir} holds no framework artifacts to run",
                                        location=Location(str(generated_dir)),
                                        hint=f"compile with a target: {', '.join(ALL_TARGETS)}"))
        return present, False
    if requested not in present:
        raise SmokeError(Diagnostic(
            summary=f"{generated_dir} has no {requested} artifacts ({', '.join(registry.get(requested).files)})",
            location=Location(str(generated_dir)),
            hint=f"targets present: {', '.join(present) or 'none'}; add {requested} to the spec's targets"))
    return [requested], True


def verify_generated(generated_dir: Path, plan: Plan, *, allow_edited: bool = False) -> list[str]:
    """Run only what dtc generated (issue #16): every file must match MANIFEST.sha256 (no edits, no
    extra files, no symbolic links). ``allow_edited``: run an edited folder anyway (to test a hand
    edit), returning the warnings the report must carry instead of refusing."""
    from compiler.artifacts import MANIFEST, hand_edited_files

    edited = hand_edited_files(generated_dir)
    if edited and allow_edited:
        return [f"edited after dtc wrote it (run anyway, --allow-edited): {rel}" for rel in edited]
    if edited:
        what = "has no MANIFEST.sha256" if MANIFEST in edited or not (generated_dir / MANIFEST).is_file() \
            else "was changed after dtc wrote it"
        raise SmokeError(Diagnostic(
            summary=f"{generated_dir} {what}; smoke runs only what dtc generated",
            location=Location(str(generated_dir)),
            detail="changed, unknown or missing files:\n" + "\n".join(f"  {rel}" for rel in edited),
            hint="move the edits into the spec and recompile (dtc compile --force), then smoke the new folder; "
                 "or pass --allow-edited to run the edited files (each edit is listed in the report)"))
    return []


def verify_artifacts_match_plan(generated_dir: Path, plan: Plan, *, allow_edited: bool = False) -> list[str]:
    """The degrees and batch in the artifacts must be plan.json's: smoke replaces the degrees with its
    own, so an edited ``TP = 3`` would otherwise "pass". ``allow_edited``: warnings instead (the edited
    files then reach their framework as they are, which reports what it makes of them)."""
    from compiler.artifacts import read_artifacts
    from compiler.render.invariants import invariant_problems

    problems = invariant_problems(plan, dict(read_artifacts(generated_dir).files))
    if problems and allow_edited:
        return [f"disagrees with plan.json (run anyway, --allow-edited): {p}" for p in problems]
    if problems:
        raise SmokeError(Diagnostic(
            summary="the artifacts disagree with plan.json; smoke would test a layout they do not run",
            location=Location(str(generated_dir / "plan.json")), detail="\n".join(problems),
            hint="recompile the spec instead of editing generated files"))
    return []


def preflight(generated_dir: Path, plan: Plan, targets: Sequence[str], *, allow_edited: bool = False) -> list[str]:
    """Fail fast, before any launch, on a plan the layout rules reject (the same codes and messages as
    `dtc validate`, `dtc plan` and `dtc estimate`) and on artifacts that contradict the plan."""
    from compiler import rules

    bad = rules.plan_violations(plan)
    if bad:
        where = Location(str(generated_dir / "plan.json"))
        raise SmokeError([Diagnostic(summary=r.message, location=where, hint=r.fix, code=r.code) for r in bad])
    warnings = verify_artifacts_match_plan(generated_dir, plan, allow_edited=allow_edited)

    for name in targets:  # each target's own checks of its files (Target.smoke.preflight)
        hook = registry.get(name).smoke
        if hook is not None and hook.preflight is not None:
            load(hook.preflight)(generated_dir, plan)
    return warnings


def machine_world() -> tuple[str, int, int]:
    """(device, ranks to use, GPUs present)."""
    gpus = 0
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError as exc:
        raise SmokeError(Diagnostic(summary=f"torch is not installed: {exc}",
                                    hint="pip install torch (and deepspeed for the deepspeed target)")) from None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    device, ranks = local_world(cpu_count=cores, gpu_count=gpus)
    return device, ranks, gpus


def run_smoke(generated_dir: Path | str, *, target: str = "all", steps: int = DEFAULT_STEPS, slurm: bool = False,
              timeout_s: float = DEFAULT_TIMEOUT_S, write_json: bool = True,
              on_line: Callable[[str], None] | None = None, allow_edited: bool = False,
              preempt_at: int | None = None) -> SmokeReport:
    """Run the requested targets of a generated folder and return the report (also written to
    ``smoke.json`` in the folder). ``allow_edited``: run a folder edited after dtc wrote it, with every
    edit and disagreement with plan.json listed as a warning (refused otherwise)."""
    from compiler.smoke import targets as T

    generated_dir = Path(generated_dir).resolve()
    plan, plan_text = load_plan(generated_dir)
    names, explicit = resolve_targets(generated_dir, target)
    warnings = verify_generated(generated_dir, plan, allow_edited=allow_edited)
    warnings += preflight(generated_dir, plan, names, allow_edited=allow_edited)
    if slurm:
        from compiler.smoke.slurm import slurm_unavailable

        why = slurm_unavailable()
        if why is not None:
            raise SmokeError(Diagnostic(summary=f"--slurm needs a SLURM cluster: {why}",
                                        hint="run without --slurm, or where sbatch reaches a controller (tests/"
                                             "slurm_cluster.py starts a local one)"))
    device, ranks, gpus = machine_world()
    setup = scale_plan(plan, device=device, max_ranks=ranks, steps=steps)
    report = SmokeReport(generated_dir=_display(generated_dir), plan_name=plan.name, plan_layout=plan.layout.tag,
                         plan_sha256=plan_sha256(plan_text), setup=setup.to_dict(), explicit=explicit,
                         warnings=warnings)
    workdir = Path(tempfile.mkdtemp(prefix="dtc-smoke-"))
    try:
        ctx = T.RunContext(generated_dir=generated_dir, plan=plan, setup=setup, workdir=workdir,
                           timeout_s=timeout_s, on_line=on_line, preempt_at=preempt_at)
        for name in names:
            report.targets.append(_run_target(ctx, name, slurm=slurm, gpus=gpus))
    finally:
        if os.environ.get("DTC_SMOKE_KEEP") != "1":
            shutil.rmtree(workdir, ignore_errors=True)
    if write_json:
        write_smoke_json(report, generated_dir)
    return report


def _run_target(ctx, name: str, *, slurm: bool, gpus: int) -> TargetResult:
    from compiler.smoke import targets as T
    from compiler.smoke.predict import compare, judge, predict_memory
    from compiler.smoke.scale import built_shape

    hooks = T.hooks(name)
    if hooks.skip is not None:
        reason = load(hooks.skip)(ctx.plan, gpus)
        if reason:
            return TargetResult(name, "skipped", reason=reason)
    if hooks.complete:  # the target's runner does it all: launch, log lines, prediction
        return load(hooks.runner)(ctx, name, slurm=slurm)
    if slurm:
        from compiler.smoke.slurm import run_slurm_target

        result = run_slurm_target(ctx, name)
    else:
        result = T.run_target(ctx, name)
    if result.status != "skipped":
        from compiler.model import ModelShape

        shape = (ModelShape.from_dict(result.model_shape) if result.model_shape
                 else built_shape(ctx.setup.shape, name))
        memory = predict_memory(ctx.setup, shape, name)
        if isinstance(memory, str):
            result.prediction_note = memory
        else:
            result.comparisons = compare(memory, result.ranks, host_offload=ctx.setup.device == "cpu",
                                         gpus_on_a_node=ctx.setup.layout.gpus_on_a_node)
            judge(result)
            if result.ranks and all(r.grad_bytes is None for r in result.ranks):
                result.prediction_note = ("gradients are not measured for this target: model_states compares "
                                          "parameters + optimizer states (+ master copies) with the prediction "
                                          "less its gradient item")
    return result


def _display(path: Path) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        rel = str(path)
    return (str(path) if rel.startswith("..") else rel) + "/"
