#!/usr/bin/env python3
"""Count the operators Megatron-Core's own MoE layer issues per forward: the source of the Megatron cost profile's
``ops_per_moe_layer`` (compiler/targets/megatron/cost.py).

    python benchmarks/moe_host_ops.py [--experts N] [--load-balancing aux_loss|seq_aux_loss|none] [--json]

Builds megatron-core 0.19.2's ``MoELayer`` (the installed package, Python 3.11 shims of
tests/runtime/megatron_import.py) with the token dispatcher dtc's Megatron target renders
(``--moe-token-dispatcher-type alltoall``, fp32 router, the given load-balancing loss) on two CPU
processes over gloo with expert parallelism 2, so that the dispatcher takes its EP > 1 path (token-count
all-gather, split sizes, two all-to-alls out and one back). One forward runs under a
``TorchDispatchMode`` that records every ATen operator by the part of the layer it came from (router,
the dispatcher's six steps, experts). Views and allocations (``empty``) launch no kernel and are counted
apart. What a GPU run adds and a CPU run would not show is put
back: the device-to-host copies of the token counts and split sizes
(``MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize`` -> ``maybe_move_tensor_to_cpu``, a no-op on a
CPU tensor) are counted one kernel each, and the split sizes come back as numpy arrays as they do from a
GPU, so that the all-to-all's size arithmetic adds no torch operator.

The experts here are megatron's SequentialMLP (Transformer Engine is not installed on a CPU machine);
their per-expert kernels are costed from Transformer Engine's GroupedLinear instead
(``ops_per_local_expert``, see compiler/targets/megatron/cost.py), so the expert part is printed but
not summed. CUDA streams and events, which the dispatcher uses for the host copies, are replaced by
no-ops; the gloo all-to-all is given its split sizes as Python lists.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NO_KERNEL = ("aten::empty", "aten::empty_strided", "aten::new_empty", "aten::detach", "aten::lift_fresh",
             "aten::_local_scalar_dense")
DISPATCHER_STEPS = ("dispatch_preprocess", "token_dispatch", "dispatch_postprocess", "combine_preprocess",
                    "token_combine", "combine_postprocess")


def _cpu_stand_ins(torch) -> None:
    """No-op CUDA streams/events and list split sizes for gloo's all-to-all (what a CPU run needs)."""
    import torch.distributed as dist

    class Event:
        def synchronize(self): pass
        def record(self, *a): pass
        def wait(self, *a): pass

    class Stream:
        def wait_stream(self, *a): pass
        def record_event(self, *a): return Event()
        def wait_event(self, *a): pass

    current = Stream()
    torch.cuda.Stream = lambda *a, **k: Stream()
    torch.cuda.Event = lambda *a, **k: Event()
    torch.cuda.current_stream = lambda *a, **k: current
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.is_current_stream_capturing = lambda: False
    torch.Tensor.record_stream = lambda self, s: None
    a2a = dist.all_to_all_single

    def all_to_all_lists(out, inp, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        def as_list(x):
            return None if x is None else [int(v) for v in x]
        return a2a(out, inp, as_list(output_split_sizes), as_list(input_split_sizes), group=group, async_op=async_op)

    dist.all_to_all_single = all_to_all_lists


def _rank(rank: int, world: int, experts: int, balancing: str, port: int, out: str) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "runtime"))
    from megatron_import import megatron_module

    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    _cpu_stand_ins(torch)
    megatron_module("megatron.core.parallel_state").initialize_model_parallel(1, 1, expert_model_parallel_size=world)
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    config_cls = megatron_module("megatron.core.transformer.transformer_config").TransformerConfig
    specs = megatron_module("megatron.core.models.gpt.gpt_layer_specs")
    cfg = config_cls(
        num_layers=1, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, num_moe_experts=experts,
        moe_router_topk=2, moe_ffn_hidden_size=32, moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False,
        add_bias_linear=False, gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        moe_router_load_balancing_type=balancing, moe_aux_loss_coeff=0.0 if balancing == "none" else 1e-3,
        moe_router_dtype="fp32", use_cpu_initialization=True, params_dtype=torch.float32)
    layer = specs.get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False).submodules.mlp(config=cfg)
    part = ["moe_layer"]

    def tag(name):
        def pre(module, args) -> None:
            part.append(name)

        def post(module, args, output) -> None:  # returns None: the layer's output is left alone
            part.pop()
        return pre, post

    for name, mod in (("router", layer.router), ("experts", layer.experts)):
        pre, post = tag(name)
        mod.register_forward_pre_hook(pre)
        mod.register_forward_hook(post)
    dispatcher = layer.token_dispatcher
    for step in DISPATCHER_STEPS:
        def wrapped(*a, _f=getattr(dispatcher, step), _step=step, **k):
            part.append(_step)
            try:
                return _f(*a, **k)
            finally:
                part.pop()
        setattr(dispatcher, step, wrapped)
    kernels: dict[str, list[str]] = collections.defaultdict(list)
    other: collections.Counter = collections.Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._schema.name
            if func.is_view or name in NO_KERNEL:
                other[part[-1]] += 1
            else:
                kernels[part[-1]].append(name.replace("aten::", ""))
            return func(*args, **(kwargs or {}))

    # on a GPU the dispatcher copies its token counts and split sizes to the host (one copy kernel each; the splits
    # become numpy arrays, so the all-to-all's size arithmetic issues no torch operator): do the same here and
    # count each copy where it happens
    token_dispatcher = megatron_module("megatron.core.transformer.moe.token_dispatcher")

    def to_host(tensor, as_numpy=False, record_stream=False):
        if not torch.is_tensor(tensor):
            return tensor
        kernels[part[-1]].append("_to_copy(device-to-host)")
        return tensor.numpy() if as_numpy else tensor

    token_dispatcher.maybe_move_tensor_to_cpu = to_host
    x = torch.randn(16, 2, 64, requires_grad=True)
    for _ in range(2):  # the second forward is the one counted (first-call set-up excluded)
        kernels.clear()
        other.clear()
        with Count():
            y, _ = layer(x)
        y.sum().backward()
    if rank == 0:
        Path(out).write_text(json.dumps({"kernels": kernels, "views_and_allocations": dict(other)}))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--load-balancing", default="aux_loss", choices=("aux_loss", "seq_aux_loss", "none"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "counts.json")
        mp.spawn(_rank, args=(2, args.experts, args.load_balancing, 29000 + os.getpid() % 1000, out), nprocs=2)
        counts = json.loads(Path(out).read_text())
    kernels = counts["kernels"]
    layer_parts = ("router",) + DISPATCHER_STEPS
    measured = sum(len(kernels.get(p, [])) for p in layer_parts)
    result = {"kernels_by_part": {p: len(kernels.get(p, [])) for p in layer_parts},
              "kernel_names": {p: kernels.get(p, []) for p in layer_parts},
              "experts_sequential_mlp_not_summed": len(kernels.get("experts", [])),
              "moe_specific_forward_ops": measured,
              "load_balancing": args.load_balancing, "experts": args.experts, "expert_parallel": 2}
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return 0
    print(f"megatron-core MoELayer forward, alltoall dispatcher, EP 2, {args.experts} experts, "
          f"{args.load_balancing}: kernel-launching ATen operators by part")
    for p in layer_parts:
        names = kernels.get(p, [])
        print(f"  {p:<20} {len(names):>3}  {' '.join(names)}")
    print(f"  (experts: SequentialMLP, {len(kernels.get('experts', []))} operators, not summed: "
          "Transformer Engine's GroupedLinear runs them on a GPU)")
    print(f"router + dispatcher: {measured} kernel-launching operators per MoE layer forward")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
