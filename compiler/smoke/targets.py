"""One smoke launch per target: the command line, the environment, and reading back what the ranks did.

Both generated entry points take every smoke setting as an option of their own (the same
options come through the environment as ``DTC_SMOKE_<OPTION>`` for ``--slurm``, see
``smoke_env``), and both end with one JSON summary line that carries the losses and the
per-rank memory (parameters, gradients, optimizer states and master copies, saved
activations, peak):

* fsdp: ``torchrun fsdp_train.py`` with the mesh overrides (--tp/--pp/--dp-shard/...), the smoke
  batch, the reduced reference model (--layers/--hidden/--heads/--kv-heads/--ffn/--vocab/--seq)
  and, where the plan's dtype cannot run here (fp16 on CPU), --param-dtype; summary
  ``dtc_fsdp_summary``.
* deepspeed: ``torchrun ds_train.py`` on the generated ds_config.json with the smoke batch
  (--micro-batch/--grad-accum, --allow-resize for the smaller world), degrees (--tp/--pp/
  --dp-shard) and reduced built-in model; ds_train.py itself maps fp16 to bf16 and uses torch's
  AdamW on CPU and fits the lr schedule to --steps, and lists each config change in its summary
  ``dtc_deepspeed_summary``.
* megatron: ``torchrun -m compiler.targets.megatron.pretrain`` (Megatron-LM's own training loop)
  with megatron_args.sh's arguments, scaled; see compiler/targets/megatron/smoke.py.
"""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from compiler.plan import Plan
from compiler.smoke import launch as L
from compiler.smoke.report import RankMeasure, TargetResult
from compiler.smoke.scale import SmokeSetup, built_shape
from compiler.split import layer_split
from compiler.targets import registry
from compiler.targets.base import SmokeHooks, Target, load

_STEP = re.compile(r"^(?:\[ds_train\] )?step (\d+)/(\d+) loss (\S+).*?time (\S+?)s")


@dataclass
class RunContext:
    generated_dir: Path
    plan: Plan
    setup: SmokeSetup
    workdir: Path  # private: logs, the SLURM job's script and output
    timeout_s: float
    on_line: Callable[[str], None] | None = None
    preempt_at: int | None = None  # --preempt-at: SIGUSR1 during this step, then resume (compiler.smoke.preempt)


def smoke_targets() -> list[Target]:
    """The registered targets `dtc smoke` can run (compiler/targets/<name>: Target.smoke)."""
    return [t for t in registry.targets() if t.smoke is not None]


def available_targets(generated_dir: Path) -> list[str]:
    return [t.name for t in smoke_targets() if all((generated_dir / f).is_file() for f in t.files)]


def hooks(target: str) -> SmokeHooks:
    got = registry.get(target).smoke
    assert got is not None, f"{target} has no smoke runner"
    return got


def torchrun_argv(nproc: int, log_dir: Path) -> list[str]:
    exe = Path(sys.executable).with_name("torchrun")
    head = [str(exe)] if exe.is_file() else [sys.executable, "-m", "torch.distributed.run"]
    return head + ["--standalone", f"--nproc-per-node={nproc}", f"--log-dir={log_dir}", "--redirects=3",
                   "--tee=3", "--max-restarts=0"]


def rank_env(ctx: RunContext, target: str) -> dict[str, str]:
    """The environment of the launcher: the caller's, minus stray DTC_SMOKE_* settings (the
    generated scripts read their options from them), plus (CPU) one OpenMP thread per rank."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTC_SMOKE_")}
    env["PYTHONWARNINGS"] = "ignore::FutureWarning"
    env["PYTHONUNBUFFERED"] = "1"
    if ctx.setup.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    if hooks(target).jit_extensions:
        env["TORCH_EXTENSIONS_DIR"] = str(L.extensions_dir())
    # the runtime trainers checkpoint into the smoke's private folder, never into the generated one
    env["DTC_SMOKE_CHECKPOINT_DIR"] = str(ctx.workdir / f"checkpoints-{target}")
    return env


# ------------------------------------------------------------------------------------------- options
def smoke_options(setup: SmokeSetup, target: str) -> dict[str, str | None]:
    """The entry point's options for the smoke run (None: a flag), in command-line order (the target's own
    Target.smoke.options); the one source for the local command line (``as_argv``) and the SLURM job's
    environment (``as_env``)."""
    options = hooks(target).options
    assert options is not None, f"{target} has no smoke options hook (a torchrun entry's target has one)"
    return load(options)(setup)


def model_options(setup: SmokeSetup, target: str, *, seq_flag: str) -> dict[str, str | None]:
    """The smoke batch and the reduced built-in model, as both generated entry points spell them; with a
    pipeline, the reduced model's split (the one its prediction is costed with)."""
    d, s = setup.degrees, built_shape(setup.shape, target)
    opts: dict[str, str | None] = {
        "--micro-batch": str(setup.micro_batch), "--grad-accum": str(setup.grad_accum),
        "--layers": str(s.num_layers), "--hidden": str(s.hidden_size), "--heads": str(s.num_attention_heads),
        "--kv-heads": str(s.num_kv_heads), "--ffn": str(s.ffn_hidden_size), "--vocab": str(s.vocab_size),
        seq_flag: str(setup.seq_len)}
    if d.pp > 1:
        split = layer_split(s.num_layers, d.pp, d.vpp, setup.layout.split)
        opts["--stage-layers"] = ",".join(map(str, split.chunk_layers))
    return opts


