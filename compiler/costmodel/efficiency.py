"""The efficiency constants of compiler/data/efficiency.yaml as frozen, typed values.

Read once per process (``load_efficiency``); every key is checked so that a typo in
the data file fails loudly instead of silently using a default. The meaning of each
number and its source is in the YAML file itself.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Any, Mapping

from ruamel.yaml import YAML

EFFICIENCY_FILE = "efficiency.yaml"


@dataclass(frozen=True)
class GenerationEfficiency:
    """Achievable fractions of peak for one GPU generation."""

    generation: str
    gemm_max_fraction: Mapping[str, float]  # by precision (bf16, fp16, fp8, fp32)
    gemm_half_dim: float
    attention_fraction: float
    hbm_fraction: float
    sources: Mapping[str, str]

    def gemm_fraction_for(self, precision: str) -> float:
        table = self.gemm_max_fraction
        return table.get(precision, table["bf16"])


@dataclass(frozen=True)
class Efficiency:
    generations: Mapping[str, GenerationEfficiency]
    activation_traffic: Mapping[str, float]
    activation_traffic_source: str
    layer_overhead_s: Mapping[str, float]  # dense, moe, moe_per_local_expert: seconds per layer per micro-batch
    layer_overhead_source: str
    grad_accumulation_bytes_per_param: float
    grad_accumulation_source: str
    busbw_fraction: Mapping[str, float]  # intra_node / inter_node
    latency_s: Mapping[str, float]
    comm_sources: Mapping[str, str]
    tp_exposed_fraction: float
    ep_exposed_fraction: float
    cp_exposed_fraction: float
    dp_overlap_window_fraction: float
    last_bucket_bytes: float
    overlap_sources: Mapping[str, str]
    cpu_adam_params_per_s_per_node: float
    nvme_bandwidth_bytes_per_s_per_node: float
    pcie_fraction: float
    host_sources: Mapping[str, str]
    cuda_context_bytes: float
    nccl_bytes_per_group: float
    fragmentation_fraction: float
    torch_ddp_bucket_bytes: float
    deepspeed_bucket_elements: float
    allowance_sources: Mapping[str, str]

    def for_generation(self, generation: str) -> GenerationEfficiency:
        if generation not in self.generations:
            raise KeyError(f"efficiency.yaml has no generation {generation!r}; known: {', '.join(self.generations)}")
        return self.generations[generation]


def _keys(raw: Any, allowed: tuple[str, ...], what: str) -> dict:
    if not isinstance(raw, dict):
        raise ValueError(f"compiler/data/{EFFICIENCY_FILE}: {what} must be a mapping")
    extra = sorted(set(raw) - set(allowed))
    missing = sorted(set(allowed) - set(raw))
    if extra or missing:
        raise ValueError(f"compiler/data/{EFFICIENCY_FILE}: {what}: unknown keys {extra}, missing keys {missing}")
    return raw


def _floats(raw: Any, what: str) -> Mapping[str, float]:
    if not isinstance(raw, dict) or not all(isinstance(v, (int, float)) and v > 0 for v in raw.values()):
        raise ValueError(f"compiler/data/{EFFICIENCY_FILE}: {what} must map names to positive numbers")
    return MappingProxyType({str(k): float(v) for k, v in raw.items()})


def _generation(name: str, raw: Any) -> GenerationEfficiency:
    raw = _keys(raw, ("gemm_max_fraction", "gemm_half_dim", "attention_fraction", "hbm_fraction", "sources"),
                f"generations.{name}")
    return GenerationEfficiency(
        generation=name,
        gemm_max_fraction=_floats(raw["gemm_max_fraction"], f"generations.{name}.gemm_max_fraction"),
        gemm_half_dim=float(raw["gemm_half_dim"]),
        attention_fraction=float(raw["attention_fraction"]),
        hbm_fraction=float(raw["hbm_fraction"]),
        sources=MappingProxyType(dict(raw["sources"])),
    )


def parse_efficiency(data: dict) -> Efficiency:
    """Validate the parsed YAML mapping and build an ``Efficiency``."""
    data = _keys(data, ("schema_version", "generations", "activation_traffic", "activation_traffic_source",
                        "layer_overhead_s", "layer_overhead_source", "grad_accumulation_bytes_per_param",
                        "grad_accumulation_source", "comm", "overlap", "host", "allowances"),
                 "top level")
    comm = _keys(data["comm"], ("busbw_fraction", "latency_s", "sources"), "comm")
    overlap = _keys(data["overlap"], ("tp_exposed_fraction", "ep_exposed_fraction", "cp_exposed_fraction",
                                      "dp_overlap_window_fraction", "last_bucket_bytes", "sources"), "overlap")
    host = _keys(data["host"], ("cpu_adam_params_per_s_per_node", "nvme_bandwidth_bytes_per_s_per_node",
                                "pcie_fraction", "sources"), "host")
    allow = _keys(data["allowances"], ("cuda_context_bytes", "nccl_bytes_per_group", "fragmentation_fraction",
                                       "torch_ddp_bucket_bytes", "deepspeed_bucket_elements", "sources"), "allowances")
    return Efficiency(
        generations=MappingProxyType({k: _generation(k, v) for k, v in data["generations"].items()}),
        activation_traffic=_floats(data["activation_traffic"], "activation_traffic"),
        activation_traffic_source=str(data["activation_traffic_source"]),
        layer_overhead_s=_floats(data["layer_overhead_s"], "layer_overhead_s"),
        layer_overhead_source=str(data["layer_overhead_source"]),
        grad_accumulation_bytes_per_param=float(data["grad_accumulation_bytes_per_param"]),
        grad_accumulation_source=str(data["grad_accumulation_source"]),
        busbw_fraction=_floats(comm["busbw_fraction"], "comm.busbw_fraction"),
        latency_s=_floats(comm["latency_s"], "comm.latency_s"),
        comm_sources=MappingProxyType(dict(comm["sources"])),
        tp_exposed_fraction=float(overlap["tp_exposed_fraction"]),
        ep_exposed_fraction=float(overlap["ep_exposed_fraction"]),
        cp_exposed_fraction=float(overlap["cp_exposed_fraction"]),
        dp_overlap_window_fraction=float(overlap["dp_overlap_window_fraction"]),
        last_bucket_bytes=float(overlap["last_bucket_bytes"]),
        overlap_sources=MappingProxyType(dict(overlap["sources"])),
        cpu_adam_params_per_s_per_node=float(host["cpu_adam_params_per_s_per_node"]),
        nvme_bandwidth_bytes_per_s_per_node=float(host["nvme_bandwidth_bytes_per_s_per_node"]),
        pcie_fraction=float(host["pcie_fraction"]),
        host_sources=MappingProxyType(dict(host["sources"])),
        cuda_context_bytes=float(allow["cuda_context_bytes"]),
        nccl_bytes_per_group=float(allow["nccl_bytes_per_group"]),
        fragmentation_fraction=float(allow["fragmentation_fraction"]),
        torch_ddp_bucket_bytes=float(allow["torch_ddp_bucket_bytes"]),
        deepspeed_bucket_elements=float(allow["deepspeed_bucket_elements"]),
        allowance_sources=MappingProxyType(dict(allow["sources"])),
    )


@functools.cache
def load_efficiency() -> Efficiency:
    """The shipped efficiency table (parsed and validated once per process)."""
    text = (resources.files("compiler") / "data" / EFFICIENCY_FILE).read_text(encoding="utf-8")
    return parse_efficiency(YAML(typ="safe").load(text))
