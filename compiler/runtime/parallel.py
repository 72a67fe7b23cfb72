"""FSDP2 parallelization of the runtime's Transformer: mesh, TP(+SP), activation checkpointing,
fully_shard / HSDP, pipeline stages, gradient helpers.

How a dtc layout runs here (torch 2.13):

- ZeRO-0: ``fully_shard`` over a 2-D (dp_replicate, dp_shard=1) mesh: replicated parameters,
  all-reduced gradients (DDP semantics that compose with TP/PP); ZeRO-2: ``reshard_after_forward``
  False; ZeRO-3: True. HSDP: the same 2-D mesh with dp_shard > 1.
- TP/SP: DTensor ``parallelize_module`` with torchtitan's Llama plan.
- PP: ``torch.distributed.pipelining`` stages built from the config's per-stage layer lists
  (GPipe, 1F1B, interleaved 1F1B); microbatches = grad_accum.
- CP: ``context_parallel`` (CUDA only in torch 2.13: no CPU sharding rule for SDPA).
- Offload: ``CPUOffloadPolicy``. Precision: MixedPrecisionPolicy(param, reduce dtypes).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from .config import ParallelConfig

MESH_DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class MeshSizeError(ValueError):
    """The device mesh does not cover exactly the launched ranks."""


def check_world(par: ParallelConfig, world_size: int) -> None:
    if par.world_size != world_size:
        raise MeshSizeError(
            f"the device mesh {par.describe()} needs {par.world_size} ranks, but WORLD_SIZE is {world_size}; "
            "launch that many processes, or scale the mesh with --tp/--pp/--cp/--dp-shard/--dp-replicate "
            "(--dp-shard -1 takes the rest)")


def build_mesh(device_type: str, par: ParallelConfig):
    from torch.distributed.device_mesh import init_device_mesh

    check_world(par, dist.get_world_size())
    shape = tuple(getattr(par, n) for n in MESH_DIM_NAMES)
    return init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIM_NAMES)


def dp_mesh(mesh, par: ParallelConfig):
    """1-D dp_shard, or 2-D (dp_replicate, dp_shard) for HSDP and ZeRO-0; context-parallel ranks join
    the shard group (torchtitan's dp_shard_cp)."""
    if par.cp == 1:
        return mesh[("dp_replicate", "dp_shard")] if par.dp_replicate > 1 else mesh["dp_shard"]
    flat = mesh[("dp_shard", "cp")]._flatten("dp_shard_cp")
    return mesh[("dp_replicate", "dp_shard_cp")] if par.dp_replicate > 1 else flat


def dp_coordinate(mesh, par: ParallelConfig) -> tuple[int, int]:
    """(this rank's data-parallel index, dp size)."""
    rep = mesh["dp_replicate"].get_local_rank()
    shard = mesh["dp_shard"].get_local_rank()
    return rep * par.dp_shard + shard, par.dp


# ------------------------------------------------------------------------------------------- tensor parallel
def block_tp_plan(block: Any, sequence_parallel: bool) -> dict[str, Any]:
    """torchtitan's Llama block plan: q/k/v and w1/w3 column-wise, wo and w2 row-wise; with sequence
    parallel the norms run on sequence shards and attention/MLP inputs are all-gathered."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    out_layout = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {}
    if sequence_parallel:
        plan["attention_norm"] = SequenceParallel()
        plan["attention"] = PrepareModuleInput(input_layouts=(Shard(1), None),
                                               desired_input_layouts=(Replicate(), None))
        plan["ffn_norm"] = SequenceParallel()
        plan["feed_forward"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    plan.update({
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=out_layout),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=out_layout),
    })
    if getattr(block.feed_forward, "w3", None) is not None:
        plan["feed_forward.w3"] = ColwiseParallel()
    return plan


def _is_tied(model: nn.Module) -> bool:
    emb, out = getattr(model, "tok_embeddings", None), getattr(model, "output", None)
    return emb is not None and out is not None and emb.weight is out.weight


def apply_tp(model: Any, tp_mesh, sequence_parallel: bool) -> nn.Module:
    """Tensor (and sequence) parallel: embeddings row-wise, output column-wise with a replicated
    result (the loss sees full logits). Learned positions are added to the full sequence before it
    is scattered (``Transformer.sequence_scatter``)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tied = _is_tied(model)
    seq = Shard(1) if sequence_parallel else Replicate()
    learned = getattr(model, "pos_embeddings", None) is not None
    top: dict[str, Any] = {}
    if getattr(model, "tok_embeddings", None) is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(),
                                                output_layouts=Replicate() if learned else seq)
        if learned and sequence_parallel:
            model.sequence_scatter = tp_mesh
    if getattr(model, "norm", None) is not None and sequence_parallel:
        top["norm"] = SequenceParallel()
    if getattr(model, "output", None) is not None:
        top["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, block_tp_plan(block, sequence_parallel))
    if tied:  # both are Shard(0) over the vocabulary: share the distributed parameter again
        model.output.weight = model.tok_embeddings.weight
    return model


# ------------------------------------------------------------------------------------------- activation checkpointing
def _sac_policy():
    """torchtitan's op-level selective AC: keep matmul, attention and reduce-scatter outputs,
    recompute pointwise ops and norms."""
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    names = ["mm", "addmm", "bmm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"]
    save = {getattr(aten, n).default for n in names if hasattr(aten, n)}
    if hasattr(torch.ops, "_c10d_functional"):
        save.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def apply_ac(model: Any, mode: str) -> nn.Module:
    """Wrap each block: ``full`` recomputes the whole block, ``selective`` only cheap ops."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    if mode == "none":
        return model
    for name, block in list(model.layers.items()):
        if mode == "full":
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False)
        else:
            context_fn = functools.partial(create_selective_checkpoint_contexts, _sac_policy())
            wrapped = checkpoint_wrapper(block, context_fn=context_fn, preserve_rng_state=False)
        model.layers[name] = wrapped
    return model


# ------------------------------------------------------------------------------------------- FSDP2
def apply_fsdp(model: Any, mesh, par: ParallelConfig, param_dtype: str, reduce_dtype: str) -> nn.Module:
    """``fully_shard`` each block, then the root (embeddings, final norm, output)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=TORCH_DTYPES[param_dtype], reduce_dtype=TORCH_DTYPES[reduce_dtype])
    offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if par.offload == "cpu" else OffloadPolicy()
    reshard = par.zero_stage == 3
    kwargs = dict(mesh=mesh, offload_policy=offload, reshard_after_forward=reshard)
    # A block's hidden-state input is already in param_dtype (the embedding's output, or the stage input the
    # previous stage sent): casting its inputs would only round the fp32 rotary table handed beside it to
    # bf16, a fresh copy at every layer that apply_rope widens again and saves for backward (two per layer,
    # measured by dtc smoke), and RoPE computed from bf16 angles.
    block_mp = dataclasses.replace(mp, cast_forward_inputs=False)
    for block in model.layers.values():
        fully_shard(block, mp_policy=block_mp, **kwargs)
    fully_shard(model, mp_policy=mp, **kwargs)
    return model


