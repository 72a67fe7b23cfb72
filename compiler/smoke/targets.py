"""One smoke launch per target: the command line, the environment, and reading back what the ranks did.

* fsdp: ``torchrun fsdp_train.py`` with the mesh overrides (--tp/--pp/--dp-shard/...), the smoke
  batch and the reduced reference model (``fsdp_config.Transformer`` through the probe's model
  factory, so saved activations are measured); its final JSON line (``dtc_fsdp_summary``) gives
  the losses and per-rank parameter / gradient / optimizer bytes.
* deepspeed: ``torchrun ds_train.py --config <smoke ds_config>`` (the generated ds_config with
  the batch fields rewritten for the smaller world), the reduced built-in model, and a fixed
  learnable batch; losses come from its step lines, memory from the probe.
* megatron: ``torchrun pretrain_gpt.py`` with megatron_args.sh's flags and the smoke overrides,
  only where GPUs and Megatron-LM are present; otherwise skipped with the reason.
"""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from compiler.model import ModelShape
from compiler.plan import Plan
from compiler.smoke import launch as L
from compiler.smoke.report import RankMeasure, TargetResult
from compiler.smoke.scale import SmokeSetup, built_shape, smoke_ds_config

PROBE_MODULE = "dtc_smoke_probe"
FILES = {"fsdp": ("fsdp_train.py", "fsdp_config.py"), "deepspeed": ("ds_train.py", "ds_config.json"),
         "megatron": ("megatron_args.sh",)}
_STEP = re.compile(r"^(?:\[ds_train\] )?step (\d+)/(\d+) loss (\S+).*?time (\S+?)s")


@dataclass
class RunContext:
    generated_dir: Path
    plan: Plan
    setup: SmokeSetup
    workdir: Path  # private: probe module, rewritten configs, logs
    timeout_s: float
    on_line: Callable[[str], None] | None = None


def available_targets(generated_dir: Path) -> list[str]:
    return [t for t, files in FILES.items() if all((generated_dir / f).is_file() for f in files)]


def torchrun_argv(nproc: int, log_dir: Path) -> list[str]:
    exe = Path(sys.executable).with_name("torchrun")
    head = [str(exe)] if exe.is_file() else [sys.executable, "-m", "torch.distributed.run"]
    return head + ["--standalone", f"--nproc-per-node={nproc}", f"--log-dir={log_dir}", "--redirects=3",
                   "--tee=3", "--max-restarts=0"]


def model_json(setup: SmokeSetup, target: str) -> str:
    s = built_shape(setup.shape, target)
    return json.dumps({"num_layers": s.num_layers, "hidden_size": s.hidden_size, "ffn_hidden_size": s.ffn_hidden_size,
                       "num_attention_heads": s.num_attention_heads, "num_kv_heads": s.num_kv_heads,
                       "head_dim": s.kv_channels, "vocab_size": s.vocab_size, "seq_len": setup.seq_len,
                       "max_position_embeddings": max(s.max_position_embeddings, setup.seq_len)},
                      sort_keys=True)


