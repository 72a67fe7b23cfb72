"""The Estimate: time line items, rates, utilisation, time to train, cost; the seed's exercises."""
from __future__ import annotations

import math
import time

import pytest

from compiler.calibration.frameworks import published_profile
from compiler.costmodel.evaluation import evaluate
from compiler.costmodel.compute import attention_core_flops_per_token_forward, gemm_params_per_token, \
    model_flops_per_token
from compiler.costmodel.context import make_setup
from compiler.costmodel.memory import stage_memory_items
from compiler.estimate import Estimate


def test_outputs_are_filled_and_consistent(problem_factory, layout_factory):
    p = problem_factory("llama3-8b", num_gpus=16, gbs=128, tokens="100B")
    lay = layout_factory(p, tp=2, pp=2, dp_shard=4, zero_stage=1, sequence_parallel=True, recompute="selective")
    e = evaluate(p, lay)
    assert isinstance(e, Estimate)
    assert e.time.step_time_s == pytest.approx(sum(i.value for i in e.time.items)) == e.step_time_s
    assert all(i.value >= 0 and i.formula and i.source for i in e.time.items)
    assert e.tokens_per_step == 128 * 4096
    assert e.tokens_per_s == pytest.approx(e.tokens_per_step / e.step_time_s)
    assert e.tokens_per_s_per_gpu == pytest.approx(e.tokens_per_s / 16)
    peak = p.gpu_options[0].spec.peak_flops["bf16"]
    assert e.mfu == pytest.approx(e.model_flops_per_step / (e.step_time_s * 16 * peak))
    assert e.hfu > e.mfu  # selective recompute adds the attention forward
    assert e.model_tflops_per_gpu == pytest.approx(e.model_flops_per_step / e.step_time_s / 16 / 1e12)
    assert e.num_steps == math.ceil(100e9 / e.tokens_per_step)
    assert e.time_to_train_s == pytest.approx(e.num_steps * e.step_time_s)
    assert e.gpu_hours == pytest.approx(16 * e.time_to_train_s / 3600)
    assert e.cost_usd == pytest.approx(e.gpu_hours * p.gpu_options[0].price_per_gpu_hour_usd)
    assert e.num_gpus == 16 and e.assumptions and e.pipeline
    assert 0 < e.pipeline_bubble_fraction < 1


def test_flop_convention_is_6n_plus_causal_attention(problem_factory):
    """6 x GEMM params (logits included, embeddings and norms excluded) + 6 l h s for the attention core:
    half of the non-causal 12 l h s (the Megatron-Bridge 25.09+ causal convention, calibration/README.md)."""
    p = problem_factory("llama3-8b")
    s, pc, shape = p.seq_len, p.params, p.shape
    gemm = pc.total - pc.embedding - pc.norms_per_layer * shape.num_layers - pc.final_norm
    assert gemm_params_per_token(shape, pc) == gemm
    assert attention_core_flops_per_token_forward(shape, s) == shape.num_layers * 2 * 32 * 256 * s / 2
    assert model_flops_per_token(shape, pc, s) == 6 * gemm + 6 * shape.num_layers * 4096 * s


def test_moe_counts_active_parameters(problem_factory):
    p = problem_factory("mixtral-8x7b")
    pc = p.params
    assert gemm_params_per_token(p.shape, pc) < pc.total / 2  # 2 of 8 experts per token
    assert gemm_params_per_token(p.shape, pc) == pytest.approx(pc.active - pc.embedding - pc.final_norm
                                                               - pc.norms_per_layer * p.shape.num_layers)


def test_activation_checkpointing_trades_memory_for_compute(problem_factory, layout_factory):
    """Seed exercise 1: full recompute keeps one input per layer and replays the forward, about a third
    more compute (8N vs 6N per token for the GEMMs)."""
    p = problem_factory("llama3-8b", num_gpus=8, gbs=64)
    none = evaluate(p, layout_factory(p, dp_shard=8, zero_stage=1), check_memory=False)
    full = evaluate(p, layout_factory(p, dp_shard=8, zero_stage=1, recompute="full"), check_memory=False)
    assert full.memory.item("activations").value < none.memory.item("activations").value / 10
    assert full.hardware_flops_per_step / none.hardware_flops_per_step == pytest.approx(4 / 3, rel=0.03)
    assert 1.2 < full.step_time_s / none.step_time_s < 1.45
    assert full.model_flops_per_step == none.model_flops_per_step  # the model FLOPs do not change


