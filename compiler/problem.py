"""lower(spec) -> Problem: presets resolved, units normalised, derived sizes computed.

The Problem is what the solver and the cost model see: no optionals left that
they must interpret, SI units throughout. Semantic checks that need the resolved
model (heads divisible by a pinned tp, ...) happen here and are reported at the
spec line that caused them, all at once.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from typing import Any

from compiler.catalog import Catalog, GpuSpec, load_catalog
from compiler.errors import Diagnostic, SpecError
from compiler.model import ModelShape, MoEShape, ParamCount, count_params, derive_dense_shape
from compiler.spec.load import LoadedSpec, SourceMap
from compiler.spec.models import Spec, parse_global_batch
from compiler import units

MAX_GLOBAL_BATCH = 10_000_000  # sequences per optimizer step, the bound of every other count
DEFAULT_MAX_GPUS = 16_384  # Llama 3 405B's cluster size; the search upper bound when the spec gives none


@dataclass(frozen=True)
class GpuOption:
    """One GPU type the solver may use, with the spec's overrides applied."""

    spec: GpuSpec
    gpus_per_node: int
    price_per_gpu_hour_usd: float
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float
    power_limit_w: float | None = None  # a cluster's power cap below the part's TDP (None: run at TDP)

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class Pins:
    """Layout knobs fixed by the spec (None: solve)."""

    tp: int | None = None
    pp: int | None = None
    vpp: int | None = None
    schedule: str | None = None
    cp: int | None = None
    ep: int | None = None
    dp: int | None = None
    dp_shard: int | None = None
    zero_stage: int | None = None
    micro_batch: int | None = None
    recompute: str | None = None
    sequence_parallel: bool | None = None
    offload_optimizer: str | None = None
    offload_params: str | None = None


@dataclass(frozen=True)
class Hyper:
    learning_rate: float
    min_learning_rate: float
    warmup_tokens: int
    weight_decay: float
    grad_clip: float
    adam_beta1: float
    adam_beta2: float
    seed: int


