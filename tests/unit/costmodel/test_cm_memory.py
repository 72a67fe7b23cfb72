"""Memory line items: model states under ZeRO (Rajbhandari et al. 2020), placement, offload, rejections."""
from __future__ import annotations

import pytest

from compiler.calibration.frameworks import published_profile
from compiler.costmodel.evaluation import evaluate
from compiler.costmodel.memory import zero_model_state_bytes_per_gpu
from compiler.estimate import Estimate, Rejection

STATES = ("weights", "gradients", "master_weights", "optimizer_states")


def states(est: Estimate) -> float:
    return sum(est.memory.item(n).value for n in STATES)


# Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
# sec. 5 / Figure 1: 7.5B parameters, Nd = 64, mixed-precision Adam (K = 12): 120 GB per device
# unsharded, 31.4 GB with P_os, 16.6 GB with P_os+g, 1.9 GB with P_os+g+p (1e9-byte GB).
@pytest.mark.parametrize("stage,expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_worked_example(stage, expected_gb):
    got = zero_model_state_bytes_per_gpu(7.5e9, zero_stage=stage, num_shards=64) / 1e9
    assert round(got, 1) == expected_gb


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_evaluate_model_states_follow_the_zero_paper(problem_factory, layout_factory, stage):
    """The same 2 + 2 + 12 bytes/param split over dp_shard = 64 through the full evaluate() path
    (Megatron GPT 7.5B of Narayanan et al. 2021, 64 GPUs, tp = pp = 1), costed for DeepSpeed with its bf16-mode
    defaults (published runs), whose ZeRO keeps exactly the paper's states (fp32 gradients add 2 B: the next test)."""
    p = problem_factory("megatron-gpt-7.5b", gpu="a100-80gb", num_gpus=64, seq=2048, gbs=64)
    lay = layout_factory(p, dp_replicate=64 if stage == 0 else 1, dp_shard=1 if stage == 0 else 64,
                         zero_stage=stage, recompute="full")
    est = evaluate(p, lay, check_memory=False, target=published_profile("deepspeed_defaults"))
    assert isinstance(est, Estimate)
    expected = zero_model_state_bytes_per_gpu(p.params.total, zero_stage=stage, num_shards=64)
    assert states(est) == pytest.approx(expected, rel=1e-9)


def test_megatron_keeps_fp32_main_grads(problem_factory, layout_factory):
    """Megatron with --bf16 accumulates and reduces gradients in fp32 (megatron/training/arguments.py, the
    default dtc's renderer keeps): 4 B per gradient; DeepSpeed's bf16-mode default gradients are 2 B; the wire
    follows. dtc's own DeepSpeed config asks for fp32 accumulation and reduction: 4 B, like Megatron."""
    p = problem_factory("megatron-gpt-7.5b", gpu="a100-80gb", num_gpus=64, seq=2048, gbs=64)
    lay = layout_factory(p, dp_shard=64, zero_stage=1, recompute="full")
    mg = evaluate(p, lay, check_memory=False, target="megatron")
    ds = evaluate(p, lay, check_memory=False, target=published_profile("deepspeed_defaults"))
    dtc_ds = evaluate(p, lay, check_memory=False, target="deepspeed")
    assert mg.memory.item("gradients").value == pytest.approx(2 * ds.memory.item("gradients").value)
    assert dtc_ds.memory.item("gradients").value == pytest.approx(mg.memory.item("gradients").value)
    grad_bytes = {e: sum(c.bytes_per_gpu_per_step for c in est.comm if "grad" in c.name) for e, est in (("mg", mg), ("ds", ds))}
    assert grad_bytes["mg"] == pytest.approx(2 * grad_bytes["ds"])


def test_fp32_recipe_has_no_master_copy(problem_factory, layout_factory):
    p = problem_factory("llama3-8b", precision="fp32")
    est = evaluate(p, layout_factory(p, dp_shard=8, zero_stage=1, recompute="full"), check_memory=False)
    assert est.memory.item("master_weights").value == 0
    assert est.memory.item("weights").value == 4 * p.params.total


def test_hsdp_shards_only_over_dp_shard(problem_factory, layout_factory):
    """dp_replicate x dp_shard = 8: HSDP with shard 4 keeps twice the states of FULL_SHARD over 8."""
    p = problem_factory("llama3-8b")
    full = evaluate(p, layout_factory(p, dp_shard=8, zero_stage=3, recompute="full"), check_memory=False)
    hsdp = evaluate(p, layout_factory(p, dp_replicate=2, dp_shard=4, zero_stage=3, recompute="full"),
                    check_memory=False)
    assert states(hsdp) == pytest.approx(2 * states(full), rel=1e-9)


def test_context_parallel_joins_the_shard_group(problem_factory, layout_factory):
    """Megatron shards the distributed optimizer over dp x cp: cp=2, dp=4 shards like dp=8."""
    p = problem_factory("llama3-8b", seq=8192, gbs=32)
    cp2 = evaluate(p, layout_factory(p, cp=2, dp_shard=4, zero_stage=1), check_memory=False)
    dp8 = evaluate(p, layout_factory(p, dp_shard=8, zero_stage=1), check_memory=False)
    assert cp2.memory.item("optimizer_states").value == pytest.approx(dp8.memory.item("optimizer_states").value)


def test_experts_split_by_ep_and_sharded_over_dp_cp_over_ep(problem_factory, layout_factory):
    p = problem_factory("mixtral-8x7b", num_gpus=8, gbs=64)
    e1 = evaluate(p, layout_factory(p, dp_shard=8, zero_stage=1, recompute="full"), check_memory=False)
    e8 = evaluate(p, layout_factory(p, ep=8, dp_shard=8, zero_stage=1, recompute="full"), check_memory=False)
    pc = p.params
    expert = pc.expert_total
    # weights: the expert part shrinks 8x with ep=8
    assert e1.memory.item("weights").value - e8.memory.item("weights").value == pytest.approx(2 * expert * 7 / 8)
    # optimizer: experts are sharded over dp x cp / ep = 1 when ep = 8 (Megatron expert-data-parallel group)
    assert e8.memory.item("optimizer_states").value == pytest.approx(8 * ((pc.total - expert) / 8 + expert / 8))


def test_embedding_on_first_stage_output_on_last(problem_factory, layout_factory):
    from compiler.costmodel.context import make_setup
    from compiler.costmodel.memory import stage_memory_items

    p = problem_factory("llama3-8b", gbs=64)
    lay = layout_factory(p, pp=4, dp_replicate=2, zero_stage=0, grad_accum=32)
    setup = make_setup(p, lay, p.gpu_options[0])
    first, last = (dict((i.name, i.value) for i in stage_memory_items(setup, setup.stages[s])) for s in (0, 3))
    assert "logits_loss" in last and "logits_loss" not in first
    vocab_h = p.shape.vocab_size * p.shape.hidden_size
    layer = (p.params.per_dense_layer) * 8
    assert first["weights"] == pytest.approx(2 * (layer + vocab_h))
    assert last["weights"] == pytest.approx(2 * (layer + vocab_h + p.params.final_norm))


def test_offloading_the_optimizer_moves_states_to_host(problem_factory, layout_factory):
    p = problem_factory("llama3-8b")
    base = layout_factory(p, dp_shard=8, zero_stage=2, recompute="full")
    on_gpu = evaluate(p, base, check_memory=False)
    off = evaluate(p, base.with_(offload_optimizer="cpu"), check_memory=False)
    assert off.memory.item("optimizer_states").value == 0 and off.memory.item("master_weights").value == 0
    moved = on_gpu.memory.item("optimizer_states").value + on_gpu.memory.item("master_weights").value
    assert off.memory.cpu_bytes_per_node == pytest.approx(moved * 8, rel=1e-6)


def test_allowances_and_transients_are_line_items(problem_factory, layout_factory):
    p = problem_factory("llama3-8b")
    est = evaluate(p, layout_factory(p, dp_shard=8, zero_stage=3, recompute="selective"))
    names = {i.name for i in est.memory.items}
    assert {"cuda_context", "nccl_buffers", "fragmentation", "zero3_gathered_params", "logits_loss"} <= names
    assert est.memory.total_bytes_per_gpu == int(sum(i.value for i in est.memory.items))
    assert all(i.formula and i.source for i in est.memory.items)
    assert est.memory.usable_bytes_per_gpu == int(p.gpu_options[0].spec.hbm_bytes * (1 - p.memory_headroom))


def test_out_of_memory_is_a_rejection_with_numbers_and_a_fix(problem_factory, layout_factory):
    p = problem_factory("llama3-70b", num_gpus=8, gbs=64)
    rej = evaluate(p, layout_factory(p, dp_replicate=8))
    assert isinstance(rej, Rejection) and rej.code == "out_of_memory"
    assert rej.details["needed_bytes"] > rej.details["usable_bytes"]
    assert set(STATES) <= set(rej.details["items"])
    assert rej.fix.startswith("needs ") and "ZeRO-3" in rej.fix and "recompute" in rej.fix


@pytest.mark.parametrize("kw,code", [
    (dict(tp=3), "tp_not_divisor"),
    (dict(pp=35), "pp_split_invalid"),  # 32 layers + embedding + loss fill at most 34 stages
    (dict(pp=2, vpp=2, schedule="interleaved_1f1b", grad_accum=3), "microbatches_not_divisible"),
])
def test_structural_rejections(problem_factory, layout_factory, kw, code):
    p = problem_factory("llama3-8b", num_gpus=8, gbs=64)
    tp, pp = kw.get("tp", 1), kw.get("pp", 1)
    lay = layout_factory(p, dp_replicate=max(1, 8 // (tp * pp)) if 8 % (tp * pp) == 0 else 1, **kw)
    rej = evaluate(p, lay)
    assert isinstance(rej, Rejection) and rej.code == code


def test_uneven_stages_are_modelled(problem_factory, layout_factory):
    from compiler.split import PipelineSplit

    p = problem_factory("llama3-8b", num_gpus=8, gbs=64)
    lay = layout_factory(p, pp=5, grad_accum=64)
    est = evaluate(p, lay)  # 32 layers on 5 stages: Megatron's most balanced split (compiler.split)
    assert isinstance(est, Estimate)
    assert evaluate(p, lay.with_(split=PipelineSplit("even"))).code == "pp_split_invalid"


def test_unknown_gpu_is_rejected(problem_factory, layout_factory):
    p = problem_factory("llama3-8b")
    lay = layout_factory(p).with_(gpu="b200")
    assert evaluate(p, lay).code == "gpu_not_offered"


def test_fp8_on_ampere_is_rejected(problem_factory, layout_factory):
    from compiler.errors import SpecError

    with pytest.raises(SpecError) as exc:  # no GPU of the spec can train in fp8: the spec is wrong
        problem_factory("llama3-8b", gpu="a100-80gb", precision="fp8", extra="targets: [megatron]\n")
    assert [d.code for d in exc.value.diagnostics] == ["precision_unsupported"]
    p = problem_factory("llama3-8b", gpu="[h100-sxm, a100-80gb]", precision="fp8", extra="targets: [megatron]\n")
    lay = layout_factory(p, dp_replicate=8).with_(gpu="a100-80gb")
    assert evaluate(p, lay).code == "precision_unsupported"


def test_nvfp4_memory_lines(problem_factory, layout_factory):
    """nvfp4 (Transformer Engine NVFP4BlockScaling): each GEMM input saved as its transposed FP4 copy, 0.5625 B per
    element against fp8's 1 B; under the distributed optimizer the weights are NVFP4 tensors (--fp4-param-gather:
    row- and column-wise, 1.125 B per parameter) and no separate quantised weight cache is kept; under DDP the bf16
    weights stay and TE caches their NVFP4 copy and transpose (1.125 B)."""
    kw = dict(gpu="gb300", extra="targets: [megatron]\n")
    fp8, fp4 = problem_factory("llama3-8b", precision="fp8", **kw), problem_factory("llama3-8b", precision="nvfp4", **kw)
    distopt = dict(tp=2, dp_shard=4, zero_stage=1)
    e8, e4 = evaluate(fp8, layout_factory(fp8, **distopt)), evaluate(fp4, layout_factory(fp4, **distopt))
    assert isinstance(e8, Estimate) and isinstance(e4, Estimate)
    assert e4.memory.item("activations").value < e8.memory.item("activations").value
    assert e4.memory.item("weights").value == pytest.approx(e8.memory.item("weights").value * 1.125 / 2)
    assert e4.memory.item("weights").formula.startswith("1.125 B x")
    assert "fp4_weight_cache" not in {i.name for i in e4.memory.items}
    assert e8.memory.item("fp8_weight_cache").value > 0
    ddp = evaluate(fp4, layout_factory(fp4, dp_replicate=8))
    assert isinstance(ddp, Estimate)
    assert ddp.memory.item("weights").formula.startswith("2 B x")
    assert ddp.memory.item("fp4_weight_cache").formula.startswith("1.125 B (fp4 weight + transpose)")
    from compiler.costmodel.context import make_setup
    from compiler.costmodel.step import precision_assumption

    said = precision_assumption(make_setup(fp4, layout_factory(fp4, **distopt), fp4.gpu_options[0]))
    assert said.startswith("Mixed precision keeps 1.125 B NVFP4 weights")
    assert "--fp4-param-gather" in e4.memory.item("weights").source


def test_nvfp4_needs_fp4_tensor_cores(problem_factory):
    from compiler.errors import SpecError

    with pytest.raises(SpecError) as exc:
        problem_factory("llama3-8b", gpu="h100-sxm", precision="nvfp4", extra="targets: [megatron]\n")
    (d,) = exc.value.diagnostics
    assert d.code == "precision_unsupported" and "gb300" in d.hint and "no fp4 tensor cores" in d.summary


def test_the_loss_memory_follows_the_cross_entropy_kernel(problem_factory, layout_factory):
    """The loss keeps some bytes per logit from its forward to its backward (logits_loss) and needs more beside
    them while it runs (loss_transient), by kernel (activations.LOSS_MEMORY): Transformer Engine's fused cross
    entropy (Megatron-Bridge's recipes) keeps only the bf16 logits, into which it writes their gradient, and
    flash-attn's writes a bf16 gradient beside them (2 + 2 bytes); Megatron-Core's jit-fused loss (dtc's Megatron
    target) keeps an fp32 softmax and peaks at 10; PyTorch's F.cross_entropy on fp32 logits (dtc's FSDP2 trainer)
    keeps an fp32 log-softmax and peaks at 12 (benchmarks/loss_memory.py measures the last two)."""
    from dataclasses import replace

    from compiler.calibration.frameworks import published_profile
    from compiler.targets import registry

    p = problem_factory("llama3-8b")
    lay = layout_factory(p, tp=2, dp_shard=4, zero_stage=1, recompute="full")
    logits = lay.micro_batch * p.seq_len * p.shape.vocab_size / lay.tp
    # (vocabulary shards of the loss: Megatron's is vocab-parallel; the FSDP2 trainer gathers the logits whole,
    # its output layer being ColwiseParallel with output_layouts=Replicate)
    expected = {"megatron": (registry.get("megatron").cost, 4, 6, 1), "bridge": (published_profile("megatron_bridge"), 2,
                                                                                2, 1),
                "fsdp": (registry.get("fsdp").cost, 4, 8, lay.tp)}
    items = {}
    for name, (profile, kept, transient, whole) in expected.items():
        est = evaluate(p, lay, target=profile, check_memory=False)
        items[name] = {i.name: i for i in est.memory.items}
        assert items[name]["logits_loss"].value == pytest.approx(kept * logits * whole), name
        assert items[name]["loss_transient"].value == pytest.approx(transient * logits * whole), name
    assert "2 B (logits kept for the loss gradient)" in items["bridge"]["logits_loss"].formula
    assert "Transformer Engine" in items["bridge"]["logits_loss"].source
    assert "F.cross_entropy" in items["fsdp"]["loss_transient"].source
    # under fp32 training the logits are 4 bytes: the fused kernel's kept logits and gradient are too
    fp32 = evaluate(replace(p, precision="fp32"), lay, target=published_profile("megatron_bridge"), check_memory=False)
    assert fp32.memory.item("logits_loss").value + fp32.memory.item("loss_transient").value \
        == pytest.approx(8 * logits)


def test_the_rematerialised_layer_and_the_loss_are_never_live_together(problem_factory, layout_factory):
    """A backward reaches a layer only after its micro-batch's loss backward has consumed the kept loss bytes and
    freed the loss's transient buffers, and after the output layer's backward has consumed the saved inputs of the
    final norm and the output projection: the last stage peaks at max(transient, working set - those freed bytes)
    above the kept bytes, not at their sum (memory.backward_peaks). The line items add up to that peak; the first
    three of them to what autograd saves at its peak (what dtc smoke measures)."""
    from compiler.costmodel.memory import output_layer_activation_bytes, recompute_working_set_bytes
    from compiler.costmodel.parts import setup_for

    p = problem_factory("llama2-7b", seq=4096, gbs=64, num_gpus=8, targets="[fsdp]")
    lay = layout_factory(p, dp_shard=8, zero_stage=3, recompute="full")
    est = evaluate(p, lay, target="fsdp", check_memory=False)
    items = {i.name: i.value for i in est.memory.items}
    setup = setup_for(p, lay, p.gpu_options[0], target="fsdp")
    working = recompute_working_set_bytes(setup, setup.stages[-1])
    head = output_layer_activation_bytes(setup)
    logits = lay.micro_batch * p.seq_len * p.shape.vocab_size / lay.tp
    kept, transient = 4 * logits, 8 * logits  # F.cross_entropy on fp32 logits: 4 B kept, 8 B more at its peak
    assert 0 < head < kept < working - head < kept + transient  # the case where both lines change
    assert items["logits_loss"] == pytest.approx(kept)
    assert items["recompute_working_set"] == pytest.approx(working - kept - head)
    assert items["loss_transient"] == pytest.approx(transient - (working - kept - head))
    beyond_kept = items["recompute_working_set"] + items["loss_transient"]
    assert beyond_kept == pytest.approx(max(transient, working - kept - head)) and beyond_kept < working + transient
