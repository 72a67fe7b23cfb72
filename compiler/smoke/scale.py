"""plan -> SmokeSetup: the plan's structure at the scale this machine allows (pure, no I/O).

What is kept: the ZeRO stage / FSDP sharding strategy, the recompute mode, the pipeline
schedule, sequence parallel, offload, the micro-batch (up to ``MAX_MICRO_BATCH``), the
gradient accumulation (up to ``MAX_GRAD_ACCUM``), the model family (attention type and GQA
ratio, MLP type, norm, positions, tied embeddings, biases, MoE with fewer experts) and the
optimizer. What is scaled down is listed as ``Change`` records, each with the reason, so the
report says exactly what a smoke run did and did not exercise.

World size. On GPUs: ``torch.cuda.device_count()``. On CPU: ``min(4, 2 x cores)`` and at
least 2. Four processes are the smallest world that holds two parallel axes of degree 2
(tp2 x dp2, pp2 x dp2, replicate2 x shard2); two processes per core keep gloo responsive
(a 4-rank FSDP2 run takes 20-30 s on 2 cores) while 8 ranks (a 3-D mesh) take ~50 s there,
too slow for CI. Each kept axis gets degree 2; the most informative axes win (see
``AXIS_PRIORITY``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

from compiler.layout import Layout, Schedule
from compiler.model import MLAShape, ModelShape, MoEShape
from compiler.plan import Plan
from compiler.split import default_split
from compiler.targets.base import TE_PRECISIONS

CPU_MAX_RANKS = 4
SMOKE_VOCAB = 256  # divisible by every tp degree a smoke run uses
SMOKE_SEQ_LEN = 64
MAX_MICRO_BATCH = 16
MAX_GRAD_ACCUM = 8
MIN_HEADS = 4
MAX_EXPERTS = 4
DEFAULT_STEPS = 4

# Which parallel axes a smaller world keeps, most informative first:
#   dp    the ZeRO/FSDP sharding axis (dp_shard; dp_replicate for ZeRO-0) - every plan's memory story
#   pp    stage split + schedule: the most code between the plan and a running step
#   tp    DTensor / AutoTP sharding of the blocks
#   hsdp  the replicate axis of hybrid sharding
#   cp    context parallel (CUDA only in torch 2.13)
AXIS_PRIORITY = ("dp", "pp", "tp", "hsdp", "cp")
# a plan whose experts fold tp away (an expert tensor-parallel degree other than tp) keeps tp before pp: the fold
# (each rank's experts whole on its sequence-parallel shard, the expert grid re-folded over tp x dp) is what only
# such a plan has to show
FOLD_PRIORITY = ("dp", "tp", "pp", "hsdp", "cp")


@dataclass(frozen=True)
class Change:
    """One thing the smoke run does differently from the plan, and why."""

    what: str
    plan: Any
    smoke: Any
    why: str

    def describe(self) -> str:
        return f"{self.what} {self.plan} -> {self.smoke}: {self.why}"

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "plan": self.plan, "smoke": self.smoke, "why": self.why}


@dataclass(frozen=True)
class SmokeDegrees:
    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    vpp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp_replicate * self.dp_shard

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    def describe(self) -> str:
        parts = [f"{k}={getattr(self, k)}" for k in ("pp", "dp_replicate", "dp_shard", "cp", "tp")]
        if self.vpp > 1:
            parts.append(f"vpp={self.vpp}")
        return " x ".join(parts)

    def to_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("tp", "pp", "cp", "dp_replicate", "dp_shard", "vpp")}


@dataclass(frozen=True)
class SmokeSetup:
    """Everything a smoke launch needs, for every target (they share one reduced world)."""

    plan_name: str
    device: str  # "cpu" or "cuda"
    backend: str  # "gloo" or "nccl"
    world_size: int
    degrees: SmokeDegrees
    layout: Layout  # the reduced layout (what the cost model is asked about)
    shape: ModelShape  # the reduced model of the plan's family
    seq_len: int
    precision: str  # what runs
    plan_precision: str
    optimizer: str
    learning_rate: float
    seed: int
    steps: int
    gpu: str  # the plan's GPU type, for the cost-model prediction
    changes: tuple[Change, ...] = ()
    kept: tuple[str, ...] = ()

    @property
    def micro_batch(self) -> int:
        return self.layout.micro_batch

    @property
    def grad_accum(self) -> int:
        return self.layout.grad_accum

    @property
    def global_batch(self) -> int:
        """Sequences per step: micro x accum x smoke dp."""
        return self.layout.global_batch

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "backend": self.backend,
            "world_size": self.world_size,
            "degrees": self.degrees.to_dict(),
            "layout": self.layout.to_dict(),
            "layout_tag": self.layout.tag,
            "shape": self.shape.to_dict(),
            "seq_len": self.seq_len,
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "global_batch": self.global_batch,
            "precision": self.precision,
            "plan_precision": self.plan_precision,
            "steps": self.steps,
            "changes": [c.to_dict() for c in self.changes],
            "kept": list(self.kept),
        }


# ------------------------------------------------------------------------------------------- world
def local_world(*, cpu_count: int, gpu_count: int) -> tuple[str, int]:
    """(device, how many ranks this machine runs): every GPU, or min(4, 2 x cores) CPU processes."""
    if gpu_count > 0:
        return "cuda", gpu_count
    return "cpu", max(2, min(CPU_MAX_RANKS, 2 * max(1, cpu_count)))


def _plan_axes(lay: Layout) -> dict[str, tuple[str, int]]:
    """priority name -> (Layout field, plan degree) for the axes the plan uses (degree > 1)."""
    axes: dict[str, tuple[str, int]] = {}
    if lay.dp_shard > 1:
        axes["dp"] = ("dp_shard", lay.dp_shard)
        if lay.dp_replicate > 1:
            axes["hsdp"] = ("dp_replicate", lay.dp_replicate)
    elif lay.dp_replicate > 1:
        axes["dp"] = ("dp_replicate", lay.dp_replicate)
    if lay.pp > 1:
        axes["pp"] = ("pp", lay.pp)
    if lay.tp > 1:
        axes["tp"] = ("tp", lay.tp)
    if lay.cp > 1:
        axes["cp"] = ("cp", lay.cp)
    return axes


def map_degrees(lay: Layout, *, device: str, max_ranks: int) -> tuple[SmokeDegrees, list[Change], list[str]]:
    """Keep the most informative axes at degree 2 within ``max_ranks``; say what was dropped."""
    budget = int(math.log2(max(1, max_ranks)))
    axes = _plan_axes(lay)
    kept: dict[str, int] = {}
    changes: list[Change] = []
    notes: list[str] = []
    for name in (FOLD_PRIORITY if lay.etp is not None else AXIS_PRIORITY):
        if name not in axes:
            continue
        field_name, degree = axes[name]
        if name == "cp" and device != "cuda":
            changes.append(Change("cp", degree, 1, "context parallel needs CUDA (torch 2.13 has no CPU sharding "
                                                  "rule for scaled_dot_product_attention)"))
            continue
        if budget <= 0:
            changes.append(Change(field_name, degree, 1, f"the local world holds {max_ranks} rank(s); "
                                                         f"axes kept first: {', '.join(kept) or 'none'}"))
            continue
        budget -= 1
        kept[field_name] = 2
        if degree != 2:
            changes.append(Change(field_name, degree, 2, "each kept parallel axis runs at degree 2"))
        notes.append(f"{field_name}={degree} kept as {field_name}=2")
    if lay.ep > 1:
        changes.append(Change("ep", lay.ep, 1, "the built-in reference models are dense: experts are not "
                                                "exercised by a smoke run"))
    vpp = 1
    if kept.get("pp", 1) > 1 and lay.vpp > 1:
        vpp = 2
        if lay.vpp != 2:
            changes.append(Change("vpp", lay.vpp, 2, "two model chunks per pipeline rank keep the interleaving"))
    elif lay.vpp > 1:
        changes.append(Change("vpp", lay.vpp, 1, "pipeline parallel was dropped"))
    degrees = SmokeDegrees(tp=kept.get("tp", 1), pp=kept.get("pp", 1), cp=kept.get("cp", 1),
                           dp_replicate=kept.get("dp_replicate", 1), dp_shard=kept.get("dp_shard", 1), vpp=vpp)
    if lay.is_hsdp and degrees.dp_replicate == 1:
        changes.append(Change("sharding", "hybrid (HSDP)", "full shard within one group",
                              "the replicate axis of HSDP was dropped for a smaller world"))
    return degrees, changes, notes


def smoke_ep(lay: Layout, degrees: SmokeDegrees) -> int:
    """The expert-parallel degree for a target that runs the experts (Megatron): 2 when the plan
    has ep > 1 and the smoke's data-parallel x context ranks hold two expert groups (Megatron
    carves the expert-parallel group out of them), else 1. (The fsdp/deepspeed reference models
    are dense: ``map_degrees`` records ep -> 1 for them.)"""
    return 2 if lay.ep > 1 and (degrees.dp * degrees.cp) % 2 == 0 else 1


# ------------------------------------------------------------------------------------------- batch
def smoke_batch(lay: Layout, degrees: SmokeDegrees) -> tuple[int, int, list[Change]]:
    """(micro_batch, grad_accum): kept up to the caps; a pipeline needs at least pp micro-batches."""
    changes: list[Change] = []
    mbs = min(lay.micro_batch, MAX_MICRO_BATCH)
    if mbs != lay.micro_batch:
        changes.append(Change("micro_batch", lay.micro_batch, mbs, f"capped at {MAX_MICRO_BATCH} for CPU time"))
    ga = min(lay.grad_accum, MAX_GRAD_ACCUM)
    if degrees.pp > 1:
        ga = max(ga, degrees.pp)
        if degrees.vpp > 1 and ga % degrees.pp:
            ga += degrees.pp - ga % degrees.pp
    if ga != lay.grad_accum:
        why = (f"capped at {MAX_GRAD_ACCUM} micro-steps per step for CPU time" if ga < lay.grad_accum
               else f"a {degrees.pp}-stage pipeline needs at least {degrees.pp} micro-batches")
        changes.append(Change("grad_accum", lay.grad_accum, ga, why))
    return mbs, ga, changes


# ------------------------------------------------------------------------------------------- model
def _round_up(x: float, step: int) -> int:
    return max(step, int(math.ceil(x / step)) * step)


def reduce_shape(shape: ModelShape, *, tp: int, num_chunks: int) -> ModelShape:
    """A few-layer, narrow model of the same family: GQA ratio, MLP, norm, positions, tying, biases;
    MoE kept with at most ``MAX_EXPERTS`` experts; MLA kept with small ranks."""
    ratio = max(1, shape.num_attention_heads // max(1, shape.num_kv_heads))
    kv = tp
    while kv * ratio < MIN_HEADS and kv * 2 <= max(tp, shape.num_kv_heads):
        kv *= 2
    heads = kv * ratio
    head_dim = 16 if heads <= 16 else 8
    hidden = max(64, heads * head_dim)
    head_dim = hidden // heads
    ffn = _round_up(shape.ffn_hidden_size / shape.hidden_size * hidden, 8 * tp)
    layers = max(2, num_chunks)
    moe = None
    if shape.moe is not None:
        m = shape.moe
        experts = min(m.num_experts, MAX_EXPERTS)
        moe = MoEShape(
            num_experts=experts,
            top_k=min(m.top_k, max(1, experts // 2)),
            expert_ffn_hidden_size=_round_up(m.expert_ffn_hidden_size / shape.hidden_size * hidden, 8 * tp),
            num_shared_experts=min(m.num_shared_experts, 1),
            shared_expert_ffn_hidden_size=(_round_up(m.shared_expert_ffn_hidden_size / shape.hidden_size * hidden,
                                                     8 * tp) if m.shared_expert_ffn_hidden_size else 0),
            first_dense_layers=min(m.first_dense_layers, 1),
            layer_freq=min(m.layer_freq, 2),
        )
        layers = max(layers, moe.first_dense_layers + 1)
    mla = None
    if shape.mla is not None:
        mla = MLAShape(q_lora_rank=hidden // 2 if shape.mla.q_lora_rank else 0, kv_lora_rank=hidden // 4,
                       qk_nope_head_dim=head_dim, qk_rope_head_dim=max(2, head_dim // 2), v_head_dim=head_dim)
    return ModelShape(
        num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads, num_kv_heads=kv,
        vocab_size=SMOKE_VOCAB, head_dim=head_dim, mlp=shape.mlp, norm=shape.norm, position=shape.position,
        max_position_embeddings=SMOKE_SEQ_LEN if shape.position == "learned" else 0,
        tied_embeddings=shape.tied_embeddings, attention_bias=shape.attention_bias, linear_bias=shape.linear_bias,
        moe=moe, mla=mla, extra_params=0,
        # a window the short smoke sequence does not span, so windowed layers really mask
        window_size=min(shape.window_size, SMOKE_SEQ_LEN // 4) if shape.window_size else 0,
        full_attention_every=min(shape.full_attention_every, 2), attention_sinks=shape.attention_sinks)


def built_shape(shape: ModelShape, target: str) -> ModelShape:
    """The shape the target's built-in reference model really builds from ``shape``: both
    generated scripts build dense decoders without MLA; fsdp_train.py's uses RoPE positions."""
    from compiler.targets import registry

    built = replace(shape, moe=None, mla=None, extra_params=0)
    hooks = registry.get(target).smoke
    if hooks is not None and hooks.rope_only and built.position == "learned":
        built = replace(built, position="rope", max_position_embeddings=0)
    return built


