"""The Megatron target of ``dtc smoke``: the generated megatron_args.sh through Megatron-LM's own training loop.

    run_megatron_smoke(ctx, slurm=False) -> TargetResult

1. The artifact's arguments are read as bash reads them (``source megatron_args.sh`` with
   CHECKPOINT_DIR set to a private folder; its CUDA_DEVICE_MAX_CONNECTIONS export or unset is
   kept for the launch).
2. ``megatron_smoke_args`` rewrites them for the smoke world (``compiler.smoke.scale``'s
   SmokeSetup: degrees, reduced model, batch, steps) and, without GPUs, for the CPU path
   (local transformer implementation, gloo, CPU initialisation, fusions off). Every rewrite is
   a ``Change``, listed in the report; what cannot run on CPU (context parallel, fp8 /
   Transformer Engine, expert-TP > 1, Megatron-FSDP, optimizer CPU offload) is a skipped *part*: its degree or
   feature is mapped to what runs, and the rest of the layout still runs. Every other
   argument is the artifact's.
3. ``torchrun -m compiler.targets.megatron.pretrain`` runs them: megatron.training.pretrain with
   pretrain_gpt.py's providers (compiler/targets/megatron/pretrain.py). Each rank first checks the
   artifact's *unscaled* arguments with Megatron's own parser, validate_args and
   TransformerConfig at the plan's world size, so a defect the scale-down would hide (a global batch the real dp does not
   divide, a layer split Megatron rejects) fails with Megatron's own message.
4. Megatron's own log lines are read back: the per-iteration line of training.py training_log
   (``iteration N/ M | ... | elapsed time per iteration (ms): T | ... | lm loss: L |``), the
   memory report of training/utils/common_utils.py report_memory (``[Rank R] (after N
   iterations) memory (MB) | allocated: ... | max allocated: ...``), and the worker's
   per-rank ``dtc_megatron_rank`` record (parameter / gradient / optimizer bytes).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from compiler.layout import Layout
from compiler.model import ModelShape
from compiler.plan import Plan
from compiler.smoke import launch as L
from compiler.smoke import slurm as S
from compiler.smoke.report import RankMeasure, TargetResult
from compiler.smoke.scale import Change, SmokeSetup, smoke_ep
from compiler.split import SPLIT_FLAGS
from compiler.targets import registry
from compiler.targets.megatron.render import ARGS_FILE, cuda_arch

WORKER_MODULE = "compiler.targets.megatron.pretrain"
PLAN_ARGS_ENV = "DTC_SMOKE_MEGATRON_PLAN_ARGS"  # the unscaled arguments (JSON), checked by every rank
PLAN_WORLD_ENV = "DTC_SMOKE_MEGATRON_PLAN_WORLD"
PLAN_CONNECTIONS_ENV = "DTC_SMOKE_MEGATRON_PLAN_CONNECTIONS"  # the artifact's own, for that check
EXPERT_TP = "expert tensor parallel"  # the skipped part of a tp > 1 MoE plan on CPU (_cpu_parts)
PLAN_CONFIG_ARGS_ENV = "DTC_SMOKE_MEGATRON_PLAN_CONFIG_ARGS"  # {"args", "connections", "world"}: same, CPU path
SUMMARY_KEY = "dtc_megatron_rank"
UNSET = "<unset>"

_ITERATION = re.compile(r"\biteration\s+(\d+)/\s*(\d+) \|.*?elapsed time per iteration \(ms\): ([0-9.]+)"
                        r".*?\| lm loss: ([-+0-9.Ee]+|nan|inf) \|")
_MEMORY = re.compile(r"^\[Rank (\d+)\] \(after \d+ iterations\) memory \(MB\) \| allocated: ([0-9.]+) \| "
                     r"max allocated: ([0-9.]+)")
_PREFIX = re.compile(r"^\[(?:default)?\d+\]:")

# the CPU path (what-runs-here 3b): no Transformer Engine or apex; gloo; weights initialised on
# the host; every fused kernel off (they are CUDA kernels or torch.compile'd ones)
CPU_FLAGS: tuple[tuple[str, str | None, str], ...] = (
    ("--transformer-impl", "local", "Transformer Engine is CUDA-only: megatron-core's local (torch) layers"),
    ("--distributed-backend", "gloo", "no NCCL without GPUs"),
    ("--use-cpu-initialization", None, "weights are initialised on the host (the same values on every layout)"),
    ("--no-gradient-accumulation-fusion", None, "the fused wgrad accumulation is a CUDA kernel"),
    ("--no-masked-softmax-fusion", None, "fused softmax is a CUDA kernel"),
    ("--no-bias-gelu-fusion", None, "fused kernel off on CPU"),
    ("--no-bias-swiglu-fusion", None, "fused kernel off on CPU"),
    ("--no-bias-dropout-fusion", None, "fused kernel off on CPU"),
    ("--no-rope-fusion", None, "fused RoPE is a Transformer Engine / CUDA kernel"),
    ("--no-persist-layer-norm", None, "persistent layer norm is an apex CUDA kernel"),
)
# validate_args' minimum Transformer Engine versions (--fp4-format: "requires Transformer Engine >= 2.7.0.dev0"): a
# machine without TE (the CPU path, the validator) cannot meet them, the GPU machine the plan names does (its notes
# say which TE); the rest of validate_args is checked with them passing (validate_args_past_te_version)
TE_VERSION_ERR = re.compile(r"requires transformer engine >= ?[0-9]", re.IGNORECASE)


def validate_args_past_te_version(A: Any, args: Any, defaults: dict[str, Any]) -> tuple[Any, ValueError | None]:
    """megatron-core's ``A.validate_args(args, defaults)`` (``A``: megatron.training.arguments). Where it stops only at
    a minimum Transformer Engine version (TE_VERSION_ERR) on a machine without TE, the rest of it runs on an
    unvalidated copy of ``args`` (validate_args edits them) with that check passing. (the arguments validated, the
    skipped check's error or None); any other error propagates."""
    import copy
    import importlib.util

    fresh = copy.deepcopy(args)
    try:
        A.validate_args(args, defaults)
        return args, None
    except ValueError as exc:
        if not TE_VERSION_ERR.search(str(exc)) or importlib.util.find_spec("transformer_engine") is not None:
            raise
        skipped = exc
    saved = A.is_te_min_version
    A.is_te_min_version = lambda *a, **k: True
    try:
        A.validate_args(fresh, defaults)
    finally:
        A.is_te_min_version = saved
    return fresh, skipped


QUANTISED_GEMM_FLAGS = ("--fp8-format", "--fp8-recipe", "--fp8-amax-history-len", "--fp8-amax-compute-algo", "--fp8-param-gather",
             "--fp4-format", "--fp4-recipe", "--fp4-param-gather")
FSDP_FLAGS = ("--use-megatron-fsdp", "--data-parallel-sharding-strategy", "--ckpt-format")
# what render.py writes for offload_optimizer=cpu (the precision-aware optimizer is Transformer Engine's FusedAdam)
OFFLOAD_FLAGS = ("--optimizer-cpu-offload", "--use-precision-aware-optimizer", "--optimizer-offload-fraction")
OPTIMIZER_OFFLOAD = "optimizer CPU offload"  # the skipped part of an offload_optimizer=cpu plan on CPU


@dataclass
class MegatronArgs:
    """The smoke's arguments for the worker, and everything it changed."""

    args: list[str]
    env: dict[str, str | None]  # CUDA_DEVICE_MAX_CONNECTIONS: a value, or None for unset
    plan_env: dict[str, str | None] = field(default_factory=dict)  # the artifact's own
    changes: list[Change] = field(default_factory=list)
    skipped: list[Change] = field(default_factory=list)  # parts of the layout that cannot run here
    layout: Layout | None = None  # the layout that runs (the prediction's)
    shape: ModelShape | None = None


# ------------------------------------------------------------------------------------------- reading
def read_megatron_args(generated_dir: Path, checkpoint_dir: Path) -> tuple[list[str], dict[str, str | None]]:
    """MEGATRON_ARGS and the CUDA_DEVICE_MAX_CONNECTIONS the file leaves, as bash sees them."""
    script = (f'source {shlex.quote(str(generated_dir / ARGS_FILE))} || exit 3; '
              f'printf "%s\\0" "${{CUDA_DEVICE_MAX_CONNECTIONS-{UNSET}}}" "${{MEGATRON_ARGS[@]}}"')
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    env["CHECKPOINT_DIR"] = str(checkpoint_dir)
    r = subprocess.run(["bash", "-c", script], capture_output=True, timeout=30, env=env, cwd=generated_dir)
    if r.returncode != 0:
        raise ValueError(f"sourcing {ARGS_FILE} failed (exit {r.returncode}): "
                         f"{r.stderr.decode(errors='replace').strip()}")
    tokens = [t.decode() for t in r.stdout.split(b"\0")[:-1]]
    connections = tokens[0]
    return tokens[1:], {"CUDA_DEVICE_MAX_CONNECTIONS": None if connections == UNSET else connections}


def split_flags(args: list[str]) -> list[tuple[str, list[str]]]:
    """[(--flag, [values...])] in order; values are the tokens up to the next ``--`` token."""
    out: list[tuple[str, list[str]]] = []
    for tok in args:
        if tok.startswith("--") or not out:
            out.append((tok, []))
        else:
            out[-1][1].append(tok)
    return out


def join_flags(flags: list[tuple[str, list[str]]]) -> list[str]:
    return [tok for flag, values in flags for tok in (flag, *values)]


# ------------------------------------------------------------------------------------------- scaling
def _scaled_values(setup: SmokeSetup, ep: int) -> dict[str, Any]:
    """flag -> the smoke's value (None: drop the flag) for every flag the scale-down rewrites."""
    from compiler.targets.megatron.render import moe_layer_pattern, window_values

    d, s = setup.degrees, setup.shape
    values: dict[str, Any] = {
        "--tensor-model-parallel-size": d.tp, "--pipeline-model-parallel-size": d.pp,
        "--context-parallel-size": d.cp if d.cp > 1 else None,
        "--num-virtual-stages-per-pipeline-rank": d.vpp if d.vpp > 1 else None,
        "--num-layers-per-virtual-pipeline-stage": s.num_layers // (d.pp * d.vpp) if d.vpp > 1 else None,
        "--expert-model-parallel-size": ep if ep > 1 else None,
        "--num-distributed-optimizer-instances": d.dp_replicate if d.dp_replicate > 1 else None,
        "--num-layers": s.num_layers, "--hidden-size": s.hidden_size, "--ffn-hidden-size": s.ffn_hidden_size,
        "--num-attention-heads": s.num_attention_heads, "--num-query-groups": s.num_kv_heads,
        "--kv-channels": s.kv_channels, "--seq-length": setup.seq_len,
        "--max-position-embeddings": max(setup.seq_len, s.max_position_embeddings),
        "--vocab-size": s.vocab_size, "--micro-batch-size": setup.micro_batch,
        "--global-batch-size": setup.global_batch, "--train-iters": setup.steps,
        "--lr-warmup-iters": 1, "--lr-decay-iters": setup.steps, "--log-interval": 1,
        # model.init's converted checkpoint is of the full model, which the smoke scales down
        "--pretrained-checkpoint": None,
        # a window shorter than the smoke's sequence, so the windowed layers really mask (scale.reduce_shape)
        **window_values(s),
    }
    for flag in SPLIT_FLAGS:
        values[flag] = None
    if not (setup.layout.sequence_parallel and d.tp > 1):
        values["--sequence-parallel"] = None
    if s.moe is not None:
        m = s.moe
        pattern = [int(s.is_moe_layer(i)) for i in range(s.num_layers)]
        values.update({"--num-experts": m.num_experts, "--moe-router-topk": m.top_k,
                       "--moe-ffn-hidden-size": m.expert_ffn_hidden_size,
                       "--moe-shared-expert-intermediate-size": (m.num_shared_experts * m.shared_ffn
                                                                 if m.num_shared_experts else None),
                       "--moe-layer-freq": moe_layer_pattern(pattern) if not all(pattern) else None})
    if s.mla is not None:
        values.update({"--q-lora-rank": s.mla.q_lora_rank or None, "--kv-lora-rank": s.mla.kv_lora_rank,
                       "--qk-head-dim": s.mla.qk_nope_head_dim, "--qk-pos-emb-head-dim": s.mla.qk_rope_head_dim,
                       "--v-head-dim": s.mla.v_head_dim})
    return values


_WHY = {
    "--tensor-model-parallel-size": "parallel degrees of the smoke world", "--num-layers": "the reduced model",
    "--global-batch-size": "micro-batch x accumulation x smoke dp", "--train-iters": "the smoke's steps",
    "--lr-warmup-iters": "the learning-rate schedule fitted to the smoke's steps",
    "--lr-decay-iters": "the learning-rate schedule fitted to the smoke's steps",
    "--log-interval": "a loss line for every iteration",
    "--pretrained-checkpoint": "the converted model.init is the full model; the smoke trains the reduced one",
    **{flag: "the reduced model's layers split evenly over the pipeline" for flag in SPLIT_FLAGS},
    "--sequence-parallel": "tensor parallel was dropped",
}


def _why(flag: str) -> str:
    if flag in _WHY:
        return _WHY[flag]
    if flag.startswith(("--pipeline", "--num-virtual", "--context", "--expert-model", "--num-distributed",
                        "--num-layers-per")):
        return "parallel degrees of the smoke world"
    if flag in ("--micro-batch-size",):
        return "the smoke batch"
    return "the reduced model"


def megatron_smoke_args(args: list[str], env: dict[str, str | None], setup: SmokeSetup,
                        plan_layout: Layout) -> MegatronArgs:
    """The artifact's arguments rewritten for the smoke world (and the CPU path without GPUs)."""
    cpu = setup.device == "cpu"
    flags = split_flags(args)
    present = {f for f, _ in flags}
    ep = smoke_ep(plan_layout, setup.degrees) if "--num-experts" in present else 1
    values = _scaled_values(setup, ep)
    out = MegatronArgs(args=[], env=dict(env), plan_env=dict(env))
    drop, add = _cpu_parts(flags, setup.degrees.tp, out) if cpu else (set(), [])
    rewritten: list[tuple[str, list[str]]] = []
    for flag, vals in flags:
        if flag in drop:
            continue
        if flag not in values:
            rewritten.append((flag, vals))
            continue
        new, old = values[flag], " ".join(vals) if vals else "on"
        if new is None:
            out.changes.append(Change(flag, old, "(dropped)", _why(flag)))
            continue
        if vals and [str(new)] != vals:
            out.changes.append(Change(flag, old, str(new), _why(flag)))
        rewritten.append((flag, [str(new)] if vals else []))
    vpp = "--num-virtual-stages-per-pipeline-rank"
    if "--pipeline-model-parallel-layout" in present and vpp not in present and setup.degrees.vpp > 1:
        # an explicit layout sets the virtual stages itself; the even split of the reduced model needs the flag
        rewritten.append((vpp, [str(setup.degrees.vpp)]))
        out.changes.append(Change(vpp, "(the layout's)", str(setup.degrees.vpp), _why(vpp)))
    for flag in ("--train-iters", "--log-interval", "--lr-decay-iters"):
        if flag not in present:
            rewritten.append((flag, [str(values[flag])]))
            out.changes.append(Change(flag, "(default)", str(values[flag]), _why(flag)))
    rewritten += add
    if cpu:
        _cpu_flags(rewritten, out)
    out.args = join_flags(rewritten)
    zero = 1 if cpu and "--use-megatron-fsdp" in present else setup.layout.zero_stage
    etp = next((int(v[0]) for f, v in reversed(rewritten) if f == "--expert-tensor-parallel-size"), None)
    out.layout = replace(setup.layout, ep=ep, zero_stage=zero, etp=etp)  # the expert TP degree that runs
    if any(c.what == OPTIMIZER_OFFLOAD for c in out.skipped):
        out.layout = out.layout.with_(offload_optimizer="none")
    out.shape = setup.shape
    return out


def _cpu_parts(flags: list[tuple[str, list[str]]], tp: int, out: MegatronArgs) \
        -> tuple[set[str], list[tuple[str, list[str]]]]:
    """What of the layout cannot run on CPU, each mapped to what runs and recorded as a skipped
    part: (flags to drop, flags to add)."""
    vals = dict(flags)
    drop: set[str] = set()
    add: list[tuple[str, list[str]]] = []

    def shown(names: list[str]) -> str:
        return " ".join(join_flags([(f, vals[f]) for f in names]))

    if vals.get("--context-parallel-size", ["1"]) != ["1"]:
        drop.add("--context-parallel-size")
        out.skipped.append(Change("context parallel", shown(["--context-parallel-size"]), "cp=1",
                                  "skipped on CPU: megatron-core's attention for cp > 1 is Transformer Engine's "
                                  "(core/transformer/dot_product_attention.py:59 asserts it)"))
    quantised = [f for f in QUANTISED_GEMM_FLAGS if f in vals]
    if quantised:
        drop.update(quantised)
        low = "nvfp4" if "--fp4-format" in vals else "fp8"
        out.skipped.append(Change(low, shown(quantised), "(bf16 GEMMs)",
                                  f"skipped on CPU: {low} GEMMs are Transformer Engine CUDA kernels"))
    if "--use-megatron-fsdp" in vals:
        fsdp = [f for f in FSDP_FLAGS if f in vals]
        drop.update(fsdp)
        if "--use-distributed-optimizer" not in vals:
            add.append(("--use-distributed-optimizer", []))
        out.skipped.append(Change(
            "Megatron-FSDP", shown(fsdp), "--use-distributed-optimizer",
            "skipped on CPU: Megatron-FSDP builds its buffers on cuda:<current device> "
            "(core/distributed/fsdp/mcore_fsdp_adapter.py:156); the distributed optimizer (ZeRO-1) shards the "
            "optimizer states instead"))
        connections = "1" if tp > 1 else None
        if out.env.get("CUDA_DEVICE_MAX_CONNECTIONS") != connections:
            out.env["CUDA_DEVICE_MAX_CONNECTIONS"] = connections
            out.changes.append(Change("CUDA_DEVICE_MAX_CONNECTIONS", "(unset, as Megatron-FSDP requires)",
                                      connections or "(unset)", "tensor parallel without Megatron-FSDP requires 1 "
                                                                "(training/arguments.py:1437)"))
    if "--optimizer-cpu-offload" in vals:
        offload = [f for f in OFFLOAD_FLAGS if f in vals]
        drop.update(offload)
        out.skipped.append(Change(
            OPTIMIZER_OFFLOAD, shown(offload), "(the optimizer where the parameters are)",
            "skipped on CPU: Megatron's HybridDeviceOptimizer copies gradients and parameters between CUDA streams "
            "(core/optimizer/cpu_offloading/hybrid_optimizer.py _set_sub_optimizer_grads) and the precision-aware "
            "optimizer is Transformer Engine's FusedAdam; on CPU the optimizer states are in host memory anyway"))
    if "--num-experts" in vals:
        etp = vals.get("--expert-tensor-parallel-size", [str(tp)])[0]  # Megatron's default: tp
        if etp != "1":
            drop.add("--expert-tensor-parallel-size")
            add.append(("--expert-tensor-parallel-size", ["1"]))
            out.skipped.append(Change(EXPERT_TP, f"etp={etp}", "etp=1",
                                      "skipped on CPU: expert-TP > 1 all-gathers uneven token counts, which gloo "
                                      "rejects (core/tensor_parallel/mappings.py:154)"))
    return drop, add


def cpu_path_args(args: list[str], env: dict[str, str | None], tp: int) -> tuple[list[str], str | None]:
    """The artifact's arguments with only the CPU path's changes (no scale-down), and the
    CUDA_DEVICE_MAX_CONNECTIONS they need: what the plan-scale model-build check parses on a
    machine without GPUs."""
    flags = split_flags(args)
    scratch = MegatronArgs(args=[], env=dict(env))
    drop, add = _cpu_parts(flags, tp, scratch)
    kept = [(f, v) for f, v in flags if f not in drop] + add
    _cpu_flags(kept, scratch)
    return join_flags(kept), scratch.env.get("CUDA_DEVICE_MAX_CONNECTIONS")


def _cpu_flags(rewritten: list[tuple[str, list[str]]], out: MegatronArgs) -> None:
    """Set each of CPU_FLAGS (replacing the artifact's value where it has the flag)."""
    index = {f: i for i, (f, _) in enumerate(rewritten)}
    for flag, value, why in CPU_FLAGS:
        new = [value] if value is not None else []
        if flag in index:
            old = rewritten[index[flag]][1]
            if old != new:
                rewritten[index[flag]] = (flag, new)
                out.changes.append(Change(flag, " ".join(old) or "on", value or "on", why))
        else:
            rewritten.append((flag, new))
            out.changes.append(Change(flag, "(default)", value or "on", why))


# ------------------------------------------------------------------------------------------- results
@dataclass
class MegatronLog:
    losses: list[float] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)
    iterations: list[int] = field(default_factory=list)
    memory_max_allocated: dict[int, int] = field(default_factory=dict)  # rank -> bytes
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> dtc_megatron_rank record