@dataclass(frozen=True)
class Problem:
    name: str
    description: str
    spec_path: str
    spec_sha256: str
    model_name: str  # preset name, "custom", or "derived from 70B"
    shape: ModelShape
    params: ParamCount
    tokens: int
    seq_len: int
    global_batch: int  # sequences
    global_batch_tolerance: float
    batch_note: str  # how a token batch was converted, for the report
    precision: str
    optimizer: str
    hyper: Hyper
    gpu_options: tuple[GpuOption, ...]
    num_gpus: int | None  # exact
    min_gpus: int
    max_gpus: int
    max_cost_usd: float | None
    deadline_s: float | None
    objective: str
    pins: Pins
    memory_headroom: float
    allow_cross_node_tp: bool
    top_k: int
    targets: tuple[str, ...]
    slurm: dict[str, Any] = field(default_factory=dict)  # the validated slurm section, plain data
    source_path: str = ""  # the spec's path as the user gave it: for error locations, never in artifacts
    fp8_recipe: str = ""  # fp8 scaling recipe (compiler/data/physics.yaml gemm.quantize_bytes_per_element); "": the framework's

    @property
    def num_params(self) -> int:
        return self.params.total

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def num_steps(self) -> int:
        return -(-self.tokens // self.tokens_per_step)


def lower(loaded: LoadedSpec, *, catalog: Catalog | None = None) -> Problem:
    """Resolve a validated spec into a Problem, or raise SpecError listing every problem."""
    catalog = catalog or load_catalog()
    spec, src = loaded.spec, loaded.source
    diags: list[Diagnostic] = []
    shape, model_name = _resolve_model(spec, src, catalog, diags)
    options = _resolve_gpus(spec, src, catalog, diags)
    kind, n = _batch(spec, src, diags)
    if shape is not None:
        _check_shape(shape, src, diags)
        _check_pins(spec, shape, options, src, diags)
    if diags:
        raise SpecError(diags)
    assert shape is not None
    seq = spec.training.sequence_length
    if kind == "tokens":
        seqs = max(1, round(n / seq))
        note = (f"{units.format_count(n)} tokens / {seq} tokens per sequence = {seqs} sequences"
                + ("" if seqs * seq == n else f" ({units.format_count(seqs * seq)} tokens, rounded)"))
    else:
        seqs, note = n, f"{n} sequences x {seq} tokens = {units.format_count(n * seq)} tokens"
    c, b, l = spec.cluster, spec.budget, spec.layout
    gpn = min(o.gpus_per_node for o in options)
    t = spec.training
    return Problem(
        name=spec.name,
        description=spec.description or "",
        spec_path=_portable(src.path),
        source_path=src.path,
        spec_sha256=loaded.sha256,
        model_name=model_name,
        shape=shape,
        params=count_params(shape),
        tokens=t.tokens,
        seq_len=seq,
        global_batch=seqs,
        global_batch_tolerance=t.global_batch_tolerance,
        batch_note=note,
        precision=t.precision,
        optimizer=t.optimizer,
        hyper=Hyper(t.learning_rate, t.min_learning_rate, t.warmup_tokens or t.tokens // 100, t.weight_decay,
                    t.grad_clip, t.adam_beta1, t.adam_beta2, t.seed),
        gpu_options=tuple(options),
        num_gpus=c.num_gpus,
        min_gpus=c.num_gpus or c.min_gpus or 1,
        max_gpus=c.num_gpus or c.max_gpus or DEFAULT_MAX_GPUS,
        max_cost_usd=b.max_cost,
        deadline_s=b.deadline,
        objective=b.objective,
        pins=Pins(tp=l.tensor_parallel, pp=l.pipeline_parallel, vpp=l.virtual_pipeline_stages,
                  schedule=l.pipeline_schedule, cp=l.context_parallel, ep=l.expert_parallel,
                  dp=l.data_parallel, dp_shard=l.data_parallel_shard, zero_stage=l.zero_stage,
                  micro_batch=l.micro_batch_size, recompute=l.recompute, sequence_parallel=l.sequence_parallel,
                  offload_optimizer=l.offload_optimizer, offload_params=l.offload_params),
        memory_headroom=spec.search.memory_headroom,
        allow_cross_node_tp=spec.search.allow_cross_node_tp,
        top_k=spec.search.top_k,
        targets=tuple(spec.targets),
        slurm=spec.slurm.model_dump(mode="json"),
    )


def _resolve_model(spec: Spec, src: SourceMap, catalog: Catalog, diags: list[Diagnostic]
                   ) -> tuple[ModelShape | None, str]:
    m = spec.model
    fields = m.shape_fields()
    if m.params is not None:
        if m.preset is not None or fields:
            other = "preset" if m.preset is not None else next(iter(fields))
            diags.append(src.diagnostic(("model", "params"),
                                        f"model: give either params or a preset/shape, not both, got params and {other}",
                                        "remove params to use the preset/shape, or remove the shape fields",
                                        prefer_key=True))
            return None, ""
        if m.params < 10_000_000:
            diags.append(src.diagnostic(("model", "params"), f"model.params must be at least 10M, got {m.params}",
                                        "write a size with a unit, e.g. 70B"))
            return None, ""
        return derive_dense_shape(m.params), f"derived from {units.format_count(m.params)} params"
    base: dict[str, Any] = {}
    name = "custom"
    if m.preset is not None:
        preset = catalog.find_model(m.preset)
        if preset is None:
            names = catalog.model_names()
            guess = difflib.get_close_matches(m.preset.lower(), names, n=1, cutoff=0.5)
            hint = f"did you mean '{guess[0]}'?" if guess else f"known models: {', '.join(names)}"
            diags.append(src.diagnostic(("model", "preset"), f"unknown model preset, got '{m.preset}'", hint))
            return None, ""
        base = preset.shape.to_dict()
        name = preset.name
    else:
        missing = [k for k in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "ffn_hidden_size")
                   if k not in fields]
        if missing:
            diags.append(src.diagnostic(("model",), f"model needs preset, params, or a shape; missing {', '.join(missing)}",
                                        "e.g. preset: llama3-70b, or params: 70B", prefer_key=True))
            return None, ""
    moe = fields.pop("moe", None)
    merged = {**base, **fields}
    if moe is not None:
        merged["moe"] = MoEShape(**moe.model_dump())
    elif base.get("moe"):
        merged["moe"] = MoEShape(**base["moe"])
    if base.get("mla"):
        from compiler.model import MLAShape
        merged["mla"] = MLAShape(**base["mla"])
    merged.setdefault("num_kv_heads", merged["num_attention_heads"])
    if m.preset is not None and fields:
        name = f"{name} (modified)"
    return ModelShape(**{k: v for k, v in merged.items() if v is not None}), name