def _shape_changes(plan_shape: ModelShape, small: ModelShape) -> list[Change]:
    out = [Change("num_layers", plan_shape.num_layers, small.num_layers, "a few layers (at least one per "
                                                                          "pipeline chunk)"),
           Change("hidden_size", plan_shape.hidden_size, small.hidden_size, "a narrow model; FFN ratio kept"),
           Change("num_attention_heads", f"{plan_shape.num_attention_heads}/{plan_shape.num_kv_heads} kv",
                  f"{small.num_attention_heads}/{small.num_kv_heads} kv", "the GQA ratio is kept"),
           Change("vocab_size", plan_shape.vocab_size, small.vocab_size, "a small vocabulary")]
    if plan_shape.moe is not None and small.moe is not None:
        out.append(Change("num_experts", plan_shape.moe.num_experts, small.moe.num_experts,
                          "MoE kept with fewer experts; note: the built-in reference models run the MoE "
                          "layers as dense MLPs"))
    if plan_shape.window_size and small.window_size != plan_shape.window_size:
        out.append(Change("window_size", plan_shape.window_size, small.window_size,
                          f"a window shorter than the {SMOKE_SEQ_LEN}-token smoke sequence, so it masks"))
    if plan_shape.mla is not None:
        out.append(Change("attention", "MLA", "MLA (small ranks)", "the built-in reference models run MLA "
                                                                  "layers as GQA attention"))
    return out


