"""The built-in catalog: GPU specs and model presets from ``compiler/data/*.yaml``.

The data files are read from the package's own folder (``DATA_DIR``: an installed wheel
unpacks them beside this module) and validated strictly: an unknown or missing field, a
bad unit, or a name that collides with another entry's name or alias raises ``ValueError``
naming the file and the entry.

Every GPU figure is per GPU; bandwidths are per direction; FLOP rates are dense
(no 2:4 sparsity). See the header of ``compiler/data/gpus.yaml`` for the conventions
and each entry's ``sources`` for where every number comes from.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from ruamel.yaml import YAML

from .model import ROPE_SCALING_KINDS, MLAShape, ModelHyperparameters, ModelShape, MoEShape, RopeScaling
from .units import UnitError, parse_bandwidth, parse_bytes, parse_count, parse_flops, parse_money

__all__ = ["GpuSpec", "ModelPreset", "Catalog", "load_catalog", "normalize_name", "PRECISIONS", "TrainingRecipe",
           "recipe_for"]

GPUS_FILE = "gpus.yaml"
MODELS_FILE = "models.yaml"
RECIPES_FILE = "recipes.yaml"

PRECISIONS = ("bf16", "fp16", "fp8", "fp4", "tf32", "fp32")
_REQUIRED_PRECISIONS = ("bf16", "fp16", "tf32", "fp32")  # fp8 is absent on Ampere, fp4 before Blackwell
_PRECISION_ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "float8": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_hybrid": "fp8",
    "nvfp4": "fp4",  # NVFP4 training (Transformer Engine NVFP4BlockScaling) runs its GEMMs on the FP4 tensor cores
}
_VENDORS = ("nvidia", "amd")
_GENERATIONS = ("ampere", "ada", "hopper", "blackwell", "cdna3")
# Which published kernel benchmarks describe a part (compiler/data/physics.yaml). Blackwell Ultra
# (B300, GB300) is generation "blackwell" for the renderers but has twice Blackwell's softmax
# (exponential) throughput, so its attention kernels have their own measurements.
_KERNEL_CLASSES = ("ampere", "ada", "hopper", "blackwell", "blackwell_ultra", "cdna3")
_LINKS = ("nvlink3", "nvlink4", "nvlink5", "xgmi", "pcie4", "pcie5")

# Numeric GPU fields; each needs an entry in `sources`.
GPU_SOURCED_FIELDS = (
    "peak_flops",
    "hbm",
    "hbm_bandwidth",
    "intra_node_bandwidth",
    "nvlink_domain_gpus",
    "default_gpus_per_node",
    "inter_node_bandwidth",
    "pcie_bandwidth",
    "price_per_gpu_hour",
    "tdp",
)
_GPU_FIELDS = (
    "display_name", "aliases", "vendor", "generation", "peak_flops", "hbm", "hbm_bandwidth",
    "intra_node_link", "intra_node_bandwidth", "nvlink_domain_gpus", "default_gpus_per_node",
    "inter_node_bandwidth", "pcie_bandwidth", "price_per_gpu_hour", "tdp", "sources",
)
_GPU_OPTIONAL_FIELDS = ("kernel_class", "host_memory")
_MODEL_FIELDS = (
    "display_name", "aliases", "published_params", "published_active_params", "source", "shape", "hyperparameters",
)
_HYPER_FIELDS = ("rope_theta", "rope_scaling", "norm_eps", "init_std", "sources")


def normalize_name(name: str) -> str:
    """Lookup key: case-insensitive, surrounding space dropped, spaces/underscores -> '-'."""
    return re.sub(r"[\s_]+", "-", name.strip().lower())


@dataclass(frozen=True)
class GpuSpec:
    """One GPU type. FLOP/s are dense; bandwidths are bytes/s per GPU per direction."""

    name: str
    display_name: str
    vendor: str
    generation: str
    peak_flops: Mapping[str, float]  # FLOP/s dense, by dtype: bf16, fp16, fp8, fp4, tf32, fp32
    hbm_bytes: int
    hbm_bandwidth_bytes_per_s: float
    intra_node_link: str
    intra_node_bandwidth_bytes_per_s: float
    nvlink_domain_gpus: int
    default_gpus_per_node: int
    inter_node_bandwidth_bytes_per_s: float
    pcie_bandwidth_bytes_per_s: float
    price_per_gpu_hour_usd: float
    sources: Mapping[str, str]
    aliases: tuple[str, ...] = ()
    tdp_w: float = 0.0  # board power the datasheet peaks are quoted at; 0: unknown (custom GPUs)
    kernel_class: str = ""  # which kernel benchmarks apply (compiler/data/physics.yaml); "" -> generation
    # host (CPU) memory of the reference system's node of default_gpus_per_node GPUs; 0: not known
    host_memory_bytes: int = 0

    @property
    def kernel_family(self) -> str:
        """The kernel-benchmark class of this part (its generation unless the catalog says otherwise)."""
        return self.kernel_class or self.generation

    def peak_flops_for(self, precision: str) -> float:
        """Dense peak FLOP/s for the matmuls of training in ``precision``.

        ``bf16``/``fp16``/``fp8``/``fp4`` (``nvfp4``)/``tf32`` return that tensor-core rate. ``fp32`` training
        returns the TF32 tensor-core rate: PyTorch/Megatron/DeepSpeed run FP32 matmuls on
        TF32 tensor cores on every GPU in the catalog (``allow_tf32``); the plain CUDA-core
        FP32 rate stays available as ``peak_flops["fp32"]``. A precision the GPU lacks
        (FP8 on Ampere, FP4 before Blackwell) raises ``KeyError``; there is no silent fallback.
        """
        key = _PRECISION_ALIASES.get(precision.strip().lower(), precision.strip().lower())
        if key not in PRECISIONS:
            raise KeyError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
        lookup = "tf32" if key == "fp32" else key
        if lookup not in self.peak_flops:
            have = ", ".join(k for k in PRECISIONS if k in self.peak_flops)
            raise KeyError(
                f"{self.display_name} ({self.generation}) has no {lookup} tensor cores; "
                f"supported: {have}. Choose another precision (e.g. bf16) or another GPU."
            )
        return self.peak_flops[lookup]


@dataclass(frozen=True)
class ModelPreset:
    name: str
    display_name: str
    aliases: tuple[str, ...]
    shape: ModelShape
    published_params: int
    published_active_params: int | None
    source: str
    hyperparameters: ModelHyperparameters


@dataclass(frozen=True)
class Catalog:
    gpus: Mapping[str, GpuSpec]
    models: Mapping[str, ModelPreset]
    _gpu_index: Mapping[str, str] = dataclasses.field(init=False, repr=False, compare=False)  # normalised name or alias -> name
    _model_index: Mapping[str, str] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_gpu_index", _build_index(self.gpus, "gpu"))
        object.__setattr__(self, "_model_index", _build_index(self.models, "model"))

    def find_gpu(self, name: str) -> GpuSpec | None:
        """By canonical name or alias, case-insensitively; None when unknown."""
        key = self._gpu_index.get(normalize_name(name))
        return None if key is None else self.gpus[key]

    def find_model(self, name: str) -> ModelPreset | None:
        key = self._model_index.get(normalize_name(name))
        return None if key is None else self.models[key]

    def gpu_names(self) -> list[str]:
        return sorted(self.gpus)

    def model_names(self) -> list[str]:
        return sorted(self.models)


def _build_index(entries: Mapping[str, Any], kind: str) -> Mapping[str, str]:
    index: dict[str, str] = {}
    for name, entry in entries.items():
        for key in (name, *entry.aliases):
            norm = normalize_name(key)
            if norm in index:
                raise ValueError(
                    f"{kind} name {key!r} of {name!r} collides with {index[norm]!r}"
                    + (" (repeated name or alias)" if index[norm] == name else "")
                )
            index[norm] = name
    return MappingProxyType(index)


# --- loading ----------------------------------------------------------------------------------


class _Ctx:
    """Error context: which file and entry is being read."""

    def __init__(self, file: str, entry: str):
        self.file, self.entry = file, entry

    def error(self, message: str) -> ValueError:
        return ValueError(f"compiler/data/{self.file}: entry {self.entry!r}: {message}")


# (a path beside this module, not importlib.resources: importing that took about 7 ms of `dtc validate`, issue #14)
DATA_DIR = Path(__file__).parent / "data"
CACHE_ENV = "DTC_CACHE_DIR"  # where parsed data files are kept (default ~/.cache/dtc/data); "off": never
CACHE_FORMAT = "1"  # bump when what a cache file holds changes


def cache_dir() -> Path | None:
    given = os.environ.get(CACHE_ENV)
    if given == "off":
        return None
    return Path(given) / "data" if given else Path.home() / ".cache" / "dtc" / "data"


def _parse_yaml_cached(filename: str, raw: bytes) -> Any:
    """``raw`` parsed as YAML, kept as JSON in the user's cache under the hash of its bytes: the C JSON reader
    takes ~0.3 ms where YAML takes ~20 ms for the catalog, a tenth of `dtc validate`'s start-up. The YAML
    file stays the one source (a changed file has another hash); a cache that cannot be read or written is
    skipped, and data that JSON would not give back exactly is not cached."""
    folder = cache_dir()
    key = hashlib.sha256(CACHE_FORMAT.encode() + b"\0" + raw).hexdigest()[:32]
    cached = None if folder is None else folder / f"{Path(filename).stem}-{key}.json"
    if cached is not None:
        try:
            return json.loads(cached.read_bytes())
        except (OSError, ValueError):
            pass
    data = YAML(typ="safe").load(raw.decode("utf-8"))
    if cached is not None:
        try:
            text = json.dumps(data)
            if json.loads(text) == data:
                cached.parent.mkdir(parents=True, exist_ok=True)
                tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, cached)
        except (OSError, TypeError, ValueError):
            pass
    return data


def _read_yaml(filename: str) -> dict:
    raw = (DATA_DIR / filename).read_bytes()
    data = _parse_yaml_cached(filename, raw)
    if not isinstance(data, dict) or not data:
        raise ValueError(f"compiler/data/{filename}: expected a non-empty mapping of entries")
    return data


def _check_keys(ctx: _Ctx, raw: Any, allowed: tuple[str, ...], required: tuple[str, ...], what: str) -> dict:
    if not isinstance(raw, dict):
        raise ctx.error(f"{what} must be a mapping, got {type(raw).__name__}")
    unknown = sorted(set(map(str, raw)) - set(allowed))
    if unknown:
        raise ctx.error(f"unknown field(s) in {what}: {', '.join(unknown)}; allowed: {', '.join(allowed)}")
    missing = [k for k in required if k not in raw]
    if missing:
        raise ctx.error(f"missing field(s) in {what}: {', '.join(missing)}")
    return raw


def _str(ctx: _Ctx, value: Any, field: str, choices: tuple[str, ...] | None = None) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ctx.error(f"{field} must be a non-empty string, got {value!r}")
    if choices is not None and value not in choices:
        raise ctx.error(f"{field} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _int(ctx: _Ctx, value: Any, field: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ctx.error(f"{field} must be an integer >= {minimum}, got {value!r}")
    return value


def _bool(ctx: _Ctx, value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise ctx.error(f"{field} must be true or false, got {value!r}")
    return value


def _aliases(ctx: _Ctx, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(a, str) and a.strip() for a in value):
        raise ctx.error(f"aliases must be a list of non-empty strings, got {value!r}")
    return tuple(value)


def _unit(ctx: _Ctx, parse: Callable[[Any], Any], value: Any, field: str, positive: bool = True):
    try:
        out = parse(value)
    except UnitError as exc:
        raise ctx.error(f"{field}: {exc} (expected {exc.expected})") from None
    if positive and out <= 0:
        raise ctx.error(f"{field} must be positive, got {value!r}")
    return out


def _watts(ctx: _Ctx, value: Any, field: str) -> float:
    """'700W' or '1.4kW' -> watts."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(k?)W\s*", str(value))
    if not m or float(m.group(1)) <= 0:
        raise ctx.error(f"{field} must be a power such as 700W or 1.4kW, got {value!r}")
    return float(m.group(1)) * (1000.0 if m.group(2) else 1.0)


