"""Collectives, links and data-parallel traffic (ring formulas: Thakur et al. 2005; nccl-tests bus bandwidth)."""
from __future__ import annotations

import pytest

from compiler.costmodel import comm
from compiler.costmodel.evaluation import evaluate
from compiler.costmodel.context import make_setup


def setup_for(problem, layout):
    return make_setup(problem, layout, problem.gpu_options[0])


def test_ring_formulas():
    link = comm.GroupLink(comm.INTRA, 100e9, 0.0, 8)
    assert comm.all_reduce_time_s(1e9, 8, link) == pytest.approx(2 * 7 / 8 * 1e9 / 100e9)
    assert comm.all_gather_time_s(1e9, 8, link) == pytest.approx(7 / 8 * 1e9 / 100e9)
    assert comm.reduce_scatter_time_s(1e9, 8, link) == comm.all_gather_time_s(1e9, 8, link)
    assert comm.all_reduce_time_s(1e9, 1, link) == 0


def test_groups_inside_a_node_use_nvlink_and_across_use_the_network(problem_factory, layout_factory):
    p = problem_factory("llama3-70b", num_gpus=64, gbs=64)
    s = setup_for(p, layout_factory(p, tp=8, dp_shard=8, zero_stage=1))
    gpu = p.gpu_options[0]
    eff = s.eff.busbw_fraction
    assert comm.tp_link(s).link == comm.INTRA
    assert comm.tp_link(s).busbw_bytes_per_s == pytest.approx(gpu.intra_node_bandwidth_bytes_per_s * eff["intra_node"])
    dp = comm.shard_link(s)  # stride 8: one member per node -> one NIC
    assert dp.link == comm.INTER and dp.members_per_domain == 1
    assert dp.busbw_bytes_per_s == pytest.approx(gpu.inter_node_bandwidth_bytes_per_s * eff["inter_node"])
    s1 = setup_for(p, layout_factory(p, tp=1, dp_shard=64, zero_stage=1))
    wide = comm.shard_link(s1)  # 8 members per node drive 8 NICs (one NCCL ring per NIC)
    assert wide.members_per_domain == 8
    assert wide.busbw_bytes_per_s == pytest.approx(min(gpu.intra_node_bandwidth_bytes_per_s * eff["intra_node"],
                                                       8 * gpu.inter_node_bandwidth_bytes_per_s * eff["inter_node"]))


def test_nvl72_domain_spans_nodes_of_four(problem_factory, layout_factory):
    p = problem_factory("mixtral-8x7b", gpu="gb200", num_gpus=64, gbs=64)
    s = setup_for(p, layout_factory(p, ep=8, dp_shard=64, zero_stage=1))
    assert s.layout.gpus_per_node == 4 and comm.ep_link(s).link == comm.INTRA  # 8 GPUs in one 72-GPU NVLink domain


def test_tp_volume_same_with_sequence_parallel(problem_factory, layout_factory):
    """Korthikanti et al. 2022 sec. 4.2.2: all-gather + reduce-scatter move what one all-reduce moves."""
    p = problem_factory("llama3-8b")
    a = comm.tp_comm_time_per_layer_s(setup_for(p, layout_factory(p, tp=8)))
    b = comm.tp_comm_time_per_layer_s(setup_for(p, layout_factory(p, tp=8, sequence_parallel=True)))
    assert a == b and a[0] > 0


def test_expected_remote_domains():
    assert comm.expected_remote_domains_per_token(8, 8, 8) == 0  # everything inside one node
    assert comm.expected_remote_domains_per_token(8, 64, 8) == pytest.approx(7 * (1 - (7 / 8) ** 8))
    assert comm.expected_remote_domains_per_token(1, 64, 8) == pytest.approx(7 / 8)


def _dp_bytes(est):
    return sum(c.bytes_per_gpu_per_step for c in est.comm if c.group == "dp")


def test_gradient_accumulation_same_gradient_one_kth_of_the_communication(problem_factory, layout_factory):
    """Seed exercise 3: accumulating K micro-batches and reducing once moves 1/K of the bytes of reducing
    after every micro-batch, for the same global batch (ZeRO-1 reduces once per step, ZeRO-2 every micro-batch)."""
    p = problem_factory("llama3-8b", num_gpus=8, gbs=64)
    k = 8
    once = evaluate(p, layout_factory(p, dp_shard=8, zero_stage=1, grad_accum=k, recompute="full"))
    every = evaluate(p, layout_factory(p, dp_shard=8, zero_stage=2, grad_accum=k, recompute="full"))
    grads_once = sum(c.bytes_per_gpu_per_step for c in once.comm if "grad" in c.name)
    grads_every = sum(c.bytes_per_gpu_per_step for c in every.comm if "grad" in c.name)
    assert grads_every == pytest.approx(k * grads_once)
    # and the bytes per step do not depend on K when reducing once
    once_k1 = evaluate(p, layout_factory(p, dp_shard=8, zero_stage=1, micro_batch=8, grad_accum=1, recompute="full"),
                       check_memory=False)
    assert _dp_bytes(once_k1) == pytest.approx(_dp_bytes(once))
    assert once.tokens_per_step == once_k1.tokens_per_step


def test_gradient_accumulation_gives_the_same_gradient():
    """The numerical half of seed exercise 3: K accumulated micro-batch gradients equal the full-batch one."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    x, y = torch.randn(32, 16), torch.randn(32, 4)
    torch.nn.functional.mse_loss(model(x), y).backward()
    full = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for xb, yb in zip(x.chunk(4), y.chunk(4)):
        (torch.nn.functional.mse_loss(model(xb), yb) / 4).backward()
    for a, b in zip(full, (p.grad for p in model.parameters())):
        assert torch.allclose(a, b, atol=1e-6)


def test_zero3_gathers_parameters_every_microbatch(problem_factory, layout_factory):
    p = problem_factory("llama3-8b", num_gpus=8, gbs=64)
    est = evaluate(p, layout_factory(p, dp_shard=8, zero_stage=3, grad_accum=8, recompute="full"))
    names = {c.name: c for c in est.comm}
    fwd = names["dense_param_all_gather_fwd"]
    assert fwd.bytes_per_gpu_per_step == pytest.approx(8 * 2 * p.params.total)  # K x bf16 weights
