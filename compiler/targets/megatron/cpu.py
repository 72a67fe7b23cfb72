"""The CUDA-to-CPU layer that lets megatron-core 0.19.2's own training loop run on CPU with gloo.

Loaded only inside ``dtc smoke --target megatron`` worker processes on a machine without GPUs
(``compiler/targets/megatron/pretrain.py`` calls ``install()`` before importing Megatron); it is
never part of a generated artifact, and on GPUs nothing here is used. In those processes "cuda"
is the CPU: every bridge below makes one CUDA-only call site answer with its CPU equivalent,
nothing else changes (the math, the schedules, the collectives, the optimizer, checkpointing are
Megatron's own). The call sites, megatron-core 0.19.2 (site-packages/megatron/...):

Device placement (``_CudaIsCpu``, a TorchFunctionMode active for the whole worker, plus
``torch.cuda.current_device()`` answering ``cpu`` for code it does not reach):
  core/models/common/embeddings/rotary_pos_embedding.py:162  inv_freq.to(current_device())
  core/pipeline_parallel/schedules.py:749,1121,2292           torch.cuda.current_device() tensors
  core/optimizer/clip_grads.py:108,112,180                      device="cuda" norms
  core/optimizer/optimizer.py:315,698                           device="cuda" found-inf / scale
  training/training.py:1131,1137,2613,2884,3298               loss/start-time tensors device="cuda"
  core/tensor_parallel/layers.py:647  the SP reduce-scatter buffer, created inside autograd's
                                      backward where no TorchFunctionMode reaches: only
                                      current_device() answering cpu places it
  Tensor.cuda() / .to("cuda") / pin_memory() / record_stream(): the tensor itself
Type names compared as strings (``Tensor.type()`` answers the CUDA name of a CPU tensor):
  core/optimizer/clip_grads.py:174, core/optimizer/distrib_optimizer.py:401,466,758,
  core/optimizer/optimizer.py:1009,1028
RNG (the CPU default generator is "the" CUDA generator: get/set_rng_state, manual_seed):
  core/tensor_parallel/random.py:118,129,147-166,303-308  (forked by
  core/transformer/dot_product_attention.py:217), core/rerun_state_machine.py:979,992
Device runtime answers (``_runtime``, set on torch.cuda): is_available True (training/initialize.py:66),
  device_count 1 (0 skips model-parallel set-up, training/initialize.py:270,281,358), set_device,
  synchronize, empty_cache, streams/events (training/initialize.py:289, the timers), memory_*
  (training/utils/common_utils.py:322-325 report_memory: the process's resident set and its
  peak, see ``_rss_bytes``), device
  properties/capability (training/arguments.py:1339, core/utils.py get_device_arch_version:
  the plan's GPU architecture, DTC_SMOKE_MEGATRON_ARCH, so CUDA_DEVICE_MAX_CONNECTIONS is checked as on
  the plan's GPUs, from the artifact's own export).
Local (torch) norm under sequence parallel: core/transformer/torch_norm.py:50 asserts no SP;
  the norm is built without it and its parameters are tagged ``sequence_parallel`` (what apex's
  FusedLayerNorm does), so their gradients are all-reduced over TP like every SP norm's.
MoE all-to-all split sizes: core/transformer/moe/moe_utils.py:1184 (maybe_move_tensor_to_cpu,
  imported by name at core/transformer/moe/token_dispatcher.py:39) turns them into host numpy
  arrays only for CUDA tensors; all_to_all_single takes host sequences, not tensors, so here the
  conversion is made for CPU tensors too.
Dataset helpers: training/initialize.py:178 runs ``make`` in core/datasets; the wheel ships the
  compiled helpers_cpp but no Makefile, so the compile is skipped when helpers_cpp imports.
Fusion kernels: core/jit.py:21 makes ``jit_fuser`` torch.compile, and training/initialize.py:494
  warms the fused bias-gelu/swiglu/dropout functions up even with the fusions off; on CPU,
  inductor would build C++ for them (and dynamo trips over the bridged current_device()), so
  torch.compile is disabled (``torch._dynamo.config.disable``): the functions run eagerly.
  The warm-up itself (training/initialize.py:497-558) is skipped: its torch.rand(device="cuda")
  draws, shaped by tp and sp, would come from the CPU generator that --use-cpu-initialization
  initialises the weights from, and make the initial weights depend on the layout (on GPUs they
  come from the CUDA generator); with torch.compile off there is nothing to warm up.
Python 3.11: megatron-core >= 0.17 declares Python >= 3.12; megatron/training uses
  ``typing.override`` (3.12), which typing_extensions provides.
"""
from __future__ import annotations

