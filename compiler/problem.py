"""lower(spec) -> Problem: presets resolved, units normalised, derived sizes computed.

The Problem is what the solver and the cost model see: no optionals left that
they must interpret, SI units throughout. Semantic checks that need the resolved
model (heads divisible by a pinned tp, ...) happen here and are reported at the
spec line that caused them, all at once.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compiler.catalog import Catalog, GpuSpec, load_catalog
from compiler.errors import Diagnostic, SpecError
from compiler.arith import divisors
from compiler.model import ModelShape, MoEShape, ParamCount, count_params, derive_dense_shape
from compiler.rules import some
from compiler.split import PipelineSplit
from compiler.spec.load import LoadedSpec, SourceMap
from compiler.spec.models import DataSpec, SlurmSpec, Spec, parse_global_batch
from compiler import units
from compiler.profile_ref import ProfileRef

if TYPE_CHECKING:
    from compiler.layout import Offload, Recompute, Schedule  # names only: `dtc validate` never imports layout
    from compiler.rules import Facts

MAX_GLOBAL_BATCH = 10_000_000  # sequences per optimizer step, the bound of every other count
DEFAULT_MAX_GPUS = 16_384  # Llama 3 405B's cluster size; the search upper bound when the spec gives none
# A token batch is a target: the sequence count is the one within this much of it that splits best
# (compiler.arith.well_dividing_count). 5% covers the decimal/binary reading of a suffix: Llama 2's
# "4M-token batch" is 1024 x 4096 = 4.19M tokens, Llama 3's "16M" is 2048 x 8192 = 16.78M (+4.9%).
TOKEN_BATCH_ROUNDING = 0.05


@dataclass(frozen=True)
class GpuOption:
    """One GPU type the solver may use, with the spec's overrides applied."""

    spec: GpuSpec
    gpus_per_node: int
    price_per_gpu_hour_usd: float
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float
    power_limit_w: float | None = None  # a cluster's power cap below the part's TDP (None: run at TDP)
    # host (CPU) memory per node, what offloaded states must fit in (cluster.host_memory, else the catalog's
    # reference system scaled to gpus_per_node); 0: not known, not checked
    host_memory_bytes_per_node: int = 0

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class Pins:
    """Layout knobs fixed by the spec (None: solve)."""

    tp: int | None = None
    pp: int | None = None
    vpp: int | None = None
    schedule: Schedule | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None
    dp: int | None = None
    dp_shard: int | None = None
    zero_stage: int | None = None
    micro_batch: int | None = None
    recompute: Recompute | None = None
    sequence_parallel: bool | None = None
    offload_optimizer: Offload | None = None
    offload_params: Offload | None = None
    split: PipelineSplit | None = None  # Megatron's split mechanism (compiler.split)

    def knobs(self) -> dict[str, Any]:
        """The pins by name, as compiler.rules.Knobs names them (None: not pinned)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def of(cls, layout: Any) -> "Pins":
        """Every knob of ``layout`` (a compiler.layout.Layout) pinned: the search can only find that layout."""
        return cls(tp=layout.tp, pp=layout.pp, vpp=layout.vpp, schedule=layout.schedule, cp=layout.cp, ep=layout.ep,
                   etp=layout.expert_tp, dp=layout.dp, dp_shard=layout.dp_shard, zero_stage=layout.zero_stage,
                   micro_batch=layout.micro_batch, recompute=layout.recompute,
                   sequence_parallel=layout.sequence_parallel, offload_optimizer=layout.offload_optimizer,
                   offload_params=layout.offload_params, split=layout.split)


def pins_of(l: Any) -> Pins:
    """The knobs a spec's ``layout`` section pins (a LayoutSpec; absent: None)."""
    return Pins(tp=l.tensor_parallel, pp=l.pipeline_parallel, vpp=l.virtual_pipeline_stages,
                schedule=l.pipeline_schedule, cp=l.context_parallel, ep=l.expert_parallel,
                etp=l.expert_tensor_parallel, dp=l.data_parallel, dp_shard=l.data_parallel_shard,
                zero_stage=l.zero_stage, micro_batch=l.micro_batch_size, recompute=l.recompute,
                sequence_parallel=l.sequence_parallel, offload_optimizer=l.offload_optimizer,
                offload_params=l.offload_params, split=l.split())


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
    learning_rate_source: str = ""  # "": the spec's; else the published recipe the default comes from


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
    slurm: SlurmSpec = field(default_factory=SlurmSpec)  # the validated slurm section
    data: DataSpec | None = None  # the spec's data section (None: none given)
    init: str | None = None  # model.init: a Hugging Face safetensors folder to start from
    source_path: str = ""  # the spec's path as the user gave it: for error locations, never in artifacts
    fp8_recipe: str = ""  # fp8 scaling recipe (compiler/data/physics.yaml gemm.quantize_bytes_per_element); "": the framework's
    max_gpus_default: bool = False  # max_gpus is DEFAULT_MAX_GPUS: the spec gave no GPU count or cap
    profile: ProfileRef | None = None  # cluster.profile: the constants measured on this cluster (dtc calibrate)
    confidence: str = "p80"  # budget.confidence: the step-time quantile the objective ranks by

    @property
    def num_params(self) -> int:
        return self.params.total

    @functools.cached_property
    def facts(self) -> "Facts":
        """What the layout rules (compiler.rules) know about this problem."""
        from compiler.rules import Facts

        return Facts.of(self)

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
    _check_limits(spec, src, diags)
    kind, n = _batch(spec, src, diags)
    seq = spec.training.sequence_length
    seqs, note = batch_sequences(kind, n, seq, spec.training.global_batch_tolerance)
    if shape is not None:
        _check_shape(shape, src, diags)
        _check_positions(shape, spec.training.sequence_length, src, diags)
        _check_pins(spec, shape, options, seqs, src, diags)
        _check_model_support(spec, shape, src, diags)
    profile = _load_profile(spec, src, diags, options)
    if diags:
        raise SpecError(diags)
    assert shape is not None
    c, b = spec.cluster, spec.budget
    t = spec.training
    params = count_params(shape)
    lr, min_lr, lr_source = _learning_rates(t, params.total, src)
    return Problem(
        name=spec.name,
        description=spec.description or "",
        spec_path=_portable(src.path),
        source_path=src.path,
        spec_sha256=loaded.sha256,
        model_name=model_name,
        shape=shape,
        params=params,
        tokens=t.tokens,
        seq_len=seq,
        global_batch=seqs,
        global_batch_tolerance=t.global_batch_tolerance,
        batch_note=note,
        precision=t.precision,
        optimizer=t.optimizer,
        hyper=Hyper(lr, min_lr, t.warmup_tokens or t.tokens // 100, t.weight_decay,
                    t.grad_clip, t.adam_beta1, t.adam_beta2, t.seed, lr_source),
        gpu_options=tuple(options),
        num_gpus=c.num_gpus,
        min_gpus=c.num_gpus or c.min_gpus or 1,
        max_gpus=c.num_gpus or c.max_gpus or DEFAULT_MAX_GPUS,
        max_gpus_default=c.num_gpus is None and c.max_gpus is None,
        max_cost_usd=b.max_cost,
        deadline_s=b.deadline,
        objective=b.objective,
        confidence=b.confidence,
        pins=pins_of(spec.layout),
        memory_headroom=spec.search.memory_headroom,
        allow_cross_node_tp=spec.search.allow_cross_node_tp,
        top_k=spec.search.top_k,
        targets=tuple(spec.targets),
        slurm=spec.slurm,
        data=spec.data,
        init=spec.model.init,
        profile=profile,
    )


