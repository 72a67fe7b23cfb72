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
* megatron: ``torchrun pretrain_gpt.py`` with megatron_args.sh's flags and the smoke overrides,
  only where GPUs and Megatron-LM are present; otherwise skipped with the reason.
"""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from compiler.plan import Plan
from compiler.smoke import launch as L
from compiler.smoke.report import RankMeasure, TargetResult
from compiler.smoke.scale import SmokeSetup, built_shape
from compiler.split import layer_split

FILES = {"fsdp": ("fsdp_train.py", "fsdp_config.py"), "deepspeed": ("ds_train.py", "ds_config.json"),
         "megatron": ("megatron_args.sh",)}
ENTRY = {"fsdp": "fsdp_train.py", "deepspeed": "ds_train.py"}
SUMMARY_KEY = {"fsdp": "dtc_fsdp_summary", "deepspeed": "dtc_deepspeed_summary"}
_STEP = re.compile(r"^(?:\[ds_train\] )?step (\d+)/(\d+) loss (\S+).*?time (\S+?)s")


@dataclass
class RunContext:
    generated_dir: Path
    plan: Plan
    setup: SmokeSetup
    workdir: Path  # private: logs, the SLURM job's script and output
    timeout_s: float
    on_line: Callable[[str], None] | None = None


def available_targets(generated_dir: Path) -> list[str]:
    return [t for t, files in FILES.items() if all((generated_dir / f).is_file() for f in files)]


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
    if target == "deepspeed":
        env["TORCH_EXTENSIONS_DIR"] = str(L.extensions_dir())
    return env


# ------------------------------------------------------------------------------------------- options
def smoke_options(setup: SmokeSetup, target: str) -> dict[str, str | None]:
    """The entry point's options for the smoke run (None: a flag), in command-line order; the one
    source for the local command line (``as_argv``) and the SLURM job's environment (``as_env``)."""
    d, s = setup.degrees, built_shape(setup.shape, target)
    opts: dict[str, str | None] = {"--steps": str(setup.steps)}
    if target == "fsdp":
        opts.update({"--tp": str(d.tp), "--pp": str(d.pp), "--cp": str(d.cp), "--dp-shard": str(d.dp_shard),
                     "--dp-replicate": str(d.dp_replicate), "--vpp": str(d.vpp)})
    else:
        # train_batch_size is recomputed for the smaller world; the preflight has checked the
        # generated config against the plan's world, so --allow-resize hides nothing
        opts.update({"--tp": str(d.tp), "--pp": str(d.pp), "--dp-shard": str(d.dp_shard), "--allow-resize": None})
    opts.update({"--micro-batch": str(setup.micro_batch), "--grad-accum": str(setup.grad_accum),
                 "--layers": str(s.num_layers), "--hidden": str(s.hidden_size),
                 "--heads": str(s.num_attention_heads), "--kv-heads": str(s.num_kv_heads),
                 "--ffn": str(s.ffn_hidden_size), "--vocab": str(s.vocab_size),
                 ("--seq" if target == "fsdp" else "--seq-len"): str(setup.seq_len)})
    if d.pp > 1:  # the reduced model's split, the one the smoke prediction is costed with
        split = layer_split(s.num_layers, d.pp, d.vpp, setup.layout.split)
        opts["--stage-layers"] = ",".join(map(str, split.chunk_layers))
    if target == "fsdp":
        opts["--device"] = setup.device
        if setup.precision != setup.plan_precision:
            opts["--param-dtype"] = setup.precision
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