import contextlib
import os
import resource
import typing
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

CPU = torch.device("cpu")
_INSTALLED: dict[str, Any] = {}

__all__ = ["install", "installed", "python_shims"]


def python_shims() -> None:
    """What megatron-core 0.19.2 needs from Python 3.12 (both on CPU and on GPUs)."""
    if not hasattr(typing, "override"):
        import typing_extensions

        # typeshed's 3.11 typing has no override: the very gap this back-port fills
        typing.override = typing_extensions.override  # type: ignore[attr-defined]


def installed() -> bool:
    return bool(_INSTALLED)


# ------------------------------------------------------------------------------------------- devices
def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


def _on_cpu(device: Any) -> Any:
    return CPU if _is_cuda(device) else device


_CUDA_NAMES = {torch.float32: "torch.cuda.FloatTensor", torch.float16: "torch.cuda.HalfTensor",
               torch.bfloat16: "torch.cuda.BFloat16Tensor", torch.float64: "torch.cuda.DoubleTensor",
               torch.int64: "torch.cuda.LongTensor", torch.int32: "torch.cuda.IntTensor",
               torch.uint8: "torch.cuda.ByteTensor", torch.bool: "torch.cuda.BoolTensor"}


class _CudaIsCpu(TorchFunctionMode):
    """Every torch call with a CUDA device (``device=`` or ``.to(...)``) gets the CPU instead."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _IDENTITY:
            return args[0]
        if func is _TYPE and len(args) == 1 and not kwargs:
            return _CUDA_NAMES.get(args[0].dtype) or func(*args)
        if "device" in kwargs:
            kwargs["device"] = _on_cpu(kwargs["device"])
        if func in _TO and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], CPU, *args[2:])
        return func(*args, **kwargs)


_IDENTITY: set[Any] = set()
_TO: set[Any] = set()
_TYPE: Any = None


# ------------------------------------------------------------------------------------------- runtime
class _Stream:
    """A CUDA stream / event on CPU: work is synchronous, so waiting is a no-op."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.device = CPU

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Stream)

    def __hash__(self) -> int:
        return 0

    def __enter__(self) -> "_Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def wait_stream(self, *a: Any) -> None: ...
    def wait_event(self, *a: Any) -> None: ...
    def record_event(self, event: Any = None) -> "_Stream":
        return event or _Stream()
    def record(self, *a: Any) -> None: ...
    def synchronize(self) -> None: ...
    def wait(self, *a: Any) -> None: ...
    def query(self) -> bool:
        return True

    def elapsed_time(self, other: Any) -> float:
        return 0.0


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


ARCH_ENV = "DTC_SMOKE_MEGATRON_ARCH"  # the plan's CUDA compute capability (major), set by megatron/smoke.py


