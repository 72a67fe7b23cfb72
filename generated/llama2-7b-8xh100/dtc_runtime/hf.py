"""Start from a Hugging Face Llama checkpoint: read safetensors lazily and load by name.

``model.init`` points at a local folder written by ``transformers`` (``config.json`` and
``model.safetensors`` or ``model.safetensors.index.json`` with its shards). The files are memory-mapped
(the safetensors layout: an 8-byte little-endian header length, a JSON header of
``{name: {dtype, shape, data_offsets}}``, then the raw bytes), so a rank reads only the bytes of the
shards it keeps: a DTensor parameter (FSDP2, tensor parallel) takes its local piece through
``distribute_tensor(..., src_data_rank=None)``, which slices without communication.

Names map one to one (this model's RoPE uses the same rotate-half layout as transformers' Llama, so
no row permutation is needed): ``model.embed_tokens`` -> ``tok_embeddings``,
``model.layers.N.self_attn.{q,k,v,o}_proj`` -> ``layers.N.attention.w{q,k,v,o}``,
``mlp.gate_proj/up_proj/down_proj`` -> ``feed_forward.w1/w3/w2``, ``input_layernorm`` ->
``attention_norm``, ``post_attention_layernorm`` -> ``ffn_norm``, ``model.norm`` -> ``norm``,
``lm_head`` -> ``output`` (a checkpoint without ``lm_head`` ties it to the embedding).
"""
from __future__ import annotations

import json
import mmap
import re
import struct
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import torch
import torch.nn as nn

from .model import ModelConfig

_DTYPES: dict[str, tuple[Any, torch.dtype]] = {
    "F64": (np.float64, torch.float64), "F32": (np.float32, torch.float32), "F16": (np.float16, torch.float16),
    "BF16": (np.uint16, torch.bfloat16), "I64": (np.int64, torch.int64), "I32": (np.int32, torch.int32),
    "I16": (np.int16, torch.int16), "I8": (np.int8, torch.int8), "U8": (np.uint8, torch.uint8),
    "BOOL": (np.bool_, torch.bool),
}

# our name (after the layer index) -> Hugging Face Llama's
_LAYER_NAMES = {
    "attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj", "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj", "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj", "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"tok_embeddings": "model.embed_tokens", "norm": "model.norm", "output": "lm_head"}
# wrappers that insert a component into a parameter's name
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "module.")


class CheckpointFormatError(ValueError):
    """The folder is not a Hugging Face safetensors checkpoint this model can load."""


def clean_name(name: str) -> str:
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def hf_name(ours: str) -> str:
    """Hugging Face Llama's name for one of our parameter names (wrapper prefixes ignored)."""
    name = clean_name(ours)
    m = re.fullmatch(r"layers\.(\d+)\.(.+)\.(weight|bias)", name)
    if m:
        inner = _LAYER_NAMES.get(m.group(2))
        if inner is None:
            raise KeyError(f"no Hugging Face Llama name for {ours!r}")
        return f"model.layers.{m.group(1)}.{inner}.{m.group(3)}"
    module, _, leaf = name.rpartition(".")
    if module not in _TOP_NAMES:
        raise KeyError(f"no Hugging Face Llama name for {ours!r}")
    return f"{_TOP_NAMES[module]}.{leaf}"


# ------------------------------------------------------------------------------------------- safetensors
class SafetensorsFile:
    """One memory-mapped .safetensors file; ``get(name)`` is a zero-copy tensor view."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise CheckpointFormatError(f"{path}: too short for a safetensors file")
            (size,) = struct.unpack("<Q", raw)
            if size > 100_000_000:
                raise CheckpointFormatError(f"{path}: header of {size} bytes; not a safetensors file")
            try:
                header = json.loads(f.read(size))
            except ValueError as exc:
                raise CheckpointFormatError(f"{path}: unreadable safetensors header ({exc})") from None
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        header.pop("__metadata__", None)
        self.header: dict[str, dict[str, Any]] = header
        self._data_start = 8 + size

    def keys(self) -> list[str]:
        return list(self.header)

    def get(self, name: str) -> torch.Tensor:
        info = self.header[name]
        if info["dtype"] not in _DTYPES:
            raise CheckpointFormatError(f"{self.path}: {name} has dtype {info['dtype']}, not one torch reads")
        np_dtype, torch_dtype = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        count = (end - begin) // np.dtype(np_dtype).itemsize
        array = np.frombuffer(self._map, dtype=np_dtype, count=count, offset=self._data_start + begin)
        tensor = torch.from_numpy(array.reshape(shape))
        return tensor.view(torch_dtype) if torch_dtype == torch.bfloat16 else tensor


class HFCheckpoint:
    """A local Hugging Face model folder: ``config`` (config.json) and lazily read tensors."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise CheckpointFormatError(f"{self.folder}: not a folder (model.init needs a Hugging Face model folder)")
        config = self.folder / "config.json"
        self.config: dict[str, Any] = json.loads(config.read_text()) if config.is_file() else {}
        index = self.folder / "model.safetensors.index.json"
        files: dict[str, SafetensorsFile] = {}
        self._where: dict[str, SafetensorsFile] = {}
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            for name, filename in weight_map.items():
                if filename not in files:
                    files[filename] = SafetensorsFile(self.folder / filename)
                self._where[name] = files[filename]
        else:
            found = sorted(self.folder.glob("*.safetensors"))
            if not found:
                raise CheckpointFormatError(
                    f"{self.folder}: no model.safetensors or model.safetensors.index.json (save the model with "
                    "transformers' save_pretrained(..., safe_serialization=True))")
            for path in found:
                shard = SafetensorsFile(path)
                for name in shard.keys():
                    self._where[name] = shard

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def keys(self) -> list[str]:
        return sorted(self._where)

    def get(self, name: str) -> torch.Tensor:
        return self._where[name].get(name)