def _check_shape(s: ModelShape, src: SourceMap, diags: list[Diagnostic]) -> None:
    if s.num_attention_heads % s.num_kv_heads:
        diags.append(src.diagnostic(("model", "num_kv_heads"),
                                    f"num_kv_heads must divide num_attention_heads ({s.num_attention_heads}), got {s.num_kv_heads}",
                                    f"use one of {_some(_divisors(s.num_attention_heads))}"))
    if s.mla is None and not s.head_dim and s.hidden_size % s.num_attention_heads:
        diags.append(src.diagnostic(("model", "hidden_size"),
                                    f"hidden_size must be divisible by num_attention_heads ({s.num_attention_heads}), got {s.hidden_size}",
                                    "or give head_dim explicitly"))
    if s.position == "learned" and not s.max_position_embeddings:
        diags.append(src.diagnostic(("model", "position"), "learned positions need max_position_embeddings, got none",
                                    "add max_position_embeddings: 2048"))
    if s.moe is not None and s.moe.first_dense_layers >= s.num_layers:
        diags.append(src.diagnostic(("model", "moe", "first_dense_layers"),
                                    f"first_dense_layers must be less than num_layers ({s.num_layers}), got {s.moe.first_dense_layers}",
                                    "lower first_dense_layers"))


def _check_pins(spec: Spec, s: ModelShape, options: list[GpuOption], src: SourceMap,
                diags: list[Diagnostic]) -> None:
    l = spec.layout
    if l.tensor_parallel is not None:
        tp = l.tensor_parallel
        for what, n in (("num_attention_heads", s.num_attention_heads), ("num_kv_heads", s.num_kv_heads)):
            if n % tp:
                ok = [d for d in _divisors(s.num_kv_heads) if s.num_attention_heads % d == 0]
                diags.append(src.diagnostic(("layout", "tensor_parallel"),
                                            f"tensor_parallel must divide {what} ({n}), got {tp}",
                                            f"use one of {_some(ok)}"))
                break
        gpn = max((o.gpus_per_node for o in options), default=8)
        if options and tp > gpn and not spec.search.allow_cross_node_tp:
            diags.append(src.diagnostic(("layout", "tensor_parallel"),
                                        f"tensor_parallel must not exceed gpus_per_node ({gpn}), got {tp}",
                                        "tensor parallel groups stay inside a node; set search.allow_cross_node_tp: true to allow it"))
    if l.pipeline_parallel is not None:
        pp, vpp = l.pipeline_parallel, l.virtual_pipeline_stages or 1
        if pp * vpp > s.num_layers:
            diags.append(src.diagnostic(("layout", "pipeline_parallel"),
                                        f"pipeline_parallel x virtual stages must not exceed num_layers ({s.num_layers}), got {pp * vpp}",
                                        "lower pipeline_parallel"))
    if l.virtual_pipeline_stages and l.virtual_pipeline_stages > 1:
        if l.pipeline_parallel == 1:
            diags.append(src.diagnostic(("layout", "virtual_pipeline_stages"),
                                        f"virtual_pipeline_stages needs pipeline_parallel > 1, got {l.virtual_pipeline_stages}",
                                        "remove virtual_pipeline_stages or raise pipeline_parallel"))
        if l.pipeline_schedule in ("gpipe", "1f1b"):
            diags.append(src.diagnostic(("layout", "pipeline_schedule"),
                                        f"virtual stages run only with interleaved_1f1b, got {l.pipeline_schedule}",
                                        "set pipeline_schedule: interleaved_1f1b"))
    if l.expert_parallel is not None and l.expert_parallel > 1:
        if s.moe is None:
            diags.append(src.diagnostic(("layout", "expert_parallel"),
                                        f"expert_parallel needs an MoE model, got {l.expert_parallel}",
                                        "remove expert_parallel, or add model.moe"))
        elif s.moe.num_experts % l.expert_parallel:
            diags.append(src.diagnostic(("layout", "expert_parallel"),
                                        f"expert_parallel must divide num_experts ({s.moe.num_experts}), got {l.expert_parallel}",
                                        f"use one of {_some(_divisors(s.moe.num_experts))}"))
    if l.context_parallel is not None and spec.training.sequence_length % (2 * l.context_parallel) and l.context_parallel > 1:
        diags.append(src.diagnostic(("layout", "context_parallel"),
                                    f"context_parallel x 2 must divide sequence_length ({spec.training.sequence_length}), got {l.context_parallel}",
                                    "causal load balancing splits each sequence into 2 x cp chunks"))
    if l.sequence_parallel and l.tensor_parallel == 1:
        diags.append(src.diagnostic(("layout", "sequence_parallel"), "sequence_parallel needs tensor_parallel > 1, got true",
                                    "remove sequence_parallel or raise tensor_parallel"))
    if l.offload_params not in (None, "none") and l.zero_stage not in (None, 3):
        diags.append(src.diagnostic(("layout", "offload_params"),
                                    f"offload_params needs zero_stage 3, got zero_stage {l.zero_stage}",
                                    "set zero_stage: 3"))
    if l.data_parallel_shard is not None:
        if l.zero_stage == 0 and l.data_parallel_shard > 1:
            diags.append(src.diagnostic(("layout", "data_parallel_shard"),
                                        f"zero_stage 0 does not shard, got data_parallel_shard {l.data_parallel_shard}",
                                        "remove data_parallel_shard or raise zero_stage"))
        if l.data_parallel is not None and l.data_parallel % l.data_parallel_shard:
            diags.append(src.diagnostic(("layout", "data_parallel_shard"),
                                        f"data_parallel_shard must divide data_parallel ({l.data_parallel}), got {l.data_parallel_shard}",
                                        "the replicate degree is data_parallel / data_parallel_shard"))
    fixed = [l.tensor_parallel, l.pipeline_parallel, l.context_parallel, l.data_parallel]
    n = spec.cluster.num_gpus
    if n is not None and all(x is not None for x in fixed):
        prod = l.tensor_parallel * l.pipeline_parallel * l.context_parallel * l.data_parallel
        if prod != n:
            diags.append(src.diagnostic(("layout",),
                                        f"tensor x pipeline x context x data parallel must equal num_gpus ({n}), got {prod}",
                                        "change one degree, or remove data_parallel so it is derived", prefer_key=True))