def _load_profile(spec: Spec, src: SourceMap, diags: list[Diagnostic], options: list[GpuOption]) -> ProfileRef | None:
    """cluster.profile: the profile file, relative to the spec, read and validated (compiler/calibration/profile.py)."""
    given = spec.cluster.profile
    if given is None:
        return None
    from pathlib import Path

    from compiler.calibration.profile import load_profile
    from compiler.errors import DtcError

    base = Path(src.path).parent if src.path and not src.path.startswith("<") else Path(".")
    path = Path(given) if Path(given).is_absolute() else base / given
    try:
        profile, sha = load_profile(path)
    except DtcError as exc:
        inner = exc.diagnostics[0]
        where = f" ({inner.location})" if inner.location is not None and str(inner.location.path) not in \
            inner.summary else ""
        diags.append(src.diagnostic(("cluster", "profile"), f"cluster.profile: {inner.summary}{where}",
                                    inner.hint or "write one with: dtc calibrate RUNS... -o profiles/NAME.yaml"))
        return None
    names = [o.name for o in options]
    if options and profile.gpus and not set(names) & set(profile.gpus):
        diags.append(src.diagnostic(("cluster", "profile"),
                                    f"cluster.profile {given} was calibrated on {', '.join(profile.gpus)}, not on the "
                                    f"spec's {', '.join(names)}",
                                    "a profile describes one cluster: calibrate one on this cluster's GPUs"))
        return None
    return profile.ref(given, sha)


