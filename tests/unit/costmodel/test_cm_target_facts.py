"""The cost facts of each framework (compiler/targets/<name>/cost.py, compiler/calibration/frameworks.py) change
exactly the line items they describe."""
from __future__ import annotations

import dataclasses

import pytest

from compiler.calibration.frameworks import published_profile
from compiler.costmodel.evaluation import evaluate
from compiler.estimate import Rejection
from compiler.costmodel import activations as act
from compiler.costmodel.compute import elementwise_traffic_ratio
from compiler.costmodel.context import make_setup
from compiler.model import ModelShape
from compiler.targets import registry


def _items(est):
    return {i.name: i.value for i in est.memory.items}


def _time(est):
    return {i.name: i.value for i in est.time.items}


def test_eager_elementwise_traffic_is_counted_from_the_block(problem_factory, layout_factory):
    """A Llama block (composite RMSNorm, RoPE, SwiGLU) moves ~3x the bytes eagerly; a block of one-kernel
    LayerNorm and GELU without RoPE (MPT) the same as fused kernels; fused frameworks 1x."""
    p = problem_factory("llama3-8b", num_gpus=8, gbs=64)
    lay = layout_factory(p, dp_shard=8, zero_stage=3)
    eager = make_setup(p, lay, p.gpu_options[0], target="fsdp")
    assert 2.5 < elementwise_traffic_ratio(eager, False) < 3.5
    assert elementwise_traffic_ratio(make_setup(p, lay, p.gpu_options[0], target="megatron"), False) == 1.0
    mpt = dataclasses.replace(p, shape=dataclasses.replace(p.shape, norm="layernorm", mlp="gelu", position="learned",
                                                           max_position_embeddings=0))
    assert elementwise_traffic_ratio(make_setup(mpt, lay, p.gpu_options[0], target="fsdp"), False) == 1.0


def test_fsdp_keeps_no_16bit_weights_at_rest_under_zero3_and_fp32_sharded_gradients(problem_factory,
                                                                                   layout_factory):
    p = problem_factory("llama3-8b", num_gpus=8, gbs=64, targets="[fsdp]")
    z3 = _items(evaluate(p, layout_factory(p, dp_shard=8, zero_stage=3), check_memory=False))
    z2 = _items(evaluate(p, layout_factory(p, dp_shard=8, zero_stage=2), check_memory=False))
    n = p.params.total
    assert z3["weights"] == 0  # the fp32 shard is the master; bf16 weights only while a unit is gathered
    assert z3["gradients"] == pytest.approx(4 * n / 8, rel=0.01)
    assert z3["master_weights"] + z3["gradients"] + z3["optimizer_states"] == pytest.approx(16 * n / 8, rel=0.01)
    assert z2["weights"] == pytest.approx(2 * n, rel=0.01)  # reshard_after_forward=False keeps them gathered
    ds = _items(evaluate(p, layout_factory(p, dp_shard=8, zero_stage=3), target="deepspeed", check_memory=False))
    assert ds["weights"] == pytest.approx(2 * n / 8, rel=0.01)  # DeepSpeed keeps a 16-bit partition and a master


def test_deepspeed_zero3_gathers_at_most_its_live_parameter_cap(problem_factory, layout_factory):
    p = problem_factory("llama3-70b", num_gpus=64, gbs=64)
    lay = layout_factory(p, dp_shard=64, zero_stage=3)
    ds = _items(evaluate(p, lay, target="deepspeed", check_memory=False))["zero3_gathered_params"]
    fsdp = _items(evaluate(p, lay, target="fsdp", check_memory=False))["zero3_gathered_params"]
    cost = registry.get("deepspeed").cost
    cap, grad_bytes = cost.zero3_live_params, {"fp32": 4, "bf16": 2}[cost.grad_dtype]
    assert ds <= cap * 2 + 5e8 * grad_bytes + 1 and ds < fsdp  # a 70B decoder layer (~0.86B) x 2 is above the 1e9 cap