def _resolve_gpus(spec: Spec, src: SourceMap, catalog: Catalog, diags: list[Diagnostic]) -> list[GpuOption]:
    from compiler.spec.models import CustomGpuSpec

    c = spec.cluster
    raw = c.gpu
    found: list[GpuSpec] = []
    if isinstance(raw, CustomGpuSpec):
        found.append(_custom_gpu(raw))
    else:
        names = [raw] if isinstance(raw, str) else list(raw)
        for i, name in enumerate(names):
            gpu = catalog.find_gpu(name)
            if gpu is None:
                loc = ("cluster", "gpu") if isinstance(raw, str) else ("cluster", "gpu", i)
                known = catalog.gpu_names()
                guess = difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.5)
                diags.append(src.diagnostic(loc, f"unknown GPU type, got '{name}'",
                                            f"did you mean '{guess[0]}'?" if guess else
                                            f"known GPUs: {', '.join(known)}; or describe a custom GPU"))
            else:
                found.append(gpu)
    net = c.network
    out = []
    for g in found:
        out.append(GpuOption(
            spec=g,
            gpus_per_node=c.gpus_per_node or g.default_gpus_per_node,
            price_per_gpu_hour_usd=c.price_per_gpu_hour if c.price_per_gpu_hour is not None else g.price_per_gpu_hour_usd,
            intra_node_bandwidth_bytes_per_s=(net.intra_node_bandwidth if net and net.intra_node_bandwidth
                                              else g.intra_node_bandwidth_bytes_per_s),
            inter_node_bandwidth_bytes_per_s=(net.inter_node_bandwidth if net and net.inter_node_bandwidth
                                              else g.inter_node_bandwidth_bytes_per_s),
        ))
    if c.num_gpus is not None:
        for o in out:
            if c.num_gpus > o.gpus_per_node and c.num_gpus % o.gpus_per_node:
                diags.append(src.diagnostic(("cluster", "num_gpus"),
                                            f"num_gpus must be whole nodes of {o.gpus_per_node} GPUs, got {c.num_gpus}",
                                            f"use {c.num_gpus // o.gpus_per_node * o.gpus_per_node} or "
                                            f"{(c.num_gpus // o.gpus_per_node + 1) * o.gpus_per_node}"))
                break
    return out


