"""Which layers and parameters sit on each pipeline stage, and how they are divided.

Layers are cut into pp * vpp chunks in order; chunk c runs on stage c % pp (Megatron's
interleaved assignment). When the layers do not divide evenly, the first and the last
chunk give up layers first (they also hold the embedding and the output layer), as
Megatron's --decoder-first/last-pipeline-num-layers are used in practice.

Per GPU, tensor parallelism divides the attention, MLP and shared-expert matrices by tp
(norms and the router are replicated); expert parallelism divides the routed experts by
ep and, as in Megatron-Core (expert tensor parallel = tp), the expert matrices by tp too.
The embedding sits on the first stage and the output layer on the last (both split over
the vocabulary by tp); tied embeddings keep a copy on each end when pp > 1.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from compiler.model import ModelShape, ParamCount


@functools.lru_cache(maxsize=1024)
def chunk_layer_counts(num_layers: int, pp: int, vpp: int) -> tuple[int, ...]:
    """Decoder layers of each of the pp * vpp chunks, in model order. When they do not divide
    evenly, the chunks nearest the middle take the extra layers, so the first and the last chunk
    (embedding, output layer) hold fewer; with pp * vpp = layers + 2 the end chunks hold only the
    embedding and the loss (Megatron's account_for_embedding/loss_in_pipeline_split)."""
    n = pp * vpp
    assert 1 <= n <= num_layers + 2, "every inner chunk needs a layer (checked by evaluate)"
    base, extra = divmod(num_layers, n)
    counts = [base] * n
    for i in sorted(range(n), key=lambda c: (-min(c, n - 1 - c), c))[:extra]:
        counts[i] += 1
    return tuple(counts)


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
def _stage_layers_cached(shape: ModelShape, pp: int, vpp: int) -> tuple[StageLayers, ...]:
    counts = chunk_layer_counts(shape.num_layers, pp, vpp)
    dense = [0] * pp
    moe = [0] * pp
    biggest = [0] * pp
    layer = 0
    for c, n in enumerate(counts):
        s = c % pp
        for i in range(layer, layer + n):
            if shape.is_moe_layer(i):
                moe[s] += 1
            else:
                dense[s] += 1
        biggest[s] = max(biggest[s], n)
        layer += n
    return tuple(StageLayers(s, dense[s], moe[s], biggest[s], s == 0, s == pp - 1) for s in range(pp))


def stage_layers(shape: ModelShape, pp: int, vpp: int) -> tuple[StageLayers, ...]:
    return _stage_layers_cached(shape, pp, vpp)


def layers_divide_evenly(num_layers: int, pp: int, vpp: int) -> bool:
    return num_layers % (pp * vpp) == 0


# --- parameters per GPU --------------------------------------------------------------------------


@dataclass(frozen=True)
class StageParams:
    """Parameters one GPU of a stage holds before ZeRO sharding."""

    dense: float  # replicated over ep: attention, dense/shared MLP, router, norms, embedding/output
    expert: float  # routed experts (divided by ep and tp)
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


def moe_layer_expert_params_per_gpu(pc: ParamCount, tp: int, ep: int) -> float:
    return pc.num_experts * pc.expert_params_per_expert / (ep * tp)


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


def stage_params(shape: ModelShape, pc: ParamCount, sl: StageLayers, *, tp: int, ep: int, pp: int) -> StageParams:
    dense_layer = dense_layer_params_per_gpu(pc, tp)
    moe_dense = moe_layer_dense_params_per_gpu(pc, tp)
    emb = embedding_params_per_gpu(shape, pc, tp, first=sl.first, last=sl.last, pp=pp)
    extra = pc.extra / pp  # parts outside the decoder stack (e.g. MTP), spread evenly: an approximation
    dense = sl.dense * dense_layer + sl.moe * moe_dense + emb + extra
    expert = sl.moe * moe_layer_expert_params_per_gpu(pc, tp, ep)
    largest = max(dense_layer if sl.dense else 0.0,
                  (moe_dense + moe_layer_expert_params_per_gpu(pc, tp, ep)) if sl.moe else 0.0)
    return StageParams(dense=dense, expert=expert, layer_dense=largest, embedding=emb)