def parse_megatron_log(lines: list[str]) -> MegatronLog:
    """Megatron's iteration and memory lines and the worker's per-rank records (any rank's output)."""
    log = MegatronLog()
    for raw in lines:
        line = _PREFIX.sub("", raw, count=1).strip()
        m = _ITERATION.search(line)
        if m:
            it = int(m.group(1))
            if it in log.iterations:
                continue
            log.iterations.append(it)
            log.step_times_s.append(float(m.group(3)) / 1000.0)
            log.losses.append(float(m.group(4)))
            continue
        m = _MEMORY.match(line)
        if m:
            rank, peak = int(m.group(1)), int(float(m.group(3)) * 2**20)
            log.memory_max_allocated[rank] = max(peak, log.memory_max_allocated.get(rank, 0))
            continue
        if line.startswith("{") and SUMMARY_KEY in line:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            log.ranks[int(record["rank"])] = record
    _unaverage_second_line(log)
    return log


def _unaverage_second_line(log: MegatronLog) -> None:
    """Megatron does not reset its loss and timer sums after a process's first logged iteration
    (training/training.py:2594 ``should_reset = not is_first_iteration``, used at 2824 and 2883),
    so with --log-interval 1 the second line reports the mean of the process's first two
    iterations, fresh or resumed (NVIDIA/Megatron-LM issue 6237). Each launch is one process:
    its second value is recovered as 2 x logged - first."""
    if len(log.iterations) >= 2 and log.iterations[1] == log.iterations[0] + 1:
        log.losses[1] = 2 * log.losses[1] - log.losses[0]
        log.step_times_s[1] = max(0.0, 2 * log.step_times_s[1] - log.step_times_s[0])


