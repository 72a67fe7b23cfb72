"""The cost model's constants as frozen, typed values: physics (hand-written, sourced) + the fit.

* ``compiler/data/physics.yaml``: kernel benchmarks, link and host measurements, datasheet
  facts, each with its source. Nothing in it is fitted to end-to-end runs.
* ``compiler/data/efficiency.yaml``: the few constants fitted on the calibration set
  (benchmarks/data/published_runs_dev.csv) by ``benchmarks/fit.py``; generated, never edited.
  ``FIT_PARAMETERS`` below defines them: meaning, prior (the physics-only value) and the
  physical range the fit may not leave.

Both files are read once per process (``load_efficiency``); every key is checked, so a typo
fails loudly instead of silently using a default.
"""
from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from types import MappingProxyType
from typing import Any, Mapping

from ruamel.yaml import YAML

from compiler.profile_ref import ProfileRef

PHYSICS_FILE = "physics.yaml"
EFFICIENCY_FILE = "efficiency.yaml"
FLASH_BACKWARD_FLOPS_RATIO = 2.5  # FlashAttention convention: backward = 2.5 x forward FLOPs (5 GEMMs vs 2)
ELEMENTWISE_STEPS = ("rmsnorm", "layernorm", "rope", "swiglu", "gelu", "residual")


@dataclass(frozen=True)
class FitParameter:
    """One fitted constant: what it means, the physics-only value, and the range it must stay in."""

    name: str
    prior: float
    lower: float
    upper: float
    meaning: str


FIT_PARAMETERS: tuple[FitParameter, ...] = (
    FitParameter("compute_scale", 1.0, 0.6, 1.15,
                 "sustained fraction of the kernel-benchmark GEMM and attention rates over a whole training run "
                 "(clock and power throttling under sustained load, interference with communication kernels)"),
    FitParameter("memory_bound_traffic", 3.0, 1.0, 8.0,
                 "HBM bytes moved by normalisation, activation, rope, residual and dropout kernels (forward + "
                 "backward) per byte of activations a layer saves for backward"),
    FitParameter("cpu_op_s", 2.0e-5, 2.0e-6, 6.0e-5,
                 "host time to launch one kernel (Python, dispatcher, driver): a layer whose GPU work is shorter "
                 "than its launches is launch-bound; prior ~20 us: PyTorch eager spends ~10 us per operator in "
                 "Python and the dispatcher before the ~5 us CUDA launch (H. He, 'Making Deep Learning Go Brrrr "
                 "From First Principles', horace.io/brrr_intro.html)"),
    FitParameter("tp_exposed_fraction", 0.5, 0.05, 1.0,
                 "share of tensor-parallel collectives left on the critical path by frameworks that overlap them "
                 "with GEMMs (Megatron async TP all-reduce, Transformer Engine userbuffers)"),
    FitParameter("step_overhead_s", 0.05, 0.005, 1.0,
                 "fixed time per optimizer step outside the layers (gradient clipping and norm, loss reduction, "
                 "data loader, logging, launch of the optimizer)"),
    FitParameter("straggler_cv", 0.01, 0.001, 0.05,
                 "coefficient of variation of one rank's step time; a synchronous step waits for the slowest of N "
                 "ranks, ~ cv x sqrt(2 ln N) longer (expected maximum of N normal variables)"),
)
FIT_PARAMETER_NAMES = tuple(p.name for p in FIT_PARAMETERS)
# The fits' robust loss: Huber on log(predicted / measured) with this delta, so that one badly transcribed run
# cannot drag a constant (the global fit, compiler/calibration/fit.py, and a cluster profile's, profile_fit.py).
HUBER_DELTA = 0.15

