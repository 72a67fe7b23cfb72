"""What every cost-model function needs to know about one (problem, layout, gpu, target), computed once.

``Setup`` gathers the resolved inputs: the model shape and parameter count, the layout,
the GPU option, the framework profile of the target it is costed for, the precision recipe,
the constants (physics + fit) and the per-stage layers. It holds no results; memory.py,
compute.py, comm.py and step.py compute those.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from compiler.costmodel.activations import FP8_GEMM_INPUT_BYTES, IMPLS, NVFP4_GEMM_INPUT_BYTES, ActivationImpl
from compiler.costmodel.efficiency import Efficiency, efficiency_of
from compiler.costmodel.frameworks import DEFAULT_TARGET, profile_of
from compiler.costmodel.stages import StageLayers, stage_layers
from compiler.layout import Layout
from compiler.model import ModelShape, ParamCount
from compiler.problem import GpuOption, Problem
from compiler.targets.cost import CostProfile


@dataclass(frozen=True)
class PrecisionRecipe:
    """Bytes per parameter (before sharding) and per activation element of a training precision."""

    name: str
    weight_bytes: float  # the copy forward/backward read
    grad_bytes: int
    master_bytes: int  # fp32 master copy; 0 when the weights are already fp32
    activation_bytes: int
    gemm_dtype: str  # which peak the transformer GEMMs run at
    source: str
    quantised_weights: bool = False  # the kept weights are the GEMMs' quantised copies (no separate cache)


_ZERO = "Rajbhandari et al. 2020, ZeRO, sec. 3.1: mixed-precision Adam keeps 2+2+K bytes/param, K=12 (fp32 master, momentum, variance)"
RECIPES = {
    "bf16": PrecisionRecipe("bf16", 2, 2, 4, 2, "bf16", _ZERO),
    "fp16": PrecisionRecipe("fp16", 2, 2, 4, 2, "fp16", _ZERO),
    "fp32": PrecisionRecipe("fp32", 4, 4, 0, 4, "fp32", "fp32 training: 4-byte weights and gradients, no master copy; Adam 8 bytes"),
    "fp8": PrecisionRecipe(
        "fp8", 2, 2, 4, 2, "fp8",
        "Transformer Engine FP8 (NVIDIA TE docs, 'Using FP8'): bf16 weights + fp32 master as in bf16 mixed "
        "precision; GEMM inputs are cast to fp8 per use; activations kept in bf16, except the fp8 copy of each "
        "GEMM input TE saves for the weight gradient (compiler/costmodel/activations.py FP8_GEMM_INPUT_BYTES)"),
    "nvfp4": PrecisionRecipe(
        "nvfp4", 2, 2, 4, 2, "fp4",
        "Transformer Engine NVFP4BlockScaling (TE docs, low_precision_training/nvfp4): E2M1 values with an E4M3 scale "
        "per 16 elements and an fp32 scale per tensor; fprop, dgrad and wgrad GEMMs all in FP4 (random Hadamard "
        "transform on the wgrad operands, stochastic rounding of gradients), attention and the output layer in bf16; "
        "bf16 weights + fp32 master as in bf16 mixed precision (Megatron-Bridge bf16_with_nvfp4_mixed builds on "
        "bf16_mixed); TE saves only the transposed FP4 copy of each GEMM input for the weight gradient "
        "(compiler/costmodel/activations.py NVFP4_GEMM_INPUT_BYTES)"),
}
# bytes per element of a quantised GEMM operand (what a GEMM reads, and what Transformer Engine saves for backward)
GEMM_INPUT_BYTES = {"fp8": float(FP8_GEMM_INPUT_BYTES), "fp4": NVFP4_GEMM_INPUT_BYTES}
QUANTISED_GEMM_DTYPES = tuple(GEMM_INPUT_BYTES)  # GEMM inputs quantised per use (casts, cached weight copies)
OPTIMIZER_STATE_BYTES = {"adam": 8, "adamw": 8, "sgd": 4}  # fp32 m and v; SGD momentum
OPTIMIZER_SOURCE = "Kingma & Ba 2015 (Adam: two fp32 moments per parameter); SGD with momentum: one"


@dataclass(frozen=True)
class Setup:
    problem: Problem
    layout: Layout
    gpu: GpuOption
    eff: Efficiency
    recipe: PrecisionRecipe
    framework: CostProfile
    impl: ActivationImpl  # the framework's activation profile (which tensors autograd keeps)
    stages: tuple[StageLayers, ...]
    quant_recipe: str = ""  # the scaling recipe of quantised GEMMs: fp8's, or "nvfp4"; "" for 16/32-bit GEMMs
    _memo: dict = field(default_factory=dict, compare=False, repr=False)  # per-layer quantities, computed once

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per Setup: per-layer costs are shared by every stage of a layout."""
        try:
            return self._memo[key]
        except KeyError:
            value = self._memo[key] = compute()
            return value

    @property
    def kernel_class(self) -> str:
        return self.gpu.spec.kernel_family

    @property
    def shape(self) -> ModelShape:
        return self.problem.shape

    @property
    def params(self) -> ParamCount:
        return self.problem.params

    @property
    def seq_len(self) -> int:
        return self.problem.seq_len

    @property
    def tokens_per_microbatch(self) -> int:
        """Tokens one GPU processes per micro-batch: micro_batch * seq / cp."""
        return self.layout.micro_batch * self.problem.seq_len // self.layout.cp

    @property
    def vocab_shards(self) -> int:
        """How many ranks split the vocabulary (word embeddings, output layer, logits): tp where the target shards
        them (CostProfile.tp_splits_vocab), else 1."""
        return self.layout.tp if self.framework.tp_splits_vocab else 1

    @property
    def loss_vocab_shards(self) -> int:
        """How many ranks split the logits the loss holds and reduces: vocab_shards where the target's loss is
        vocab-parallel (CostProfile.tp_splits_loss), else 1 (the logits gathered whole)."""
        return self.vocab_shards if self.framework.tp_splits_loss else 1

    @property
    def num_microbatches(self) -> int:
        return self.layout.grad_accum

    @property
    def optimizer_state_bytes(self) -> int:
        return self.framework.optimizer_state_bytes or OPTIMIZER_STATE_BYTES.get(self.problem.optimizer, 8)

    @property
    def grad_bytes(self) -> int:
        """Bytes per kept gradient element: 16-bit mixed precision keeps the framework's gradient buffers
        (Megatron: fp32 main_grad); fp32 training keeps fp32."""
        if self.recipe.name == "fp32":
            return 4
        return self.framework.grad_bytes

    @property
    def grad_reduce_bytes(self) -> int:
        """Bytes per gradient element on the wire of the data-parallel reduction."""
        if self.recipe.name == "fp32":
            return 4
        return self.framework.grad_reduce_bytes

    @property
    def nvlink_domain_gpus(self) -> int:
        """GPUs that reach each other over NVLink: the node, or the rack for NVL72-style systems."""
        spec = self.gpu.spec
        if spec.nvlink_domain_gpus > spec.default_gpus_per_node:
            return spec.nvlink_domain_gpus
        return self.layout.gpus_per_node

    @property
    def power_factor(self) -> float:
        """Compute slowdown of a part run under a power limit below its TDP (physics.yaml power)."""
        limit, tdp = self.gpu.power_limit_w, self.gpu.spec.tdp_w
        if not limit or not tdp or limit >= tdp:
            return 1.0
        return (limit / tdp) ** self.eff.physics.dvfs_exponent

    def peak_flops_per_s(self, dtype: str) -> float:
        return self.gpu.spec.peak_flops_for(dtype)

    def hbm_rate(self, kernels: str | None = None) -> float:
        """Achieved HBM bytes/s of memory-bound kernels: fused (TE, cuDNN, compiled) or eager."""
        fraction = self.eff.physics.memory_bound_fraction[kernels or self.framework.elementwise]
        return self.gpu.spec.hbm_bandwidth_bytes_per_s * fraction