def problem_from_data(data: dict[str, Any], *, path: str = "<data>", catalog: Catalog | None = None) -> Problem:
    """The Problem of a spec given as data (no YAML): validated and lowered exactly as a spec file is."""
    from compiler.spec.load import load_spec_data

    return lower(load_spec_data(data, path), catalog=catalog)


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


def _check_limits(spec: Spec, src: SourceMap, diags: list[Diagnostic]) -> None:
    """A spec must bound the run somehow: with no GPU count, budget or deadline every objective runs away to
    the largest cluster dtc can imagine (fastest: an 8B model on 4,096 GPUs for an hour; cheapest: the
    fastest of the near-equal costs, the same)."""
    c, b = spec.cluster, spec.budget
    if c.num_gpus is None and c.max_gpus is None and b.max_cost is None and b.deadline is None:
        diags.append(src.diagnostic(
            ("cluster",), f"cluster needs a GPU limit: with no cluster.max_gpus (or num_gpus), budget.max_cost or "
            f"budget.deadline, objective '{b.objective}' would use every GPU up to {DEFAULT_MAX_GPUS:,}",
            "add 'max_gpus: 512' (the most GPUs you can use) or 'num_gpus: 64' under cluster:, or a budget "
            "(budget: {max_cost: $1M}) or a deadline (budget: {deadline: 30d})", prefer_key=True))


def _check_positions(s: ModelShape, seq_len: int, src: SourceMap, diags: list[Diagnostic]) -> None:
    """A learned position table must cover the sequence (issue #16: a 128-row table with sequence
    4096 was accepted; plan.json said 128 and megatron_args.sh 4096)."""
    if s.position == "learned" and 0 < s.max_position_embeddings < seq_len:
        diags.append(src.diagnostic(("model", "max_position_embeddings"),
                                    f"model.max_position_embeddings must cover training.sequence_length ({seq_len}) "
                                    f"with learned positions, got {s.max_position_embeddings}",
                                    f"raise max_position_embeddings to {seq_len}, shorten the sequence, or use "
                                    "position: rope"))


def _check_shape(s: ModelShape, src: SourceMap, diags: list[Diagnostic]) -> None:
    if s.num_attention_heads % s.num_kv_heads:
        diags.append(src.diagnostic(("model", "num_kv_heads"),
                                    f"num_kv_heads must divide num_attention_heads ({s.num_attention_heads}), got {s.num_kv_heads}",
                                    f"use one of {some(divisors(s.num_attention_heads))}"))
    if s.mla is None and not s.head_dim and s.hidden_size % s.num_attention_heads:
        diags.append(src.diagnostic(("model", "hidden_size"),
                                    f"hidden_size must be divisible by num_attention_heads ({s.num_attention_heads}), got {s.hidden_size}",
                                    "or give head_dim explicitly"))
    if s.position == "learned" and not s.max_position_embeddings:
        diags.append(src.diagnostic(("model", "position"), "learned positions need max_position_embeddings, got none",
                                    "add max_position_embeddings: 2048"))
    if s.full_attention_every and not s.window_size:
        diags.append(src.diagnostic(("model", "full_attention_every"),
                                    f"full_attention_every needs a sliding window, got window_size {s.window_size}",
                                    "add window_size: 128 (the window in tokens), or remove full_attention_every"))
    if s.moe is not None and s.moe.first_dense_layers >= s.num_layers:
        diags.append(src.diagnostic(("model", "moe", "first_dense_layers"),
                                    f"first_dense_layers must be less than num_layers ({s.num_layers}), got {s.moe.first_dense_layers}",
                                    "lower first_dense_layers"))


