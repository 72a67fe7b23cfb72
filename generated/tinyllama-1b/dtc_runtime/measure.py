"""Measurements the smoke runner compares with the cost model: what autograd keeps for backward.

``SAVED`` counts, inside ``SAVED.hooks()`` (torch.autograd.graph.saved_tensors_hooks), every tensor
autograd saves while it holds it, each storage once; ``count_sac_caches`` adds what a
selective-checkpoint policy caches outside those hooks; ``local_bytes`` and
``optimizer_state_bytes`` measure a rank's shards.
"""
from __future__ import annotations

import collections
import functools
import threading
import weakref

import torch


class _Held:
    """What autograd keeps instead of a saved tensor: gives the bytes back when it is dropped."""

    __slots__ = ("tensor", "key", "owner", "__weakref__")

    def __init__(self, tensor, key, owner):
        self.tensor, self.key, self.owner = tensor, key, owner

    def __del__(self):
        if self.key is not None:
            try:
                self.owner.release(self.key)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass


class SavedActivations:
    """The bytes this rank keeps for the backward pass: ``live`` now, ``peak`` so far.

    Inside ``hooks()`` (torch.autograd.graph.saved_tensors_hooks) every tensor autograd saves is
    counted while autograd holds it, each storage once (views and repeated saves of one storage
    count once). Parameters and views of them are weights, not activations, and are left out; a
    pipeline stage's received input (a leaf that needs a gradient) is counted. ``hold(tensor)``
    counts a tensor kept outside those hooks (an activation checkpoint's inputs, a
    selective-checkpoint cache) for as long as the returned handle lives.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._refs = {}  # storage address -> [handles, bytes]
        self.live = 0
        self.peak = 0

    @staticmethod
    def _is_weight(t):
        return isinstance(t._base if t._base is not None else t, torch.nn.Parameter)

    def hold(self, t):
        if not isinstance(t, torch.Tensor) or t.device.type == "meta" or self._is_weight(t):
            return _Held(t, None, self)
        try:
            local = t.to_local() if hasattr(t, "to_local") else t
            storage = local.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
        except Exception:  # noqa: BLE001 - tensor subclasses without a storage
            return _Held(t, None, self)
        if not key or not nbytes:
            return _Held(t, None, self)
        with self._lock:
            entry = self._refs.setdefault(key, [0, nbytes])
            entry[0] += 1
            if entry[0] == 1:
                self.live += nbytes
                self.peak = max(self.peak, self.live)
        # detached: autograd hands a saved *output* to the pack hook with its grad_fn, and keeping that
        # tensor would close a cycle (node -> saved variable -> _Held -> tensor -> node) that only the
        # garbage collector breaks; a graph dropped without a backward (torch pipelining's metadata
        # inference on the first stage) then stayed counted for the rest of the run. Unpacking needs the
        # data only: autograd re-attaches the grad_fn (torch/csrc/autograd/saved_variable.cpp).
        return _Held(t.detach(), key, self)

    @staticmethod
    def drop(held):
        """Give back ``held``'s bytes now (a handle returned by ``hold``)."""
        key, held.key = held.key, None
        if key is not None:
            held.owner.release(key)

    def release(self, key):
        with self._lock:
            entry = self._refs.get(key)
            if entry is None:
                return
            entry[0] -= 1
            if entry[0] <= 0:
                del self._refs[key]
                self.live -= entry[1]

    @staticmethod
    def _unpack(held):
        return held.tensor

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.hold, self._unpack)


SAVED = SavedActivations()


def count_recomputation() -> bool:
    """Non-reentrant activation checkpointing (torch.utils.checkpoint, FSDP2's checkpoint_wrapper)
    rematerialises a block during backward under saved-tensor hooks of its own
    (``torch.utils.checkpoint._recomputation_hook``), which hide what it keeps from ``SAVED``'s: count
    each rematerialised tensor from the moment it is recomputed until backward consumes it (its
    handle in the checkpoint frame dies). Reentrant checkpointing (DeepSpeed's) needs nothing: its
    recomputation is an ordinary forward inside ``SAVED.hooks()``. False where torch's checkpoint
    internals differ from torch 2.13's (then the rematerialised block goes uncounted)."""
    import torch.utils.checkpoint as ckpt

    base = getattr(ckpt, "_recomputation_hook", None)
    if base is None:
        return False
    if getattr(base, "dtc_counting", False):
        return True

    class _CountingRecomputation(base):  # type: ignore[misc, valid-type]
        dtc_counting = True

        def __init__(self, target_frame_ref, gid):
            super().__init__(target_frame_ref, gid)
            pack = self.pack_hook

            def counting_pack(x):
                try:
                    return pack(x)
                finally:  # early stop raises after storing the last tensor it needs
                    _count_recomputed(target_frame_ref(), gid, x)

            self.pack_hook = counting_pack

    setattr(ckpt, "_recomputation_hook", _CountingRecomputation)  # torch looks it up here at each recompute
    return True


