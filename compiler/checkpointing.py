"""How a long run survives: checkpoint size, save time, save interval, signal lead time, segments.

Pure functions over numbers (the renderers and PLAN.md call them with the plan's values):

- ``checkpoint_bytes``: what one full training checkpoint holds per parameter, by target (the
  trainers' own formats: Megatron's distributed checkpoint and DeepSpeed save bf16 weights plus the
  fp32 optimizer partitions, master copy and two Adam moments = 2 + 12 bytes; FSDP2's DCP saves
  its fp32 sharded parameters plus the two moments = 4 + 8 bytes).
- ``save_seconds``: bytes over the aggregate write bandwidth of the job's nodes (the spec may state
  it; the default is the sustained figure of Meta's Tectonic store for Llama 3, 2 TB/s over 2,048
  nodes, "The Llama 3 Herd of Models" section 3.3.1, about 1 GB/s per node).
- ``mtbf_hours``: job-level mean time between failures from Llama 3's record: 419 unexpected
  interruptions in 54 days of pre-training on 16,384 H100s (section 3.3.4), scaled by GPU count.
- ``save_interval_s``: Young's optimal interval sqrt(2 x save time x MTBF) (J. W. Young, "A first
  order approximation to the optimum checkpoint interval", CACM 17(9), 1974), at least 10 save
  times so saving never takes more than ~10% of the run; ``expected_loss_per_failure_s``: half an
  interval plus the restart (Daly 2006's first-order term).
- ``signal_lead_s``: how long before the time limit SLURM must send SIGUSR1: one step to finish,
  the save, and a safety factor of 2 on the save; at most SLURM's limit of 65,535 s.
- ``segments``: how many jobs of the time limit the run needs.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

BYTES_PER_PARAM = {
    "megatron": 2 + 12,  # bf16 weights + fp32 main params, exp_avg, exp_avg_sq (distributed optimizer)
    "deepspeed": 2 + 12,  # bf16 module weights + ZeRO's fp32 master partitions and two moments
    "fsdp": 4 + 8,  # fp32 sharded parameters (MixedPrecisionPolicy computes in bf16) + two fp32 moments
}
SGD_BYTES_PER_PARAM = {"megatron": 2 + 8, "deepspeed": 2 + 8, "fsdp": 4 + 4}  # one momentum buffer
DEFAULT_WRITE_BYTES_PER_S_PER_NODE = 2e12 / 2048  # Llama 3 paper 3.3.1: Tectonic sustains 2 TB/s, 2,048 nodes
LLAMA3_INTERRUPTIONS = 419  # Llama 3 paper 3.3.4: unexpected interruptions during 54 days of pre-training
LLAMA3_GPU_HOURS_OBSERVED = 54 * 24 * 16384
SLURM_MAX_SIGNAL_S = 65535  # sbatch --signal: sig_time at most 65535 seconds
RESTART_S = 600  # requeue + process start + checkpoint load on a large job: a stated allowance


def checkpoint_bytes(num_params: int, target: str, optimizer: str = "adamw") -> int:
    table = SGD_BYTES_PER_PARAM if optimizer == "sgd" else BYTES_PER_PARAM
    return int(num_params) * table[target]


def save_seconds(nbytes: int, num_nodes: int, write_bytes_per_s_per_node: float = DEFAULT_WRITE_BYTES_PER_S_PER_NODE,
                 ) -> float:
    return nbytes / (max(1, num_nodes) * write_bytes_per_s_per_node)


def mtbf_hours(num_gpus: int) -> float:
    """A job's mean time between failures on ``num_gpus`` GPUs at Llama 3's observed rate."""
    return LLAMA3_GPU_HOURS_OBSERVED / LLAMA3_INTERRUPTIONS / max(1, num_gpus)


def save_interval_s(save_s: float, num_gpus: int) -> float:
    young = math.sqrt(2.0 * save_s * mtbf_hours(num_gpus) * 3600.0)
    return max(young, 10.0 * save_s)


def expected_loss_per_failure_s(interval_s: float, restart_s: float = RESTART_S) -> float:
    return interval_s / 2.0 + restart_s


def signal_lead_s(save_s: float, step_s: float) -> int:
    return int(min(SLURM_MAX_SIGNAL_S, math.ceil(step_s + 2.0 * save_s + 60.0)))


def segments(run_s: float, time_limit_s: float | None, lead_s: float, restart_s: float = RESTART_S) -> int:
    """Jobs needed: each does (time limit - signal lead - restart) of training."""
    if time_limit_s is None:
        return 1
    useful = time_limit_s - lead_s - restart_s
    if useful <= 0:
        raise ValueError(f"a job of {time_limit_s:.0f} s cannot save a checkpoint that needs {lead_s:.0f} s of "
                         f"warning and {restart_s:.0f} s to restart")
    return max(1, math.ceil(run_s / useful))


@dataclass(frozen=True)
class CheckpointPolicy:
    target: str
    checkpoint_bytes: int
    save_s: float
    write_bytes_per_s: float  # aggregate over the job's nodes
    mtbf_h: float
    interval_s: float
    interval_steps: int
    expected_loss_per_failure_s: float
    signal_lead_s: int
    segments: int | None  # None: a job of the time limit cannot even save and restart

    def to_dict(self) -> dict:
        return asdict(self)


def policy(*, target: str, num_params: int, optimizer: str, num_gpus: int, num_nodes: int, step_s: float,
           run_s: float, time_limit_s: float | None,
           write_bytes_per_s_per_node: float = DEFAULT_WRITE_BYTES_PER_S_PER_NODE) -> CheckpointPolicy:
    nbytes = checkpoint_bytes(num_params, target, optimizer)
    save = save_seconds(nbytes, num_nodes, write_bytes_per_s_per_node)
    interval = save_interval_s(save, num_gpus)
    lead = signal_lead_s(save, step_s)
    try:
        jobs: int | None = segments(run_s, time_limit_s, lead)
    except ValueError:
        jobs = None
    return CheckpointPolicy(
        target=target, checkpoint_bytes=nbytes, save_s=save, write_bytes_per_s=num_nodes * write_bytes_per_s_per_node,
        mtbf_h=mtbf_hours(num_gpus), interval_s=interval,
        interval_steps=max(1, round(interval / step_s)) if step_s > 0 else 1,
        expected_loss_per_failure_s=expected_loss_per_failure_s(interval), signal_lead_s=lead,
        segments=jobs)


def plan_policy(plan: Any, target: str) -> CheckpointPolicy:
    """``policy`` for ``plan`` (a compiler.plan.Plan) run by ``target``: the model's size, the layout's
    GPUs and nodes, slurm.checkpoint_write_bandwidth (or the Llama 3 default), the target's own costed step time
    and time to train (the plan's when the target
    was not costed on its own) and slurm.time_limit."""
    lay = plan.layout
    est = next((e for e in plan.target_estimates if e.target == target), plan.estimate)
    stated = plan.slurm.checkpoint_write_bandwidth
    return policy(target=target, num_params=plan.model.params_total, optimizer=plan.training.optimizer,
                  num_gpus=lay.world_size, num_nodes=lay.num_nodes, step_s=est.step_time_s,
                  run_s=est.time_to_train_s, time_limit_s=plan.slurm.time_limit,
                  write_bytes_per_s_per_node=DEFAULT_WRITE_BYTES_PER_S_PER_NODE if stated is None else float(stated))


__all__ = ["plan_policy",
           "checkpoint_bytes", "save_seconds", "mtbf_hours", "save_interval_s", "expected_loss_per_failure_s",
           "signal_lead_s", "segments", "policy", "CheckpointPolicy", "BYTES_PER_PARAM",
           "DEFAULT_WRITE_BYTES_PER_S_PER_NODE"]