def test_megatron_artifacts_overlap_only_the_backward_tp_collectives(problem_factory, layout_factory):
    """dtc's megatron_args.sh has no --tp-comm-overlap: the forward's TP collectives are exposed in full; the
    published recipes' userbuffers overlap both passes."""
    p = problem_factory("llama3-8b", num_gpus=8, gbs=64)
    lay = layout_factory(p, tp=8, sequence_parallel=True)
    mine = evaluate(p, lay, check_memory=False)
    bridge = evaluate(p, lay, target=published_profile("megatron_bridge"), check_memory=False)
    assert registry.get("megatron").cost.tp_overlap == "backward"
    assert _time(mine)["tp_comm"] > _time(bridge)["tp_comm"]


def test_zero_traffic_of_a_pipelined_step_hides_behind_the_whole_step(problem_factory, layout_factory):
    """ZeRO-2 reduce-scatters each micro-batch's gradients on their own stream: with many micro-batches in a
    pipeline what shows is what exceeds the step's busy time, not what exceeds one micro-batch's backward."""
    p = problem_factory("llama3-70b", num_gpus=64, gbs=256)
    lay = layout_factory(p, tp=8, pp=4, dp_shard=2, zero_stage=2, sequence_parallel=True)
    est = evaluate(p, lay, check_memory=False)
    t = _time(est)
    per_mb = [c for c in est.comm if c.name.endswith("grad_reduce_scatter")]
    assert per_mb and sum(c.time_s for c in per_mb) > 0
    assert t.get("zero_per_microbatch_comm", 0.0) < sum(c.time_s for c in per_mb)


def test_torchtitan_op_checkpointing_keeps_every_other_matmul():
    shape = ModelShape(num_layers=1, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64, num_kv_heads=8,
                       vocab_size=32000)
    terms = act.layer_terms(shape, moe_layer=False, seq_kv=4096, act_bytes=2, impl=act.TORCH_EAGER)
    per_op = act.activation_bytes_per_token_per_layer(terms, tp=1, sequence_parallel=False,
                                                      recompute="selective_per_op", hidden=8192, act_bytes=2)
    alt = act.every_other_mm_sac_bytes_per_token(shape, moe_layer=False, tp=1, sequence_parallel=False, act_bytes=2)
    # wq 16384 + wv 2048 + SDPA out 16384 + lse 256 + input and w2 out 32768 + w1 57344 bytes per token
    assert alt == 16384 + 2048 + 16384 + 256 + 32768 + 57344
    assert alt < per_op


@pytest.mark.parametrize("target", ["deepspeed", "megatron", "fsdp"])
def test_an_offloaded_optimizer_takes_the_gradient_shard_to_the_host_where_the_target_does(
        problem_factory, layout_factory, target):
    """DeepSpeed's ZeRO-Offload (ZeRO-1/2) keeps the fp32 gradient partition in host memory for the CPU optimizer
    (stage_1_and_2.py single_partition_of_fp32_groups[i].grad on 'cpu') and still accumulates the partition on the
    GPU (with an fp32 grad_accum_dtype: _build_compact_grad_partition_buffer on the accelerator), with a staging
    buffer of the largest parameter on each side; FSDP2's CPUOffloadPolicy (ZeRO-3 only) moves the gradient shard;
    Megatron's optimizer CPU offload keeps main_grad on the GPU. The smoke measures each
    (tests/test_smoke_launch.py test_model_states_are_measured_as_costed)."""
    p = problem_factory("llama3-8b", num_gpus=8, gbs=64, targets=f"[{target}]")
    stage = 3 if target == "fsdp" else 1
    on_gpu = evaluate(p, layout_factory(p, dp_shard=8, zero_stage=stage), target=target, check_memory=False)
    off_layout = layout_factory(p, dp_shard=8, zero_stage=stage, offload_optimizer="cpu",
                                offload_params="cpu" if target == "fsdp" else "none")
    off = evaluate(p, off_layout, target=target, check_memory=False)
    grads = _items(on_gpu)["gradients"]
    partition = 4 * p.params.total / 8  # fp32, this rank's 1/8
    assert grads == pytest.approx(partition if target == "fsdp" else 8 * partition, rel=0.01)
    host_optimizer = _items(on_gpu)["master_weights"] + _items(on_gpu)["optimizer_states"]
    per_gpu = off.memory.cpu_bytes_per_node / off_layout.gpus_per_node
    staging = _items(off).get("offload_grad_buffer", 0.0)
    if target == "deepspeed":
        assert _items(off)["gradients"] == pytest.approx(partition, rel=0.01)
        assert staging == 2 * p.shape.vocab_size * p.shape.hidden_size  # the embedding, bf16
        assert per_gpu == pytest.approx(host_optimizer + partition + staging, rel=0.01)
    elif target == "fsdp":
        assert _items(off)["gradients"] == 0 and staging == 0
        assert per_gpu == pytest.approx(host_optimizer + partition, rel=0.01)
    else:
        assert _items(off)["gradients"] == grads and staging == 0
        assert per_gpu == pytest.approx(host_optimizer, rel=1e-6)