# Fitted only by a cluster profile (dtc calibrate, compiler/calibration/profile.py): multipliers on sourced physics
# that differ from one cluster to the next; the global fit leaves them at 1 (the physics as measured by the
# kernel benchmarks and nccl-tests compiler/data/physics.yaml cites). Each range keeps the result physical.
PROFILE_PARAMETERS: tuple[FitParameter, ...] = (
    FitParameter("fp8_gemm_scale", 1.0, 0.7, 1.25,
                 "this cluster's sustained fp8 GEMM rate over physics.yaml gemm.fraction (kernel benchmarks); "
                 "up to 1.25 keeps fp8 fractions (0.6-0.8 of the datasheet peak) under the peak"),
    FitParameter("grouped_gemm_scale", 1.0, 0.6, 1.4,
                 "this cluster's MoE grouped-GEMM rate over physics.yaml gemm.grouped_fraction (0.7, a grouped "
                 "kernel at typical expert token counts); up to 1.4 reaches a dense GEMM's rate"),
    FitParameter("attention_scale", 1.0, 0.7, 1.25,
                 "this cluster's attention-kernel rate over physics.yaml's FlashAttention benchmark curves "
                 "(another kernel version or clock); up to 1.25 stays under the datasheet peak"),
    FitParameter("inter_node_bandwidth_scale", 1.0, 0.25, 1.2,
                 "achieved inter-node bus bandwidth over physics.yaml comm.busbw_fraction x the catalog's link: "
                 "down to 1/4 for an oversubscribed or rail-unaware fabric, up to 1.2 for nccl-tests results "
                 "above the typical fraction"),
    FitParameter("all_to_all_scale", 1.0, 0.4, 1.25,
                 "this cluster's MoE token-dispatch (all-to-all) rate over physics.yaml comm.all_to_all_fraction "
                 "(DeepEP's kernels): down to 0.4 for a plain NCCL all-to-all dispatcher or an unbalanced router, up "
                 "to 1.25, where DeepEP's measured 153 GB/s on a 160 GB/s NVLink (0.96) sits over the 0.78 taken"),
    FitParameter("long_sequence_attention_scale", 1.0, 0.8, 1.25,
                 "this cluster's attention-kernel rate at 32k tokens relative to 4k, over the ratio of physics.yaml's "
                 "FlashAttention curves (another FlashAttention version or head layout scales differently with "
                 "sequence length: FlashAttention-2 vs -3 differ by up to ~1.2x between 2k and 16k, Shah et al. "
                 "2024, arXiv:2407.08608 fig. 5); applied as scale^(log(seq/4k)/log(8)), clamped to [4k/8, 32k]"),
)


# --- physics ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionCurve:
    """Measured forward / backward TFLOP/s (FlashAttention convention) against sequence length."""

    seq: tuple[float, ...]
    fwd: tuple[float, ...] = ()
    bwd: tuple[float, ...] = ()
    fwd_bwd: tuple[float, ...] = ()

    def _at(self, values: tuple[float, ...], seq: float) -> float:
        """Log-linear interpolation in sequence length, clamped at the measured ends."""
        xs = self.seq
        if seq <= xs[0]:
            return values[0]
        if seq >= xs[-1]:
            return values[-1]
        i = bisect.bisect_right(xs, seq)
        x0, x1 = math.log(xs[i - 1]), math.log(xs[i])
        w = (math.log(seq) - x0) / (x1 - x0)
        return values[i - 1] + w * (values[i] - values[i - 1])

    def seconds_per_forward_flop(self, seq: float) -> float:
        """Forward + backward seconds per forward FLOP at the reference part: 1/R_f + 2.5/R_b."""
        if self.fwd_bwd:
            return (1.0 + FLASH_BACKWARD_FLOPS_RATIO) / (self._at(self.fwd_bwd, seq) * 1e12)
        return 1.0 / (self._at(self.fwd, seq) * 1e12) + FLASH_BACKWARD_FLOPS_RATIO / (self._at(self.bwd, seq) * 1e12)