def parallelize(model: nn.Module, mesh, par: ParallelConfig, param_dtype: str, reduce_dtype: str) -> nn.Module:
    """TP -> activation checkpointing -> FSDP, in torchtitan's order (a model or one pipeline stage)."""
    if par.tp > 1:
        apply_tp(model, mesh["tp"], par.sequence_parallel)
    apply_ac(model, par.recompute)
    apply_fsdp(model, dp_mesh(mesh, par), par, param_dtype, reduce_dtype)
    return model


def set_grad_sync(modules, is_last_microbatch: bool, par: ParallelConfig) -> None:
    """Gradient accumulation: pure replication skips the all-reduce until the last micro-step; HSDP
    reduce-scatters every micro-step but all-reduces across replicas only on the last."""
    from torch.distributed.fsdp import FSDPModule

    for module in modules:
        if not isinstance(module, FSDPModule):
            continue
        if par.dp_shard * par.cp == 1:
            module.set_requires_gradient_sync(is_last_microbatch)
        elif par.dp_replicate > 1:
            module.set_requires_all_reduce(is_last_microbatch)


# ------------------------------------------------------------------------------------------- pipeline
def split_stage(model: Any, layers: list[int], first: bool, last: bool) -> nn.Module:
    """A shallow copy of ``model`` holding only ``layers`` (keys keep their global index, so the
    state-dict names are the model's); embeddings on the first stage, norm and output on the last."""
    part: Any = copy.copy(model)
    part._modules = dict(model._modules)
    part._parameters = dict(model._parameters)
    part._buffers = dict(model._buffers)
    part.layers = nn.ModuleDict({str(i): model.layers[str(i)] for i in layers})
    if not first:
        part.tok_embeddings = None
        part.pos_embeddings = None
    if not last:
        part.norm = None
        part.output = None
    elif not first and _is_tied(model):
        part.output = copy.deepcopy(model.output)  # the last stage trains its own copy of a tied head
    return part