# ------------------------------------------------------------------------------------------- precision
def smoke_precision(precision: str, device: str) -> tuple[str, Change | None]:
    if precision in TE_PRECISIONS:
        return "bf16", Change("precision", precision, "bf16", f"the built-in reference models have no {precision} "
                                                              "(Transformer Engine) path")
    if precision == "fp16" and device != "cuda":
        return "bf16", Change("precision", "fp16", "bf16", "fp16 is not supported on CPU (DeepSpeed: 'Type fp16 "
                                                           "is not supported on your device')")
    return precision, None


# ------------------------------------------------------------------------------------------- all together
def scale_plan(plan: Plan, *, device: str, max_ranks: int, steps: int = DEFAULT_STEPS) -> SmokeSetup:
    """The SmokeSetup for ``plan`` on ``max_ranks`` local ranks of ``device``."""
    lay = plan.layout
    degrees, changes, notes = map_degrees(lay, device=device, max_ranks=max_ranks)
    mbs, ga, batch_changes = smoke_batch(lay, degrees)
    changes += batch_changes
    plan_shape = plan.model.shape
    small = reduce_shape(plan_shape, tp=degrees.tp, num_chunks=degrees.pp * degrees.vpp)
    changes += _shape_changes(plan_shape, small)
    seq = int(plan.training.seq_len)
    if seq != SMOKE_SEQ_LEN:
        changes.append(Change("seq_len", seq, SMOKE_SEQ_LEN, "short sequences"))
    precision, pchange = smoke_precision(str(plan.training.precision), device)
    if pchange:
        changes.append(pchange)
    sp = lay.sequence_parallel and degrees.tp > 1
    if lay.sequence_parallel and not sp:
        changes.append(Change("sequence_parallel", True, False, "tensor parallel was dropped"))
    layout = Layout(
        gpu=lay.gpu, gpus_per_node=max(1, degrees.world_size), tp=degrees.tp, pp=degrees.pp, cp=degrees.cp, ep=1,
        dp_replicate=degrees.dp_replicate, dp_shard=degrees.dp_shard, zero_stage=lay.zero_stage,
        micro_batch=mbs, grad_accum=ga, vpp=degrees.vpp,
        schedule=_schedule(lay, degrees), recompute=lay.recompute, sequence_parallel=sp,
        offload_optimizer=lay.offload_optimizer, offload_params=lay.offload_params,
        split=default_split(small.num_layers, degrees.pp, degrees.vpp))
    kept = [f"zero_stage={lay.zero_stage}", f"recompute={lay.recompute}",
            f"micro_batch={mbs}", f"grad_accum={ga}", f"optimizer={plan.training.optimizer}"]
    if degrees.pp > 1:
        kept.append(f"schedule={layout.schedule}")
    if lay.offload_optimizer != "none" or lay.offload_params != "none":
        kept.append(f"offload optimizer={lay.offload_optimizer} params={lay.offload_params}")
    if precision == plan.training.precision:
        kept.append(f"precision={precision}")
    kept += notes
    return SmokeSetup(
        plan_name=plan.name, device=device, backend="nccl" if device == "cuda" else "gloo",
        world_size=degrees.world_size, degrees=degrees, layout=layout, shape=small, seq_len=SMOKE_SEQ_LEN,
        precision=precision, plan_precision=str(plan.training.precision),
        optimizer=str(plan.training.optimizer), learning_rate=float(plan.training.learning_rate),
        seed=int(plan.training.seed), steps=steps, gpu=str(plan.cluster.gpu),
        changes=tuple(changes), kept=tuple(kept))


