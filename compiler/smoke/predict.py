"""The cost model's prediction for the reduced model and world a smoke run used.

A Problem for the reduced model is built the way a user would write it: a spec (as data) with the
explicit shape, the smoke's sequence length, global batch and precision, on the plan's GPU
type (``problem_from_data``), and the smoke layout is costed with ``evaluate``.
The comparison groups the line items the way the ranks can measure them:

* ``model_states``: weights + gradients + master weights + optimizer states, of the stage that holds the most
  (measured: parameter + gradient + optimizer-state bytes of the rank, the most of any rank);
* ``activations``: activations + the logits the loss keeps + recompute working set, of the stage that keeps
  the most (measured: the peak bytes autograd saved for backward on any rank; the loss's transient buffers
  are not saved tensors);
* ``total``: everything the allocator sees (GPU only: ``torch.cuda.max_memory_allocated``
  against the total less the CUDA context and NCCL allowances).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from compiler.errors import DtcError
from compiler.estimate import Estimate, MemoryBreakdown
from compiler.model import ModelShape
from compiler.smoke.report import Comparison, RankMeasure, TargetResult
from compiler.smoke.scale import SmokeSetup

# What a smoke run must measure, as a ratio measured / predicted, to pass (docs/smoke.md). Model states are
# exact byte arithmetic (ZeRO paper; FSDP2 shards matched exactly in tests/test_costmodel_measured.py), saved
# activations are within 5% of the cost model for the implementation that runs (same test): 0.8-1.25 leaves
# room for what a few-step run adds (allocator rounding, the optimizer's lazily created states) and nothing
# more. The total adds allowances a CPU run does not measure (communication buckets, fragmentation), so it
# is judged loosely. Step time is not compared: the reduced model's step is launch overhead and Python, not
# the at-scale kernels the cost model predicts.
BANDS: dict[str, tuple[float, float]] = {"model_states": (0.8, 1.25), "activations": (0.8, 1.25),
                                         "total": (0.5, 1.5)}

STATE_ITEMS = ("weights", "secondary_weights", "gradients", "offload_grad_buffer", "master_weights", "optimizer_states")
ACTIVATION_ITEMS = ("activations", "logits_loss", "recompute_working_set")  # what autograd saves (not loss_transient)
NOT_ALLOCATED = ("cuda_context", "nccl_buffers")


def reduced_spec(setup: SmokeSetup, shape: ModelShape, target: str) -> dict[str, Any]:
    """The spec of the reduced model on the smoke world, as data (compiler.problem.problem_from_data)."""
    from compiler.spec.models import ModelSpec

    # every shape field a spec can give (moe below; a learned position table only with learned positions)
    keys = [k for k in ModelSpec.model_fields if k not in ("preset", "params", "init", "moe", "max_position_embeddings")]
    model: dict[str, Any] = {key: getattr(shape, key) for key in keys}
    if shape.position == "learned":
        model["max_position_embeddings"] = max(shape.max_position_embeddings, setup.seq_len)
    if shape.moe is not None:
        model["moe"] = dataclasses.asdict(shape.moe)
    return {
        "name": f"{setup.plan_name}-smoke",
        "model": model,
        "training": {"tokens": setup.global_batch * setup.seq_len * max(1, setup.steps), "sequence_length": setup.seq_len,
                     "global_batch": setup.global_batch, "precision": setup.precision, "optimizer": setup.optimizer},
        "cluster": {"gpu": setup.gpu, "num_gpus": setup.world_size, "gpus_per_node": setup.layout.gpus_per_node},
        "targets": [target],
    }


def activation_impl(target: str, device: str) -> Any:
    """Which tensors the reduced run saves for backward (compiler.costmodel.activations): the generated fsdp and
    deepspeed trainers are plain PyTorch modules (nn.RMSNorm, SDPA, eager SwiGLU; no dropout: their cost profile's
    ``dropout`` is False, so the CPU profile's dropout-mask dtype never applies to them).
    Megatron on GPUs runs Transformer Engine (the cost model's default); on CPU it runs megatron-core's local
    layers with every fusion off (compiler/targets/megatron/cpu.py: --no-masked-softmax-fusion,
    --no-bias-swiglu-fusion, ...): torch norms, the unfused DotProductAttention, which repeats the KV heads to
    every query head and keeps the softmax (megatron/core/transformer/dot_product_attention.py), and MLP.forward's
    unfused glu (megatron/core/transformer/mlp.py), whose product saves silu(gate) and a copy of up
    (``x_linear + glu_linear_offset``) beside the fc1 output, and whose MoE experts multiply that product by the
    routing probabilities in one more op that saves it (``per_token_scale``), and the unfused RoPE, which casts cos and
    sin to bf16 for q and for k and saves the four (rope_cast_tables); under sequence parallel its linear layers save
    the input's sequence shard and gather it again in backward, as on GPUs (not torch TP's gathered input); counted
    by saved_tensors_hooks on megatron-core 0.19.2's CPU smoke runs."""
    from dataclasses import replace

    from compiler.costmodel.activations import DEFAULT_IMPL, TORCH_EAGER, TORCH_EAGER_CPU

    if target in ("fsdp", "deepspeed"):
        return TORCH_EAGER_CPU if device == "cpu" else TORCH_EAGER
    if device == "cpu":
        return replace(TORCH_EAGER_CPU, name="megatron_local_cpu", attention="unfused", swiglu_saved_widths=4,
                       expert_scale_saves_output=True, rope_cast_tables=4, sp_gathers_gemm_inputs=False,
                       source="megatron-core local layers on CPU with every fusion off: torch norms, unfused "
                              "DotProductAttention (KV repeated per query head, softmax kept), the unfused glu (fc1 "
                              "output, silu(gate), a copy of up), the experts' probability scaling and the unfused "
                              "RoPE's bf16 cos and sin")
    return DEFAULT_IMPL


@dataclass(frozen=True)
class MemoryPrediction:
    memory: MemoryBreakdown  # the largest stage's line items (what PLAN.md shows)
    stages: tuple[dict[str, float], ...]  # each distinct pipeline stage's line items, by name

    def most(self, names: tuple[str, ...]) -> tuple[int, tuple[str, ...]]:
        """The most any stage holds of the line items ``names`` (ranks are measured one by one, and the largest
        measurement is compared), and which of them that stage has."""
        stage = max(self.stages, key=lambda items: sum(items.get(n, 0.0) for n in names))
        used = tuple(n for n in names if n in stage)
        return int(sum(stage[n] for n in used)), used


def predict_memory(setup: SmokeSetup, shape: ModelShape, target: str) -> MemoryPrediction | str:
    """The predicted per-GPU memory of the smoke layout, or why there is none."""
    from compiler.costmodel.evaluation import evaluate, memory_by_stage
    from compiler.problem import problem_from_data

    impl = activation_impl(target, setup.device)
    try:
        problem = problem_from_data(reduced_spec(setup, shape, target), path=f"<smoke {setup.plan_name}>")
        est = evaluate(problem, setup.layout, target=target, impl=impl)
    except DtcError as exc:
        return f"no prediction: {exc.diagnostics[0].summary}"
    if not isinstance(est, Estimate):
        return f"no prediction: the cost model rejects the smoke layout ({est.code}: {est.message})"
    stages = tuple({i.name: i.value for i in items}
                   for items in memory_by_stage(problem, setup.layout, target=target, impl=impl))
    return MemoryPrediction(est.memory, stages)


def _max(values: list[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def compare(prediction: MemoryPrediction, ranks: list[RankMeasure], *, host_offload: bool = False,
            gpus_on_a_node: int = 1) -> list[Comparison]:
    """Measured (max over ranks) vs predicted, by group (a rank's ``peak_bytes`` is the allocator's
    peak on GPU, the sum of the measured parts on CPU)."""
    memory = prediction.memory
    items = {i.name: i.value for i in memory.items}
    grads_measured = any(r.grad_bytes is not None for r in ranks)
    states, state_names = prediction.most(STATE_ITEMS if grads_measured or not ranks
                                          else tuple(n for n in STATE_ITEMS if n != "gradients"))
    acts, act_names = prediction.most(ACTIVATION_ITEMS)
    measured_states = _max([None if r.param_bytes is None else
                            r.param_bytes + (r.grad_bytes or 0) + (r.optimizer_bytes or 0) for r in ranks])
    if host_offload and memory.cpu_bytes_per_node:
        # on CPU the offloaded states live in the same memory the ranks measure
        states += int(memory.cpu_bytes_per_node / max(1, gpus_on_a_node))
        state_names += ("offloaded_to_host",)
    out = [Comparison("model_states", measured_states, states, state_names, BANDS["model_states"]),
           Comparison("activations", _max([r.activation_bytes for r in ranks]), acts, act_names,
                      BANDS["activations"])]
    allocated_names = tuple(n for n in items if n not in NOT_ALLOCATED)
    allocated = int(sum(items[n] for n in allocated_names))
    out.append(Comparison("total", _max([r.peak_bytes for r in ranks]), allocated, allocated_names, BANDS["total"]))
    return out


def judge(result: TargetResult) -> None:
    """A run that passed but measured a ratio outside its band is a failed check, naming the line items."""
    bad = [c.verdict() for c in result.comparisons if c.out_of_band]
    if bad and result.status == "passed":
        result.status = "failed"
        result.reason = "the cost model's memory prediction is off: " + "; ".join(bad)