class _Props:
    name = "CPU (dtc smoke: megatron_cpu bridge)"
    # answers the plan's GPU architecture to the arch probes (Hopper when not told); no kernel of it runs here
    major, minor = int(os.environ.get(ARCH_ENV, "9")), 0
    multi_processor_count = 1
    total_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _runtime() -> dict[str, Any]:
    gen = torch.default_generator
    return {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: CPU,
        "set_device": lambda *a, **k: None,
        "synchronize": lambda *a, **k: None,
        "empty_cache": lambda: None,
        "Stream": _Stream, "Event": _Stream,
        "current_stream": lambda *a, **k: _Stream(), "default_stream": lambda *a, **k: _Stream(),
        "set_stream": lambda *a, **k: None, "stream": lambda s=None: contextlib.nullcontext(),
        "memory_allocated": lambda *a, **k: _rss_bytes(),
        "memory_reserved": lambda *a, **k: _rss_bytes(),
        "max_memory_allocated": lambda *a, **k: max(_peak_rss_bytes(), _rss_bytes()),
        "max_memory_reserved": lambda *a, **k: max(_peak_rss_bytes(), _rss_bytes()),
        "reset_peak_memory_stats": lambda *a, **k: None,
        "reset_max_memory_allocated": lambda *a, **k: None,
        "memory_stats": lambda *a, **k: {},
        "mem_get_info": lambda *a, **k: (_Props.total_memory - _rss_bytes(), _Props.total_memory),
        "get_device_properties": lambda *a, **k: _Props(),
        "get_device_capability": lambda *a, **k: (_Props.major, _Props.minor),
        "get_device_name": lambda *a, **k: _Props.name,
        "get_rng_state": lambda *a, **k: gen.get_state(),
        "set_rng_state": lambda state, *a, **k: gen.set_state(state),
        "manual_seed": lambda seed: gen.manual_seed(int(seed)),
        "manual_seed_all": lambda seed: gen.manual_seed(int(seed)),
        "default_generators": (gen,),
    }


# ------------------------------------------------------------------------------------------- Megatron
def _bridge_megatron() -> None:
    """The call sites inside Megatron that the device-level bridge cannot reach."""
    import torch._dynamo

    torch._dynamo.config.disable = True  # core/jit.py:21: jit_fuser is torch.compile; run eagerly
    from megatron.core.datasets import utils as dataset_utils
    from megatron.core.tensor_parallel import random as tp_random
    from megatron.core.transformer import torch_norm

    def compile_helpers() -> None:  # training/initialize.py:178: the wheel ships helpers_cpp built
        from megatron.core.datasets import helpers_cpp  # noqa: F401 - ImportError: really missing

    dataset_utils.compile_helpers = compile_helpers

    from megatron.training import initialize

    # initialize.py:497-558 (see the module docstring: its draws would shift the weight init)
    initialize._warmup_jit_function = lambda tp_size=None: None

    gen = torch.default_generator

    def get_state(device: Any = "cuda", clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
        return gen.get_state()

    def set_state(new_state: torch.Tensor, device: int = -1, graph_safe: bool = False) -> None:
        gen.set_state(new_state)

    tp_random._get_cuda_rng_state = get_state  # random.py:104-133
    tp_random._set_cuda_rng_state = set_state  # random.py:135-175

    original_new = torch_norm.WrappedTorchNorm.__new__

    def norm_new(cls, config, hidden_size, eps=1e-5, persist_layer_norm=False, zero_centered_gamma=False,
                 normalization="LayerNorm"):
        sp = config.sequence_parallel
        if sp:
            import copy

            config = copy.copy(config)
            config.sequence_parallel = False
        norm = original_new(cls, config, hidden_size, eps, persist_layer_norm, zero_centered_gamma, normalization)
        for p in norm.parameters():
            p.sequence_parallel = sp  # torch_norm.py:50; apex FusedLayerNorm tags its weights the same way
        return norm

    torch_norm.WrappedTorchNorm.__new__ = norm_new

    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        if as_numpy and torch.is_tensor(tensor):
            return tensor.numpy()
        return tensor

    moe_utils.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu
    token_dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu


def install() -> None:
    """Make this process's "cuda" the CPU (idempotent). Call before importing megatron."""
    global _TYPE
    if _INSTALLED:
        return
    python_shims()
    _IDENTITY.update({torch.Tensor.cuda, torch.Tensor.pin_memory, torch.Tensor.record_stream})
    _TO.update({torch.Tensor.to})
    _TYPE = torch.Tensor.type
    saved = {name: getattr(torch.cuda, name, None) for name in _runtime()}
    for name, value in _runtime().items():
        setattr(torch.cuda, name, value)
    torch.cuda.random.get_rng_state = torch.cuda.get_rng_state
    torch.cuda.random.set_rng_state = torch.cuda.set_rng_state
    mode = _CudaIsCpu()
    mode.__enter__()
    _INSTALLED.update(mode=mode, saved=saved)
    _bridge_megatron()