def test_megatron_costs_the_token_dispatcher_it_renders(problem_factory, layout_factory):
    """dtc's Megatron target renders the 'alltoall' dispatcher, which sends every routed copy across nodes: its cost
    profile must not assume a node-aware (DeepEP-style) dispatch, so inter-node expert parallelism costs more than
    under the hierarchical profile the published NeMo runs are fitted with."""
    from compiler.targets.megatron.cost import COST, TOKEN_DISPATCHER

    assert TOKEN_DISPATCHER == "alltoall" and COST.hierarchical_all_to_all is False
    assert published_profile("megatron_bridge").hierarchical_all_to_all is True
    p = problem_factory("mixtral-8x7b", num_gpus=64, gbs=256)
    from compiler.costmodel.comm import ep_comm_time_per_moe_layer_s

    lay = layout_factory(p, dp_shard=64, zero_stage=1, ep=16)  # 16 GPUs over two 8-GPU nodes
    flat = make_setup(p, lay, p.gpu_options[0], target="megatron")
    fresh = make_setup(p, lay, p.gpu_options[0], target="megatron")  # its own memo: nothing computed yet
    hier = dataclasses.replace(fresh, framework=dataclasses.replace(fresh.framework, hierarchical_all_to_all=True))

    assert sum(ep_comm_time_per_moe_layer_s(flat)) > sum(ep_comm_time_per_moe_layer_s(hier))


def test_megatron_dispatches_bf16_hidden_states_under_fp8_and_deepseek_v3_fp8(problem_factory, layout_factory):
    """Megatron-Core's dispatchers move the layer input as it is (bf16; Transformer Engine quantises inside the
    expert GEMMs after the dispatch; HybridEP 'does not support fp8 dispatch'); DeepSeek-V3's framework quantises
    before the dispatch (report sec. 3.3.2). Under fp8 the forward dispatch then costs what the bf16 combine does
    for Megatron, half of it for DeepSeek-V3; the backward's gradients are bf16 either way."""
    from compiler.costmodel.comm import ep_comm_time_per_moe_layer_s

    assert not registry.get("megatron").cost.moe_dispatch_fp8
    assert not published_profile("megatron_bridge").moe_dispatch_fp8
    assert published_profile("deepseek_v3").moe_dispatch_fp8
    p = problem_factory("mixtral-8x7b", num_gpus=64, gbs=256, precision="fp8")
    lay = layout_factory(p, dp_shard=64, zero_stage=1, ep=8)  # inside one 8-GPU node
    bf16 = make_setup(p, lay, p.gpu_options[0], target="megatron")
    fresh = make_setup(p, lay, p.gpu_options[0], target="megatron")
    fp8 = dataclasses.replace(fresh, framework=dataclasses.replace(fresh.framework, moe_dispatch_fp8=True))
    (f16, b16), (f8, b8) = ep_comm_time_per_moe_layer_s(bf16), ep_comm_time_per_moe_layer_s(fp8)
    assert f16 == pytest.approx(b16) and b8 == pytest.approx(b16)  # bf16 both ways: as the backward
    assert f8 < f16 and f8 > f16 / 2  # the fp8 dispatch moves half the bytes; the combine is bf16