@dataclass(frozen=True)
class AttentionTable:
    reference_gpu: str
    variants: Mapping[str, AttentionCurve]  # hd128, mla, hd64


@dataclass(frozen=True)
class Physics:
    gemm_fraction: Mapping[str, Mapping[str, float]]  # kernel class -> kind -> fraction
    gemm_reference: Mapping[str, str]  # kernel class -> the catalog GPU its fractions were measured on (if one)
    gemm_measured_tflops: Mapping[str, float]  # catalog GPU -> its best measured large 16-bit GEMM, TFLOP/s
    grouped_gemm_fraction: float
    gemm_launch_s: float
    quantize_bytes_per_element: Mapping[str, float]
    attention_tables: Mapping[str, Mapping[str, AttentionTable]]  # kernel class -> kernel -> table
    attention_kernels: Mapping[str, Mapping[str, str]]  # kernel class -> requested kernel -> table kernel
    attention_borrow: Mapping[str, str]
    memory_bound_fraction: Mapping[str, float]  # fused / eager
    elementwise_bytes: Mapping[str, tuple[float, float]]  # step -> (fused, eager) forward bytes per element
    cross_entropy_bytes: Mapping[str, tuple[float, float]]  # implementation -> (forward, backward) bytes per logit
    dvfs_exponent: float
    busbw_fraction: Mapping[str, float]
    latency_s: Mapping[str, float]
    all_to_all_fraction: Mapping[str, float]
    cp_exposed_fraction: float
    ep_exposed_fraction: float
    dp_overlap_window_fraction: float
    last_bucket_bytes: float
    grad_accumulation_bytes_per_param: float
    comm_sm_fraction: float  # SMs an overlapped all-to-all kernel takes from the computation under it
    cpu_adam_params_per_s_per_node: float
    nvme_bandwidth_bytes_per_s_per_node: float
    pcie_fraction: float
    cuda_context_bytes: float
    nccl_bytes_per_group: float
    fragmentation_fraction: float
    torch_ddp_bucket_bytes: float
    deepspeed_bucket_elements: float
    sources: Mapping[str, Mapping[str, str]]  # section -> key -> source text

    def gemm_fraction_for(self, kernel_class: str, kind: str) -> float:
        table = self.gemm_fraction.get(kernel_class) or self.gemm_fraction["hopper"]
        return table.get(kind, table["bf16"])

    def attention_curve(self, kernel_class: str, kernel: str, variant: str) -> tuple[AttentionCurve, str]:
        """(curve, reference GPU) for a requested kernel on a kernel class and a head-dim variant."""
        cls = kernel_class if kernel_class in self.attention_tables else self.attention_borrow.get(kernel_class,
                                                                                                     "hopper")
        actual = self.attention_kernels.get(kernel_class, {}).get(kernel, kernel)
        tables = self.attention_tables[cls]
        table = tables.get(actual) or next(iter(tables.values()))
        curve = table.variants.get(variant) or table.variants["hd128"]
        return curve, table.reference_gpu