def as_argv(options: dict[str, str | None]) -> list[str]:
    return [item for opt, value in options.items() for item in ((opt,) if value is None else (opt, value))]


def as_env(options: dict[str, str | None]) -> dict[str, str]:
    """``--kv-heads 2`` -> ``DTC_SMOKE_KV_HEADS=2``; a flag -> ``1`` (the scripts' own env rule)."""
    return {"DTC_SMOKE_" + opt[2:].upper().replace("-", "_"): "1" if value is None else value
            for opt, value in options.items()}


# ------------------------------------------------------------------------------------------- reading results
def parse_steps(lines: list[str]) -> tuple[list[float], list[float]]:
    losses, times = [], []
    for line in lines:
        m = _STEP.match(line)
        if m:
            losses.append(float(m.group(3)))
            times.append(float(m.group(4)))
    return losses, times


def summary_line(lines: list[str], key: str) -> dict[str, Any] | None:
    """The last JSON line carrying ``key`` (dtc_fsdp_summary, dtc_deepspeed_summary)."""
    for line in reversed(lines):
        if line.startswith("{") and key in line:
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def rank_measures(summary_ranks: list[dict[str, Any]], world: int, device: str) -> list[RankMeasure]:
    """RankMeasures from a summary's per-rank records (fsdp_train.py and ds_train.py use the same
    keys; ds_train.py adds master_bytes, the fp32 copies DeepSpeed steps, counted with the states)."""
    by_rank = {int(r["rank"]): r for r in summary_ranks}
    out = []
    for rank in range(world):
        r = by_rank.get(rank)
        if not r:
            continue
        optimizer = r.get("optimizer_bytes")
        if optimizer is not None:
            optimizer += r.get("master_bytes") or 0
        m = RankMeasure(rank=rank, param_bytes=r.get("param_bytes"), grad_bytes=r.get("grad_bytes"),
                        optimizer_bytes=optimizer, activation_bytes=r.get("saved_activation_bytes"))
        if device == "cuda":
            m.peak_bytes = r.get("peak_memory_bytes")
        else:
            m.rss_bytes = r.get("peak_memory_bytes")  # the process's peak resident set
            parts = [m.param_bytes, m.grad_bytes, m.optimizer_bytes, m.activation_bytes]
            m.peak_bytes = sum(x for x in parts if x is not None) if m.param_bytes is not None else None
        out.append(m)
    return out


def read_result(result: TargetResult, lines: list[str], setup: SmokeSetup) -> dict[str, Any]:
    """Fill ``result`` from the entry point's output (the summary, else its step lines); returns
    the summary ({} when it printed none)."""
    summary = summary_line(lines, hooks(result.target).summary_key or "") or {}
    losses, times = parse_steps(lines)
    result.losses = [float(x) for x in summary.get("losses", losses)]
    result.steps_done = int(summary.get("steps", len(losses)))
    if summary.get("mean_step_time_s_after_first") is not None:
        result.step_time_s = float(summary["mean_step_time_s_after_first"])
    elif times:
        result.step_time_s = sum(times[1:] or times) / len(times[1:] or times)
    result.ranks = rank_measures(summary.get("ranks", []), setup.world_size, setup.device)
    result.changes = [{"what": "ds_config." + c["key"], "plan": c["from"], "smoke": c["to"], "why": c["why"]}
                      for c in summary.get("config_changes", [])]
    return summary


def target_notes(result: TargetResult, setup: SmokeSetup, summary: dict[str, Any]) -> None:
    """The target's own remarks on its run (Target.smoke.notes)."""
    hook = hooks(result.target).notes
    if hook is not None:
        result.notes += load(hook)(setup, summary)


def run_verdict(result: TargetResult) -> str | None:
    """Why a run that ended on its own (launcher exit 0, or a COMPLETED SLURM job) failed, None when it passed: every
    requested step ran, and the loss stayed finite and fell."""
    if result.steps_done < result.steps_requested:
        return f"only {result.steps_done} of {result.steps_requested} steps ran"
    if not all(math.isfinite(x) for x in result.losses):
        return "the loss is not finite"
    if not result.loss_fell:
        return "the loss did not fall on the learnable synthetic task"
    return None