def _learning_rates(t: Any, num_params: int, src: SourceMap) -> tuple[float, float, str]:
    """(peak lr, final lr, source): the spec's, else the published recipe for a model of ``num_params``
    parameters (compiler/data/recipes.yaml); a final lr the spec gives may not exceed the default peak."""
    from compiler.catalog import recipe_for

    recipe = recipe_for(num_params)
    lr = t.learning_rate if t.learning_rate is not None else recipe.lr
    min_lr = (t.min_learning_rate if t.min_learning_rate is not None
              else float(f"{lr * recipe.min_lr_ratio:.12g}"))  # 1.5e-4 x 0.1 = 1.5e-05, not 1.4999999999999999e-05
    if min_lr > lr:
        raise SpecError([src.diagnostic(
            ("training", "min_learning_rate"),
            f"min_learning_rate {min_lr:g} exceeds the default learning rate {lr:g} for this model's size",
            "set training.learning_rate too, or lower min_learning_rate",
            detail=f"the default peak comes from {' '.join(recipe.source.split())}")])
    source = "" if t.learning_rate is not None else " ".join(recipe.source.split())
    return lr, min_lr, source


def _check_model_support(spec: Spec, shape: ModelShape, src: SourceMap, diags: list[Diagnostic]) -> None:
    """Targets that cannot build the model at all (compiler.targets.support.model_reasons: the runtime's
    Transformer has no experts or MLA), at the spec's targets (or its model when targets are the default)."""
    from compiler.targets import registry
    from compiler.targets.support import model_reasons

    reasons = model_reasons(spec.targets, shape)
    if not reasons:
        return
    keep = [t for t in spec.targets if t not in reasons]
    if all(registry.get(t).launches_others for t in keep):  # no framework left: the first that can build it
        frameworks = [t.name for t in registry.targets() if t.slurm is not None]
        every = model_reasons(frameworks, shape)
        builds = next((t for t in frameworks if t not in every), None)
        if builds is None:  # no target of dtc builds it: the model must change
            diags.append(src.diagnostic(
                ("model",), "no target can build this model (" + "; ".join(
                    f"{registry.get(t).display_name}: {why}" for t, why in every.items()) + ")",
                "change the model as the reasons say", code="framework_unsupported", prefer_key=True))
            return
        keep.insert(0, builds)
    explicit = "targets" in spec.model_fields_set
    where = ("targets",) if explicit else ("model",)
    by_reason: dict[str, list[str]] = {}
    for t, why in reasons.items():
        by_reason.setdefault(why, []).append(registry.get(t).display_name)
    names = "; ".join(f"{' and '.join(ts)}: {why}" for why, ts in by_reason.items())
    diags.append(src.diagnostic(
        where, f"{' and '.join(reasons)} cannot build this model ({names})",
        f"set targets: [{', '.join(keep)}]" + ("" if explicit else " (the default is every target)"),
        code="framework_unsupported", prefer_key=True))