def test_1f1b_and_gpipe_same_bubble_less_memory(problem_factory, layout_factory):
    """Seed exercise 2: the same bubble, but 1F1B holds pp micro-batches instead of all of them."""
    p = problem_factory("llama3-8b", num_gpus=8, gbs=64)
    base = layout_factory(p, pp=4, dp_replicate=2, grad_accum=8, recompute="full")
    one = evaluate(p, base, check_memory=False)
    gp = evaluate(p, base.with_(schedule="gpipe"), check_memory=False)
    assert one.pipeline_bubble_fraction == pytest.approx(gp.pipeline_bubble_fraction, rel=0.05)
    assert one.pipeline_bubble_fraction == pytest.approx(3 / 11, rel=0.1)
    first = {}
    for lay in (base, base.with_(schedule="gpipe")):  # the first stage holds the most micro-batches
        setup = make_setup(p, lay, p.gpu_options[0])
        first[lay.schedule] = next(i.value for i in stage_memory_items(setup, setup.stages[0]) if i.name == "activations")
    assert first["gpipe"] == pytest.approx(2 * first["1f1b"])  # m = 8 vs pp = 4 in flight


def test_zero_offload_fits_70b_on_4_gpus_at_the_price_of_a_slower_step(problem_factory, layout_factory):
    """Seed exercise 5 (ZeRO-Offload, Ren et al. 2021): offloading the optimizer states of a 70B model lets
    4 x 80 GB GPUs hold it, where keeping them on the GPUs needs more GPUs; the CPU optimizer step costs time."""
    p = problem_factory("llama3-70b", gpu="a100-80gb", num_gpus=4, seq=2048, gbs=8)
    on = layout_factory(p, dp_shard=4, zero_stage=3, recompute="full")
    paper = published_profile("deepspeed_defaults")  # the paper's DeepSpeed: 16-bit gradients
    assert evaluate(p, on, target=paper).code == "out_of_memory"
    off = evaluate(p, on.with_(offload_optimizer="cpu", offload_params="cpu"), target=paper)
    assert isinstance(off, Estimate)
    assert off.memory.cpu_bytes_per_node > 70e9 * 12
    assert off.time.item("offload").value > 0
    gpu_opt = evaluate(p, on, check_memory=False, target="deepspeed")
    assert off.step_time_s > gpu_opt.step_time_s


def test_cost_estimator_scales_with_tokens_and_price(problem_factory, layout_factory):
    """Seed exercise 4: dollars = GPU-hours x price; twice the tokens, twice the cost."""
    a = problem_factory("llama3-8b", tokens="100B")
    b = problem_factory("llama3-8b", tokens="200B", extra="")
    la = layout_factory(a, dp_shard=8, zero_stage=1, recompute="selective")
    ea, eb = evaluate(a, la, check_memory=False), evaluate(b, la, check_memory=False)
    assert eb.cost_usd == pytest.approx(2 * ea.cost_usd, rel=1e-3)


def test_moe_expert_parallel_adds_all_to_all(problem_factory, layout_factory):
    p = problem_factory("mixtral-8x7b", num_gpus=8, gbs=64)
    e = evaluate(p, layout_factory(p, ep=8, dp_shard=8, zero_stage=1, recompute="full"), check_memory=False)
    assert e.time.item("ep_comm").value > 0
    assert any(c.name == "ep_all_to_all" and c.link == "intra_node" for c in e.comm)


def test_evaluate_is_fast(problem_factory, layout_factory):
    """The solver calls evaluate thousands of times: well under a few ms per call without events."""
    p = problem_factory("llama3-70b", num_gpus=64, gbs=512)
    lay = layout_factory(p, tp=8, pp=4, vpp=5, schedule="interleaved_1f1b", dp_shard=2, zero_stage=1,
                         sequence_parallel=True, recompute="selective")
    evaluate(p, lay, pipeline_events=False)
    start = time.perf_counter()
    for _ in range(50):
        evaluate(p, lay, pipeline_events=False)
    assert (time.perf_counter() - start) / 50 < 0.02


def test_a_layout_is_costed_for_its_target_and_defaults_to_the_first(problem_factory, layout_factory):
    """evaluate() costs for the problem's first framework target unless told; the targets differ where their
    framework facts differ (eager kernels, no TP overlap, gradient dtype)."""
    p = problem_factory("llama3-8b", num_gpus=8, gbs=64, tokens="100B", targets="[fsdp, megatron, slurm]")
    lay = layout_factory(p, tp=2, dp_shard=4, zero_stage=3, recompute="full")
    default, fsdp, mg = evaluate(p, lay), evaluate(p, lay, target="fsdp"), evaluate(p, lay, target="megatron")
    assert default.step_time_s == fsdp.step_time_s
    assert fsdp.step_time_s > mg.step_time_s  # eager elementwise kernels, FA2, TP collectives on the critical path
    assert "PyTorch FSDP2" in " ".join(i.source for i in fsdp.time.items)