def rank_measures(log: MegatronLog, world: int) -> list[RankMeasure]:
    """Per rank: parameters, gradient buffers, optimizer states + fp32 masters, saved activations;
    peak: Megatron's 'max allocated' (GPU) or the sum of the parts (CPU, where rss is the process's)."""
    out = []
    for rank in range(world):
        r = log.ranks.get(rank)
        if r is None:
            continue
        m = RankMeasure(rank=rank, param_bytes=r.get("param_bytes"), grad_bytes=r.get("grad_bytes"),
                        optimizer_bytes=(r.get("optimizer_bytes") or 0) + (r.get("master_bytes") or 0),
                        activation_bytes=r.get("saved_activation_bytes"))
        if r.get("device") == "cuda":
            m.peak_bytes = log.memory_max_allocated.get(rank, r.get("peak_memory_bytes"))
        else:
            m.rss_bytes = r.get("peak_memory_bytes")
            m.peak_bytes = sum(x or 0 for x in (m.param_bytes, m.grad_bytes, m.optimizer_bytes, m.activation_bytes))
        out.append(m)
    return out


# ------------------------------------------------------------------------------------------- running
def worker_env(run: MegatronArgs, plan_args: list[str], plan: Plan, device: str) -> dict[str, str]:
    """What the worker processes get on top of the launch environment."""
    from compiler.targets.megatron.cpu import ARCH_ENV  # (imports torch: not at module level)

    plan_layout = plan.layout
    planned = run.plan_env.get("CUDA_DEVICE_MAX_CONNECTIONS")
    env = {PLAN_ARGS_ENV: json.dumps(plan_args), PLAN_WORLD_ENV: str(plan_layout.world_size),
           PLAN_CONNECTIONS_ENV: UNSET if planned is None else planned}
    if device == "cpu":
        # the CPU layer answers the plan's GPU architecture to Megatron's probes: its validate_args applies that
        # GPU's rules to the artifact (no CUDA_DEVICE_MAX_CONNECTIONS=1 requirement from Blackwell on)
        env[ARCH_ENV] = str(cuda_arch(plan.cluster.generation))
        args, connections = cpu_path_args(plan_args, run.plan_env, plan_layout.tp)
        # checked at the world of the CPU path's own cp (_cpu_parts drops it), so that Megatron's data-parallel size,
        # and every batch check on it, stays the plan's (at the plan's world, dp would grow by the dropped cp)
        cp = int(dict(split_flags(args)).get("--context-parallel-size", ["1"])[0])
        env[PLAN_CONFIG_ARGS_ENV] = json.dumps({"args": args, "connections": UNSET if connections is None
                                                else connections,
                                                "world": str(plan_layout.world_size // plan_layout.cp * cp)})
    value = run.env.get("CUDA_DEVICE_MAX_CONNECTIONS")
    if value is not None:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = value
    return env


def prepare(ctx) -> tuple[MegatronArgs, list[str]]:
    """(the smoke's arguments, the artifact's own) for ``ctx``."""
    checkpoints = ctx.workdir / "megatron-checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    plan_args, env = read_megatron_args(ctx.generated_dir, checkpoints)
    return megatron_smoke_args(plan_args, env, ctx.setup, ctx.plan.layout), plan_args


def worker_argv(ctx, run: MegatronArgs, log_dir: Path) -> list[str]:
    from compiler.smoke.targets import torchrun_argv

    return torchrun_argv(ctx.setup.world_size, log_dir) + ["-m", WORKER_MODULE] + run.args


def run_megatron(ctx, target: str = "megatron", *, slurm: bool = False) -> TargetResult:
    """The target's smoke hook (compiler.targets.base.SmokeHooks, ``complete``)."""
    return run_megatron_smoke(ctx, slurm=slurm)


def run_megatron_smoke(ctx, *, slurm: bool = False, extra_args: tuple[str, ...] = ()) -> TargetResult:
    """Run the generated megatron_args.sh through Megatron-LM's training loop on the smoke world."""
    from compiler.smoke import targets as T

    setup: SmokeSetup = ctx.setup
    try:
        run, plan_args = prepare(ctx)
    except (ValueError, OSError, subprocess.SubprocessError) as exc:
        return TargetResult("megatron", "failed", reason=str(exc), steps_requested=setup.steps)
    run.args += list(extra_args)
    if slurm:
        result = run_slurm_megatron(ctx, run, worker_env(run, plan_args, ctx.plan, setup.device))
    else:
        log_dir = ctx.workdir / "logs-megatron"
        argv = worker_argv(ctx, run, log_dir)
        result = TargetResult("megatron", "failed", launched=True, command=shlex.join(argv),
                              steps_requested=setup.steps)
        launch = launch_local(ctx, argv, log_dir, worker_env(run, plan_args, ctx.plan, setup.device))
        fill_result(result, launch.all_lines, setup, rank_stdout=L.rank_logs(log_dir, "stdout"))
        result.wall_s = launch.wall_s
        T.judge(result, launch)
    describe(result, run, setup)
    predict(result, run, setup)
    return result


def launch_local(ctx, argv: list[str], log_dir: Path, extra_env: dict[str, str]) -> L.LaunchResult:
    """torchrun with the launch environment of every target; CUDA_DEVICE_MAX_CONNECTIONS only as
    the artifact leaves it (megatron_args.sh exports it, or unsets it for Megatron-FSDP)."""
    from compiler.smoke.targets import rank_env

    env = rank_env(ctx, "megatron")
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    env.update(extra_env)
    spec = L.LaunchSpec(argv=argv, env=env, cwd=ctx.generated_dir, log_dir=log_dir, timeout_s=ctx.timeout_s,
                        setup_timeout_s=min(ctx.timeout_s, L.LaunchSpec.setup_timeout_s),
                        stall_timeout_s=min(ctx.timeout_s, L.LaunchSpec.stall_timeout_s))
    on_line = (lambda line: ctx.on_line("[megatron] " + line)) if ctx.on_line else None
    return L.run_launch(spec, on_line=on_line)


def fill_result(result: TargetResult, lines: list[str], setup: SmokeSetup,
                rank_stdout: dict[int, Path] | None = None) -> MegatronLog:
    """``lines``: the console; ``rank_stdout``: each rank's own stdout.log (torchrun --log-dir), whose
    records a console line can lose when two ranks' output meet on it."""
    log = parse_megatron_log(lines)
    if rank_stdout and len(log.ranks) < setup.world_size:  # a console line lost a rank's record
        for path in rank_stdout.values():
            try:
                own = parse_megatron_log(path.read_text(errors="replace").splitlines())
            except OSError:
                continue
            for rank, record in own.ranks.items():
                log.ranks.setdefault(rank, record)
    result.losses, result.steps_done = log.losses, len(log.losses)
    if log.step_times_s:
        after_first = log.step_times_s[1:] or log.step_times_s
        result.step_time_s = sum(after_first) / len(after_first)
    result.ranks = rank_measures(log, setup.world_size)
    return log


def describe(result: TargetResult, run: MegatronArgs, setup: SmokeSetup) -> None:
    result.changes = [{"what": "megatron_args " + c.what, "plan": c.plan, "smoke": c.smoke, "why": c.why}
                      for c in run.changes]
    result.changes += [{"what": "skipped part: " + c.what, "plan": c.plan, "smoke": c.smoke, "why": c.why}
                       for c in run.skipped]
    moe = setup.shape.moe
    if run.layout is not None and run.layout.ep > 1 and moe is not None:
        result.notes.append(f"experts run for real: ep={run.layout.ep}, {moe.num_experts} experts "
                            f"(the setup's ep -> 1 is the dense fsdp/deepspeed reference models')")
    if setup.device == "cpu":
        result.notes.append("CPU: megatron-core runs through compiler/targets/megatron/cpu.py (the CUDA-to-CPU "
                            "layer of the smoke worker processes); Megatron's memory lines report each "
                            "process's resident set there")
    result.model_shape = setup.shape.to_dict()


def predict(result: TargetResult, run: MegatronArgs, setup: SmokeSetup) -> None:
    """The cost model's memory for the layout and model that ran (same machinery as the others)."""
    from compiler.smoke.predict import compare, judge, predict_memory

    if result.status == "skipped" or run.layout is None:
        return
    ran = replace(setup, layout=run.layout)
    memory = predict_memory(ran, setup.shape, "megatron")
    if isinstance(memory, str):
        result.prediction_note = memory
        return
    result.comparisons = compare(memory, result.ranks, host_offload=setup.device == "cpu",
                                 gpus_on_a_node=run.layout.gpus_on_a_node)
    judge(result)


# ------------------------------------------------------------------------------------------- dtc smoke --slurm
_MEGATRON_DIR_LINE = re.compile(r"^MEGATRON_DIR=.*$", re.M)
_NTASKS_PER_NODE = re.compile(r"^#SBATCH --ntasks-per-node=\d+$", re.M)
STAND_IN = '''\
# dtc smoke: Megatron-LM's pretrain_gpt.py for this job is the smoke worker (the same providers,
# megatron.training.pretrain from the installed megatron-core; compiler/targets/megatron/pretrain.py).
import runpy

runpy.run_module("compiler.targets.megatron.pretrain", run_name="__main__", alter_sys=True)
'''


def megatron_job_files(ctx, run, job_dir: Path) -> tuple[Path, Path]:
    """(the artifact folder the job sources, the MEGATRON_DIR it runs pretrain_gpt.py from): the
    smoke's arguments as a megatron_args.sh of the same form, and the worker as pretrain_gpt.py."""
    artifacts, megatron_dir = job_dir / "artifacts", job_dir / "megatron-lm"
    artifacts.mkdir(parents=True, exist_ok=True)
    megatron_dir.mkdir(parents=True, exist_ok=True)
    value = run.env.get("CUDA_DEVICE_MAX_CONNECTIONS")
    connections = (f"export CUDA_DEVICE_MAX_CONNECTIONS={shlex.quote(value)}" if value is not None
                   else "unset CUDA_DEVICE_MAX_CONNECTIONS")
    lines = ["# dtc smoke: the generated megatron_args.sh, scaled for this job (see the smoke report)",
             "# shellcheck shell=bash disable=SC2034", connections, "MEGATRON_ARGS=("]
    lines += [f"  {shlex.quote(a)}" for a in run.args] + [")", ""]
    (artifacts / ARGS_FILE).write_text("\n".join(lines))
    (megatron_dir / "pretrain_gpt.py").write_text(STAND_IN)
    return artifacts, megatron_dir


def local_job_env(ctx, job_dir: Path) -> tuple[MegatronArgs, dict[str, str]]:
    """(the smoke's arguments, the environment that makes the generated train_megatron.sbatch, unchanged, run
    them on this machine): the scaled megatron_args.sh (DTC_ARTIFACT_DIR) and the worker as pretrain_gpt.py
    (MEGATRON_DIR) from ``megatron_job_files``, with the worker's checks of the artifact's own arguments
    (``worker_env``). dtc sweep --local-cpu runs each Megatron candidate's launcher with it; ValueError or
    OSError when the artifact cannot be read."""
    run, plan_args = prepare(ctx)
    artifacts, megatron_dir = megatron_job_files(ctx, run, job_dir)
    env = worker_env(run, plan_args, ctx.plan, ctx.setup.device)
    env.update({"DTC_ARTIFACT_DIR": str(artifacts), "MEGATRON_DIR": str(megatron_dir),
                "DTC_NPROC_PER_NODE": str(ctx.setup.world_size), "PYTHONUNBUFFERED": "1",
                "PYTHONWARNINGS": "ignore::FutureWarning"})
    return run, env


def run_slurm_megatron(ctx, run, worker_env: dict[str, str]) -> TargetResult:
    """Submit train_megatron.sbatch: its #SBATCH lines fitted to the local node (one task per rank,
    overcommitted onto the node's cores), MEGATRON_DIR pointed at the smoke worker, sourcing the
    smoke's megatron_args.sh; reported from Megatron's own log lines like a local launch."""
    from compiler.smoke import targets as T

    setup: SmokeSetup = ctx.setup
    launch = registry.get("megatron").slurm
    assert launch is not None  # the Megatron target has an sbatch launcher (compiler/targets/megatron/__init__.py)
    script = ctx.generated_dir / launch.script
    if not script.is_file():
        return TargetResult("megatron", "skipped", reason=f"{script.name} not generated (add slurm to the targets)")
    out_dir = ctx.workdir / "slurm"
    out_dir.mkdir(parents=True, exist_ok=True)
    artifacts, megatron_dir = megatron_job_files(ctx, run, out_dir)
    text = S.rewrite_sbatch(script.read_text(), partition=os.environ.get("SLURM_SMOKE_PARTITION") or "debug",
                          cpus_per_task=1, time_limit_s=ctx.timeout_s, output_dir=out_dir)
    text = _NTASKS_PER_NODE.sub(f"#SBATCH --ntasks-per-node={setup.world_size}\n#SBATCH --overcommit", text, 1)
    text, found = _MEGATRON_DIR_LINE.subn(f"MEGATRON_DIR={shlex.quote(str(megatron_dir))}", text, 1)
    result = TargetResult("megatron", "failed", launched=True, steps_requested=setup.steps)
    if not found:
        result.reason = f"{script.name} sets no MEGATRON_DIR= line to point at the smoke worker"
        return result
    job_script = out_dir / script.name
    job_script.write_text(text)
    result.command = f"sbatch {job_script}"
    run_id = uuid.uuid4().hex
    env = S.smoke_env(setup, artifacts, T.rank_env(ctx, "megatron"), "megatron")
    env = {k: v for k, v in env.items() if not k.startswith("DTC_SMOKE_")}
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)  # megatron_args.sh sets or unsets it
    env.update(worker_env)
    env[L.RUN_ID_ENV] = run_id
    job = S.submit_and_wait(ctx, job_script, text, env, run_id, result)
    if job is None:
        return result
    L.end_processes(None, run_id)  # a task's process still exiting when SLURM reports the job done
    fill_result(result, S._read_lines(job.out_path) + S._read_lines(job.err_path), setup)
    result.slurm = job.summary()
    result.notes.append(f"{script.name}: MEGATRON_DIR -> {megatron_dir} (its pretrain_gpt.py runs the smoke "
                        f"worker), DTC_ARTIFACT_DIR -> {artifacts} (the scaled megatron_args.sh); one task per "
                        f"rank, --overcommit onto the local node")
    if not job.completed:
        job.explain_failure(result)
    elif (why := T.run_verdict(result)) is not None:
        result.reason = why
    else:
        result.status = "passed"
    return result