def _schedule(lay: Layout, degrees: SmokeDegrees) -> Schedule:
    if degrees.pp == 1:
        return "1f1b"
    if degrees.vpp > 1:
        return "interleaved_1f1b"
    return "1f1b" if lay.schedule == "interleaved_1f1b" else lay.schedule


# ------------------------------------------------------------------------------------------- DeepSpeed
def check_ds_batch(cfg: Mapping[str, Any], layout: Layout) -> str | None:
    """Why the generated ds_config's batch fields disagree with the plan's layout (None if they agree)."""
    try:
        tbs = int(cfg["train_batch_size"])
        mbs = int(cfg["train_micro_batch_size_per_gpu"])
        gas = int(cfg["gradient_accumulation_steps"])
    except (KeyError, TypeError, ValueError) as exc:
        return f"ds_config.json lacks a usable batch field ({exc})"
    world = layout.dp * layout.tp if layout.tp > 1 else layout.dp
    if tbs != mbs * gas * world:
        return (f"train_batch_size {tbs} != train_micro_batch_size_per_gpu {mbs} x gradient_accumulation_steps "
                f"{gas} x data-parallel world {world} = {mbs * gas * world}")
    if mbs != layout.micro_batch or gas != layout.grad_accum:
        return (f"micro-batch {mbs} / accumulation {gas} differ from the plan's layout "
                f"({layout.micro_batch} / {layout.grad_accum})")
    return None