def _custom_gpu(c: Any) -> GpuSpec:
    import types

    peak = {"bf16": c.bf16_flops, "fp16": c.bf16_flops, "fp32": c.fp32_flops or c.bf16_flops / 2,
            "tf32": c.fp32_flops or c.bf16_flops / 2}
    if c.fp8_flops:
        peak["fp8"] = c.fp8_flops
    src = "given in the spec (cluster.gpu)"
    return GpuSpec(
        name=c.name, display_name=c.name, vendor="custom", generation=c.generation,
        peak_flops=types.MappingProxyType(peak), hbm_bytes=c.hbm, hbm_bandwidth_bytes_per_s=c.hbm_bandwidth,
        intra_node_link="custom", intra_node_bandwidth_bytes_per_s=c.intra_node_bandwidth,
        nvlink_domain_gpus=8, default_gpus_per_node=8, inter_node_bandwidth_bytes_per_s=c.inter_node_bandwidth,
        pcie_bandwidth_bytes_per_s=c.pcie_bandwidth, price_per_gpu_hour_usd=c.price_per_gpu_hour,
        sources=types.MappingProxyType({k: src for k in ("peak_flops", "hbm", "hbm_bandwidth", "intra_node_bandwidth",
                                                         "inter_node_bandwidth", "pcie_bandwidth", "price_per_gpu_hour")}),
    )


def _batch(spec: Spec, src: SourceMap, diags: list[Diagnostic]) -> tuple[str, int]:
    try:
        kind, n = parse_global_batch(spec.training.global_batch)
    except units.UnitError as exc:
        diags.append(src.diagnostic(("training", "global_batch"),
                                    f"training.global_batch must be a batch size, got {spec.training.global_batch!r}",
                                    f"write {exc.expected}"))
        return "sequences", 1
    if kind == "tokens" and n < spec.training.sequence_length:
        diags.append(src.diagnostic(("training", "global_batch"),
                                    f"training.global_batch must hold at least one sequence ({spec.training.sequence_length} tokens), got {n} tokens",
                                    "raise the batch, e.g. '4M tokens'"))
    seqs = n if kind == "sequences" else round(n / spec.training.sequence_length)
    if seqs > MAX_GLOBAL_BATCH:
        diags.append(src.diagnostic(("training", "global_batch"),
                                    f"training.global_batch must be at most {MAX_GLOBAL_BATCH} sequences, "
                                    f"got {units.format_count(seqs)}",
                                    "write the batch per optimizer step, e.g. 2048 or '16M tokens'"))
    return kind, n


def _portable(path: str) -> str:
    """The spec path as recorded in the plan: an absolute path is reduced to its file name, so that
    plan.json holds nothing of the machine it was compiled on (a relative path is kept as given)."""
    from pathlib import PurePosixPath, PureWindowsPath

    if PurePosixPath(path).is_absolute() or PureWindowsPath(path).is_absolute():
        return PureWindowsPath(path).name if "\\" in path else PurePosixPath(path).name
    return path


def _divisors(n: int) -> list[int]:
    """Divisors of ``n`` in ascending order (O(sqrt n): shape fields go up to 10M)."""
    low, high = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            low.append(d)
            if d * d != n:
                high.append(n // d)
        d += 1
    return low + high[::-1]


def _some(values: list[int], limit: int = 12) -> str:
    """'1, 2, 4, 8' -- or the first ``limit`` and a count of the rest, for hints."""
    shown = ", ".join(map(str, values[:limit]))
    return shown if len(values) <= limit else f"{shown}, ... ({len(values)} in all)"
