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


def test_a_graph_dropped_without_backward_gives_its_bytes_back_at_once():
    """Autograd hands a saved *output* (sigmoid keeps its result) to the pack hook with its grad_fn; keeping that
    tensor closed a cycle only the garbage collector breaks, so a graph dropped without a backward stayed counted
    (torch pipelining's metadata inference on the first stage: +8% on a pp=2 x vpp=2 smoke run)."""
    import gc

    counter = M.SavedActivations()
    x = torch.randn(64, 64, requires_grad=True)
    gc.disable()
    try:
        with counter.hooks():
            y = torch.sigmoid(x @ x)
        assert counter.live > 0
        del y
        assert counter.live == 0, counter.live
    finally:
        gc.enable()


FSDP_ROPE = """
import os, torch, torch.distributed as dist
from compiler.runtime.config import ModelConfig, ParallelConfig
from compiler.runtime.model import Transformer
from compiler.runtime.parallel import build_mesh, parallelize
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + os.environ["PORT"])
cfg = ModelConfig(num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_kv_heads=2,
                  vocab_size=64, seq_len=8)
par = ParallelConfig(dp_shard=1, zero_stage=2)
model = parallelize(Transformer(cfg), build_mesh("cpu", par), par, "bfloat16", "float32")
seen = []
for block in model.layers.values():
    block.register_forward_pre_hook(lambda m, args: seen.append((args[0].dtype, args[1].dtype)))
model(torch.randint(0, 64, (1, 8)))
print(sorted({(str(a), str(b)) for a, b in seen}))
dist.destroy_process_group()
"""


def test_fsdp2_blocks_get_the_rotary_table_in_fp32():
    """FSDP2's mixed precision casts a module's floating-point forward inputs to param_dtype: the rotary table
    handed to every block arrived in bf16 (RoPE from bf16-rounded cos/sin, and a fresh copy per layer that
    apply_rope widened again and autograd saved). The blocks take their hidden state in bf16 as it comes."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, "-c", FSDP_ROPE], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PORT": str(port)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[('torch.bfloat16', 'torch.float32')]", out.stdout