def _all_profiles():
    from compiler.calibration.frameworks import PUBLISHED_FRAMEWORKS

    return {**{n: registry.get(n).cost for n in registry.names() if registry.get(n).cost is not None},
            **PUBLISHED_FRAMEWORKS}


def test_the_gradient_and_tp_citations_are_parts_of_the_source_and_follow_the_facts():
    """The memory breakdown's gradients line cites grad_fact and the step breakdown's tp_comm line tp_fact (not the
    whole profile source): each is a part of the source, and a profile built by replacing another one's dtypes or
    TP overlap does not keep the other's sentence (two profiles citing one sentence state the same facts)."""
    profiles = _all_profiles()
    assert {"megatron", "fsdp", "deepspeed", "nemo_2407", "deepspeed_defaults"} <= set(profiles)
    for name, p in profiles.items():
        assert p.grad_fact in p.source and p.tp_fact in p.source, name
    targets = [n for n in registry.names() if registry.get(n).cost is not None]
    assert {"megatron", "fsdp", "deepspeed"} <= set(targets)
    for target in targets:  # what PLAN.md shows for a target: the sentence, not the whole source
        p = profiles[target]
        assert p.grad_source and len(p.grad_fact) < len(p.source) / 2, target
        if p.tp_overlap == "none":
            assert p.tp_source and len(p.tp_fact) < len(p.source) / 2, target
    for a in profiles.values():
        for b in profiles.values():
            if a.grad_source and a.grad_source == b.grad_source:
                assert (a.grad_dtype, a.grad_reduce_dtype) == (b.grad_dtype, b.grad_reduce_dtype), (a.name, b.name)
            if a.tp_source and a.tp_source == b.tp_source:
                assert a.tp_overlap == b.tp_overlap, (a.name, b.name)


def test_plan_lines_cite_the_sentence_of_the_fact(problem_factory, layout_factory):
    """fp32 gradients under bf16 (a framework's choice, not the recipe's) cite the framework's gradient sentence;
    tensor-parallel time without overlap cites the framework's TP sentence."""
    p = problem_factory("llama3-8b", num_gpus=8, gbs=64)
    lay = layout_factory(p, tp=2, dp_shard=4, zero_stage=3)
    for target in ("megatron", "fsdp", "deepspeed"):
        profile = registry.get(target).cost
        est = evaluate(p, lay, target=target)
        sources = {i.name: i.source for i in est.memory.items}
        assert sources["gradients"] == profile.grad_fact, target
        if profile.tp_overlap == "none":
            assert {i.name: i.source for i in est.time.items}["tp_comm"] == profile.tp_fact, target