def test_evaluate_targets_binds_to_the_slowest_or_the_rejecting_target(problem_factory, layout_factory):
    from compiler.costmodel.evaluation import evaluate_targets

    p = problem_factory("llama3-8b", num_gpus=8, gbs=64, tokens="100B", targets="[megatron, fsdp, slurm]")
    lay = layout_factory(p, tp=2, dp_shard=4, zero_stage=3, recompute="full")
    both = evaluate_targets(p, lay)
    assert [t for t, _ in both.by_target] == ["megatron", "fsdp"]
    assert both.binding == "fsdp" and both.result.step_time_s == evaluate(p, lay, target="fsdp").step_time_s
    # 70B on 8 GPUs without sharding: no target fits, the first rejection binds
    big = problem_factory("llama3-70b", num_gpus=8, gbs=64, tokens="100B", targets="[megatron, fsdp]")
    rej = evaluate_targets(big, layout_factory(big, dp_replicate=8))
    assert rej.binding == "megatron" and rej.result.code == "out_of_memory"


def test_evaluate_targets_binds_to_the_slowest_at_the_specs_confidence(problem_factory, layout_factory, monkeypatch):
    """The objective ranks by the step time at budget.confidence (times the band's factor): the binding target is
    the slowest by that key, so a layout is not ranked by a target a hair slower on the point estimate whose band is
    narrower than another target's."""
    from dataclasses import replace

    import compiler.costmodel.evaluation as ev

    p = problem_factory("llama3-8b", num_gpus=8, gbs=64, tokens="100B", targets="[megatron, fsdp, slurm]")
    lay = layout_factory(p, tp=2, dp_shard=4, zero_stage=3, recompute="full")
    mg, fsdp = evaluate(p, lay, target="megatron"), evaluate(p, lay, target="fsdp")
    assert fsdp.step_time_s > mg.step_time_s and mg.band is not None and fsdp.band is not None
    ratio = 2 * fsdp.step_time_s * fsdp.band.high / mg.step_time_s
    wide_mg = replace(mg, band=replace(mg.band, p80=ratio, high=ratio))
    real = ev.evaluate
    monkeypatch.setattr(ev, "evaluate", lambda problem, layout, target=None, **kw: wide_mg if target == "megatron"
                        else real(problem, layout, target=target, **kw))
    assert ev.evaluate_targets(p, lay).binding == "megatron"
    assert ev.evaluate_targets(replace(p, confidence="p90"), lay).binding == "megatron"
    assert ev.evaluate_targets(replace(p, confidence="expected"), lay).binding == "fsdp"


def test_blocking_zero3_per_weight_gathers_are_all_exposed(problem_factory, layout_factory):
    """A profile whose ZeRO-3 fetches block (DeepSpeed 2021) shows every gather and reduce-scatter in the step; one
    collective per weight matrix adds ring latencies; full recompute fetches the parameters a third time."""
    from dataclasses import replace

    from compiler.costmodel import comm
    from compiler.costmodel.stages import stage_params

    base = published_profile("deepspeed_defaults")
    blocking = replace(base, name="blocking", zero3_gathers_per_layer=4, zero3_blocking=True)
    p = problem_factory("llama3-8b", gpu="a100-80gb", num_gpus=64, gbs=64, tokens="100B")
    lay = layout_factory(p, dp_shard=64, zero_stage=3, gpus_per_node=8)

    def item(est, name):
        return sum(i.value for i in est.time.items if i.name == name)

    overlapped, blocked = evaluate(p, lay, target=base), evaluate(p, lay, target=blocking)
    assert item(blocked, "zero_per_microbatch_comm") > item(overlapped, "zero_per_microbatch_comm")
    setup = make_setup(p, lay, p.gpu_options[0], target=blocking)
    sl = setup.stages[0]
    sp = stage_params(setup.shape, setup.params, sl, tp=1, ep=1, pp=1)
    coll = comm.dp_collectives(setup, sp, units=sl.layers + 1)
    per_mb = sum(c.time_per_call_s for c in coll if c.phase in ("forward", "backward"))
    assert item(blocked, "zero_per_microbatch_comm") == pytest.approx(lay.grad_accum * per_mb)
    one = comm.dp_collectives(make_setup(p, lay, p.gpu_options[0], target=replace(blocking, zero3_gathers_per_layer=1)), sp,
                              units=sl.layers + 1)
    gather = next(c for c in coll if c.name == "dense_param_all_gather_fwd")
    gather1 = next(c for c in one if c.name == "dense_param_all_gather_fwd")
    link = comm.shard_link(setup)
    assert gather.time_per_call_s - gather1.time_per_call_s == pytest.approx(3 * (sl.layers + 1) * 63 * link.latency_s)
    rec = comm.dp_collectives(make_setup(p, layout_factory(p, dp_shard=64, zero_stage=3, gpus_per_node=8,
                                                           recompute="full"), p.gpu_options[0], target=blocking), sp,
                              units=sl.layers + 1)
    assert [c.name for c in rec if "gather" in c.name] == [
        "dense_param_all_gather_fwd", "dense_param_all_gather_bwd", "dense_param_all_gather_recompute"]