# --- the fit and the whole ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Efficiency:
    """Everything the cost model's formulas read: physics + fitted constants."""

    physics: Physics
    fitted: Mapping[str, float]
    fit_provenance: Mapping[str, Any] = field(default_factory=dict)
    loso: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # left-out source -> fitted values
    # False: host launches that run beside GPU work are left out, keeping only the launches the GPU must wait
    # for (a MoE layer's after its token-count sync): a stage's time then only falls, and stays linear in its
    # pieces (the solver's bounds, parts.bound_efficiency)
    overlapped_launches: bool = True

    def __post_init__(self) -> None:
        # the formulas read eff.<name> thousands of times per search: plain attributes, not __getattr__
        for f in fields(self.physics):
            self.__dict__.setdefault(f.name, getattr(self.physics, f.name))
        for name, value in self.fitted.items():
            self.__dict__.setdefault(name, value)

    def fit(self, name: str) -> float:
        return self.fitted[name]

    def profile_scale(self, name: str) -> float:
        """A cluster profile's multiplier (PROFILE_PARAMETERS); 1 (the physics) without a profile."""
        return self.fitted.get(name, 1.0)

    def with_fitted(self, values: Mapping[str, float]) -> "Efficiency":
        """The same physics with other fitted constants (calibration, leave-one-source-out)."""
        merged = dict(self.fitted)
        merged.update(values)
        return replace(self, fitted=MappingProxyType(merged))

    def left_out(self, source_id: str) -> "Efficiency":
        """The constants fitted without ``source_id`` (the committed fit's leave-one-source-out refit), or
        this fit when that source was not in the calibration set."""
        values = self.loso.get(source_id)
        return self.with_fitted(values) if values else self

    # the names the formulas use (one place that maps them onto the two files)
    def __getattr__(self, name: str) -> Any:
        physics = self.__dict__.get("physics")
        if physics is not None and hasattr(physics, name):
            return getattr(physics, name)
        fitted = self.__dict__.get("fitted")
        if fitted is not None and name in fitted:
            return fitted[name]
        raise AttributeError(name)


def _file(name: str) -> str:
    return f"compiler/data/{name}"


def _keys(raw: Any, allowed: tuple[str, ...], what: str, file: str = PHYSICS_FILE,
          optional: tuple[str, ...] = ()) -> dict:
    if not isinstance(raw, dict):
        raise ValueError(f"{_file(file)}: {what} must be a mapping")
    extra = sorted(set(raw) - set(allowed) - set(optional))
    missing = sorted(set(allowed) - set(raw))
    if extra or missing:
        raise ValueError(f"{_file(file)}: {what}: unknown keys {extra}, missing keys {missing}")
    return raw


def _floats(raw: Any, what: str, file: str = PHYSICS_FILE) -> Mapping[str, float]:
    if not isinstance(raw, dict) or not all(isinstance(v, (int, float)) and v > 0 for v in raw.values()):
        raise ValueError(f"{_file(file)}: {what} must map names to positive numbers")
    return MappingProxyType({str(k): float(v) for k, v in raw.items()})


def _curve(raw: Any, what: str) -> AttentionCurve:
    raw = _keys(raw, ("seq",), what, optional=("fwd", "bwd", "fwd_bwd"))
    seq = tuple(float(x) for x in raw["seq"])
    cols = {k: tuple(float(x) for x in raw.get(k, ())) for k in ("fwd", "bwd", "fwd_bwd")}
    if list(seq) != sorted(seq) or not all(len(v) in (0, len(seq)) for v in cols.values()):
        raise ValueError(f"{_file(PHYSICS_FILE)}: {what}: seq must increase and every column match its length")
    if not (cols["fwd_bwd"] or (cols["fwd"] and cols["bwd"])):
        raise ValueError(f"{_file(PHYSICS_FILE)}: {what}: needs fwd and bwd, or fwd_bwd")
    return AttentionCurve(seq, cols["fwd"], cols["bwd"], cols["fwd_bwd"])