def test_the_precision_assumption_states_the_costed_targets_gradients(problem_factory, layout_factory):
    """PLAN.md's assumption about weights, gradients and master copies is written from the costed framework's profile:
    it said 'DeepSpeed's bf16' gradients for every plan while dtc's DeepSpeed trainer keeps and reduces fp32 ones
    (the memory items did count 4 B). Each target's sentence names the dtype its gradients line counts."""
    from compiler.targets.cost import DTYPE_BYTES

    p = problem_factory("llama3-8b", num_gpus=8, gbs=64)
    lay = layout_factory(p, dp_shard=8, zero_stage=3)
    for target in ("megatron", "fsdp", "deepspeed"):
        profile = registry.get(target).cost
        est = evaluate(p, lay, target=target, check_memory=False)
        assert not isinstance(est, Rejection), (target, est)
        (sentence,) = [a for a in est.assumptions if a.startswith("Mixed precision keeps")]
        assert sentence.endswith(f"{profile.display_name} keeps {profile.grad_dtype} gradients and reduces them in "
                                 f"{profile.grad_reduce_dtype}."), (target, sentence)
        assert ("the sharded fp32 parameter as the master" in sentence) == profile.master_is_param
        grads = next(i for i in est.memory.items if i.name == "gradients")
        assert grads.formula.startswith(f"{DTYPE_BYTES[profile.grad_dtype]} B x "), (target, grads.formula)
    fp32 = evaluate(dataclasses.replace(p, precision="fp32"), lay, target="deepspeed", check_memory=False)
    assert any(a.startswith("fp32 training keeps 4 B weights and gradients, no master copy but the ZeRO optimizer's")
               for a in fp32.assumptions)


def test_the_precisions_that_need_transformer_engine_are_the_quantised_gemm_ones():
    """targets/base.py TE_PRECISIONS (what the DeepSpeed rule refuses and the smoke swaps for bf16) names the
    precisions whose GEMMs the cost model runs quantised, and each is a precision a spec may ask for."""
    import typing

    from compiler.costmodel.context import QUANTISED_GEMM_DTYPES, RECIPES
    from compiler.spec.models import TrainingSpec
    from compiler.targets.base import TE_PRECISIONS

    assert {p for p, r in RECIPES.items() if r.gemm_dtype in QUANTISED_GEMM_DTYPES} == set(TE_PRECISIONS)
    assert set(TE_PRECISIONS) <= set(typing.get_args(TrainingSpec.model_fields["precision"].annotation))


def test_every_cross_entropy_kernel_has_a_price_and_a_size():
    """A cost profile's cross_entropy names a kernel whose HBM traffic physics.yaml prices and whose memory
    activations.LOSS_MEMORY sizes: the three lists name the same kernels."""
    import typing

    from compiler.costmodel.activations import LOSS_MEMORY
    from compiler.costmodel.efficiency import load_efficiency
    from compiler.targets.cost import CostProfile

    kernels = set(typing.get_args(typing.get_type_hints(CostProfile)["cross_entropy"]))
    assert set(LOSS_MEMORY) == set(load_efficiency().physics.cross_entropy_bytes) == kernels


def test_dtc_targets_train_without_dropout(problem_factory, layout_factory):
    """Dropout is the training stack's fact, not the model's: dtc's Megatron arguments set --attention-dropout and
    --hidden-dropout to 0 and the FSDP2 / DeepSpeed trainers' blocks have none, so a GPT-3-style plan keeps no
    dropout masks for them; a published Megatron-LM 2021 run of the same model trained with dropout 0.1 and keeps
    them (embedding, attention and MLP masks)."""
    p = problem_factory("gpt3-175b", seq=2048, gbs=64, num_gpus=64)
    lay = layout_factory(p, tp=8, pp=8, dp_shard=1, zero_stage=0, recompute="none")
    for name in ("megatron", "fsdp", "deepspeed"):
        assert registry.get(name).cost.dropout is False, name
    ours = evaluate(p, lay, target="megatron", check_memory=False)
    with_dropout = evaluate(p, lay, target=dataclasses.replace(registry.get("megatron").cost, dropout=None),
                            check_memory=False)
    assert published_profile("megatron_lm_2021").dropout is None
    terms = act.layer_terms(p.shape, moe_layer=False, seq_kv=2048, act_bytes=2, dropout=False)
    assert not any("dropout" in t.name for t in terms)
    assert {"attention_dropout_mask", "mlp_dropout_mask"} <= {
        t.name for t in act.layer_terms(p.shape, moe_layer=False, seq_kv=2048, act_bytes=2)}
    # the masks alone: 1 B per element of the embedding output and of each layer's attention and MLP outputs, for
    # the pp micro-batches the first stage holds under 1F1B
    masks = (2 * p.shape.num_layers / lay.pp + 1) * lay.micro_batch * 2048 * p.shape.hidden_size * lay.pp
    assert with_dropout.memory.item("activations").value - ours.memory.item("activations").value \
        == pytest.approx(masks, rel=0.02)