def fsdp_summary(lines: list[str]) -> dict[str, Any] | None:
    return summary_line(lines, SUMMARY_KEY["fsdp"])


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
    summary = summary_line(lines, SUMMARY_KEY[result.target]) or {}
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
    if result.target == "fsdp" and setup.precision != setup.plan_precision:
        result.notes.append(f"--param-dtype {setup.precision}: the plan's {setup.plan_precision} parameters "
                            f"run as {setup.precision} here")
    if result.target == "fsdp" and summary.get("sac_cache_counted") is False:
        result.notes.append("selective-checkpoint cache not counted in the saved activations (torch internals "
                            "differ from torch 2.13's)")
    if result.target == "deepspeed" and setup.device == "cpu":
        result.notes.append("CPU: ds_train.py uses torch's AdamW (--cpu-optimizer torch, no fused_adam / cpu_adam "
                            "JIT build) and skips the shared-memory allreduce op")


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
    elif result.steps_done < result.steps_requested:
        result.status, result.reason = "failed", f"only {result.steps_done} of {result.steps_requested} steps ran"
    elif not all(math.isfinite(x) for x in result.losses):
        result.status, result.reason = "failed", "the loss is not finite"
    elif not result.loss_fell:
        result.status, result.reason = "failed", "the loss did not fall on the learnable synthetic task"
    else:
        result.status = "passed"
    result.error_rank, result.error, result.error_tail = launch.failing_rank, launch.error, launch.error_tail
    result.jit_ops, result.jit_build_s = list(launch.jit_ops), launch.jit_build_s


# ------------------------------------------------------------------------------------------- targets
def run_entry(ctx: RunContext, target: str) -> TargetResult:
    """fsdp_train.py or ds_train.py under torchrun with the smoke options; judged on its summary."""
    setup = ctx.setup
    log_dir = ctx.workdir / f"logs-{target}"
    argv = (torchrun_argv(setup.world_size, log_dir) + [str(ctx.generated_dir / ENTRY[target])]
            + as_argv(smoke_options(setup, target)))
    result = TargetResult(target, "failed", launched=True, command=shlex.join(argv), steps_requested=setup.steps)
    if target == "deepspeed":
        removed = L.clear_stale_locks(L.extensions_dir())
        if removed:
            result.notes.append("removed stale JIT lock(s): " + ", ".join(str(p) for p in removed))
    launch = run_launch(ctx, target, argv, log_dir)
    summary = read_result(result, launch.lines, setup)
    result.wall_s = launch.wall_s
    target_notes(result, setup, summary)
    judge(result, launch)
    if result.status == "passed" and not summary:
        result.status, result.reason = "failed", f"{ENTRY[target]} printed no {SUMMARY_KEY[target]} line"
    return result


def run_fsdp(ctx: RunContext) -> TargetResult:
    return run_entry(ctx, "fsdp")


def run_deepspeed(ctx: RunContext) -> TargetResult:
    return run_entry(ctx, "deepspeed")


def run_launch(ctx: RunContext, target: str, argv: list[str], log_dir: Path,
               extra_env: dict[str, str] | None = None) -> L.LaunchResult:
    env = rank_env(ctx, target)
    env.update(extra_env or {})
    spec = L.LaunchSpec(argv=argv, env=env, cwd=ctx.generated_dir, log_dir=log_dir, timeout_s=ctx.timeout_s,
                        setup_timeout_s=min(ctx.timeout_s, L.LaunchSpec.setup_timeout_s),
                        stall_timeout_s=min(ctx.timeout_s, L.LaunchSpec.stall_timeout_s))
    prefix = f"[{target}] "
    return L.run_launch(spec, on_line=(lambda line: ctx.on_line(prefix + line)) if ctx.on_line else None)


# ------------------------------------------------------------------------------------------- megatron
def megatron_skip_reason(plan: Plan, gpu_count: int) -> str | None:
    if gpu_count == 0:
        return "Megatron-LM needs CUDA GPUs; none here"
    pretrain = Path(str(plan.slurm.get("megatron_dir", "/opt/Megatron-LM"))) / "pretrain_gpt.py"
    if not pretrain.is_file():
        return f"Megatron-LM is not installed ({pretrain} not found; set slurm.megatron_dir)"
    return None


