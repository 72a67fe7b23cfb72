"""torchrun worker for tests/test_smoke_equivalence.py: the generated fsdp_config.py, for real.

    torchrun --standalone --nproc-per-node 4 smoke_equivalence.py GENERATED_DIR OUT_JSON

Every rank builds the same reference model (fsdp_config.Transformer, seeded) and computes the
loss and gradients of one fixed global batch on its own, unsharded: the 1-rank result. Then,
for each mesh below, a fresh copy with the same initial weights is parallelized with the
generated ``parallelize`` (TP -> AC -> FSDP2), each data-parallel rank trains its slice of the
same global batch with gradient accumulation (``set_grad_sync`` as generated), and the
all-reduced loss and the gathered (``full_tensor``) gradients are compared with the 1-rank
result. For the TP mesh the forward output before any step is compared with the unsharded
model's output on the same micro-batch. Rank 0 writes the numbers to OUT_JSON; any mismatch
is left to the test to judge (the worker only fails on errors).
"""
from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, sys.argv[1])
import fsdp_config as C  # noqa: E402  (the generated module)

GLOBAL_BATCH, GRAD_ACCUM, SEQ = 8, 2, 32
MESHES = {
    "fsdp_full_shard_4": dict(pp=1, dp_replicate=1, dp_shard=4, cp=1, tp=1, vpp=1),
    "hsdp_2x2": dict(pp=1, dp_replicate=2, dp_shard=2, cp=1, tp=1, vpp=1),
    "tp2_x_fsdp2": dict(pp=1, dp_replicate=1, dp_shard=2, cp=1, tp=2, vpp=1),
}


def loss_fn(logits, targets):
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def batch(vocab):
    g = torch.Generator().manual_seed(1234)
    start = torch.randint(0, vocab, (GLOBAL_BATCH, 1), generator=g)
    stride = torch.randint(1, 4, (GLOBAL_BATCH, 1), generator=g)
    seqs = (start + stride * torch.arange(SEQ + 1)) % vocab
    return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()


def clean(name: str) -> str:
    return name.replace("_checkpoint_wrapped_module.", "")


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, "run with 4 ranks"
    cfg = C.reference_config(layers=2, hidden=64, heads=4, kv_heads=2, ffn=176, vocab=256, seq_len=SEQ, tp=2)
    torch.manual_seed(0)
    ref = C.Transformer(cfg)
    init = {k: v.clone() for k, v in ref.state_dict().items()}
    inputs, targets = batch(cfg["vocab_size"])
    ref_loss = loss_fn(ref(inputs), targets)
    ref_loss.backward()
    ref_grads = {clean(n): p.grad.clone() for n, p in ref.named_parameters()}
    results = {"ref_loss": ref_loss.item(), "param_dtype": C.PARAM_DTYPE, "meshes": {}}
    for name, values in MESHES.items():
        degrees = C.Degrees(**values)
        C.validate_world_size(degrees, world)
        mesh = C.build_mesh("cpu", degrees)
        model = C.Transformer(cfg)
        model.load_state_dict(init)
        C.parallelize(model, mesh, degrees)
        dp_index, dp = C.dp_coordinate(mesh, degrees)
        per_rank = GLOBAL_BATCH // dp
        mb = per_rank // GRAD_ACCUM
        x_all = inputs[dp_index * per_rank:(dp_index + 1) * per_rank]
        y_all = targets[dp_index * per_rank:(dp_index + 1) * per_rank]
        out: dict = {"dp": dp, "micro_batch": mb}
        if degrees.tp > 1:
            with torch.no_grad():
                sharded = full(model(x_all[:mb])).float()
                unsharded = ref(x_all[:mb]).float()
            out["tp_output_max_abs_diff"] = (sharded - unsharded).abs().max().item()
            out["tp_output_max_abs"] = unsharded.abs().max().item()
        local = torch.zeros(())
        for i in range(GRAD_ACCUM):
            C.set_grad_sync([model], i == GRAD_ACCUM - 1, degrees)
            micro = loss_fn(model(x_all[i * mb:(i + 1) * mb]), y_all[i * mb:(i + 1) * mb]) / GRAD_ACCUM
            micro.backward()
            local += micro.detach()
        dist.all_reduce(local)
        out["loss"] = (local / world).item()
        worst, worst_name, count = 0.0, "", 0
        for pname, p in model.named_parameters():
            g = full(p.grad)
            r = ref_grads[clean(pname)]
            assert g.shape == r.shape, f"{pname}: {tuple(g.shape)} vs {tuple(r.shape)}"
            diff = ((g - r).abs() / (r.abs() + 1e-3)).max().item()
            count += 1
            if diff > worst:
                worst, worst_name = diff, pname
        out.update(grad_max_rel_diff=worst, grad_worst=clean(worst_name), num_grads=count,
                   ref_grad_count=len(ref_grads))
        results["meshes"][name] = out
        dist.barrier()
    if rank == 0:
        with open(sys.argv[2], "w") as f:
            json.dump(results, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The run is done and its output flushed; leave without the interpreter's shutdown, where
    # torch's c10d/gloo threads can abort a finished rank ("terminate called without an
    # active exception", seen intermittently on CPU under torchrun).
    import os

    os._exit(0)