def rank_env(ctx: RunContext, target: str) -> dict[str, str]:
    """The environment of the launcher: the caller's, minus stray DTC_SMOKE_* settings, plus the
    probe and (CPU) one OpenMP thread per rank."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTC_SMOKE_")}
    probe_dir = ctx.workdir / "probe"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(probe_dir), env.get("PYTHONPATH", "")) if p)
    env["DTC_SMOKE_MODEL"] = model_json(ctx.setup, target)
    env["DTC_SMOKE_GRAD_ACCUM"] = str(ctx.setup.grad_accum)
    env["DTC_SMOKE_PROBE_DIR"] = str(ctx.workdir / f"measure-{target}")
    env["PYTHONWARNINGS"] = "ignore::FutureWarning"
    env["PYTHONUNBUFFERED"] = "1"
    if ctx.setup.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    if target == "deepspeed":
        env["TORCH_EXTENSIONS_DIR"] = str(L.extensions_dir())
    return env


def install_probe(workdir: Path) -> None:
    (workdir / "probe").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(__file__).with_name("probe.py"), workdir / "probe" / f"{PROBE_MODULE}.py")


# ------------------------------------------------------------------------------------------- commands
def fsdp_args(setup: SmokeSetup) -> list[str]:
    d = setup.degrees
    return ["--steps", str(setup.steps), "--tp", str(d.tp), "--pp", str(d.pp), "--cp", str(d.cp),
            "--dp-shard", str(d.dp_shard), "--dp-replicate", str(d.dp_replicate), "--vpp", str(d.vpp),
            "--micro-batch", str(setup.micro_batch), "--grad-accum", str(setup.grad_accum),
            "--seq", str(setup.seq_len), "--device", setup.device,
            "--model-factory", f"{PROBE_MODULE}:fsdp_model"]


def ds_args(setup: SmokeSetup, config: Path, *, pipeline: bool) -> list[str]:
    """ds_train.py's options. A pipeline plan keeps ds_train.py's own model path: with a model factory
    it would build the model under deepspeed.zero.Init, whose config check counts every rank."""
    s = built_shape(setup.shape, "deepspeed")
    args = ["--config", str(config), "--allow-resize", "--steps", str(setup.steps),
            "--layers", str(s.num_layers), "--hidden", str(s.hidden_size), "--heads", str(s.num_attention_heads),
            "--vocab", str(s.vocab_size), "--seq-len", str(setup.seq_len),
            "--dataset-factory", f"{PROBE_MODULE}:ds_batches"]
    if not pipeline:
        args += ["--model-factory", f"{PROBE_MODULE}:ds_model"]
    return args


def ds_own_shape(setup: SmokeSetup, plan_shape: ModelShape) -> ModelShape:
    """The shape ds_train.py derives itself from --layers/--hidden/--heads (no --kv-heads / --ffn):
    KV heads gcd(plan KV heads, heads), FFN scaled with the width to a multiple of 8."""
    s = built_shape(setup.shape, "deepspeed")
    ffn = max(8, int(round(plan_shape.ffn_hidden_size * (s.hidden_size / plan_shape.hidden_size) / 8)) * 8)
    return replace(s, num_kv_heads=math.gcd(plan_shape.num_kv_heads, s.num_attention_heads), ffn_hidden_size=ffn)


# ------------------------------------------------------------------------------------------- reading results
def parse_steps(lines: list[str]) -> tuple[list[float], list[float]]:
    losses, times = [], []
    for line in lines:
        m = _STEP.match(line)
        if m:
            losses.append(float(m.group(3)))
            times.append(float(m.group(4)))
    return losses, times


def fsdp_summary(lines: list[str]) -> dict[str, Any] | None:
    for line in reversed(lines):
        if line.startswith("{") and "dtc_fsdp_summary" in line:
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def read_probe(folder: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for path in sorted(folder.glob("rank*.json")):
        try:
            rec = json.loads(path.read_text())
            out[int(rec["rank"])] = rec
        except (OSError, ValueError, KeyError):
            continue
    return out


def rank_measures(summary_ranks: list[dict[str, Any]], probe: dict[int, dict[str, Any]], world: int,
                  device: str) -> list[RankMeasure]:
    by_rank = {int(r["rank"]): r for r in summary_ranks}
    out = []
    for rank in range(world):
        s, p = by_rank.get(rank, {}), probe.get(rank, {})
        if not s and not p:
            continue
        optimizer = s.get("optimizer_bytes")
        if optimizer is None and "optimizer_bytes" in p:
            optimizer = p["optimizer_bytes"] + p.get("master_bytes", 0)
        m = RankMeasure(rank=rank, param_bytes=s.get("param_bytes", p.get("param_bytes")),
                        grad_bytes=s.get("grad_bytes"), optimizer_bytes=optimizer,
                        activation_bytes=p.get("saved_activation_peak_bytes"), rss_bytes=p.get("rss_peak_bytes"))
        if device == "cuda":
            m.peak_bytes = s.get("peak_memory_bytes", p.get("cuda_peak_bytes"))
        else:
            parts = [m.param_bytes, m.grad_bytes, m.optimizer_bytes, m.activation_bytes]
            m.peak_bytes = sum(x for x in parts if x is not None) if m.param_bytes is not None else None
        out.append(m)
    return out


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
def run_fsdp(ctx: RunContext) -> TargetResult:
    setup = ctx.setup
    log_dir = ctx.workdir / "logs-fsdp"
    argv = torchrun_argv(setup.world_size, log_dir) + [str(ctx.generated_dir / "fsdp_train.py")] + fsdp_args(setup)
    result = TargetResult("fsdp", "failed", launched=True, command=shlex.join(argv), steps_requested=setup.steps)
    if setup.plan_precision == "fp16" and setup.precision != "fp16":
        result.notes.append("fsdp_train.py has no dtype override: it keeps the plan's fp16 parameters")
    launch = run_launch(ctx, "fsdp", argv, log_dir)
    summary = fsdp_summary(launch.lines) or {}
    losses, times = parse_steps(launch.lines)
    result.losses = [float(x) for x in summary.get("losses", losses)]
    result.steps_done = int(summary.get("steps", len(losses)))
    if "mean_step_time_s_after_first" in summary:
        result.step_time_s = float(summary["mean_step_time_s_after_first"])
    elif times:
        result.step_time_s = sum(times[1:] or times) / len(times[1:] or times)
    result.wall_s = launch.wall_s
    result.ranks = rank_measures(summary.get("ranks", []), read_probe(ctx.workdir / "measure-fsdp"),
                                 setup.world_size, setup.device)
    judge(result, launch)
    if result.status == "passed" and not summary:
        result.status, result.reason = "failed", "fsdp_train.py printed no dtc_fsdp_summary line"
    return result


def run_deepspeed(ctx: RunContext) -> TargetResult:
    setup = ctx.setup
    log_dir = ctx.workdir / "logs-deepspeed"
    cfg = json.loads((ctx.generated_dir / "ds_config.json").read_text())
    smoke_cfg, changes = smoke_ds_config(cfg, setup)
    config = ctx.workdir / "ds_config.smoke.json"
    config.write_text(json.dumps(smoke_cfg, indent=2, sort_keys=True) + "\n")
    pipeline = "pipeline" in smoke_cfg
    argv = (torchrun_argv(setup.world_size, log_dir) + [str(ctx.generated_dir / "ds_train.py")]
            + ds_args(setup, config, pipeline=pipeline))
    result = TargetResult("deepspeed", "failed", launched=True, command=shlex.join(argv),
                          steps_requested=setup.steps, changes=[c.to_dict() for c in changes])
    if pipeline:
        own = ds_own_shape(setup, ModelShape.from_dict(dict(ctx.plan.model["shape"])))
        result.model_shape = own.to_dict()
        result.notes.append(f"pipeline: ds_train.py builds its own PipelineModule ({own.num_attention_heads} heads / "
                            f"{own.num_kv_heads} KV heads, FFN {own.ffn_hidden_size})")
    if setup.device == "cpu":
        result.notes.append("CPU: ds_train.py uses torch's AdamW (no fused_adam / cpu_adam JIT build) and skips "
                            "the shared-memory allreduce op")
    removed = L.clear_stale_locks(L.extensions_dir())
    if removed:
        result.notes.append("removed stale JIT lock(s): " + ", ".join(str(p) for p in removed))
    launch = run_launch(ctx, "deepspeed", argv, log_dir, extra_env={"DTC_SMOKE_DS_CONFIG": str(config)})
    result.losses, times = parse_steps(launch.lines)
    result.steps_done = len(result.losses)
    if times:
        result.step_time_s = sum(times[1:] or times) / len(times[1:] or times)
    result.wall_s = launch.wall_s
    result.ranks = rank_measures([], read_probe(ctx.workdir / "measure-deepspeed"), setup.world_size, setup.device)
    judge(result, launch)
    return result


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
MEGATRON_DROP = ("--save", "--load", "--data-path", "--tensorboard-dir", "--wandb-project")


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