def judge(result: TargetResult, launch: L.LaunchResult) -> None:
    """passed iff the launch succeeded, ran every step, and the loss fell (finite throughout)."""
    if launch.interrupted:
        result.status, result.reason = "failed", "interrupted"
    elif launch.hang is not None:
        phase = {"setup": "set-up (rendezvous, process group, model build) did not reach a first step",
                 "stall": "no step finished", "total": "the launch did not finish"}[launch.hang]
        result.status, result.reason = "failed", f"timeout: {phase} in time; all processes ended"
    elif launch.returncode != 0:
        rank = "" if launch.failing_rank is None else f" (rank {launch.failing_rank} failed first)"
        result.status, result.reason = "failed", f"the launcher exited with {launch.returncode}{rank}"
    elif (why := run_verdict(result)) is not None:
        result.status, result.reason = "failed", why
    else:
        result.status = "passed"
    result.error_rank, result.error, result.error_tail = launch.failing_rank, launch.error, launch.error_tail
    result.jit_ops, result.jit_build_s = list(launch.jit_ops), launch.jit_build_s


# ------------------------------------------------------------------------------------------- targets
def run_entry(ctx: RunContext, target: str) -> TargetResult:
    """fsdp_train.py or ds_train.py under torchrun with the smoke options; judged on its summary."""
    setup = ctx.setup
    log_dir = ctx.workdir / f"logs-{target}"
    entry = hooks(target).entry
    assert entry is not None
    argv = (torchrun_argv(setup.world_size, log_dir) + [str(ctx.generated_dir / entry)]
            + as_argv(smoke_options(setup, target)))
    result = TargetResult(target, "failed", launched=True, command=shlex.join(argv), steps_requested=setup.steps)
    if hooks(target).jit_extensions:
        removed = L.clear_stale_locks(L.extensions_dir())
        if removed:
            result.notes.append("removed stale JIT lock(s): " + ", ".join(str(p) for p in removed))
    launch = run_launch(ctx, target, argv, log_dir)
    summary = read_result(result, launch.lines, setup)
    result.wall_s = launch.wall_s
    target_notes(result, setup, summary)
    judge(result, launch)
    if result.status == "passed" and not summary:
        result.status, result.reason = "failed", f"{entry} printed no {hooks(target).summary_key} line"
    if result.status == "passed" and ctx.preempt_at is not None:
        preemption_check(ctx, target, entry, summary, result)
    return result


def preemption_check(ctx: RunContext, target: str, entry: str, reference: dict[str, Any],
                     result: TargetResult) -> None:
    """The run again, stopped by SIGUSR1 during step ``ctx.preempt_at`` and relaunched from its
    checkpoint; the resumed losses must equal the reference run's (compiler.smoke.preempt)."""
    from compiler.smoke import preempt as P

    at = ctx.preempt_at
    assert at is not None
    if not 1 <= at < ctx.setup.steps:
        result.status, result.reason = "failed", f"--preempt-at {at} must be a step before the last ({ctx.setup.steps})"
        return
    key = hooks(target).summary_key or ""
    mark = P.new_mark()
    env = {P.MARK_ENV: mark, "DTC_SMOKE_CHECKPOINT_DIR": str(ctx.workdir / f"preempt-{target}")}
    exe = Path(sys.executable).with_name("torchrun")
    head = [str(exe)] if exe.is_file() else [sys.executable, "-m", "torch.distributed.run"]
    # no --tee: torchrun tails the log files late; the workers print straight to the pipe
    argv = head + ["--standalone", f"--nproc-per-node={ctx.setup.world_size}", "--max-restarts=0",
                   str(ctx.generated_dir / entry)] + as_argv(smoke_options(ctx.setup, target))
    summaries = []
    for attempt, watch in (("stopped", P.Signaller(mark, at, (entry,))), ("resumed", None)):
        log_dir = ctx.workdir / f"logs-{target}-{attempt}"
        launch = run_launch(ctx, target, argv, log_dir, extra_env=env, watch=watch)
        summary = summary_line(launch.lines, key) or {}
        if launch.returncode != 0 or not summary:
            result.status = "failed"
            result.reason = f"preemption: the {attempt} launch failed (exit {launch.returncode})"
            result.error, result.error_tail = launch.error, launch.error_tail
            return
        summaries.append(summary)
    verdict = P.compare(reference, summaries[0], summaries[1], at)
    result.preemption = verdict.to_dict()
    if not verdict.losses_match:
        result.status, result.reason = "failed", f"preemption: {verdict.reason}"
    elif verdict.reason:
        result.notes.append(f"preemption: {verdict.reason}")


def run_target(ctx: RunContext, target: str) -> TargetResult:
    """The target's own smoke runner (Target.smoke.runner)."""
    return load(hooks(target).runner)(ctx, target)


def run_launch(ctx: RunContext, target: str, argv: list[str], log_dir: Path,
               extra_env: dict[str, str] | None = None,
               watch: Callable[[str], None] | None = None) -> L.LaunchResult:
    env = rank_env(ctx, target)
    env.update(extra_env or {})
    spec = L.LaunchSpec(argv=argv, env=env, cwd=ctx.generated_dir, log_dir=log_dir, timeout_s=ctx.timeout_s,
                        setup_timeout_s=min(ctx.timeout_s, L.LaunchSpec.setup_timeout_s),
                        stall_timeout_s=min(ctx.timeout_s, L.LaunchSpec.stall_timeout_s))
    prefix, on_line = f"[{target}] ", ctx.on_line
    return L.run_launch(spec, on_line=(lambda line: on_line(prefix + line)) if on_line else None, watch=watch)
