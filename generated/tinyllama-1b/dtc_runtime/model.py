"""The one decoder every torch trainer of dtc builds (FSDP2 and DeepSpeed alike).

A pre-norm decoder in torchtitan's naming (``tok_embeddings``, ``layers.<i>.attention.wq/wk/wv/wo``,
``layers.<i>.feed_forward.w1/w2/w3``, ``attention_norm``, ``ffn_norm``, ``norm``, ``output``):

- Llama style: RMSNorm, rotary positions (theta and Llama-3 "llama3" frequency scaling from the
  config), grouped-query attention, SwiGLU (``w2(silu(w1 x) * w3 x)``), no biases;
- GPT style: LayerNorm, learned absolute positions (``pos_embeddings``), GELU MLP, biases.

RoPE uses the rotate-half layout of Hugging Face transformers and Megatron-LM (the first half of a
head's channels pairs with the second half), so a Hugging Face Llama checkpoint loads by renaming
alone (``hf.py``) and the three targets rotate the same channels.

Initialisation follows Megatron-LM (megatron/core/utils.py ``init_method_normal`` and
``scaled_init_method_normal``): every matrix and embedding N(0, init_std), the two projections that
write into the residual stream (``wo``, ``w2``) N(0, init_std / sqrt(2 x layers)); biases 0; norm
weights 1. ``init_std`` comes from the model catalog.

Pipeline stages hold a subset of ``layers`` (a ModuleDict keyed by the global layer index, so
state-dict keys are the same on every stage); a stage without ``tok_embeddings`` takes hidden
states, a stage without ``output`` returns them.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig, RopeScaling


# ------------------------------------------------------------------------------------------- rotary
def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/d), i < d/2; with Llama 3.1's scaling (Meta's reference
    ``apply_scaling`` in llama-models, = transformers' ``_compute_llama3_parameters``): wavelengths
    longer than original/low_freq_factor are divided by ``factor``, shorter than
    original/high_freq_factor kept, and the band between interpolated smoothly."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim))
    if scaling is None:
        return inv.float()
    old = scaling.original_max_position_embeddings
    low_wavelen = old / scaling.low_freq_factor
    high_wavelen = old / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / scaling.factor, inv)
    smooth = (old / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled).float()


def rope_table(seq_len: int, head_dim: int, theta: float, scaling: RopeScaling | None = None,
               device: torch.device | str | None = None) -> torch.Tensor:
    """(seq_len, head_dim / 2, 2): cos and sin of position x inverse frequency, sequence first
    (context parallel shards it along dimension 0 with the inputs)."""
    inv = rope_inv_freq(head_dim, theta, scaling, device)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate (batch, seq, heads, head_dim) in the rotate-half layout: channel i pairs with
    channel i + head_dim / 2 (transformers' ``rotate_half``, Megatron's non-interleaved RoPE)."""
    t = table[: x.shape[1]].float()
    cos, sin = t[..., 0].unsqueeze(1), t[..., 1].unsqueeze(1)  # (seq, 1, head_dim / 2)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