@dataclasses.dataclass
class Pipeline:
    schedule: Any
    modules: list  # this rank's stage modules, parallelized
    has_first: bool
    has_last: bool

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """One optimizer step's forward/backward over the microbatches; the mean loss on the last
        stage, None elsewhere."""
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.has_first else ()
        kwargs = dict(target=targets, losses=losses) if self.has_last else {}
        self.schedule.step(*args, **kwargs)
        if self.has_last:
            return torch.stack([loss.detach().float() for loss in losses]).mean()
        return None


def build_pipeline(model: Any, mesh, par: ParallelConfig, *, device: torch.device, loss_fn: Callable,
                   n_microbatches: int, param_dtype: str, reduce_dtype: str) -> Pipeline:
    """pp x vpp stages (rank r holds stages r, r + pp, ...) with the configured layer lists, each
    parallelized with TP/AC/FSDP and wrapped in the planned schedule."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    pp_mesh = mesh["pp"]
    rank, n_stages = pp_mesh.get_local_rank(), par.pp * par.vpp
    layer_lists = par.stages(len(model.layers))
    stage_ids = [rank + v * par.pp for v in range(par.vpp)]
    stages: list[Any] = []
    modules: list[nn.Module] = []
    for sid in stage_ids:
        part = split_stage(model, layer_lists[sid], sid == 0, sid == n_stages - 1)
        part = parallelize(part, mesh, par, param_dtype, reduce_dtype)
        modules.append(part)
        stages.append(PipelineStage(part, sid, n_stages, device, group=pp_mesh.get_group()))
    if par.schedule == "interleaved_1f1b":
        schedule: Any = ScheduleInterleaved1F1B(stages, n_microbatches=n_microbatches, loss_fn=loss_fn)
    else:
        cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[par.schedule]
        schedule = cls(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn)
    return Pipeline(schedule, modules, has_first=0 in stage_ids, has_last=n_stages - 1 in stage_ids)


class TiedEmbeddings:
    """Tied input/output embeddings across pipeline stages, as Megatron-LM keeps them (its
    "embedding group"): the last stage holds its own copy of the head, set from the first stage's
    embedding at the start (``sync_weights``) and given the sum of both gradients after every
    backward (``sync_grads``), so the two copies stay equal. The sums run over a group of the first
    and the last pipeline rank of each (dp, cp, tp) coordinate; their shards line up because both
    copies have the same shape and placements."""

    def __init__(self, parts, mesh):
        self.embedding = next((p.tok_embeddings.weight for p in parts if getattr(p, "tok_embeddings", None)
                               is not None), None)
        self.head = next((p.output.weight for p in parts if getattr(p, "output", None) is not None), None)
        ranks = mesh.mesh  # (pp, dp_replicate, dp_shard, cp, tp) global ranks
        me = dist.get_rank()
        self.group = None
        for idx in torch.cartesian_prod(*[torch.arange(n) for n in ranks.shape[1:]]).reshape(-1, ranks.ndim - 1):
            pair = [int(ranks[(0, *idx.tolist())]), int(ranks[(-1, *idx.tolist())])]
            group = dist.new_group(pair)  # every rank creates every group, in the same order
            if me in pair:
                self.group = group

    def _reduce(self, *tensors) -> torch.Tensor:
        present = [t for t in tensors if t is not None]
        total = present[0].clone()
        for t in present[1:]:
            total += t
        dist.all_reduce(total, group=self.group)
        return total

    @torch.no_grad()
    def sync_weights(self) -> None:
        if self.group is None:
            return
        if self.embedding is not None and self.head is not None:
            return  # one rank holds both ends (pp x vpp stages on one rank): nothing to send
        first = _local(self.embedding) if self.embedding is not None else None
        last = torch.zeros_like(_local(self.head)) if self.head is not None else None
        total = self._reduce(first, last)
        if self.head is not None:
            _local(self.head).copy_(total)

    @torch.no_grad()
    def sync_grads(self) -> None:
        if self.group is None:
            return
        grads = [_local(w.grad) for w in (self.embedding, self.head) if w is not None and w.grad is not None]
        if not grads:
            return
        total = self._reduce(*grads)
        for weight in (self.embedding, self.head):
            if weight is not None and weight.grad is not None:
                _local(weight.grad).copy_(total)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def cp_context(mesh, par: ParallelConfig, modules, inputs, targets):
    """Context parallel shards inputs, targets and each module's rotary table along the sequence."""
    if par.cp == 1:
        return contextlib.nullcontext()
    from torch.distributed.tensor.experimental import context_parallel

    buffers, dims = [inputs, targets], [1, 1]
    for module in modules:
        freqs = getattr(module, "freqs_cis", None)
        if freqs is not None and not any(freqs is b for b in buffers):
            buffers.append(freqs)
            dims.append(0)
    return context_parallel(mesh["cp"], buffers=buffers, buffer_seq_dims=dims, no_restore_buffers={inputs, targets})


