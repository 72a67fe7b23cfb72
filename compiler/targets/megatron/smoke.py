"""`dtc smoke` for Megatron-LM: pretrain_gpt.py under torchrun with megatron_args.sh's flags, scaled down.

Only where GPUs and a Megatron-LM checkout are present (``skip_reason`` says what is missing).
"""
from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from compiler.plan import Plan
from compiler.smoke.report import TargetResult
from compiler.smoke.scale import SmokeSetup
from compiler.smoke.targets import RunContext, judge, run_launch, torchrun_argv
from compiler.split import layer_split
from compiler.targets.megatron.render import pipeline_flags


def skip_reason(plan: Plan, gpu_count: int) -> str | None:
    if gpu_count == 0:
        return "Megatron-LM needs CUDA GPUs; none here"
    pretrain = Path(str(plan.slurm.megatron_dir)) / "pretrain_gpt.py"
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


def run_megatron(ctx: RunContext, target: str = "megatron") -> TargetResult:
    """Only reached with GPUs and a Megatron-LM checkout (not exercised on CPU-only CI)."""
    setup = ctx.setup
    log_dir = ctx.workdir / "logs-megatron"
    pretrain = Path(str(ctx.plan.slurm.megatron_dir)) / "pretrain_gpt.py"
    flags = megatron_flags(read_megatron_args(ctx.generated_dir), setup)
    argv = torchrun_argv(setup.world_size, log_dir) + [str(pretrain)] + flags
    result = TargetResult("megatron", "failed", launched=True, command=shlex.join(argv), steps_requested=setup.steps)
    launch = run_launch(ctx, "megatron", argv, log_dir, extra_env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    losses = [float(m.group(1)) for line in launch.all_lines
              for m in [re.search(r"lm loss: ([0-9.Ee+-]+)", line)] if m]
    result.losses, result.steps_done, result.wall_s = losses, len(losses), launch.wall_s
    judge(result, launch)
    return result