def test_deepspeed_hybrid_sharding_is_zero_plus_plus_hpz(problem_factory, layout_factory):
    """DeepSpeed runs HSDP as ZeRO++ hpZ (DeepSpeed 0.19.8 partition_parameters.py): every state stays partitioned
    over all dp ranks and a secondary 16-bit weight copy over the hpZ group; FSDP2's HSDP keeps a whole sharded copy
    per replica group. dtc smoke measured the DeepSpeed states at x0.66 of a prediction sharded like FSDP2's."""
    p = problem_factory("llama3-8b", num_gpus=64, gbs=64, targets="[deepspeed, fsdp]")
    hsdp = layout_factory(p, dp_replicate=8, dp_shard=8, zero_stage=3, gpus_per_node=8)
    flat = layout_factory(p, dp_shard=64, zero_stage=3, gpus_per_node=8)
    n = p.params.total
    ds, ds_flat = (_items(evaluate(p, lay, target="deepspeed", check_memory=False)) for lay in (hsdp, flat))
    for name in ("weights", "gradients", "master_weights", "optimizer_states"):
        assert ds[name] == pytest.approx(ds_flat[name]), name
    assert ds["gradients"] == pytest.approx(4 * n / 64, rel=0.01)
    assert ds["secondary_weights"] == pytest.approx(2 * n / 8, rel=0.01)
    assert "secondary_weights" not in ds_flat
    said = [a for a in evaluate(p, hsdp, target="deepspeed", check_memory=False).assumptions if "hpZ" in a]
    assert len(said) == 1 and not any("hpZ" in a for a in evaluate(p, hsdp, target="fsdp").assumptions)
    fsdp = _items(evaluate(p, hsdp, target="fsdp", check_memory=False))
    assert fsdp["gradients"] == pytest.approx(4 * n / 8, rel=0.01) and "secondary_weights" not in fsdp
    # the optimizer step updates the 1/64 partition, not 1/8
    steps = [_time(evaluate(p, lay, target="deepspeed", check_memory=False))["optimizer_step"] for lay in (hsdp, flat)]
    assert steps[0] == pytest.approx(steps[1])
    # offloaded parameters take their secondary copy to the host as well
    off = layout_factory(p, dp_replicate=8, dp_shard=8, zero_stage=3, gpus_per_node=8, offload_optimizer="cpu",
                         offload_params="cpu")
    off_flat = layout_factory(p, dp_shard=64, zero_stage=3, gpus_per_node=8, offload_optimizer="cpu",
                              offload_params="cpu")
    host, host_flat = (evaluate(p, lay, target="deepspeed", check_memory=False).memory.cpu_bytes_per_node
                       for lay in (off, off_flat))
    assert "secondary_weights" not in _items(evaluate(p, off, target="deepspeed", check_memory=False))
    assert host - host_flat == pytest.approx(8 * 2 * n / 8, rel=0.01)  # 8 GPUs per node x their secondary copies


