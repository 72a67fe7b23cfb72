"""The runtime's one decoder: shapes, parameter counts (= the cost model's), RoPE against
transformers and against a closed form, Megatron's init and weight-decay rule, HF loading."""
from __future__ import annotations

import math

import pytest
import torch

from compiler.model import ModelShape, count_params
from compiler.runtime.hf import CheckpointFormatError, config_mismatches, hf_name, load_into
from compiler.runtime.model import (
    ModelConfig,
    RopeScaling,
    Transformer,
    apply_rope,
    count_parameters,
    rope_inv_freq,
    rope_table,
    weight_decay_groups,
)

LLAMA = dict(num_layers=2, hidden_size=64, ffn_hidden_size=160, num_attention_heads=8, num_kv_heads=2,
             vocab_size=97, seq_len=32, rope_theta=500000.0, norm_eps=1e-5)
GPT = dict(num_layers=2, hidden_size=48, ffn_hidden_size=192, num_attention_heads=4, num_kv_heads=4, vocab_size=50,
           seq_len=16, mlp="gelu", norm="layernorm", position="learned", max_position_embeddings=16,
           linear_bias=True, tied_embeddings=True)
SCALING = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16)


def _shape(cfg: ModelConfig) -> ModelShape:
    return ModelShape(num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, ffn_hidden_size=cfg.ffn_hidden_size,
                      num_attention_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_kv_heads,
                      vocab_size=cfg.vocab_size, head_dim=cfg.head_dim, mlp=cfg.mlp, norm=cfg.norm,
                      position=cfg.position, max_position_embeddings=cfg.max_position_embeddings,
                      tied_embeddings=cfg.tied_embeddings, attention_bias=cfg.attention_bias,
                      linear_bias=cfg.linear_bias)


@pytest.mark.parametrize("fields", [LLAMA, GPT, {**LLAMA, "attention_bias": True}, {**LLAMA, "tied_embeddings": True}],
                         ids=["llama-gqa", "gpt-learned-tied", "qwen-qkv-bias", "llama-tied"])
def test_forward_shape_and_parameter_count_equal_the_cost_models(fields):
    cfg = ModelConfig(**fields)
    model = Transformer(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (3, cfg.seq_len))
    assert model(tokens).shape == (3, cfg.seq_len, cfg.vocab_size)
    # one rule: what the trainers build is what compiler.model counts (and the cost model charges)
    assert count_parameters(model) == count_params(_shape(cfg)).total


