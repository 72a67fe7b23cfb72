"""Measurements inside the ranks of a smoke run; copied next to the run as ``dtc_smoke_probe.py``.

Standalone on purpose (torch only, no ``compiler`` import): the ranks may run on a SLURM node
where dtc is not installed. The generated scripts load it through their documented
``--model-factory module:function`` hook (``DTC_SMOKE_MODEL_FACTORY`` for fsdp_train.py):

* ``fsdp_model()`` builds ``fsdp_config.Transformer`` (the generated reference model) from
  ``DTC_SMOKE_MODEL`` (a JSON shape), ``ds_model(shape)`` builds ds_train.py's own
  ``DecoderLM`` (or its pipeline model); the model itself is unchanged.
* On import it enters ``torch.autograd.graph.saved_tensors_hooks`` for the main thread and
  counts the bytes autograd saves for backward (parameters and views of parameters excluded;
  storages counted once), keeping the peak.
* At exit each rank writes ``$DTC_SMOKE_PROBE_DIR/rank<R>.json``: that peak, the process's peak
  RSS, and the local bytes of the model's parameters and of every optimizer's states found.

Limits: tensors cached by a selective-checkpoint policy (torch SAC) are kept outside
autograd's saved-tensor hooks and are not seen; gradients are not measured here (the
generated fsdp_train.py measures them itself).
"""
from __future__ import annotations

import atexit
import gc
import json
import os
import resource
import threading

import torch

_LOCK = threading.Lock()
_STATE = {"live": 0, "peak": 0, "refs": {}, "model": None}


def _is_param_like(t: torch.Tensor) -> bool:
    base = t._base if t._base is not None else t
    return isinstance(base, torch.nn.Parameter) or (base.is_leaf and base.requires_grad)


class _Held:
    """What autograd stores instead of the tensor: releases its bytes when the graph drops it."""

    __slots__ = ("tensor", "key", "__weakref__")

    def __init__(self, tensor: torch.Tensor, key: int | None):
        self.tensor = tensor
        self.key = key

    def __del__(self) -> None:
        if self.key is None:
            return
        with _LOCK:
            count, nbytes = _STATE["refs"].get(self.key, (0, 0))
            if count <= 1:
                _STATE["refs"].pop(self.key, None)
                _STATE["live"] -= nbytes
            else:
                _STATE["refs"][self.key] = (count - 1, nbytes)


def _pack(t: torch.Tensor):
    if not isinstance(t, torch.Tensor) or t.device.type == "meta" or _is_param_like(t):
        return _Held(t, None)
    try:
        local = t.to_local() if hasattr(t, "to_local") else t
        storage = local.untyped_storage()
        key, nbytes = storage.data_ptr(), storage.nbytes()
    except Exception:  # noqa: BLE001 - tensor subclasses without a storage
        return _Held(t, None)
    if key == 0 or nbytes == 0:
        return _Held(t, None)
    with _LOCK:
        count, _ = _STATE["refs"].get(key, (0, nbytes))
        if count == 0:
            _STATE["live"] += nbytes
            _STATE["peak"] = max(_STATE["peak"], _STATE["live"])
        _STATE["refs"][key] = (count + 1, nbytes)
    return _Held(t, key)


def _unpack(held: _Held) -> torch.Tensor:
    return held.tensor


def _local_bytes(t) -> int:
    if t is None:
        return 0
    ds = getattr(t, "ds_tensor", None)  # DeepSpeed ZeRO-3 partition
    if ds is not None:
        t = ds
    if hasattr(t, "to_local"):
        t = t.to_local()
    return t.numel() * t.element_size()


def _optimizer_bytes() -> tuple[int, int]:
    """(state bytes, master-weight bytes) over every live torch optimizer."""
    model_params = set()
    model = _STATE["model"]
    if model is not None:
        model_params = {id(p) for p in model.parameters()}
    states, masters, seen, counted = 0, 0, set(), set()
    for obj in gc.get_objects():
        if not isinstance(obj, torch.optim.Optimizer) or id(obj) in seen:
            continue
        seen.add(id(obj))
        for state in obj.state.values():
            states += sum(_local_bytes(v) for v in state.values() if torch.is_tensor(v) and v.dim() > 0)
        # master copies: what the optimizer steps that is not a model parameter (DeepSpeed's fp32
        # partitions; ZeRO-3 empties param_groups between steps, so its state keys count too)
        owned = [p for p in obj.state.keys() if torch.is_tensor(p)]
        owned += [p for group in obj.param_groups for p in group["params"]]
        for p in owned:
            if id(p) not in model_params and id(p) not in counted:
                counted.add(id(p))
                masters += _local_bytes(p)
    return states, masters