def _count_recomputed(frame, gid, x) -> None:
    if SavedActivations._is_weight(x):  # a weight's view (``w.t()``): the frame stores it detached, no longer
        return                          # recognisable as a parameter, but it is the weight's storage
    try:
        holder = frame.weak_holders[frame.recomp_counter[gid] - 1]()
        handle = holder.handles.get(gid) if holder is not None else None
    except (AttributeError, IndexError, KeyError, TypeError):
        return
    if handle is not None and frame.recomputed[gid].get(handle) is not None:
        weakref.finalize(handle, SavedActivations.drop, SAVED.hold(frame.recomputed[gid][handle]))


class _CachedOutputs(dict):
    """One op's entries in a selective-checkpoint cache, their tensors counted while cached (the
    backward pass replaces each entry with a marker as it consumes it)."""

    def __init__(self):
        super().__init__()
        self._held = {}

    def __setitem__(self, index, entry):
        self._held.pop(index, None)
        super().__setitem__(index, entry)
        tensors = [getattr(leaf, "val", None) for leaf in torch.utils._pytree.tree_leaves(entry)]
        held = [SAVED.hold(t) for t in tensors if isinstance(t, torch.Tensor)]
        if held:
            self._held[index] = held


def count_sac_caches(modules):
    """Selective activation checkpointing keeps the outputs its policy saves in a cache of its own
    (torch.utils.checkpoint's dispatch-mode storage), outside the saved-tensor hooks: give each
    checkpointed block a counting cache. None without selective checkpointing; else a function
    returning False where torch's checkpoint internals differ from torch 2.13's (then the cache
    goes uncounted)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    found, counted = False, True
    for module in modules:
        for block in module.modules():
            fn = getattr(block, "checkpoint_fn", None) if isinstance(block, CheckpointWrapper) else None
            context_fn = fn.keywords.get("context_fn") if isinstance(fn, functools.partial) else None
            if context_fn is None:
                continue
            found = True

            def counting_context(context_fn=context_fn):
                nonlocal counted
                caching, cached = context_fn()
                storage = getattr(caching, "storage", None)
                if isinstance(storage, dict) and not storage and getattr(cached, "storage", None) is storage:
                    caching.storage = cached.storage = collections.defaultdict(_CachedOutputs)
                else:
                    counted = False
                return caching, cached

            block.checkpoint_fn = functools.partial(fn.func, *fn.args, **{**fn.keywords,
                                                                         "context_fn": counting_context})
    return (lambda: counted) if found else None


def local_bytes(tensors) -> int:
    """Bytes this rank holds for ``tensors`` (the local shard of DTensors)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


class UnshardedParams:
    """Peak bytes of the unsharded parameters FSDP2 keeps after a forward when it does not reshard them
    (reshard_after_forward=False, dtc's ZeRO-2 and ZeRO-0: each unit's 16-bit parameters live from its forward to its
    backward), read by a forward hook on each part: the parameters the parts hold then that are not the sharded
    ones they were built with (``registered``)."""

    def __init__(self, parts, registered):
        self.peak = 0
        ids = {id(p) for p in registered}

        def hook(module, args, output):
            now = local_bytes(p for part in parts for p in part.parameters() if id(p) not in ids)
            self.peak = max(self.peak, now)

        self.handles = [part.register_forward_hook(hook) for part in parts]


def optimizer_state_bytes(optimizer) -> int:
    return local_bytes(v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))


def peak_memory_bytes(device) -> int:
    """CUDA: torch.cuda.max_memory_allocated; CPU: the peak resident set of this process."""
    import resource

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
