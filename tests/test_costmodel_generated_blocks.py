"""The activation profile each target is costed with, against the generated trainers' own blocks.

For every framework profile that runs on CPU (compiler/costmodel/frameworks.py: ``fsdp`` and
``deepspeed``), the transformer block of the trainer dtc generates for that target
(generated/<spec>/fsdp_config.py ``TransformerBlock``, generated/<spec>/ds_train.py ``Block``) runs
forward under torch.autograd.graph.saved_tensors_hooks; the unique storages autograd keeps for
backward (parameters and the RoPE table left out) are summed and compared with the bytes the cost
model predicts for that target's profile (compiler.costmodel.activations): within 5% for every
shape and dtype, the same formula and profile the cost model uses for plans of that target,
nothing fitted per shape. (The Megatron profile needs Transformer Engine on a GPU.)
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch  # required (the smoke extra): a missing torch fails, never skips

from compiler.costmodel.activations import activation_bytes_per_layer, layer_terms
from compiler.costmodel.activations import IMPLS
from compiler.targets import registry
from compiler.model import ModelShape

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ROOT / "generated" / "llama2-7b-8xh100"

SHAPES = [  # (batch, seq, hidden, heads, kv_heads, ffn, mlp, norm)
    (2, 64, 128, 8, 2, 352, "swiglu", "rmsnorm"),
    (1, 128, 256, 8, 8, 688, "swiglu", "rmsnorm"),
    (4, 32, 192, 6, 3, 512, "swiglu", "rmsnorm"),
    (2, 64, 128, 4, 4, 512, "gelu", "layernorm"),
]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def saved_bytes(module: torch.nn.Module, inputs: tuple, constants: tuple = ()) -> int:
    """Unique storages autograd saves for backward, minus parameters and constant inputs."""
    storages: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        storages[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*inputs)
    skip = {p.untyped_storage().data_ptr() for p in module.parameters()}
    skip |= {c.untyped_storage().data_ptr() for c in constants}
    return sum(n for ptr, n in storages.items() if ptr not in skip)


def predicted(target: str, shape: ModelShape, tokens: int, act_bytes: int) -> float:
    impl = IMPLS[registry.get(target).cost.activations]
    terms = layer_terms(shape, moe_layer=False, seq_kv=tokens, act_bytes=act_bytes, impl=impl)
    return activation_bytes_per_layer(terms, tokens=tokens, tp=1, sequence_parallel=False, recompute="none",
                                      hidden=shape.hidden_size, act_bytes=act_bytes)


def _shape(h, heads, kv, ffn, mlp, norm) -> ModelShape:
    return ModelShape(num_layers=1, hidden_size=h, ffn_hidden_size=ffn, num_attention_heads=heads, num_kv_heads=kv,
                      vocab_size=32, mlp=mlp, norm=norm)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("b,t,h,heads,kv,ffn,mlp,norm", SHAPES)
def test_fsdp_trainer_block_matches_the_fsdp_profile(b, t, h, heads, kv, ffn, mlp, norm, dtype):
    config = _load("fsdp_config", GENERATED / "fsdp_config.py")
    dt = getattr(torch, dtype)
    cfg = dict(hidden_size=h, num_attention_heads=heads, num_kv_heads=kv, head_dim=h // heads, ffn_hidden_size=ffn,
               mlp=mlp, norm=norm, attention_bias=False, linear_bias=False)
    torch.manual_seed(0)
    block = config.TransformerBlock(cfg).to(dt)
    x = torch.randn(b, t, h, dtype=dt, requires_grad=True)
    freqs = config.rope_table(t, h // heads)
    measured = saved_bytes(block, (x, freqs), (freqs,))
    expected = predicted("fsdp", _shape(h, heads, kv, ffn, mlp, norm), b * t, dt.itemsize)
    assert measured == pytest.approx(expected, rel=0.05), (measured, expected)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("b,t,h,heads,kv,ffn,mlp,norm", SHAPES)
def test_deepspeed_trainer_block_matches_the_deepspeed_profile(b, t, h, heads, kv, ffn, mlp, norm, dtype):
    ds = _load("ds_train", GENERATED / "ds_train.py")
    dt = getattr(torch, dtype)
    s = dict(hidden_size=h, num_attention_heads=heads, num_kv_heads=kv, head_dim=h // heads, ffn_hidden_size=ffn,
             mlp=mlp, norm=norm, attention_bias=False, linear_bias=False, position="rope", tied_embeddings=False,
             vocab_size=32, max_position_embeddings=t, num_layers=1)
    torch.manual_seed(0)
    block = ds.Block(s).to(dt)
    x = torch.randn(b, t, h, dtype=dt, requires_grad=True)
    measured = saved_bytes(block, (x,))
    expected = predicted("deepspeed", _shape(h, heads, kv, ffn, mlp, norm), b * t, dt.itemsize)
    assert measured == pytest.approx(expected, rel=0.05), (measured, expected)


def test_targets_are_costed_with_their_own_profile():
    """Eager PyTorch blocks keep more than Megatron + Transformer Engine (fp32 RMSNorm copies, GQA-expanded
    K/V, silu(gate)): the FSDP and DeepSpeed targets are costed with that, not with Megatron's sizes."""
    shape = _shape(4096, 32, 8, 14336, "swiglu", "rmsnorm")
    eager, te = predicted("fsdp", shape, 4096, 2), predicted("megatron", shape, 4096, 2)
    assert eager > 1.3 * te