MEGATRON_OVERRIDES = {
    "--tensor-model-parallel-size": lambda s: s.degrees.tp, "--pipeline-model-parallel-size": lambda s: s.degrees.pp,
    "--context-parallel-size": lambda s: s.degrees.cp, "--num-layers": lambda s: s.shape.num_layers,
    "--hidden-size": lambda s: s.shape.hidden_size, "--ffn-hidden-size": lambda s: s.shape.ffn_hidden_size,
    "--num-attention-heads": lambda s: s.shape.num_attention_heads,
    "--num-query-groups": lambda s: s.shape.num_kv_heads, "--kv-channels": lambda s: s.shape.kv_channels,
    "--seq-length": lambda s: s.seq_len, "--max-position-embeddings": lambda s: s.seq_len,
    "--micro-batch-size": lambda s: s.micro_batch, "--global-batch-size": lambda s: s.global_batch,
    "--train-iters": lambda s: s.steps, "--vocab-size": lambda s: s.shape.vocab_size,
    "--num-experts": lambda s: s.shape.moe.num_experts if s.shape.moe else None,
    "--moe-router-topk": lambda s: s.shape.moe.top_k if s.shape.moe else None,
    "--expert-model-parallel-size": lambda s: 1,
    "--num-layers-per-virtual-pipeline-stage": lambda s: None,
}
MEGATRON_DROP = ("--save", "--load", "--data-path", "--tensorboard-dir", "--wandb-project",
                 # the plan's pipeline split; the reduced model's split is appended (megatron_flags)
                 "--num-virtual-stages-per-pipeline-rank", "--decoder-first-pipeline-num-layers",
                 "--decoder-last-pipeline-num-layers", "--account-for-embedding-in-pipeline-split",
                 "--account-for-loss-in-pipeline-split", "--pipeline-model-parallel-layout")


def megatron_flags(flags: list[str], setup: SmokeSetup) -> list[str]:
    """megatron_args.sh's flags with the smoke overrides (value flags replaced, dropped ones removed)."""
    out, i = [], 0
    seen = set()
    while i < len(flags):
        flag = flags[i]
        has_value = i + 1 < len(flags) and not flags[i + 1].startswith("--")
        if flag in MEGATRON_DROP:
            i += 2 if has_value else 1
            continue
        if flag in MEGATRON_OVERRIDES:
            seen.add(flag)
            value = MEGATRON_OVERRIDES[flag](setup)
            if value is not None:
                out += [flag, str(value)]
            i += 2 if has_value else 1
            continue
        out.append(flag)
        i += 1
    for flag in ("--train-iters", "--vocab-size"):
        if flag not in seen:
            out += [flag, str(MEGATRON_OVERRIDES[flag](setup))]
    from compiler.render.megatron import pipeline_flags

    d = setup.degrees
    split = layer_split(setup.shape.num_layers, d.pp, d.vpp, setup.layout.split).split
    out += [tok for flag in pipeline_flags(d.pp, d.vpp, split)[1:] for tok in flag]  # [0]: the pp size, above
    if "--mock-data" not in out:
        out.append("--mock-data")
    return out


def read_megatron_args(generated_dir: Path) -> list[str]:
    script = f'source {shlex.quote(str(generated_dir / "megatron_args.sh"))}; printf "%s\\0" "${{MEGATRON_ARGS[@]}}"'
    r = subprocess.run(["bash", "-c", script], capture_output=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"megatron_args.sh failed: {r.stderr.decode(errors='replace')}")
    return [a.decode() for a in r.stdout.split(b"\0") if a]


def run_megatron(ctx: RunContext) -> TargetResult:
    """Only reached with GPUs and a Megatron-LM checkout (not exercised on CPU-only CI)."""
    setup = ctx.setup
    log_dir = ctx.workdir / "logs-megatron"
    pretrain = Path(str(ctx.plan.slurm.get("megatron_dir", "/opt/Megatron-LM"))) / "pretrain_gpt.py"
    flags = megatron_flags(read_megatron_args(ctx.generated_dir), setup)
    argv = torchrun_argv(setup.world_size, log_dir) + [str(pretrain)] + flags
    result = TargetResult("megatron", "failed", launched=True, command=shlex.join(argv), steps_requested=setup.steps)
    launch = run_launch(ctx, "megatron", argv, log_dir, extra_env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    losses = [float(m.group(1)) for line in launch.all_lines
              for m in [re.search(r"lm loss: ([0-9.Ee+-]+)", line)] if m]
    result.losses, result.steps_done, result.wall_s = losses, len(losses), launch.wall_s
    judge(result, launch)
    return result