def test_eager_elementwise_time_counts_the_eager_extra_tensors_once(problem_factory, layout_factory):
    """An eager block keeps more tensors (fp32 RMSNorm copies, silu(gate)) than its fused counterpart; its
    elementwise time scales the fused block's saved bytes by the eager/fused traffic ratio, which already holds
    those extra passes, while its memory keeps the eager bytes."""
    from compiler.costmodel import compute
    from compiler.costmodel.memory import activation_bytes_per_layer_kind, fused_activation_bytes_per_layer

    p = problem_factory("llama3-8b", num_gpus=8, gbs=64, tokens="100B", targets="[fsdp]")
    setup = make_setup(p, layout_factory(p, dp_shard=8, zero_stage=3), p.gpu_options[0], target="fsdp")
    eager = activation_bytes_per_layer_kind(setup, moe_layer=False, recompute="none")
    fused = fused_activation_bytes_per_layer(setup, moe_layer=False)
    assert eager > 1.2 * fused
    ratio = compute.elementwise_traffic_ratio(setup, False)
    assert ratio > 2
    assert compute.memory_bound_time_per_layer_s(setup, False) == pytest.approx(
        setup.eff.fit("memory_bound_traffic") * ratio * fused / setup.hbm_rate())


def test_a_gemm_benchmark_carries_by_the_parts_measured_gemm_rates():
    """physics.yaml gemm.measured_tflops: where a kernel benchmark measured both parts' best 16-bit GEMM, a rate
    measured on one carries to the other by their ratio, for every dtype (GB300 2174 over B300 1769: 1.23x, above
    both the power rule's 1.08x and the datasheet peaks' 1.11x), unless the dtype's own peak ratio is smaller still;
    a part without a figure falls back to the power rule."""

    from compiler.catalog import load_catalog
    from compiler.costmodel.compute import sustained_rate_ratio
    from compiler.costmodel.efficiency import load_efficiency

    gpus, measured = load_catalog().gpus, load_efficiency().physics.gemm_measured_tflops
    b300, gb300 = gpus["b300"], gpus["gb300"]
    assert measured["gb300"] == 2174 and measured["b300"] == 1769
    for dtype in ("bf16", "fp8", "fp4"):
        assert sustained_rate_ratio(gb300, b300, dtype, dvfs_exponent=1 / 3, measured=measured,
                                    headroom=1.78) == pytest.approx(2174 / 1769)
    assert sustained_rate_ratio(gpus["b200"], b300, "fp4", dvfs_exponent=1 / 3, measured=measured,
                                headroom=0.67 / 0.377) == pytest.approx(1745 / 1769)  # 9 PF x 1.78 headroom: not binding
    # a dtype whose tensor cores are relatively fewer on the part (no headroom): its peak ratio binds
    assert sustained_rate_ratio(gpus["b200"], b300, "fp4", dvfs_exponent=1 / 3, measured=measured) \
        == pytest.approx(1745 / 1769 * (9 / 13.5))
    # attention tables carry the same way (the Blackwell Ultra table was measured on a GB300)
    assert sustained_rate_ratio(b300, gb300, "bf16", dvfs_exponent=1 / 3, measured=measured) == pytest.approx(1769 / 2174)
    # a part without a measured figure: the power rule
    assert sustained_rate_ratio(gb300, b300, "bf16", dvfs_exponent=1 / 3,
                                measured={"b300": 1769}) == pytest.approx((1400 / 1100) ** (1 / 3))


