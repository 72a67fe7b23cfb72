"""The activation profile each target is costed with, against the generated trainers' own blocks.

For every framework profile that runs on CPU (the registry's ``fsdp`` and ``deepspeed`` cost
profiles), the transformer block both generated trainers run (compiler/runtime/model.py
``TransformerBlock``, shipped verbatim as generated/<spec>/dtc_runtime/) runs forward under
torch.autograd.graph.saved_tensors_hooks; the unique storages autograd keeps for
backward (parameters and the RoPE table left out) are summed and compared with the bytes the cost
model predicts for that target's profile (compiler.costmodel.activations): within 5% for every
shape and dtype, the same formula and profile the cost model uses for plans of that target,
nothing fitted per shape. (The Megatron profile needs Transformer Engine on a GPU.)
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch  # required (the smoke extra): a missing torch fails, never skips

from compiler.costmodel.activations import activation_bytes_per_layer, layer_terms
from compiler.costmodel.activations import IMPLS
from compiler.targets import registry
from compiler.model import ModelShape
from compiler.runtime.config import ModelConfig
from compiler.runtime.model import TransformerBlock, rope_table

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ROOT / "generated" / "llama2-7b-8xh100"

SHAPES = [  # (batch, seq, hidden, heads, kv_heads, ffn, mlp, norm)
    (2, 64, 128, 8, 2, 352, "swiglu", "rmsnorm"),
    (1, 128, 256, 8, 8, 688, "swiglu", "rmsnorm"),
    (4, 32, 192, 6, 3, 512, "swiglu", "rmsnorm"),
    (2, 64, 128, 4, 4, 512, "gelu", "layernorm"),
]


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


def runtime_block(h, heads, kv, ffn, mlp, norm, t, dt):
    """The generated trainers' block (the copy shipped in generated/, which must be the runtime's own) and its
    RoPE table."""
    shipped = GENERATED / "dtc_runtime" / "model.py"
    assert shipped.read_text() == (ROOT / "compiler" / "runtime" / "model.py").read_text()
    cfg = ModelConfig(num_layers=1, hidden_size=h, ffn_hidden_size=ffn, num_attention_heads=heads, num_kv_heads=kv,
                      vocab_size=32, seq_len=t, mlp=mlp, norm=norm)
    torch.manual_seed(0)
    return TransformerBlock(cfg).to(dt), rope_table(t, h // heads, cfg.rope_theta)


@pytest.mark.parametrize("target", ["fsdp", "deepspeed"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("b,t,h,heads,kv,ffn,mlp,norm", SHAPES)
def test_trainer_block_matches_the_target_profile(b, t, h, heads, kv, ffn, mlp, norm, dtype, target):
    dt = getattr(torch, dtype)
    block, freqs = runtime_block(h, heads, kv, ffn, mlp, norm, t, dt)
    x = torch.randn(b, t, h, dtype=dt, requires_grad=True)
    measured = saved_bytes(block, (x, freqs), (freqs,))
    expected = predicted(target, _shape(h, heads, kv, ffn, mlp, norm), b * t, dt.itemsize)
    assert measured == pytest.approx(expected, rel=0.05), (measured, expected)


def test_targets_are_costed_with_their_own_profile():
    """Eager PyTorch blocks keep more than Megatron + Transformer Engine (fp32 RMSNorm copies, GQA-expanded
    K/V, silu(gate)): the FSDP and DeepSpeed targets are costed with that, not with Megatron's sizes."""
    shape = _shape(4096, 32, 8, 14336, "swiglu", "rmsnorm")
    eager, te = predicted("fsdp", shape, 4096, 2), predicted("megatron", shape, 4096, 2)
    assert eager > 1.3 * te
