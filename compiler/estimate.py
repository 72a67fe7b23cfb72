"""What the cost model returns: named line items with formulas and sources.

``evaluate(problem, layout)`` (compiler.costmodel) returns an ``Estimate`` or a
``Rejection``. Every number in an estimate is a ``LineItem`` that says how it
was computed and where its constants come from, so `dtc estimate` and PLAN.md
can explain a prediction line by line.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class LineItem:
    name: str  # stable snake_case id, e.g. "weights", "activations", "tp_comm"
    value: float  # bytes (memory) or seconds (time)
    formula: str  # how it was computed, with the numbers filled in
    source: str = ""  # paper, datasheet or measurement the formula/constant comes from


@dataclass(frozen=True)
class MemoryBreakdown:
    items: tuple[LineItem, ...]
    total_bytes_per_gpu: int
    hbm_bytes_per_gpu: int
    usable_bytes_per_gpu: int  # HBM minus headroom; the feasibility limit
    cpu_bytes_per_node: int = 0  # offloaded states
    nvme_bytes_per_node: int = 0
    stage: int = 0  # the pipeline stage these items describe (the one with the most memory)

    def item(self, name: str) -> LineItem:
        return next(i for i in self.items if i.name == name)


@dataclass(frozen=True)
class TimeBreakdown:
    items: tuple[LineItem, ...]  # exposed (critical-path) seconds per step; they sum to step_time_s
    step_time_s: float

    def item(self, name: str) -> LineItem:
        return next(i for i in self.items if i.name == name)


@dataclass(frozen=True)
class CommVolume:
    """One collective per step: what, over which group and link, how many bytes, how long."""

    name: str  # e.g. "tp_all_reduce", "dp_reduce_scatter", "pp_send_recv"
    group: str  # axis: tp, pp, cp, ep, dp
    group_size: int
    link: str  # "intra_node" or "inter_node"
    bytes_per_gpu_per_step: float
    time_s: float  # total time of this collective per step
    exposed_s: float  # part not hidden behind compute


@dataclass(frozen=True)
class PipelineEvent:
    stage: int  # pipeline rank
    chunk: int  # virtual stage on that rank
    microbatch: int
    kind: str  # "F" forward, "B" backward
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Estimate:
    memory: MemoryBreakdown
    time: TimeBreakdown
    comm: tuple[CommVolume, ...]
    pipeline: tuple[PipelineEvent, ...]  # the simulated schedule of one step (empty when pp == 1)
    step_time_s: float
    tokens_per_step: int
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_flops_per_token: float  # 6N(active) + attention, no recompute
    model_flops_per_step: float
    hardware_flops_per_step: float  # incl. recompute
    model_tflops_per_gpu: float
    mfu: float
    hfu: float
    pipeline_bubble_fraction: float
    num_steps: int
    time_to_train_s: float
    gpu_hours: float
    cost_usd: float
    num_gpus: int
    assumptions: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Rejection:
    """A layout that cannot run, as data: a stable reason code and the numbers behind it."""

    code: str  # e.g. out_of_memory, tp_not_divisor, batch_not_divisible, over_budget, framework_unsupported
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)
    fix: str = ""  # what would make it fit, e.g. "needs 9.3 GiB more per GPU: enable ZeRO-3 ..."

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": dict(self.details), "fix": self.fix}