def config_mismatches(cfg: ModelConfig, hf_config: Mapping[str, Any]) -> list[str]:
    """Differences between our architecture and a Hugging Face Llama config.json (empty: it fits)."""
    if not hf_config:
        return []
    scaling = hf_config.get("rope_scaling") or (hf_config.get("rope_parameters") or {})
    rope_theta = hf_config.get("rope_theta", (hf_config.get("rope_parameters") or {}).get("rope_theta"))
    pairs = [
        ("num_layers", cfg.num_layers, hf_config.get("num_hidden_layers")),
        ("hidden_size", cfg.hidden_size, hf_config.get("hidden_size")),
        ("ffn_hidden_size", cfg.ffn_hidden_size, hf_config.get("intermediate_size")),
        ("num_attention_heads", cfg.num_attention_heads, hf_config.get("num_attention_heads")),
        ("num_kv_heads", cfg.num_kv_heads,
         hf_config.get("num_key_value_heads", hf_config.get("num_attention_heads"))),
        ("vocab_size", cfg.vocab_size, hf_config.get("vocab_size")),
        ("head_dim", cfg.kv_channels, hf_config.get("head_dim") or cfg.kv_channels),
        ("norm_eps", cfg.norm_eps, hf_config.get("rms_norm_eps")),
        ("rope_theta", cfg.rope_theta, rope_theta),
        ("tied_embeddings", cfg.tied_embeddings, hf_config.get("tie_word_embeddings", False)),
    ]
    out = []
    for name, ours, theirs in pairs:
        if theirs is None:
            continue
        if isinstance(ours, float) or isinstance(theirs, float):
            same = abs(float(ours) - float(theirs)) <= 1e-9 * max(1.0, abs(float(ours)))
        else:
            same = ours == theirs
        if not same:
            out.append(f"{name}: ours {ours}, checkpoint {theirs}")
    kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, Mapping) else None
    ours_kind = "llama3" if cfg.rope_scaling is not None else None
    if kind in (None, "default"):
        kind = None
    if kind != ours_kind:
        out.append(f"rope_scaling: ours {ours_kind}, checkpoint {kind}")
    elif kind == "llama3" and cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        for key, ours_value in (("factor", s.factor), ("low_freq_factor", s.low_freq_factor),
                                ("high_freq_factor", s.high_freq_factor),
                                ("original_max_position_embeddings", s.original_max_position_embeddings)):
            if key in scaling and float(scaling[key]) != float(ours_value):
                out.append(f"rope_scaling.{key}: ours {ours_value}, checkpoint {scaling[key]}")
    return out


# ------------------------------------------------------------------------------------------- loading
def _local_piece(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """What this rank keeps of ``full`` for ``param`` (a DTensor's local shard, else all of it)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor):
        return distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
    return full


def load_hf_weights(named_params: Iterable[tuple[str, torch.Tensor]], checkpoint: HFCheckpoint, *,
                    rename: Callable[[str], str] = hf_name,
                    assign: Callable[[torch.Tensor, torch.Tensor], None] | None = None) -> dict[str, Any]:
    """Copy the checkpoint into ``named_params`` (our names; each tensor written in place, or through
    ``assign(param, value)``: DeepSpeed ZeRO-3 gathers first). Every parameter must be found with
    its exact shape; a checkpoint tensor nobody asked for is listed (a pipeline stage asks for a
    part of the model). Returns {"loaded": n, "tied_from_embedding": bool}."""
    loaded, tied = 0, False
    problems = []
    seen: set[int] = set()
    for name, param in named_params:
        if id(param) in seen:
            continue  # a tied weight appears twice
        seen.add(id(param))
        key = rename(name)
        if key not in checkpoint and key == "lm_head.weight" and "model.embed_tokens.weight" in checkpoint:
            key, tied = "model.embed_tokens.weight", True  # transformers ties a head it did not save
        if key not in checkpoint:
            problems.append(f"{name}: {key} is not in the checkpoint")
            continue
        full = checkpoint.get(key)
        shape = tuple(getattr(param, "ds_shape", None) or param.shape)
        if tuple(full.shape) != shape:
            problems.append(f"{name}: checkpoint {key} has shape {tuple(full.shape)}, the model {shape}")
            continue
        value = _local_piece(full, param)
        with torch.no_grad():
            if assign is not None:
                assign(param, value)
            else:
                target = param.to_local() if hasattr(param, "to_local") else param
                target.copy_(value.to(dtype=target.dtype, device=target.device))
        loaded += 1
    if problems:
        raise CheckpointFormatError(f"{checkpoint.folder}: {len(problems)} parameter(s) do not load:\n  "
                                    + "\n  ".join(problems[:20]))
    return {"loaded": loaded, "tied_from_embedding": tied}


def load_into(model: nn.Module, folder: str | Path) -> dict[str, Any]:
    """Check the architecture against config.json, then load every parameter of ``model``."""
    checkpoint = HFCheckpoint(folder)
    cfg = getattr(model, "args", None)
    if isinstance(cfg, ModelConfig):
        mismatches = config_mismatches(cfg, checkpoint.config)
        if mismatches:
            raise CheckpointFormatError(f"{checkpoint.folder}: the checkpoint's config.json does not match the "
                                        "planned model: " + "; ".join(mismatches))
    return load_hf_weights(model.named_parameters(remove_duplicate=False), checkpoint)


__all__ = ["HFCheckpoint", "SafetensorsFile", "CheckpointFormatError", "hf_name", "clean_name",
           "config_mismatches", "load_hf_weights", "load_into"]