def test_deepspeed_hpz_collectives(problem_factory, layout_factory):
    """hpZ reduce-scatters gradients over all dp ranks every micro-batch, gathers the first forward over all of them
    once per step and every other gather inside the hpZ group; nothing is all-reduced across replicas (FSDP2 HSDP:
    all inside the shard group, then the replica all-reduce)."""
    from compiler.costmodel import comm
    from compiler.costmodel.stages import stage_params

    p = problem_factory("llama3-8b", num_gpus=64, gbs=64, targets="[deepspeed, fsdp]")
    lay = layout_factory(p, dp_replicate=8, dp_shard=8, zero_stage=3, gpus_per_node=8, grad_accum=4)

    def collectives(target):
        setup = make_setup(p, lay, p.gpu_options[0], target=target)
        sl = setup.stages[0]
        sp = stage_params(setup.shape, setup.params, sl, tp=1, ep=1, pp=1)
        return {c.name: c for c in comm.dp_collectives(setup, sp)}

    ds, fsdp = collectives("deepspeed"), collectives("fsdp")
    assert ds["dense_grad_reduce_scatter"].group_size == 64 and ds["dense_grad_reduce_scatter"].calls_per_step == 4
    primary = ds["dense_param_all_gather_fwd_primary"]
    assert (primary.group_size, primary.calls_per_step, primary.phase) == (64, 1, "step_param")
    assert ds["dense_param_all_gather_fwd"].group_size == ds["dense_param_all_gather_bwd"].group_size == 8
    assert "dense_grad_all_reduce_replicas" not in ds
    assert fsdp["dense_grad_reduce_scatter"].group_size == 8 and "dense_grad_all_reduce_replicas" in fsdp
    assert "dense_param_all_gather_fwd_primary" not in fsdp


def test_fsdp2_offload_keeps_one_host_copy_of_a_parameter(problem_factory, layout_factory):
    """FSDP2's CPUOffloadPolicy offloads the sharded parameter, which is the fp32 master: 4 B master + 4 B
    gradient + 8 B Adam moments per parameter on the host, no 16-bit copy besides (DeepSpeed keeps one: 18 B).
    The smoke measures it (tests/test_smoke_launch.py, fsdp-offload)."""
    p = problem_factory("llama3-8b", num_gpus=8, gbs=64, targets="[fsdp, deepspeed]")
    lay = layout_factory(p, dp_shard=8, zero_stage=3, offload_optimizer="cpu", offload_params="cpu")
    per_param = {t: evaluate(p, lay, target=t, check_memory=False).memory.cpu_bytes_per_node / p.params.total
                 for t in ("fsdp", "deepspeed")}
    assert per_param["fsdp"] == pytest.approx(16, rel=0.01)
    assert per_param["deepspeed"] == pytest.approx(18, rel=0.01)


def test_deepspeed_autotp_keeps_the_vocabulary_whole(problem_factory, layout_factory):
    """DeepSpeed AutoTP splits the blocks' linear layers (compiler/runtime/model.py Transformer._tp_plan), not the
    embeddings or the output layer: at tp=2 each rank holds them whole and computes the full logits, where Megatron
    splits the vocabulary. The smoke measures the states (tests/test_smoke_launch.py, ds-tp2)."""
    p = problem_factory("llama3-8b", num_gpus=8, gbs=64, targets="[deepspeed, megatron]")
    lay = layout_factory(p, tp=2, dp_shard=4, zero_stage=1)
    ds, mg = (evaluate(p, lay, target=t, check_memory=False) for t in ("deepspeed", "megatron"))
    vocab = p.shape.vocab_size * p.shape.hidden_size  # each of the two untied vocabulary matrices
    # weights: 2 B x (blocks / 2 + both vocabulary matrices whole) vs 2 B x (blocks + vocabulary) / 2
    assert _items(ds)["weights"] - _items(mg)["weights"] == pytest.approx(2 * vocab, rel=0.01)
    v = p.shape.vocab_size
    assert f"x {v}/1 vocab" in ds.memory.item("logits_loss").formula
    assert f"x {v}/2 vocab" in mg.memory.item("logits_loss").formula
    # the output layer's GEMM is whole on each DeepSpeed rank: twice Megatron's per-rank columns
    from compiler.costmodel.compute import logits_gemm
    from compiler.costmodel.context import make_setup

    assert logits_gemm(make_setup(p, lay, p.gpu_options[0], target="deepspeed")).n == v
    assert logits_gemm(make_setup(p, lay, p.gpu_options[0], target="megatron")).n == v / 2