def test_a_gemm_benchmark_carries_to_another_part_of_its_generation_by_board_power():
    """Without measured GEMM rates (physics.yaml power): the Blackwell fractions were measured on a B300 (1,100 W);
    a part of the same generation sustains that rate x (its TDP / 1,100 W)^(1/3), never more than its datasheet peak
    allows; a table borrowed across generations (or a part without a TDP) scales by the peak ratio."""
    from dataclasses import replace

    from compiler.catalog import load_catalog
    from compiler.costmodel.compute import sustained_rate_ratio

    gpus = load_catalog().gpus
    b300, e = gpus["b300"], 1 / 3
    assert sustained_rate_ratio(gpus["gb300"], b300, "fp8", dvfs_exponent=e) == pytest.approx((1400 / 1100) ** e)
    assert sustained_rate_ratio(gpus["gb200"], b300, "bf16", dvfs_exponent=e) == pytest.approx((1200 / 1100) ** e)
    assert sustained_rate_ratio(gpus["b200"], b300, "bf16", dvfs_exponent=e) == pytest.approx((1000 / 1100) ** e)
    # a 350 W PCIe H100 has fewer SMs and a lower boost clock: its peak ratio (0.76) binds, not its power (0.79)
    h100, pcie = gpus["h100-sxm"], gpus["h100-pcie"]
    assert sustained_rate_ratio(pcie, h100, "bf16", dvfs_exponent=e) == pytest.approx(756.5 / 989.4)
    # across generations (MI300X borrowing Hopper's tables) and without a TDP: the peak ratio
    assert sustained_rate_ratio(gpus["mi300x"], h100, "bf16", dvfs_exponent=e) == pytest.approx(1307.4 / 989.4, rel=1e-3)
    assert sustained_rate_ratio(replace(gpus["gb300"], tdp_w=0.0), b300, "bf16", dvfs_exponent=e) == pytest.approx(2.5 / 2.25)


def test_nvfp4_gemms_are_not_capped_by_a_smaller_fp4_peak(problem_factory, layout_factory):
    """NVFP4 runs at 0.377 of the B300's 13.5 PF FP4 peak, far below the 0.67 its tensor cores sustain in BF16: a
    GB200 (10 PF dense FP4) reaches the B300's NVFP4 rate x its power ratio, and it beats MXFP8 (TE GEMM profiling
    tutorial on B300: 3.764 against 7.161 ms per layer, pre-quantised)."""
    from compiler.catalog import load_catalog
    from compiler.costmodel.compute import gemm_rate
    from compiler.costmodel.context import make_setup

    b300 = load_catalog().gpus["b300"]
    rates = {}
    for gpu in ("gb200", "gb300", "b300"):
        for precision in ("fp8", "nvfp4"):
            p = problem_factory("llama3-8b", num_gpus=8, gbs=64, tokens="100B", gpu=gpu, precision=precision,
                                extra="targets: [megatron]\n")
            lay = layout_factory(p, dp_replicate=8)
            setup = make_setup(p, lay, p.gpu_options[0])
            dtype = setup.recipe.gemm_dtype
            rates[gpu, precision] = gemm_rate(setup, dtype) / setup.eff.fit("compute_scale")
    assert rates["b300", "nvfp4"] == pytest.approx(0.377 * b300.peak_flops_for("fp4"))
    assert rates["gb200", "nvfp4"] / rates["b300", "nvfp4"] == pytest.approx(1822 / 1769, rel=1e-3)  # measured GEMMs
    assert rates["b300", "nvfp4"] / rates["b300", "fp8"] == pytest.approx(0.377 * 13.5 / (0.595 * 4.5), rel=1e-3)
    for gpu in ("gb200", "gb300"):
        assert rates[gpu, "nvfp4"] > 1.7 * rates[gpu, "fp8"]


def test_gb300_gemms_outrun_gb200s_at_the_same_datasheet_peak(problem_factory, layout_factory):
    """GB200 and GB300 print the same dense 16-bit peak; measured, the GB300's best cuBLAS GEMM (2174 TFLOP/s at
    1,400 W) is 1.19x the GB200's (1822 at 1,200 W)."""
    from compiler.costmodel.compute import gemm_rate

    p = problem_factory("llama3-8b", num_gpus=8, gbs=64, tokens="100B")
    lay = layout_factory(p, dp_shard=8, zero_stage=1)
    rates = {}
    for name in ("gb200", "gb300", "b300"):
        gpu = replace_gpu(p.gpu_options[0], name)
        rates[name] = gemm_rate(make_setup(p, lay, gpu), "bf16")
    assert rates["gb300"] / rates["gb200"] == pytest.approx(2174 / 1822)
    assert rates["b300"] < rates["gb200"] < rates["gb300"]


def replace_gpu(option, name):
    from dataclasses import replace

    from compiler.catalog import load_catalog

    return replace(option, spec=load_catalog().gpus[name], power_limit_w=None)