def _parse_gpu(name: str, raw: Any) -> GpuSpec:
    ctx = _Ctx(GPUS_FILE, name)
    if name != name.strip().lower() or normalize_name(name) != name:
        raise ctx.error("canonical names are lower-case with hyphens")
    raw = _check_keys(ctx, raw, _GPU_FIELDS + _GPU_OPTIONAL_FIELDS, _GPU_FIELDS, "the entry")
    flops_raw = _check_keys(ctx, raw["peak_flops"], PRECISIONS, _REQUIRED_PRECISIONS, "peak_flops")
    flops = {k: _unit(ctx, parse_flops, flops_raw[k], f"peak_flops.{k}") for k in PRECISIONS if k in flops_raw}
    sourced = GPU_SOURCED_FIELDS + (("host_memory",) if "host_memory" in raw else ())
    sources_raw = _check_keys(ctx, raw["sources"], GPU_SOURCED_FIELDS + ("host_memory",), sourced, "sources")
    if "host_memory" in sources_raw and "host_memory" not in raw:
        raise ctx.error("sources.host_memory names a source for a host_memory the entry does not give")
    sources = {k: _str(ctx, sources_raw[k], f"sources.{k}") for k in sourced}
    domain = _int(ctx, raw["nvlink_domain_gpus"], "nvlink_domain_gpus", 1)
    per_node = _int(ctx, raw["default_gpus_per_node"], "default_gpus_per_node", 1)
    if domain % per_node and per_node % domain:
        raise ctx.error(f"nvlink_domain_gpus ({domain}) and default_gpus_per_node ({per_node}) must nest")
    return GpuSpec(
        name=name,
        display_name=_str(ctx, raw["display_name"], "display_name"),
        vendor=_str(ctx, raw["vendor"], "vendor", _VENDORS),
        generation=_str(ctx, raw["generation"], "generation", _GENERATIONS),
        peak_flops=MappingProxyType(flops),
        hbm_bytes=_unit(ctx, parse_bytes, raw["hbm"], "hbm"),
        hbm_bandwidth_bytes_per_s=_unit(ctx, parse_bandwidth, raw["hbm_bandwidth"], "hbm_bandwidth"),
        intra_node_link=_str(ctx, raw["intra_node_link"], "intra_node_link", _LINKS),
        intra_node_bandwidth_bytes_per_s=_unit(ctx, parse_bandwidth, raw["intra_node_bandwidth"], "intra_node_bandwidth"),
        nvlink_domain_gpus=domain,
        default_gpus_per_node=per_node,
        inter_node_bandwidth_bytes_per_s=_unit(ctx, parse_bandwidth, raw["inter_node_bandwidth"], "inter_node_bandwidth"),
        pcie_bandwidth_bytes_per_s=_unit(ctx, parse_bandwidth, raw["pcie_bandwidth"], "pcie_bandwidth"),
        price_per_gpu_hour_usd=_unit(ctx, parse_money, raw["price_per_gpu_hour"], "price_per_gpu_hour"),
        sources=MappingProxyType(sources),
        aliases=_aliases(ctx, raw["aliases"]),
        tdp_w=_watts(ctx, raw["tdp"], "tdp"),
        kernel_class=_str(ctx, raw["kernel_class"], "kernel_class", _KERNEL_CLASSES) if "kernel_class" in raw else "",
        host_memory_bytes=_unit(ctx, parse_bytes, raw["host_memory"], "host_memory") if "host_memory" in raw else 0,
    )


