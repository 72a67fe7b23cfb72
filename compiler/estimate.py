"""What the cost model returns: named line items with formulas and sources.

``evaluate(problem, layout)`` (compiler.costmodel) returns an ``Estimate`` or a
``Rejection``. Every number in an estimate is a ``LineItem`` that says how it
was computed and where its constants come from, so `dtc estimate` and PLAN.md
can explain a prediction line by line.
"""
from __future__ import annotations

import math
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
    # host memory per node less the headroom, the limit of cpu_bytes_per_node: set when states are offloaded to
    # the CPU and the node's host memory is known (left out of plan.json otherwise)
    usable_cpu_bytes_per_node: int | None = field(default=None, metadata={"omit_if_none": True})

    def item(self, name: str) -> LineItem:
        return next(i for i in self.items if i.name == name)

    @property
    def cpu_fits(self) -> bool | None:
        """Whether the states offloaded to the CPU fit the usable host memory; None when not checked (nothing
        offloaded to the CPU, or the node's host memory not known)."""
        usable = self.usable_cpu_bytes_per_node
        return None if usable is None else self.cpu_bytes_per_node <= usable

    def host_lines(self) -> list[str]:
        """What the offloaded states take per node, and whether they fit the host memory (PLAN.md, dtc estimate)."""
        from compiler.units import format_bytes

        out = []
        if self.cpu_bytes_per_node:
            usable, fits = self.usable_cpu_bytes_per_node, self.cpu_fits
            verdict = ("(host memory not known for this GPU: not checked; give cluster.host_memory)"
                       if usable is None else
                       f"of {format_bytes(usable)} usable host memory: " + ("fits" if fits else "DOES NOT FIT"))
            out.append(f"CPU memory per node for offloaded states: {format_bytes(self.cpu_bytes_per_node)} {verdict}.")
        if self.nvme_bytes_per_node:
            out.append(f"NVMe per node for offloaded states: {format_bytes(self.nvme_bytes_per_node)}.")
        return out


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
class ErrorBand:
    """How far measured step times fall from this estimate's, from the published runs of its regime
    (compiler/costmodel/bands.py): factors on the step time (and so on time to train and cost; tokens/s
    divides by them), and a factor on the peak memory for its upper end."""

    low: float  # 10th percentile of measured / predicted step time (<= 1)
    p80: float  # 80th percentile (>= 1)
    high: float  # 90th percentile (>= 1): [low, high] is the 80% band
    runs: int  # published runs behind it (0: uncalibrated)
    sources: int  # ... from this many sources
    regime: str  # the (nearest) regime they come from, e.g. "megatron, hopper, fp8 (mxfp8), PP, EP"
    calibrated: bool  # False: no regime near enough had runs; the band is a wide stated default
    thin: bool  # uncalibrated, or few runs behind it (PLAN.md names a well-calibrated alternative)
    memory_high: float  # upper end of the memory band: predicted peak x this
    # the cluster profile (cluster.profile) whose own leave-one-out residuals gave this band; None: published runs
    profile: str | None = field(default=None, metadata={"omit_if_none": True})
    # a profile the spec uses but whose runs are too few for its own band: why the band is the published runs' one
    profile_fallback: str | None = field(default=None, metadata={"omit_if_none": True})

    def time_factor(self, confidence: str) -> float:
        """The step-time factor of a quantile the solver ranks by: 'expected' (1), 'p80' or 'p90'."""
        return {"expected": 1.0, "p80": self.p80, "p90": self.high}[confidence]

    def contains(self, log_error: float) -> bool:
        """Whether a residual log(measured / predicted step time) lies inside the 80% band."""
        return math.log(self.low) - 1e-12 <= log_error <= math.log(self.high) + 1e-12

    def describe(self) -> str:
        """'from 37 similar published runs (megatron, hopper, bf16, PP)' or the uncalibrated note."""
        few = " (few)" if self.thin else ""
        if self.profile is not None:
            return (f"from the leave-one-out errors of the {self.runs} runs{few} of the cluster profile "
                    f"'{self.profile}'")
        if not self.calibrated and self.runs:  # runs of one kind kept out of the fit (bands.unsourced_table)
            text = f"uncalibrated: a wide band from {self.regime}"
        elif not self.calibrated:
            text = f"uncalibrated: no published runs near this regime ({self.regime}), a wide default band"
        else:
            text = f"from {self.runs} similar published runs{few} ({self.regime})"
        return text if self.profile_fallback is None else f"{text}; {self.profile_fallback}"


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
    band: ErrorBand | None = None  # the 80% band from published runs (None: a test's stand-in cost model)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def time_factor(self, confidence: str) -> float:
        """The step-time factor of ``confidence`` ('expected', 'p80', 'p90'); 1 without a band."""
        return 1.0 if self.band is None else self.band.time_factor(confidence)

    @property
    def step_time_band_s(self) -> tuple[float, float]:
        b = self.band
        return (self.step_time_s, self.step_time_s) if b is None else (self.step_time_s * b.low,
                                                                       self.step_time_s * b.high)

    @property
    def tokens_per_s_per_gpu_band(self) -> tuple[float, float]:
        b = self.band
        t = self.tokens_per_s_per_gpu
        return (t, t) if b is None else (t / b.high, t / b.low)

    @property
    def time_to_train_band_s(self) -> tuple[float, float]:
        b = self.band
        t = self.time_to_train_s
        return (t, t) if b is None else (t * b.low, t * b.high)

    @property
    def cost_band_usd(self) -> tuple[float, float]:
        b = self.band
        c = self.cost_usd
        return (c, c) if b is None else (c * b.low, c * b.high)

    @property
    def memory_high_bytes_per_gpu(self) -> int:
        """Upper end of the memory band: what feasibility checks against usable HBM."""
        total = self.memory.total_bytes_per_gpu
        return total if self.band is None else int(math.ceil(total * self.band.memory_high))


@dataclass(frozen=True)
class Rejection:
    """A layout that cannot run, as data: a stable reason code and the numbers behind it."""

    code: str  # e.g. out_of_memory, tp_not_divisor, batch_not_divisible, over_budget, framework_unsupported
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)
    fix: str = ""  # what would make it fit, e.g. "needs 9.3 GiB more per GPU: enable ZeRO-3 ..."

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": dict(self.details), "fix": self.fix}