def parse_physics(data: dict) -> Physics:
    data = _keys(data, ("schema_version", "gemm", "attention", "memory_bound", "power", "comm", "overlap", "host",
                        "allowances"), "top level")
    gemm = _keys(data["gemm"], ("fraction", "reference", "measured_tflops", "grouped_fraction", "launch_s",
                                "quantize_bytes_per_element", "sources"), "gemm")
    if not isinstance(gemm["reference"], dict) or not set(gemm["reference"]) <= set(gemm["fraction"]):
        raise ValueError(f"{_file(PHYSICS_FILE)}: gemm.reference must map kernel classes of gemm.fraction to GPUs")
    att = _keys(data["attention"], ("tables", "kernels", "borrow", "sources"), "attention")
    tables: dict[str, dict[str, AttentionTable]] = {}
    for cls, kernels in att["tables"].items():
        tables[cls] = {}
        for kernel, raw in kernels.items():
            ref = raw.get("reference")
            variants = {k: _curve(v, f"attention.tables.{cls}.{kernel}.{k}") for k, v in raw.items() if k != "reference"}
            if not ref or "hd128" not in variants:
                raise ValueError(f"{_file(PHYSICS_FILE)}: attention.tables.{cls}.{kernel} needs a reference GPU and hd128")
            tables[cls][kernel] = AttentionTable(ref, MappingProxyType(variants))
    mb = _keys(data["memory_bound"], ("fraction", "bytes_per_element", "cross_entropy_bytes_per_element", "sources"),
               "memory_bound")
    bpe = _keys(mb["bytes_per_element"], ELEMENTWISE_STEPS, "memory_bound.bytes_per_element")
    for step, pair in bpe.items():
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, (int, float)) and x > 0 for x in pair)):
            raise ValueError(f"{_file(PHYSICS_FILE)}: memory_bound.bytes_per_element.{step} must be [fused, eager]")
    power = _keys(data["power"], ("dvfs_exponent", "sources"), "power")
    comm = _keys(data["comm"], ("busbw_fraction", "latency_s", "all_to_all_fraction", "sources"), "comm")
    overlap = _keys(data["overlap"], ("cp_exposed_fraction", "ep_exposed_fraction", "dp_overlap_window_fraction",
                                      "last_bucket_bytes",
                                      "grad_accumulation_bytes_per_param", "comm_sm_fraction", "sources"),
                    "overlap")
    host = _keys(data["host"], ("cpu_adam_params_per_s_per_node", "nvme_bandwidth_bytes_per_s_per_node",
                                "pcie_fraction", "sources"), "host")
    allow = _keys(data["allowances"], ("cuda_context_bytes", "nccl_bytes_per_group", "fragmentation_fraction",
                                       "torch_ddp_bucket_bytes", "deepspeed_bucket_elements", "sources"), "allowances")
    return Physics(
        gemm_fraction=MappingProxyType({k: _floats(v, f"gemm.fraction.{k}") for k, v in gemm["fraction"].items()}),
        gemm_reference=MappingProxyType({str(k): str(v) for k, v in gemm["reference"].items()}),
        gemm_measured_tflops=_floats(gemm["measured_tflops"], "gemm.measured_tflops"),
        grouped_gemm_fraction=float(gemm["grouped_fraction"]),
        gemm_launch_s=float(gemm["launch_s"]),
        quantize_bytes_per_element=_floats(gemm["quantize_bytes_per_element"], "gemm.quantize_bytes_per_element"),
        attention_tables=MappingProxyType({k: MappingProxyType(v) for k, v in tables.items()}),
        attention_kernels=MappingProxyType({k: MappingProxyType(dict(v)) for k, v in att["kernels"].items()}),
        attention_borrow=MappingProxyType(dict(att["borrow"])),
        memory_bound_fraction=_floats(mb["fraction"], "memory_bound.fraction"),
        elementwise_bytes=MappingProxyType({k: (float(v[0]), float(v[1])) for k, v in bpe.items()}),
        cross_entropy_bytes=MappingProxyType({str(k): (float(v[0]), float(v[1]))
                                              for k, v in mb["cross_entropy_bytes_per_element"].items()}),
        dvfs_exponent=float(power["dvfs_exponent"]),
        busbw_fraction=_floats(comm["busbw_fraction"], "comm.busbw_fraction"),
        latency_s=_floats(comm["latency_s"], "comm.latency_s"),
        all_to_all_fraction=_floats(comm["all_to_all_fraction"], "comm.all_to_all_fraction"),
        cp_exposed_fraction=float(overlap["cp_exposed_fraction"]),
        ep_exposed_fraction=float(overlap["ep_exposed_fraction"]),
        dp_overlap_window_fraction=float(overlap["dp_overlap_window_fraction"]),
        last_bucket_bytes=float(overlap["last_bucket_bytes"]),
        grad_accumulation_bytes_per_param=float(overlap["grad_accumulation_bytes_per_param"]),
        comm_sm_fraction=float(overlap["comm_sm_fraction"]),
        cpu_adam_params_per_s_per_node=float(host["cpu_adam_params_per_s_per_node"]),
        nvme_bandwidth_bytes_per_s_per_node=float(host["nvme_bandwidth_bytes_per_s_per_node"]),
        pcie_fraction=float(host["pcie_fraction"]),
        cuda_context_bytes=float(allow["cuda_context_bytes"]),
        nccl_bytes_per_group=float(allow["nccl_bytes_per_group"]),
        fragmentation_fraction=float(allow["fragmentation_fraction"]),
        torch_ddp_bucket_bytes=float(allow["torch_ddp_bucket_bytes"]),
        deepspeed_bucket_elements=float(allow["deepspeed_bucket_elements"]),
        sources=MappingProxyType({name: MappingProxyType(dict(section["sources"])) for name, section in
                                  (("gemm", gemm), ("attention", att), ("memory_bound", mb), ("power", power),
                                   ("comm", comm), ("overlap", overlap), ("host", host),
                                   ("allowances", allow))}),
    )