def _field_types(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _required(cls) -> tuple[str, ...]:
    return tuple(
        f.name for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )


def _int_record(ctx: _Ctx, cls, raw: Any, what: str) -> dict:
    names = tuple(_field_types(cls))
    raw = _check_keys(ctx, raw, names, _required(cls), what)
    return {k: _int(ctx, v, f"{what}.{k}") for k, v in raw.items()}


_SHAPE_CHOICES = {"mlp": ("swiglu", "gelu", "quick_geglu"), "norm": ("rmsnorm", "layernorm"), "position": ("rope", "learned")}
_SHAPE_BOOLS = ("tied_embeddings", "attention_bias", "linear_bias", "attention_sinks")
_SHAPE_POSITIVE = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads", "vocab_size")


def _parse_shape(ctx: _Ctx, raw: Any) -> ModelShape:
    names = tuple(_field_types(ModelShape))
    raw = _check_keys(ctx, raw, names, _required(ModelShape), "shape")
    kw: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _SHAPE_CHOICES:
            kw[key] = _str(ctx, value, f"shape.{key}", _SHAPE_CHOICES[key])
        elif key in _SHAPE_BOOLS:
            kw[key] = _bool(ctx, value, f"shape.{key}")
        elif key == "moe":
            kw[key] = None if value is None else MoEShape(**_int_record(ctx, MoEShape, value, "shape.moe"))
        elif key == "mla":
            kw[key] = None if value is None else MLAShape(**_int_record(ctx, MLAShape, value, "shape.mla"))
        else:
            kw[key] = _int(ctx, value, f"shape.{key}", 1 if key in _SHAPE_POSITIVE else 0)
    shape = ModelShape(**kw)
    if shape.num_attention_heads % shape.num_kv_heads:
        raise ctx.error("shape.num_attention_heads must be a multiple of shape.num_kv_heads")
    if shape.position == "learned" and shape.max_position_embeddings <= 0:
        raise ctx.error("learned positions need shape.max_position_embeddings > 0")
    if shape.full_attention_every and not shape.window_size:
        raise ctx.error("shape.full_attention_every needs shape.window_size > 0")
    if shape.moe is not None:
        m = shape.moe
        if not (1 <= m.top_k <= m.num_experts) or m.layer_freq < 1 or m.first_dense_layers >= shape.num_layers:
            raise ctx.error("shape.moe: need 1 <= top_k <= num_experts, layer_freq >= 1, first_dense_layers < num_layers")
    return shape


def _float(ctx: _Ctx, value: Any, field: str, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and value <= 0):
        raise ctx.error(f"{field} must be a {'positive ' if positive else ''}number, got {value!r}")
    return float(value)


def _parse_hyper(ctx: _Ctx, raw: Any, shape: ModelShape) -> ModelHyperparameters:
    raw = _check_keys(ctx, raw, _HYPER_FIELDS, _HYPER_FIELDS, "hyperparameters")
    theta = raw["rope_theta"]
    if (theta is None) != (shape.position == "learned"):
        raise ctx.error("hyperparameters.rope_theta must be given exactly for rotary (position: rope) models")
    scaling = None
    if raw["rope_scaling"] is not None:
        names = tuple(_field_types(RopeScaling))
        sc = _check_keys(ctx, raw["rope_scaling"], names, ("kind", "factor", "original_max_position_embeddings"),
                         "hyperparameters.rope_scaling")
        kw: dict[str, Any] = {"kind": _str(ctx, sc["kind"], "rope_scaling.kind", ROPE_SCALING_KINDS),
                              "original_max_position_embeddings": _int(ctx, sc["original_max_position_embeddings"],
                                                                       "rope_scaling.original_max_position_embeddings", 1)}
        for key in names:
            if key in sc and key not in kw:
                kw[key] = _bool(ctx, sc[key], f"rope_scaling.{key}") if key == "round_correction_range" \
                    else _float(ctx, sc[key], f"rope_scaling.{key}")
        scaling = RopeScaling(**kw)
    sources_raw = _check_keys(ctx, raw["sources"], ("rope_theta", "rope_scaling", "norm_eps", "init_std"),
                              ("norm_eps", "init_std"), "hyperparameters.sources")
    needed = [k for k, v in (("rope_theta", theta), ("rope_scaling", scaling)) if v is not None]
    missing = [k for k in needed if k not in sources_raw]
    if missing:
        raise ctx.error(f"hyperparameters.sources needs {', '.join(missing)}")
    return ModelHyperparameters(
        rope_theta=None if theta is None else _float(ctx, theta, "hyperparameters.rope_theta"),
        rope_scaling=scaling,
        norm_eps=_float(ctx, raw["norm_eps"], "hyperparameters.norm_eps"),
        init_std=_float(ctx, raw["init_std"], "hyperparameters.init_std"),
        sources=tuple((k, _str(ctx, v, f"hyperparameters.sources.{k}")) for k, v in sources_raw.items()),
    )


def _parse_model(name: str, raw: Any) -> ModelPreset:
    ctx = _Ctx(MODELS_FILE, name)
    if normalize_name(name) != name:
        raise ctx.error("canonical names are lower-case with hyphens")
    raw = _check_keys(ctx, raw, _MODEL_FIELDS, _MODEL_FIELDS, "the entry")
    shape = _parse_shape(ctx, raw["shape"])
    active_raw = raw["published_active_params"]
    if shape.is_moe and active_raw is None:
        raise ctx.error("an MoE shape needs published_active_params")
    if not shape.is_moe and active_raw is not None:
        raise ctx.error("published_active_params is for MoE shapes only; use null")
    return ModelPreset(
        name=name,
        display_name=_str(ctx, raw["display_name"], "display_name"),
        aliases=_aliases(ctx, raw["aliases"]),
        shape=shape,
        hyperparameters=_parse_hyper(ctx, raw["hyperparameters"], shape),
        published_params=_unit(ctx, parse_count, raw["published_params"], "published_params"),
        published_active_params=None if active_raw is None
        else _unit(ctx, parse_count, active_raw, "published_active_params"),
        source=_str(ctx, raw["source"], "source"),
    )


def _parse_file(filename: str, parse: Callable[[str, Any], Any], kind: str) -> Mapping[str, Any]:
    data = _read_yaml(filename)
    entries = {}
    for name, raw in data.items():
        if not isinstance(name, str):
            raise ValueError(f"compiler/data/{filename}: entry names must be strings, got {name!r}")
        entries[name] = parse(name, raw)
    try:
        _build_index(entries, kind)
    except ValueError as exc:
        raise ValueError(f"compiler/data/{filename}: {exc}") from None
    return MappingProxyType(entries)


@functools.cache
def load_catalog() -> Catalog:
    """The built-in catalog (parsed and validated once per process)."""
    return Catalog(
        gpus=_parse_file(GPUS_FILE, _parse_gpu, "gpu"),
        models=_parse_file(MODELS_FILE, _parse_model, "model"),
    )


# --- training recipes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingRecipe:
    """Learning-rate schedule defaults for one model-size band (compiler/data/recipes.yaml)."""

    max_params: int | None  # None: the open last band
    lr: float
    min_lr_ratio: float
    warmup_steps: int | None
    warmup_tokens: int | None
    source: str

    @property
    def min_lr(self) -> float:
        return self.lr * self.min_lr_ratio

    def warmup_tokens_for(self, tokens_per_step: int) -> int:
        """The warm-up in tokens (a band stated in steps, times the run's tokens per step)."""
        if self.warmup_tokens is not None:
            return self.warmup_tokens
        return int(self.warmup_steps or 0) * tokens_per_step


_RECIPE_FIELDS = ("max_params", "lr", "min_lr_ratio", "warmup_steps", "warmup_tokens", "source")


@functools.cache
def load_recipes() -> tuple[TrainingRecipe, ...]:
    data = _read_yaml(RECIPES_FILE)
    bands = data.get("bands")
    if not isinstance(bands, list) or not bands:
        raise ValueError(f"compiler/data/{RECIPES_FILE}: expected a non-empty list under bands")
    out = []
    for i, raw in enumerate(bands):
        ctx = _Ctx(RECIPES_FILE, f"bands[{i}]")
        raw = _check_keys(ctx, raw, _RECIPE_FIELDS, ("max_params", "lr", "min_lr_ratio", "source"), "the band")
        if ("warmup_steps" in raw) == ("warmup_tokens" in raw):
            raise ctx.error("give exactly one of warmup_steps and warmup_tokens")
        ratio = _float(ctx, raw["min_lr_ratio"], "min_lr_ratio")
        if ratio > 1:
            raise ctx.error("min_lr_ratio must be at most 1")
        out.append(TrainingRecipe(
            max_params=None if raw["max_params"] is None else _unit(ctx, parse_count, raw["max_params"], "max_params"),
            lr=_float(ctx, raw["lr"], "lr"), min_lr_ratio=ratio,
            warmup_steps=_int(ctx, raw["warmup_steps"], "warmup_steps", 1) if "warmup_steps" in raw else None,
            warmup_tokens=_unit(ctx, parse_count, raw["warmup_tokens"], "warmup_tokens") if "warmup_tokens" in raw
            else None,
            source=_str(ctx, raw["source"], "source")))
    bounds = [r.max_params for r in out]
    inner = [b for b in bounds[:-1] if b is not None]
    if bounds[-1] is not None or len(inner) != len(bounds) - 1 or inner != sorted(inner):
        raise ValueError(f"compiler/data/{RECIPES_FILE}: bands must rise in max_params and end with max_params: null")
    return tuple(out)


def recipe_for(num_params: int) -> TrainingRecipe:
    """The recipe band of a model with ``num_params`` total parameters."""
    for recipe in load_recipes():
        if recipe.max_params is None or num_params <= recipe.max_params:
            return recipe
    raise AssertionError("the last band is open")  # load_recipes checks it
