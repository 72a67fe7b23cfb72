"""Which layers and parameters sit on each pipeline stage, and how they are divided.

Layers are cut into pp * vpp chunks in order; chunk c runs on stage c % pp (Megatron's
interleaved assignment). How many layers each chunk holds is Megatron's split for the
layout's mechanism (compiler.split: even, --account-for-*, --decoder-first/last-*, or an
explicit --pipeline-model-parallel-layout), the same split the renderers emit.

Per GPU, tensor parallelism divides the attention, MLP and shared-expert matrices by tp
(norms and the router are replicated); expert parallelism divides the routed experts by
ep and the expert matrices by the expert tensor-parallel degree etp (Megatron-Core's default: tp).
The embedding sits on the first stage and the output layer on the last (both split over
the vocabulary by tp); tied embeddings keep a copy on each end when pp > 1.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from compiler.model import ModelShape, ParamCount
from compiler.split import PipelineSplit, layer_split


@dataclass(frozen=True)
class StageLayers:
    stage: int
    dense: int  # dense-MLP decoder layers on this stage (all its chunks)
    moe: int
    max_chunk_layers: int  # the largest chunk on this stage (one in-flight activation unit)
    first: bool
    last: bool

    @property
    def layers(self) -> int:
        return self.dense + self.moe


@functools.lru_cache(maxsize=4096)
def _stage_layers_cached(shape: ModelShape, pp: int, vpp: int, split: PipelineSplit | None) -> tuple[StageLayers, ...]:
    built = layer_split(shape.num_layers, pp, vpp, split)
    moe = [0] * pp
    if shape.moe is not None:
        for c, n in enumerate(built.chunk_layers):
            first = built.layers(c % pp, c // pp).start
            moe[c % pp] += sum(shape.is_moe_layer(i) for i in range(first, first + n))
    return tuple(StageLayers(s, built.rank_layers[s] - moe[s], moe[s], max(built.rank_chunks(s)), s == 0, s == pp - 1)
                 for s in range(pp))


def stage_layers(shape: ModelShape, pp: int, vpp: int, split: PipelineSplit | None = None) -> tuple[StageLayers, ...]:
    """The decoder layers of every pipeline stage under Megatron's ``split`` (None: the default for the
    shape's layer count); raises compiler.split.SplitError when Megatron cannot build it."""
    return _stage_layers_cached(shape, pp, vpp, split)


# --- parameters per GPU --------------------------------------------------------------------------


@dataclass(frozen=True)
class StageParams:
    """Parameters one GPU of a stage holds before ZeRO sharding."""

    dense: float  # replicated over ep: attention, dense/shared MLP, router, norms, embedding/output
    expert: float  # routed experts (divided by ep and etp)
    layer_dense: float  # dense params of the largest decoder layer on the GPU (an FSDP unit)
    embedding: float  # embedding/output parameters on this GPU

    @property
    def total(self) -> float:
        return self.dense + self.expert


def dense_layer_params_per_gpu(pc: ParamCount, tp: int) -> float:
    """Attention + dense MLP split by tp; norms replicated."""
    return (pc.attention_per_layer + pc.dense_mlp_per_layer) / tp + pc.norms_per_layer


def moe_layer_dense_params_per_gpu(pc: ParamCount, tp: int) -> float:
    """The non-expert part of an MoE layer: attention and shared experts split by tp; router, norms replicated."""
    return (pc.attention_per_layer + pc.shared_expert_per_layer) / tp + pc.moe_router_per_layer + pc.norms_per_layer


def moe_layer_expert_params_per_gpu(pc: ParamCount, etp: int, ep: int) -> float:
    return pc.num_experts * pc.expert_params_per_expert / (ep * etp)


def embedding_params_per_gpu(shape: ModelShape, pc: ParamCount, tp: int, *, first: bool, last: bool, pp: int) -> float:
    """Word embeddings (vocab-split by tp) on the first stage; the output layer on the last."""
    word = shape.vocab_size * shape.hidden_size / tp
    params = 0.0
    if first:
        params += word + (pc.embedding - shape.vocab_size * shape.hidden_size)  # + learned positions
    if last:
        if not shape.tied_embeddings:
            params += pc.output / tp
        elif pp > 1:
            params += word  # a tied copy on the last stage (Megatron shared embedding)
        params += pc.final_norm
    return params


def stage_params(shape: ModelShape, pc: ParamCount, sl: StageLayers, *, tp: int, ep: int, pp: int,
                 vocab_tp: int | None = None, etp: int | None = None) -> StageParams:
    """``vocab_tp``: how many ranks split the vocabulary (Setup.vocab_shards; default tp); ``etp``: the expert
    tensor-parallel degree (Layout.etp; default tp)."""
    etp = tp if etp is None else etp
    dense_layer = dense_layer_params_per_gpu(pc, tp)
    moe_dense = moe_layer_dense_params_per_gpu(pc, tp)
    emb = embedding_params_per_gpu(shape, pc, tp if vocab_tp is None else vocab_tp, first=sl.first, last=sl.last,
                                   pp=pp)
    extra = pc.extra / pp  # parts outside the decoder stack (e.g. MTP), spread evenly: an approximation
    dense = sl.dense * dense_layer + sl.moe * moe_dense + emb + extra
    expert = sl.moe * moe_layer_expert_params_per_gpu(pc, etp, ep)
    largest = max(dense_layer if sl.dense else 0.0,
                  (moe_dense + moe_layer_expert_params_per_gpu(pc, etp, ep)) if sl.moe else 0.0)
    return StageParams(dense=dense, expert=expert, layer_dense=largest, embedding=emb)
