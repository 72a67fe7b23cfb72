"""Activation memory per layer: Korthikanti et al. 2022 Table 2, then the generalisations."""
from __future__ import annotations

import pytest

from compiler.costmodel.activations import (MEGATRON_TE, PAPER, activation_bytes_per_layer, layer_terms,
                                            recompute_working_set_bytes)
from compiler.model import ModelShape, MoEShape

# GPT-3 175B as in Korthikanti et al. 2022, Table 3: h = 12288, a = 96, s = 2048, t = 8, b = 1.
H, A, S, B, T = 12288, 96, 2048, 1, 8
GPT3 = ModelShape(num_layers=96, hidden_size=H, ffn_hidden_size=4 * H, num_attention_heads=A, num_kv_heads=A,
                  vocab_size=51200, mlp="gelu", norm="layernorm", position="learned", max_position_embeddings=S,
                  linear_bias=True)


def per_layer(shape=GPT3, *, tp=1, sp=False, recompute="none", impl=PAPER, s=S, b=B, act_bytes=2, moe=False):
    terms = layer_terms(shape, moe_layer=moe, seq_kv=s, act_bytes=act_bytes, impl=impl)
    return activation_bytes_per_layer(terms, tokens=s * b, tp=tp, sequence_parallel=sp, recompute=recompute,
                                      hidden=shape.hidden_size, act_bytes=act_bytes)


# Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Table 2
# (bytes per layer; the paper's "sbh(...)" with s = sequence, b = micro-batch, h = hidden, a = heads).
@pytest.mark.parametrize("tp,sp,recompute,formula", [
    (1, False, "none", lambda: S * B * H * (34 + 5 * A * S / H)),
    (T, False, "none", lambda: S * B * H * (10 + 24 / T + 5 * A * S / (H * T))),
    (T, True, "none", lambda: S * B * H / T * (34 + 5 * A * S / H)),
    (T, False, "selective", lambda: S * B * H * (10 + 24 / T)),
    (T, True, "selective", lambda: S * B * H / T * 34),
    (1, False, "full", lambda: 2 * S * B * H),
])
def test_korthikanti_table_2(tp, sp, recompute, formula):
    assert per_layer(tp=tp, sp=sp, recompute=recompute) == pytest.approx(formula(), rel=1e-12)


def test_full_recompute_with_sp_keeps_the_sharded_input():
    assert per_layer(tp=T, sp=True, recompute="full") == pytest.approx(2 * S * B * H / T)


def test_flash_attention_drops_the_s_squared_term():
    """FlashAttention saves O and a fp32 log-sum-exp per head instead of the a x s x s matrices."""
    flash = per_layer(impl=MEGATRON_TE)
    assert flash < per_layer()  # paper's unfused softmax
    assert per_layer(impl=MEGATRON_TE, s=4 * S, b=1) / (4 * S) == pytest.approx(flash / S, rel=1e-12)


def test_gqa_saves_narrower_k_and_v():
    mha = ModelShape(num_layers=1, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32, num_kv_heads=32,
                     vocab_size=1000)
    gqa = ModelShape(**{**mha.to_dict(), "num_kv_heads": 8})
    saving = per_layer(mha, impl=MEGATRON_TE) - per_layer(gqa, impl=MEGATRON_TE)
    assert saving == pytest.approx(S * B * 2 * (4096 - 1024) * 2)  # K and V: (32 - 8) heads x 128 x 2 B


def test_swiglu_saves_gate_and_up():
    """Megatron's fused SwiGLU keeps the fc1 output [gate, up] (2f) plus the fc2 input (f)."""
    shape = ModelShape(num_layers=1, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=8, num_kv_heads=8,
                       vocab_size=1000)
    terms = {t.name: t.bytes_per_token for t in layer_terms(shape, moe_layer=False, seq_kv=S, act_bytes=2,
                                                             impl=MEGATRON_TE)}
    assert terms["mlp_activation"] == 2 * 4096 * 2 and terms["mlp_fc2_input"] == 4096 * 2


def test_moe_layer_holds_top_k_copies():
    moe = MoEShape(num_experts=8, top_k=2, expert_ffn_hidden_size=14336)
    shape = ModelShape(num_layers=1, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32, num_kv_heads=8,
                       vocab_size=1000, moe=moe)
    terms = {t.name: t.bytes_per_token for t in layer_terms(shape, moe_layer=True, seq_kv=S, act_bytes=2,
                                                             impl=MEGATRON_TE)}
    assert terms["moe_dispatched_tokens"] == 2 * 2 * 4096 * 2  # top_k x (fc1 input + combine input)
    assert terms["moe_expert_activation"] == 2 * 2 * 14336 * 2
    assert terms["moe_router_probs"] == 8 * 4


def test_fp8_keeps_gemm_inputs_in_one_byte():
    shape = ModelShape(num_layers=1, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=8, num_kv_heads=8,
                       vocab_size=1000)
    bf16 = {t.name: t.bytes_per_token for t in layer_terms(shape, moe_layer=False, seq_kv=S, act_bytes=2)}
    fp8 = {t.name: t.bytes_per_token for t in layer_terms(shape, moe_layer=False, seq_kv=S, act_bytes=2,
                                                           gemm_bytes=1)}
    assert fp8["mlp_fc2_input"] == bf16["mlp_fc2_input"] / 2 and fp8["qkv_input"] == bf16["qkv_input"] / 2
    assert fp8["mlp_activation"] == bf16["mlp_activation"]


def test_context_parallel_divides_the_tokens(problem_factory, layout_factory):
    from compiler.costmodel.evaluation import evaluate

    p = problem_factory("llama3-8b", seq=8192, gbs=32)
    cp1 = evaluate(p, layout_factory(p, dp_replicate=8, recompute="full"), check_memory=False)
    cp2 = evaluate(p, layout_factory(p, cp=2, dp_replicate=4, recompute="full"), check_memory=False)
    assert cp2.memory.item("activations").value == pytest.approx(cp1.memory.item("activations").value / 2, rel=0.02)


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_recompute_orders_memory(mode):
    """full <= selective <= none for every shape (Korthikanti sec. 5)."""
    order = {"none": 2, "selective": 1, "full": 0}
    values = {m: per_layer(impl=MEGATRON_TE, recompute=m) for m in order}
    assert sorted(values, key=values.get) == sorted(order, key=order.get)
    terms = layer_terms(GPT3, moe_layer=False, seq_kv=S, act_bytes=2, impl=PAPER)
    working = recompute_working_set_bytes(terms, tokens=S, tp=1, sequence_parallel=False, recompute=mode,
                                          hidden=H, act_bytes=2)
    assert working == (0 if mode == "none" else pytest.approx(5 * A * S * S if mode == "selective" else per_layer()))