def _check_pins(spec: Spec, shape: ModelShape, options: list[GpuOption], seqs: int, src: SourceMap,
                diags: list[Diagnostic]) -> None:
    """Every layout rule (compiler.rules) the pinned knobs already break, at the pinned field's line."""
    from compiler.arith import GpuCounts, batch_range
    from compiler.rules import (FRAMEWORK_UNSUPPORTED, GPU_COUNT_NOT_ALLOWED, PRECISION_UNSUPPORTED, SPEC_KEYS, Facts,
                                Knobs, gpu_facts, violations)

    l, t, c = spec.layout, spec.training, spec.cluster
    knobs = Knobs(**pins_of(l).knobs())
    min_gpus, max_gpus = c.num_gpus or c.min_gpus or 1, c.num_gpus or c.max_gpus or DEFAULT_MAX_GPUS
    gpus = {o.name: gpu_facts(o, t.precision, GpuCounts(min_gpus, max_gpus, o.gpus_per_node, c.num_gpus))
            for o in options}
    facts = Facts(shape=shape, seq_len=t.sequence_length, precision=t.precision, targets=tuple(spec.targets),
                  gpus=gpus, allow_cross_node_tp=spec.search.allow_cross_node_tp,
                  batch=batch_range(seqs, t.global_batch_tolerance))
    found = violations(facts, knobs)
    if any(r.code != FRAMEWORK_UNSUPPORTED for r in found):  # the layout itself first, then what targets can run
        found = [r for r in found if r.code != FRAMEWORK_UNSUPPORTED]
    # the rules about one GPU: a violation only when every GPU option breaks it
    for code in (PRECISION_UNSUPPORTED, GPU_COUNT_NOT_ALLOWED):
        per_option = [violations(facts, knobs.with_(gpu=o.name), codes=(code,)) for o in options]
        if per_option and all(per_option):
            found.append(per_option[0][0])
    for r in found:
        where = r.details.get("field", "")
        key = SPEC_KEYS.get(where)
        loc: tuple[str, ...] = ("training", "precision") if where == "precision" else ("cluster", "gpu") \
            if where == "gpu" else ("layout", key) if key and getattr(l, key) is not None else ("layout",)
        diags.append(src.diagnostic(loc, r.message, r.fix, code=r.code, prefer_key=loc == ("layout",)))


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
        per_node = c.gpus_per_node or g.default_gpus_per_node
        out.append(GpuOption(
            spec=g,
            gpus_per_node=per_node,
            price_per_gpu_hour_usd=c.price_per_gpu_hour if c.price_per_gpu_hour is not None else g.price_per_gpu_hour_usd,
            intra_node_bandwidth_bytes_per_s=(net.intra_node_bandwidth if net and net.intra_node_bandwidth
                                              else g.intra_node_bandwidth_bytes_per_s),
            inter_node_bandwidth_bytes_per_s=(net.inter_node_bandwidth if net and net.inter_node_bandwidth
                                              else g.inter_node_bandwidth_bytes_per_s),
            host_memory_bytes_per_node=(c.host_memory if c.host_memory is not None else
                                        g.host_memory_bytes * per_node // g.default_gpus_per_node),
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
    if c.fp4_flops:
        peak["fp4"] = c.fp4_flops
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
    seqs = batch_sequences(kind, n, spec.training.sequence_length)[0]
    if seqs > MAX_GLOBAL_BATCH:
        diags.append(src.diagnostic(("training", "global_batch"),
                                    f"training.global_batch must be at most {MAX_GLOBAL_BATCH} sequences, "
                                    f"got {units.format_count(seqs)}",
                                    "write the batch per optimizer step, e.g. 2048 or '16M tokens'"))
    return kind, n


def batch_sequences(kind: str, n: int, seq_len: int, tolerance: float = 0.0) -> tuple[int, str]:
    """(sequences per optimizer step, how they were chosen) for a batch of ``n`` ``kind`` ('tokens' or
    'sequences'). A token batch is a target: the count within TOKEN_BATCH_ROUNDING of it that splits best."""
    from compiler.arith import power_of_two_form, well_dividing_count

    after = (f"; the solver may realise it within {tolerance:.0%} (training.global_batch_tolerance)"
             if tolerance > 0 else "")
    if kind != "tokens":
        return n, f"{n} sequences x {seq_len} tokens = {units.format_count(n * seq_len)} tokens{after}"
    target = n / seq_len
    seqs = well_dividing_count(target, TOKEN_BATCH_ROUNDING)
    exact = f"{target:.1f}" if target != int(target) else str(int(target))
    head = f"{units.format_count(n)} tokens / {seq_len} tokens per sequence = {exact} sequences"
    if seqs == target:
        return seqs, f"{head} = {power_of_two_form(seqs)}{after}"
    dev = seqs / target - 1
    return seqs, (f"{head}; chose {seqs} = {power_of_two_form(seqs)} ({units.format_count(seqs * seq_len)} tokens, "
                  f"{dev:+.1%}): within {TOKEN_BATCH_ROUNDING:.0%} of the target, the count with the most factors "
                  f"of two, so that it splits evenly over data-parallel ranks and micro-batches (write "
                  f"'global_batch: {round(target)}' for {round(target)} sequences exactly){after}")


def _portable(path: str) -> str:
    """The spec path as recorded in the plan: an absolute path is reduced to its file name, so that
    plan.json holds nothing of the machine it was compiled on (a relative path is kept as given)."""
    from pathlib import PurePosixPath, PureWindowsPath

    if PurePosixPath(path).is_absolute() or PureWindowsPath(path).is_absolute():
        return PureWindowsPath(path).name if "\\" in path else PurePosixPath(path).name
    return path
