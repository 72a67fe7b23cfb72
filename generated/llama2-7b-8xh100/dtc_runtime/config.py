"""The run configuration the renderer generates (``train_config.json``) and the trainers read.

Everything that varies per plan is here, as data; the trainers are fixed code. Relative paths
(dataset prefixes, the checkpoint folder, ``init``) are relative to the config file's folder, so a
generated folder works from any current directory. This module imports only the standard library,
so dtc itself (without torch) builds and checks the same ``RunConfig`` the trainers read.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

from .schedule import LRSchedule

CONFIG_VERSION = 1
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
RECOMPUTE = ("none", "selective", "full")
DTYPES = ("float32", "bfloat16", "float16")


class ConfigError(ValueError):
    """The run configuration is malformed or inconsistent."""


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's frequency scaling (``rope_type: llama3`` in Hugging Face configs)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """The architecture; every field is read from the generated config (never guessed here)."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    vocab_size: int
    seq_len: int
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    mlp: str = "swiglu"  # swiglu | gelu
    norm: str = "rmsnorm"  # rmsnorm | layernorm
    norm_eps: float = 1e-5
    position: str = "rope"  # rope | learned
    max_position_embeddings: int = 0  # learned positions: the table size (>= seq_len)
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tied_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases (Qwen)
    linear_bias: bool = False  # biases on every linear and norm (GPT)
    init_std: float = 0.02

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.num_attention_heads % self.num_kv_heads:
            problems.append(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                            f"num_kv_heads ({self.num_kv_heads})")
        if self.mlp not in ("swiglu", "gelu"):
            problems.append(f"mlp must be swiglu or gelu, got {self.mlp!r}")
        if self.norm not in ("rmsnorm", "layernorm"):
            problems.append(f"norm must be rmsnorm or layernorm, got {self.norm!r}")
        if self.position not in ("rope", "learned"):
            problems.append(f"position must be rope or learned, got {self.position!r}")
        if self.position == "rope" and self.kv_channels % 2:
            problems.append(f"rotary positions need an even head dimension, got {self.kv_channels}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def kv_channels(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def position_table(self) -> int:
        return max(self.max_position_embeddings, self.seq_len)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown model field(s): {', '.join(unknown)}")
        values = dict(data)
        if values.get("rope_scaling") is not None:
            values["rope_scaling"] = RopeScaling(**values["rope_scaling"])
        return cls(**values)


@dataclass(frozen=True)
class DataSource:
    """One dataset of a blend: a prefix (PREFIX.bin / PREFIX.idx) and its weight."""

    prefix: str
    weight: float = 1.0



@dataclass(frozen=True)
class ParallelConfig:
    """Degrees and how the torch trainers realise them. The FSDP2 mesh is pp x dp_replicate x
    dp_shard x cp x tp (tp innermost). ``stage_layers`` lists the decoder layers of each pipeline
    (virtual) stage in stage order (stage s runs on pipeline rank s mod pp): dtc's one split
    function decides it, and the trainers build exactly these stages."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    vpp: int = 1
    zero_stage: int = 3
    sequence_parallel: bool = False
    pp_schedule: str = "1f1b"
    stage_layers: tuple[tuple[int, ...], ...] | None = None
    recompute: str = "none"
    offload: str = "none"

    def __post_init__(self) -> None:
        for axis in ("tp", "pp", "cp", "dp_replicate", "dp_shard", "vpp"):
            if getattr(self, axis) < 1:
                raise ConfigError(f"parallel.{axis} must be >= 1, got {getattr(self, axis)}")
        if self.pp_schedule not in PP_SCHEDULES:
            raise ConfigError(f"parallel.pp_schedule must be one of {', '.join(PP_SCHEDULES)}")
        if self.recompute not in RECOMPUTE:
            raise ConfigError(f"parallel.recompute must be one of {', '.join(RECOMPUTE)}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError("parallel.zero_stage must be 0, 1, 2 or 3")
        if self.offload not in ("none", "cpu"):
            raise ConfigError("parallel.offload must be none or cpu")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp_replicate * self.dp_shard

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def schedule(self) -> str:
        if self.vpp > 1:
            return "interleaved_1f1b"
        return "1f1b" if self.pp_schedule == "interleaved_1f1b" else self.pp_schedule

    def stages(self, num_layers: int) -> list[list[int]]:
        """The layers of each of the pp x vpp stages: ``stage_layers`` when given (checked: every
        layer once, in order), else contiguous ranges with the remainder on the earlier stages."""
        n = self.pp * self.vpp
        if self.stage_layers is not None:
            stages = [list(s) for s in self.stage_layers]
            flat = [layer for s in stages for layer in s]
            if len(stages) != n:
                raise ConfigError(f"parallel.stage_layers has {len(stages)} stages, pp x vpp is {n}")
            if flat != list(range(num_layers)):
                raise ConfigError(f"parallel.stage_layers must list layers 0..{num_layers - 1} once each, in order")
            if any(not s for s in stages):
                raise ConfigError("parallel.stage_layers: every stage needs at least one layer")
            return stages
        if num_layers < n:
            raise ConfigError(f"pp={self.pp} x vpp={self.vpp} stages need at least {n} layers, got {num_layers}")
        base, extra = divmod(num_layers, n)
        out, start = [], 0
        for s in range(n):
            size = base + (1 if s < extra else 0)
            out.append(list(range(start, start + size)))
            start += size
        return out

    def describe(self) -> str:
        return " x ".join(f"{n}={getattr(self, n)}" for n in ("pp", "dp_replicate", "dp_shard", "cp", "tp"))


@dataclass(frozen=True)
class BatchConfig:
    micro_batch: int
    grad_accum: int
    seq_len: int

    def __post_init__(self) -> None:
        for name in ("micro_batch", "grad_accum", "seq_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"batch.{name} must be >= 1")


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "adamw"  # adamw | adam | sgd
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0: off

    def __post_init__(self) -> None:
        if self.name not in ("adamw", "adam", "sgd"):
            raise ConfigError(f"optimizer.name must be adamw, adam or sgd, got {self.name!r}")


@dataclass(frozen=True)
class DataConfig:
    """``synthetic``: the learnable stride task (``repeat`` > 0 repeats the first ``repeat``
    samples); else ``sources`` (Megatron indexed datasets with blend weights)."""

    synthetic: bool = False
    sources: tuple[DataSource, ...] = ()
    repeat: int = 0
    tokenizer: str | None = None  # informational: what prepared the data

    def __post_init__(self) -> None:
        if not self.synthetic and not self.sources:
            raise ConfigError("data: give sources (prepared with `dtc data prepare`) or synthetic: true")


@dataclass(frozen=True)
class CheckpointConfig:
    dir: str | None = None  # None: no checkpoints
    interval_steps: int = 0  # 0: only on SIGUSR1 and at the end
    keep: int = 2  # complete checkpoints kept (0: all)
    save_at_end: bool = True


@dataclass(frozen=True)
class RunConfig:
    name: str
    model: ModelConfig
    parallel: ParallelConfig
    batch: BatchConfig
    schedule: LRSchedule
    train_steps: int
    optimizer: OptimizerConfig = OptimizerConfig()
    data: DataConfig = DataConfig(synthetic=True)
    checkpoint: CheckpointConfig = CheckpointConfig()
    param_dtype: str = "bfloat16"
    reduce_dtype: str = "float32"
    init: str | None = None  # a Hugging Face safetensors folder to start from
    seed: int = 1234
    layout_tag: str = ""
    base_dir: str = "."  # where relative paths point (the config file's folder)
    version: int = CONFIG_VERSION
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.param_dtype not in DTYPES or self.reduce_dtype not in DTYPES:
            raise ConfigError(f"param_dtype and reduce_dtype must be one of {', '.join(DTYPES)}")
        if self.train_steps < 1:
            raise ConfigError("train_steps must be >= 1")

    @property
    def global_batch(self) -> int:
        return self.batch.micro_batch * self.batch.grad_accum * self.parallel.dp

    @property
    def init_path(self) -> Path:
        path = self.path(self.init)
        if path is None:
            raise ConfigError("no init checkpoint configured")
        return path

    def path(self, value: str | None) -> Path | None:
        if value is None:
            return None
        p = Path(value).expanduser()
        return p if p.is_absolute() else Path(self.base_dir) / p

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("base_dir")
        return out

    def with_changes(self, **changes: Any) -> "RunConfig":
        return replace(self, **changes)


def _build(cls, data: Any, where: str):
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a mapping")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def run_config_from_dict(data: Mapping[str, Any], base_dir: str | Path = ".") -> RunConfig:
    values = dict(data)
    if values.get("version", CONFIG_VERSION) != CONFIG_VERSION:
        raise ConfigError(f"config version {values.get('version')} (this runtime reads {CONFIG_VERSION})")
    try:
        values["model"] = ModelConfig.from_dict(values["model"])
        parallel = dict(values.get("parallel", {}))
        if parallel.get("stage_layers") is not None:
            parallel["stage_layers"] = tuple(tuple(int(x) for x in s) for s in parallel["stage_layers"])
        values["parallel"] = _build(ParallelConfig, parallel, "parallel")
        values["batch"] = _build(BatchConfig, values["batch"], "batch")
        values["schedule"] = _build(LRSchedule, values["schedule"], "schedule")
        values["optimizer"] = _build(OptimizerConfig, values.get("optimizer", {}), "optimizer")
        data_section = dict(values.get("data", {"synthetic": True}))
        data_section["sources"] = tuple(_build(DataSource, s, "data.sources[]")
                                        for s in data_section.get("sources", ()))
        values["data"] = _build(DataConfig, data_section, "data")
        values["checkpoint"] = _build(CheckpointConfig, values.get("checkpoint", {}), "checkpoint")
        values["notes"] = tuple(values.get("notes", ()))
    except KeyError as exc:
        raise ConfigError(f"missing section {exc}") from None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    values["base_dir"] = str(base_dir)
    return _build(RunConfig, values, "the config")


def load_run_config(path: str | Path) -> RunConfig:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return run_config_from_dict(data, base_dir=path.resolve().parent)


def dump_run_config(cfg: RunConfig) -> str:
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n"


# ------------------------------------------------------------------------------------------- scale-down
def scaled_model(model: ModelConfig, *, layers: int | None = None, hidden: int | None = None,
                 heads: int | None = None, kv_heads: int | None = None, ffn: int | None = None,
                 vocab: int | None = None, seq_len: int | None = None, tp: int = 1) -> ModelConfig:
    """A smaller model of the same family (smoke runs): a smaller ``hidden`` keeps the FFN ratio and
    the GQA ratio and picks head counts that ``tp`` divides."""
    values = model.to_dict()
    ratio = max(1, model.num_attention_heads // model.num_kv_heads)
    if hidden is not None and hidden != model.hidden_size:
        if heads is None:
            fits = [h for h in range(1, model.num_attention_heads + 1)
                    if hidden % h == 0 and h % tp == 0 and hidden // h >= 8 and h % ratio == 0
                    and (h // ratio) % tp == 0]
            heads = max(fits) if fits else tp
        if ffn is None:
            step = 8 * tp
            ffn = max(step, round(model.ffn_hidden_size / model.hidden_size * hidden / step) * step)
        values["hidden_size"] = hidden
    if heads is not None:
        values["num_attention_heads"] = heads
        if kv_heads is None:
            kv_heads = heads // ratio if heads % ratio == 0 else math.gcd(model.num_kv_heads, heads)
    if kv_heads is not None:
        values["num_kv_heads"] = kv_heads
    if hidden is not None or heads is not None:
        values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
    for key, value in (("num_layers", layers), ("ffn_hidden_size", ffn), ("vocab_size", vocab),
                       ("seq_len", seq_len)):
        if value is not None:
            values[key] = value
    if seq_len is not None and model.position == "learned":
        values["max_position_embeddings"] = seq_len
    if values.get("rope_scaling") is not None:
        values["rope_scaling"] = RopeScaling(**values["rope_scaling"])
    return ModelConfig(**values)


__all__ = ["ModelConfig", "RopeScaling", "DataSource", "RunConfig", "ParallelConfig", "BatchConfig",
           "OptimizerConfig", "DataConfig", "CheckpointConfig", "ConfigError", "load_run_config",
           "run_config_from_dict", "dump_run_config", "scaled_model", "CONFIG_VERSION"]