def fp8_recipe_of(problem: Problem, framework: CostProfile, gpu: GpuOption) -> str:
    """The scaling recipe of fp8 GEMMs: the spec's, else the framework's on this GPU generation; "" unless fp8."""
    if RECIPES[problem.precision].gemm_dtype != "fp8":
        return ""
    return problem.fp8_recipe or framework.fp8_recipe_on(gpu.spec.generation)


def quant_recipe_of(problem: Problem, framework: CostProfile, gpu: GpuOption) -> str:
    """The scaling recipe of the quantised GEMMs (physics.yaml gemm.fraction / quantize_bytes_per_element key): the
    fp8 recipe, "nvfp4" under nvfp4, "" for 16/32-bit GEMMs."""
    if RECIPES[problem.precision].gemm_dtype == "fp4":
        return "nvfp4"
    return fp8_recipe_of(problem, framework, gpu)


def make_setup(problem: Problem, layout: Layout, gpu: GpuOption, *, target: str | CostProfile = DEFAULT_TARGET,
               eff: Efficiency | None = None, stages: tuple[StageLayers, ...] | None = None) -> Setup:
    """``target``: a dtc target name or a cost profile; ``stages``: the layout's stages when the caller already
    has them (the solver's bounds cache them)."""
    eff = eff or efficiency_of(problem.profile)
    framework = profile_of(target)
    recipe = RECIPES[problem.precision]
    if framework.zero_fp32_partition_copy and recipe.master_bytes == 0 and layout.zero_stage >= 1:
        recipe = replace(recipe, master_bytes=4)  # the ZeRO optimizer's fp32 partition (targets/cost.py)
    if recipe.gemm_dtype == "fp4" and framework.fp4_param_gather and layout.zero_stage >= 1:
        # --fp4-param-gather: the weights are NVFP4 tensors, row- and column-wise (Megatron-Bridge's
        # bf16_with_nvfp4_mixed sets fp4_param_gather, megatron/bridge/training/mixed_precision.py)
        recipe = replace(recipe, weight_bytes=2 * NVFP4_GEMM_INPUT_BYTES, quantised_weights=True, source=recipe.source + (
            "; under a distributed optimizer or FSDP the weights are NVFP4 tensors, row- and column-wise, "
            "all-gathered in NVFP4 (Megatron-LM --fp4-param-gather: 'Keep the compute param in fp4'; Megatron-Bridge's "
            "bf16_with_nvfp4_mixed sets fp4_param_gather), no 16-bit copy and no separate cache"))
    quant = quant_recipe_of(problem, framework, gpu)
    if stages is None:
        stages = stage_layers(problem.shape, layout.pp, layout.vpp, layout.split)
    impl = IMPLS[framework.activations]
    if framework.fused_norm:  # a fused norm kernel keeps no fp32 copies (targets/cost.py)
        impl = replace(impl, name=impl.name + "+fused_norm", rmsnorm_fp32_copies=0)
    return Setup(problem=problem, layout=layout, gpu=gpu, eff=eff, recipe=recipe, framework=framework,
                 impl=impl, stages=stages, quant_recipe=quant)