def test_rope_table_is_the_closed_form_rotation():
    d, theta = 8, 10000.0
    x = torch.randn(1, 5, 1, d, dtype=torch.float64)
    out = apply_rope(x, rope_table(5, d, theta)).double()
    for pos in range(5):
        for i in range(d // 2):
            angle = pos * theta ** (-2 * i / d)
            a, b = x[0, pos, 0, i].item(), x[0, pos, 0, i + d // 2].item()  # rotate-half: i pairs with i + d/2
            c, s = math.cos(angle), math.sin(angle)
            assert out[0, pos, 0, i].item() == pytest.approx(a * c - b * s, abs=1e-5)
            assert out[0, pos, 0, i + d // 2].item() == pytest.approx(b * c + a * s, abs=1e-5)


@pytest.mark.parametrize("scaling", [None, SCALING], ids=["theta-500k", "llama3-scaling"])
def test_rope_matches_transformers(scaling):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    rope = None if scaling is None else {"rope_type": "llama3", "factor": scaling.factor,
                                         "low_freq_factor": scaling.low_freq_factor,
                                         "high_freq_factor": scaling.high_freq_factor,
                                         "original_max_position_embeddings": scaling.original_max_position_embeddings}
    hc = LlamaConfig(hidden_size=64, num_attention_heads=4, rope_theta=500000.0, max_position_embeddings=64,
                     rope_scaling=rope)
    emb = LlamaRotaryEmbedding(hc)
    assert torch.allclose(emb.inv_freq.float(), rope_inv_freq(16, 500000.0, scaling), rtol=1e-6)
    q = torch.randn(2, 40, 4, 16)
    cos, sin = emb(q, torch.arange(40)[None])
    ref, _ = apply_rotary_pos_emb(q.transpose(1, 2), q.transpose(1, 2), cos, sin)
    ours = apply_rope(q, rope_table(40, 16, 500000.0, scaling))
    assert (ours - ref.transpose(1, 2)).abs().max().item() < 1e-5


def test_megatron_init_and_weight_decay_rule():
    cfg = ModelConfig(**{**LLAMA, "num_layers": 8, "hidden_size": 256, "ffn_hidden_size": 512, "init_std": 0.01})
    torch.manual_seed(0)
    model = Transformer(cfg)
    assert model.layers["0"].attention.wq.weight.std().item() == pytest.approx(0.01, rel=0.05)
    assert model.layers["0"].attention.wo.weight.std().item() == pytest.approx(0.01 / math.sqrt(16), rel=0.05)
    assert model.layers["0"].feed_forward.w2.weight.std().item() == pytest.approx(0.01 / math.sqrt(16), rel=0.05)
    assert torch.all(model.norm.weight == 1)
    groups = weight_decay_groups(model.named_parameters(), 0.1)
    decayed = {id(p) for p in groups[0]["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    assert all(names[i].endswith(".weight") and "norm" not in names[i] for i in decayed)
    assert {names[id(p)] for p in groups[1]["params"]} == {n for n, p in model.named_parameters() if p.ndim == 1}
    assert id(model.tok_embeddings.weight) in decayed  # Megatron decays embeddings


def test_hf_names():
    assert hf_name("layers.3.attention.wq.weight") == "model.layers.3.self_attn.q_proj.weight"
    wrapped = "layers.3._checkpoint_wrapped_module.feed_forward.w1.weight"
    assert hf_name(wrapped) == "model.layers.3.mlp.gate_proj.weight"
    assert hf_name("layers.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    assert hf_name("tok_embeddings.weight") == "model.embed_tokens.weight"
    with pytest.raises(KeyError):
        hf_name("pos_embeddings.weight")  # GPT-style learned positions have no Llama counterpart


def _save_tiny_llama(folder, scaling=None, tie=False):
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = None if scaling is None else {"rope_type": "llama3", **{k: getattr(scaling, k) for k in (
        "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}}
    torch.manual_seed(0)
    hc = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=8,
                     num_key_value_heads=2, max_position_embeddings=64, rope_theta=500000.0, rms_norm_eps=1e-5,
                     tie_word_embeddings=tie, rope_scaling=rope)
    model = LlamaForCausalLM(hc).eval()
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("scaling,tie", [(None, False), (SCALING, False), (None, True)],
                         ids=["llama3", "llama3.1-scaling", "tied"])
def test_transformers_checkpoint_loads_and_logits_match(tmp_path, scaling, tie):
    hf = _save_tiny_llama(tmp_path, scaling, tie)
    ours = Transformer(ModelConfig(**{**LLAMA, "rope_scaling": scaling, "tied_embeddings": tie}))
    report = load_into(ours, tmp_path)
    assert report["loaded"] == count_parameters_tensors(ours)
    tokens = torch.randint(0, 97, (2, 32))
    with torch.no_grad():
        diff = (hf(tokens).logits - ours(tokens)).abs().max().item()
    assert diff < 1e-5


def count_parameters_tensors(model) -> int:
    return len({id(p) for p in model.parameters()})


def test_a_checkpoint_of_another_shape_is_refused(tmp_path):
    _save_tiny_llama(tmp_path)
    with pytest.raises(CheckpointFormatError, match="rope_theta: ours 10000.0, checkpoint 500000.0"):
        load_into(Transformer(ModelConfig(**{**LLAMA, "rope_theta": 10000.0})), tmp_path)
    cfg = ModelConfig(**LLAMA)
    assert config_mismatches(cfg, {"num_hidden_layers": 3, "hidden_size": 64}) == ["num_layers: ours 2, checkpoint 3"]