def _engine_module():
    """The model a DeepSpeed engine wraps, when the script built it itself (pipeline plans)."""
    for obj in gc.get_objects():
        if type(obj).__name__ in ("PipelineEngine", "DeepSpeedEngine") and hasattr(obj, "module"):
            return obj.module
    return None


def _write() -> None:
    out = os.environ.get("DTC_SMOKE_PROBE_DIR")
    rank = os.environ.get("RANK")
    if not out or rank is None:
        return
    record = {"rank": int(rank), "saved_activation_peak_bytes": _STATE["peak"],
              "rss_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        record["cuda_peak_bytes"] = torch.cuda.max_memory_allocated()
    try:
        model = _STATE["model"] or _engine_module()
        _STATE["model"] = model
        if model is not None:
            record["param_bytes"] = sum(_local_bytes(p) for p in model.parameters())
        record["optimizer_bytes"], record["master_bytes"] = _optimizer_bytes()
    except Exception as exc:  # noqa: BLE001 - a measurement must never fail the run
        record["error"] = f"{type(exc).__name__}: {exc}"
    try:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(record, f)
    except OSError:
        pass


def _install() -> None:
    if os.environ.get("DTC_SMOKE_PROBE_DIR") and "RANK" in os.environ:
        torch.autograd.graph.saved_tensors_hooks(_pack, _unpack).__enter__()
        atexit.register(_write)


def fsdp_model():
    """``--model-factory dtc_smoke_probe:fsdp_model``: the generated reference model, unchanged."""
    import fsdp_config as C

    cfg = dict(C.MODEL)
    cfg.update(json.loads(os.environ["DTC_SMOKE_MODEL"]))
    model = C.Transformer(cfg)
    _STATE["model"] = model
    return model


def ds_model(shape):
    """``--model-factory dtc_smoke_probe:ds_model``: ds_train.py's own DecoderLM (or pipeline model),
    with the exact reduced shape of ``DTC_SMOKE_MODEL`` (ds_train.py derives KV heads and FFN width
    from --hidden/--heads itself)."""
    import __main__ as ds_train

    shape = dict(shape)
    shape.update(json.loads(os.environ.get("DTC_SMOKE_MODEL", "{}")))
    cfg_path = os.environ.get("DTC_SMOKE_DS_CONFIG")
    cfg = json.load(open(cfg_path)) if cfg_path else {}
    if "pipeline" in cfg:
        model = ds_train.pipeline_model(shape, cfg)
    else:
        model = ds_train.DecoderLM(shape)
    _STATE["model"] = model
    return model


def ds_batches(seq_len, micro_batch, dp_rank, dp_size, seed):
    """``--dataset-factory dtc_smoke_probe:ds_batches``: fsdp_train.py's learnable task (token t+1 =
    token t + a per-sequence stride, mod the vocabulary) on one fixed global batch of micro x accum x
    dp sequences, sliced by data-parallel rank and repeated every step, so the loss falls within a
    few steps and does not depend on how the batch is sharded."""
    vocab = int(json.loads(os.environ["DTC_SMOKE_MODEL"])["vocab_size"])
    accum = int(os.environ["DTC_SMOKE_GRAD_ACCUM"])
    g = torch.Generator().manual_seed(seed)
    n = micro_batch * accum * dp_size
    start = torch.randint(0, vocab, (n, 1), generator=g)
    stride = torch.randint(1, 4, (n, 1), generator=g)
    seqs = ((start + stride * torch.arange(seq_len + 1)) % vocab).view(dp_size, accum, micro_batch, seq_len + 1)
    mine = seqs[dp_rank]
    while True:
        for i in range(accum):
            yield mine[i, :, :-1].contiguous(), mine[i, :, 1:].contiguous()


_install()