def _fitted_values(raw: Any, what: str) -> Mapping[str, float]:
    raw = _keys(raw, FIT_PARAMETER_NAMES, what, EFFICIENCY_FILE)
    out = {}
    for p in FIT_PARAMETERS:
        v = raw[p.name]
        if not isinstance(v, (int, float)) or not (p.lower <= v <= p.upper):
            raise ValueError(f"{_file(EFFICIENCY_FILE)}: {what}.{p.name} = {v!r} is outside its range "
                             f"[{p.lower:g}, {p.upper:g}] ({p.meaning})")
        out[p.name] = float(v)
    return MappingProxyType(out)


def parse_efficiency(physics: dict, fitted: dict) -> Efficiency:
    """Validate both parsed YAML mappings and build an ``Efficiency``."""
    fitted = _keys(fitted, ("schema_version", "fitted", "leave_one_source_out", "provenance"), "top level",
                   EFFICIENCY_FILE)
    loso = {str(k): _fitted_values(v, f"leave_one_source_out.{k}") for k, v in
            (fitted["leave_one_source_out"] or {}).items()}
    return Efficiency(physics=parse_physics(physics), fitted=_fitted_values(fitted["fitted"], "fitted"),
                      fit_provenance=MappingProxyType(dict(fitted["provenance"] or {})),
                      loso=MappingProxyType(loso))


def read_data_file(name: str) -> str:
    return (resources.files("compiler") / "data" / name).read_text(encoding="utf-8")


def prior_efficiency() -> Efficiency:
    """The physics with every fitted constant at its prior (what the fit starts from)."""
    physics = parse_physics(YAML(typ="safe").load(read_data_file(PHYSICS_FILE)))
    return Efficiency(physics=physics, fitted=MappingProxyType({p.name: p.prior for p in FIT_PARAMETERS}))


@functools.cache
def load_efficiency() -> Efficiency:
    """The shipped constants (parsed and validated once per process)."""
    yaml = YAML(typ="safe")
    return parse_efficiency(yaml.load(read_data_file(PHYSICS_FILE)), yaml.load(read_data_file(EFFICIENCY_FILE)))


@functools.lru_cache(maxsize=32)
def efficiency_of(profile: ProfileRef | None) -> Efficiency:
    """The shipped constants, or a cluster profile's: the shipped physics with the profile's fitted constants (the
    same for every source: a profile has no leave-one-source-out refits)."""
    base = load_efficiency()
    if profile is None:
        return base
    return replace(base.with_fitted(dict(profile.constants)), loso=MappingProxyType({}))

