"""What the smoke runner's saved-activation counter (compiler/runtime/measure.py) counts under full recompute."""
from __future__ import annotations

import torch

from compiler.runtime import measure as M
from compiler.runtime.config import ModelConfig
from compiler.runtime.model import Transformer, cross_entropy
from compiler.runtime.parallel import apply_ac

# wide layers over few tokens: a block's weights (~1.7 MB in bf16) outweigh its saved activations (~0.13 MB)
CFG = ModelConfig(num_layers=2, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=4, num_kv_heads=2,
                  vocab_size=128, seq_len=8)


def _model(recompute: str) -> Transformer:
    torch.manual_seed(0)
    return apply_ac(Transformer(CFG).to(torch.bfloat16), recompute)


def test_a_rematerialised_block_counts_its_activations_not_its_weights():
    """Full recompute: the backward's peak is at most what the forward kept plus one block's saved activations
    (measured on the same block without recompute). The rematerialised block's weight views (``w.t()``), which
    the checkpoint frame stores detached, were counted as activations: 2.1 MB where 0.16 MB is the most."""
    x = torch.randint(0, CFG.vocab_size, (1, CFG.seq_len))
    y = torch.randint(0, CFG.vocab_size, (1, CFG.seq_len))

    plain = _model("none")
    h = plain.tok_embeddings(x)
    one_block = M.SavedActivations()
    with one_block.hooks():
        out = plain.layers["0"](h, plain.freqs_cis[:CFG.seq_len])
    block_bytes = one_block.live
    del out
    assert block_bytes > 0

    model = _model("full")
    assert M.count_recomputation()
    saved = M.SAVED
    saved.peak = saved.live
    base = saved.live
    with saved.hooks():
        loss = cross_entropy(model(x), y)
        kept = saved.live - base
        loss.backward()
    peak = saved.peak - base
    assert saved.live == base  # everything counted was given back
    assert block_bytes <= peak <= kept + block_bytes, (peak, kept, block_bytes)