# ------------------------------------------------------------------------------------------- gradients
def _by_mesh(tensors) -> list[list[torch.Tensor]]:
    """Tensors grouped by DTensor mesh (foreach ops cannot mix meshes)."""
    from torch.distributed.tensor import DTensor

    groups: dict[Any, list] = {}
    for t in tensors:
        groups.setdefault(t.device_mesh if isinstance(t, DTensor) else None, []).append(t)
    return list(groups.values())


def grad_norm(params, pp_group=None) -> torch.Tensor:
    """The global L2 gradient norm over DTensors on different meshes and over pipeline stages."""
    from torch.distributed.tensor import DTensor

    comm_device = "cuda" if torch.cuda.is_available() else "cpu"
    total_sq = torch.zeros((), device=comm_device)
    for tensors in _by_mesh(p.grad for p in params if p.grad is not None):
        norm = torch.nn.utils.get_total_norm(tensors, 2.0, error_if_nonfinite=False, foreach=True)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        total_sq += norm.float().to(comm_device) ** 2
    if pp_group is not None:
        dist.all_reduce(total_sq, group=pp_group)
    return total_sq.sqrt()


def scale_grads_(params, factor: float) -> None:
    for tensors in _by_mesh(p.grad for p in params if p.grad is not None):
        torch._foreach_mul_(tensors, factor)


def clip_grads(params, max_norm: float, total_norm: torch.Tensor) -> None:
    """Scale gradients so their global norm is at most ``max_norm`` (0: off)."""
    coef = max_norm / (float(total_norm) + 1e-6)
    if max_norm > 0 and coef < 1.0:
        scale_grads_(params, coef)


class LossScaler:
    """Dynamic loss scaling for fp16 (identity when disabled); the overflow decision uses the global
    gradient norm, so every rank skips or takes the same step."""

    def __init__(self, enabled: bool, init_scale: float = 2.0 ** 16, growth_interval: int = 1000):
        self.enabled = enabled
        self.scale = init_scale if enabled else 1.0
        self.growth_interval = growth_interval
        self._good = 0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.enabled else loss

    def unscale_(self, params, norm: torch.Tensor) -> tuple[bool, torch.Tensor]:
        if not self.enabled:
            return True, norm
        if not torch.isfinite(norm).item():
            self.scale, self._good = max(1.0, self.scale / 2), 0
            return False, norm
        scale_grads_(params, 1.0 / self.scale)
        self._good += 1
        if self._good % self.growth_interval == 0:
            self.scale *= 2
        return True, norm / self.scale

    def state_dict(self) -> dict[str, float]:
        return {"scale": self.scale, "good": self._good}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.scale, self._good = float(state["scale"]), int(state["good"])
