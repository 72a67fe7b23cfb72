"""Lower bounds for the solver: cheap numbers that no completion of a partial layout can beat.

Both take the knobs fixed so far as keywords (None: not decided yet) and return a value
that is provably <= what ``evaluate`` returns for ANY layout with those knobs, so a
candidate whose bound already exceeds usable HBM (or the best step time found) can be
dropped without evaluating it.

memory_lower_bound_bytes: the binding stage holds at least the average stage's
parameters (max >= mean), i.e. params / (tp x pp), divided by the largest possible shard
group where the most favourable ZeRO stage shards that state (unknown ZeRO: 3; unknown
offload: offloaded); plus the activations of full recompute (the smallest mode) for one
micro-batch in flight on L/pp layers; plus the CUDA-context allowance. Every other line
item is >= 0. Each factor uses the extreme value the unknown knobs allow: tp x pp x
dp_shard x cp <= num_gpus.

step_time_lower_bound_s: every FLOP of the step runs on some GPU, no faster than the
highest achievable rate of that GPU for the training precision (max of peak x gemm_max_fraction
over the dtypes its GEMMs use, and the attention rate): step >= model FLOPs per step /
(num_gpus x that rate). The pipeline
bubble, communication and memory-bound work only add.
"""
from __future__ import annotations

from compiler.costmodel.compute import model_flops_per_token
from compiler.costmodel.context import OPTIMIZER_STATE_BYTES, RECIPES
from compiler.costmodel.efficiency import load_efficiency
from compiler.problem import GpuOption, Problem


def _max_gpus(problem: Problem, num_gpus: int | None) -> int:
    return num_gpus or problem.num_gpus or problem.max_gpus


def memory_lower_bound_bytes(problem: Problem, gpu: GpuOption, *, num_gpus: int | None = None,
                             tp: int | None = None, pp: int | None = None, cp: int | None = None,
                             ep: int | None = None, dp_shard: int | None = None, zero_stage: int | None = None,
                             micro_batch: int | None = None, recompute: str | None = None,
                             sequence_parallel: bool | None = None, offload_optimizer: str | None = None,
                             offload_params: str | None = None) -> float:
    """Bytes per GPU that every completion of these knobs needs at least (see the module docstring)."""
    n = _max_gpus(problem, num_gpus)
    r = RECIPES[problem.precision]
    pc, shape = problem.params, problem.shape
    model_par = tp * pp if tp is not None and pp is not None else n
    if zero_stage == 0:
        shard = 1
    elif dp_shard is not None and cp is not None:
        shard = dp_shard * cp
    else:
        shard = max(1, n // model_par)
    z = 3 if zero_stage is None else zero_stage
    expert = pc.expert_total
    dense = pc.total - expert
    ep_max = ep if ep is not None else max(1, n // model_par)

    def per_gpu(sharded: bool) -> float:
        d = min(n, model_par * (shard if sharded else 1))
        e = min(n, model_par * max(ep_max, shard if sharded else 1))
        return dense / d + expert / e

    opt_bytes = OPTIMIZER_STATE_BYTES.get(problem.optimizer, 8)
    weights = 0.0 if (offload_params not in (None, "none") or (offload_params is None and z == 3)) \
        else r.weight_bytes * per_gpu(z >= 3)
    grads = r.grad_bytes * per_gpu(z >= 2)
    states = 0.0 if offload_optimizer != "none" else (r.master_bytes + opt_bytes) * per_gpu(z >= 1)
    # activations: full recompute (the smallest mode) keeps the layer input, h x bytes per token per
    # layer, divided by tp only with sequence parallelism; one micro-batch of seq / cp tokens in flight
    # on L / pp layers.
    if sequence_parallel is not False:
        div = tp * pp * cp if None not in (tp, pp, cp) else n
    else:
        div = pp * cp if None not in (pp, cp) else max(1, n // (tp or 1))
    acts = (micro_batch or 1) * problem.seq_len * shape.num_layers * shape.hidden_size * r.activation_bytes / div
    return weights + grads + states + acts + load_efficiency().cuda_context_bytes


def _fastest_attention_flops_per_s(eff, gpu: GpuOption) -> float:
    """The highest forward+backward attention rate any kernel table of this part's class reaches."""
    from compiler.catalog import load_catalog

    best = 0.0
    for kernel in ("cudnn", "fa3", "fa2"):
        for variant in ("hd128", "mla", "hd64"):
            curve, ref = eff.physics.attention_curve(gpu.spec.kernel_family, kernel, variant)
            ref_spec = load_catalog().gpus.get(ref)
            scale = gpu.spec.peak_flops_for("bf16") / ref_spec.peak_flops_for("bf16") if ref_spec else 1.0
            fastest = min(curve.seconds_per_forward_flop(s) for s in curve.seq)
            best = max(best, 3.0 / fastest * scale)  # 3x forward FLOPs per (fwd + bwd) pass in dtc's convention
    return best


def step_time_lower_bound_s(problem: Problem, gpu: GpuOption, *, num_gpus: int | None = None,
                            global_batch: int | None = None) -> float:
    """Seconds per step that every layout on at most ``num_gpus`` GPUs needs at least."""
    n = _max_gpus(problem, num_gpus)
    if global_batch is None:
        global_batch = max(1, int(problem.global_batch * (1.0 - problem.global_batch_tolerance)))
    eff = load_efficiency()
    recipe = RECIPES[problem.precision]
    cls = gpu.spec.kernel_family
    dtypes = {recipe.gemm_dtype, "fp32" if recipe.name == "fp32" else "bf16"}  # layer GEMMs; logits/attention
    kinds = {"fp8": ("fp8_tensorwise", "fp8_blockwise", "mxfp8")}
    rates = [gpu.spec.peak_flops_for(d) * max(eff.physics.gemm_fraction_for(cls, k) for k in kinds.get(d, (d,)))
             for d in dtypes]
    rates.append(_fastest_attention_flops_per_s(eff, gpu))
    rates = [r * max(1.0, eff.fit("compute_scale")) for r in rates]
    flops = model_flops_per_token(problem.shape, problem.params, problem.seq_len) * global_batch * problem.seq_len
    return flops / (n * max(rates))