# ------------------------------------------------------------------------------------------- blocks
def core_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax(q k^T / sqrt(d)) v on (batch, seq, heads, head_dim), K/V heads repeated for
    GQA; returns (batch, seq, heads, head_dim)."""
    rep = q.shape[2] // k.shape[2]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        dim, d = cfg.hidden_size, cfg.kv_channels
        qkv_bias = cfg.attention_bias or cfg.linear_bias
        self.head_dim = d
        self.use_rope = cfg.position == "rope"
        self.wq = nn.Linear(dim, cfg.num_attention_heads * d, bias=qkv_bias)
        self.wk = nn.Linear(dim, cfg.num_kv_heads * d, bias=qkv_bias)
        self.wv = nn.Linear(dim, cfg.num_kv_heads * d, bias=qkv_bias)
        self.wo = nn.Linear(cfg.num_attention_heads * d, dim, bias=cfg.linear_bias)
        self.checkpoint_core: Callable | None = None

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor | None) -> torch.Tensor:
        bs, seq, _ = x.shape
        q = self.wq(x).view(bs, seq, -1, self.head_dim)  # -1: the local heads under tensor parallel
        k = self.wk(x).view(bs, seq, -1, self.head_dim)
        v = self.wv(x).view(bs, seq, -1, self.head_dim)
        if self.use_rope:
            assert freqs_cis is not None, "a rotary model needs its table"
            q, k = apply_rope(q, freqs_cis), apply_rope(k, freqs_cis)
        if self.checkpoint_core is not None:  # selective recompute of the attention core (DeepSpeed)
            out = self.checkpoint_core(core_attention, q, k, v)
        else:
            out = core_attention(q, k, v)
        return self.wo(out.reshape(bs, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        dim, hidden, bias = cfg.hidden_size, cfg.ffn_hidden_size, cfg.linear_bias
        self.w1 = nn.Linear(dim, hidden, bias=bias)  # SwiGLU: the gate; GELU: the up projection
        self.w2 = nn.Linear(hidden, dim, bias=bias)  # down projection
        self.w3 = nn.Linear(dim, hidden, bias=bias) if cfg.mlp == "swiglu" else None  # SwiGLU: up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "layernorm":
        return nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.linear_bias)
    return nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention_norm = make_norm(cfg)
        self.attention = Attention(cfg)
        self.ffn_norm = make_norm(cfg)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor | None = None) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


# ------------------------------------------------------------------------------------------- the model
class Transformer(nn.Module):
    """The decoder; ``forward(tokens) -> logits`` (or hidden states on a pipeline stage)."""

    # Hugging Face-style tensor-parallel plan, which DeepSpeed AutoTP reads (runtime/engine.py,
    # ``_get_hf_tp_plan``); the FSDP2 trainer uses DTensor plans of the same split (parallel.py).
    _tp_plan = {
        "layers.*.attention.wq": "colwise", "layers.*.attention.wk": "colwise",
        "layers.*.attention.wv": "colwise", "layers.*.attention.wo": "rowwise",
        "layers.*.feed_forward.w1": "colwise", "layers.*.feed_forward.w3": "colwise",
        "layers.*.feed_forward.w2": "rowwise",
    }

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.args = cfg
        dim = cfg.hidden_size
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(cfg.vocab_size, dim)
        self.pos_embeddings: nn.Embedding | None = (
            nn.Embedding(cfg.position_table, dim) if cfg.position == "learned" else None)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.num_layers)})
        self.norm: nn.Module | None = make_norm(cfg)
        self.output: nn.Linear | None = nn.Linear(dim, cfg.vocab_size, bias=False)
        if cfg.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        if cfg.position == "rope":
            self.register_buffer("freqs_cis", self._rope_table(None), persistent=False)
        else:
            self.freqs_cis = None
        # set by parallel.apply_tp for learned positions under sequence parallel: the mesh the
        # embedding output is scattered over along the sequence after the positions are added
        self.sequence_scatter: Any = None
        self.checkpoint_block: Callable | None = None
        self.init_weights()

    def _rope_table(self, device) -> torch.Tensor:
        cfg = self.args
        return rope_table(cfg.seq_len, cfg.kv_channels, cfg.rope_theta, cfg.rope_scaling, device=device)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens)
            if self.pos_embeddings is not None:
                positions = torch.arange(tokens.shape[1], device=tokens.device)
                h = h + self.pos_embeddings(positions)[None]
                if self.sequence_scatter is not None:
                    h = _scatter_sequence(h, self.sequence_scatter)
        else:
            h = tokens
        for layer in self.layers.values():
            if self.checkpoint_block is not None:  # full recompute (DeepSpeed's checkpointing)
                # no None argument: with partition_activations (tp > 1) DeepSpeed saves a None as (None, size) and
                # hands the block both in the recompute (a learned-position model has no rotary table). The table is
                # a constant, not an activation: partitioned, DeepSpeed would empty it after the first layer
                # (checkpointing.py get_partitioned_activations_for_backward: arg.data = torch.empty([])) and the
                # next layer's rope fail; no_checkpointing is its is_activation_to_checkpoint opt-out
                if self.freqs_cis is not None:
                    self.freqs_cis.no_checkpointing = True
                h = self.checkpoint_block(layer, h, *(() if self.freqs_cis is None else (self.freqs_cis,)))
            else:
                h = layer(h, self.freqs_cis)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h

    @torch.no_grad()
    def init_weights(self) -> None:
        """Megatron's initialisation (``init_module_weights``); also recomputes the rotary table, so a
        model built on the meta device is ready after ``to_empty`` + ``init_weights``."""
        if isinstance(self.freqs_cis, torch.Tensor) and self.freqs_cis.device.type != "meta":
            self.freqs_cis.copy_(self._rope_table(self.freqs_cis.device))
        init_module_weights(self, self.args)


@torch.no_grad()
def init_module_weights(root: nn.Module, cfg: ModelConfig, gather: Callable[[list], Any] | None = None) -> None:
    """Megatron-LM's initialisation of every module under ``root`` (module docstring): matrices and
    embeddings N(0, init_std), ``wo``/``w2`` N(0, init_std / sqrt(2 x layers)), biases 0, norms 1.
    ``gather(params)`` returns a context in which partitioned parameters are whole and written back
    (DeepSpeed ZeRO-3: ``GatheredParameters(params, modifier_rank=0)``)."""
    import contextlib

    out_std = cfg.init_std / math.sqrt(2.0 * cfg.num_layers)
    for name, module in root.named_modules():
        own = list(module.parameters(recurse=False))
        if not own or not isinstance(module, (nn.Linear, nn.Embedding, nn.LayerNorm, nn.RMSNorm)):
            continue
        with (gather(own) if gather is not None else contextlib.nullcontext()):
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = out_std if name.rsplit(".", 1)[-1] in ("wo", "w2") else cfg.init_std
                nn.init.normal_(module.weight, mean=0.0, std=std)
                bias = getattr(module, "bias", None)
                if isinstance(bias, torch.Tensor):
                    nn.init.zeros_(bias)
            else:
                module.reset_parameters()


def _scatter_sequence(h: torch.Tensor, tp_mesh) -> torch.Tensor:
    """This rank's sequence shard of a replicated (batch, seq, dim) tensor; its backward gathers
    the gradient over ``tp_mesh`` (DTensor Replicate -> Shard(1))."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    full = DTensor.from_local(h, tp_mesh, [Replicate()], run_check=False)
    return full.redistribute(tp_mesh, [Shard(1)]).to_local()


# ------------------------------------------------------------------------------------------- helpers
def weight_decay_groups(named_params, weight_decay: float) -> list[dict[str, Any]]:
    """Megatron-LM's rule (megatron/core/optimizer ``_get_param_groups``: no decay where
    ``name.endswith('.bias') or len(param.shape) == 1``): matrices and embeddings decay, norms and
    biases do not. Returns torch optimizer parameter groups (empty groups left out)."""
    decay: list[torch.Tensor] = []
    no_decay: list[torch.Tensor] = []
    seen: set[int] = set()
    for name, p in named_params:
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (no_decay if name.endswith(".bias") or p.ndim == 1 else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss in fp32 over (batch, seq)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


__all__ = ["ModelConfig", "RopeScaling", "Transformer", "TransformerBlock", "Attention", "FeedForward",
           "rope_inv_freq", "rope_table", "apply_rope", "core_attention", "weight_decay_groups", "cross_entropy",
           "count_parameters", "init_module_weights"]
