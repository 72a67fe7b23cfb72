"""How dtc's Megatron artifacts run a layout, as the cost model needs it (compiler.targets.cost).

The facts follow megatron_args.sh as render.py writes it: ``--bf16`` without
``--grad-reduce-in-bf16`` (fp32 main_grad buffers, fp32 gradient reduction), no
``--tp-comm-overlap`` (so only the backward's tensor-parallel collectives overlap a GEMM:
Transformer Engine's Linear launches the dgrad all-reduce / reduce-scatter asynchronously and
runs the wgrad GEMM under it, transformer_engine/pytorch/module/linear.py backward;
the forward's are on the critical path), ``--fp8-recipe`` as ``COST.fp8_recipe_on(generation)``
says (render.py emits exactly that recipe).
"""
from compiler.targets.cost import CostProfile

# the gradients' dtype (COST.grad_dtype, grad_reduce_dtype), as the memory breakdown cites it
GRAD_SOURCE = ("--bf16 keeps fp32 main_grad buffers and reduces gradients in fp32 unless --grad-reduce-in-bf16 "
               "(megatron/training/arguments.py: 'bfloat16 requires gradient accumulation and all-reduce to be done "
               "in fp32')")
SOURCE = (
    "Megatron-Core 0.19 + Transformer Engine: fused norms/linears/SwiGLU (TE LayerNormLinear, LayerNormMLP), "
    "cuDNN fused attention (TE get_attention_backend); " + GRAD_SOURCE + "; TP collectives overlap the weight-gradient "
    "GEMM (async TP all-reduce) and, with --tp-comm-overlap, TE userbuffers; kernels per layer counted from "
    "megatron/core/transformer/transformer_layer.py (norm+QKV, rope, attention, proj, bias-dropout-add, "
    "norm+fc1, SwiGLU, fc2, bias-dropout-add, plus fp8 casts); an MoE layer is that layer less the dense MLP's "
    "fc1, SwiGLU and fc2 (3) plus the expert activation (1) plus the 48 operators megatron-core 0.19.2's own "
    "MoELayer issues for its router (fp32, aux loss) and alltoall dispatcher at EP > 1 (token-count all-gather, "
    "5 device-to-host copies of counts and splits, permute, 2 all-to-alls out and 1 back, chunk sorts, "
    "unpermute), counted by benchmarks/moe_host_ops.py (TE's fused permute/sort/unpermute, "
    "transformer_engine/pytorch/permutation.py, launch as many Triton kernels as the unfused ops they replace); "
    "per local expert and projection, its fp8 input cast (TE split_quantize) and its cuBLASLt GEMM "
    "(TE GroupedLinear launches one GEMM per expert, common/gemm/cublaslt_gemm.cu multi_stream_cublas_gemm), "
    "whose host time TE's own benchmark puts at ~33 us, 1.65x a 20 us PyTorch operator (8 experts x 128 tokens, "
    "N=K=2048: 0.267 ms per multi-stream call with operands pre-swizzled, NVIDIA/TransformerEngine PR #3134): "
    "2 x (1 + 1.65) = 5 operators per expert; "
    "selective recompute = the attention core (Korthikanti et al. 2022)")
# what dtc's own artifacts add to SOURCE (the stack facts NeMo's and Megatron-Bridge's profiles share)
ARTIFACT_SOURCE = ("; the loss is Megatron-Core's jit-fused cross entropy (render.py passes --cross-entropy-loss-fusion "
                   "--cross-entropy-fusion-impl native under bf16 and fp8: megatron-core 0.19.2 training/arguments.py "
                   "refuses the te implementation 'due to stability issues', and fusions/fused_cross_entropy.py "
                   "calculate_gradients casts the logits' gradient to bf16, so fp16 and fp32 runs keep the unfused fp32 "
                   "vocab_parallel_cross_entropy)")
# the loss by precision (render.py emits the fusion flags exactly where this says megatron_native)
CROSS_ENTROPY_BY_PRECISION = (("fp16", "megatron_fp32"), ("fp32", "megatron_fp32"))

# Kernel-launching operators of one forward (each costs the host fit.cpu_op_s): a dense layer's (counted from
# transformer_layer.py, see SOURCE); the router and alltoall dispatcher of an MoE layer at EP > 1, counted by
# benchmarks/moe_host_ops.py on megatron-core 0.19.2's own MoELayer (tests/test_moe_host_ops.py checks the count);
# an MoE layer is the dense layer less the dense MLP's fc1, SwiGLU and fc2, plus the expert activation and these
OPS_PER_DENSE_LAYER = 16
MOE_ROUTER_AND_DISPATCHER_OPS = 48
OPS_PER_MOE_LAYER = OPS_PER_DENSE_LAYER - 3 + 1 + MOE_ROUTER_AND_DISPATCHER_OPS
# per local expert and projection: the fp8 input cast and one cuBLASLt GEMM at ~1.65 operators' host time (SOURCE)
OPS_PER_LOCAL_EXPERT = 5

# fp8 scaling: Blackwell has hardware MXFP8 block scaling (Transformer Engine's MXFP8BlockScaling recipe);
# Hopper/Ada use delayed (per-tensor amax history) scaling, as NVIDIA's Megatron-LM fp8 examples do.
COST = CostProfile(
    name="megatron", display_name="Megatron-Core + Transformer Engine", activations="megatron_te", attention="cudnn",
    elementwise="fused", grad_dtype="fp32", grad_reduce_dtype="fp32", tp_overlap="backward",
    ops_per_dense_layer=OPS_PER_DENSE_LAYER, ops_per_moe_layer=OPS_PER_MOE_LAYER, ops_per_local_expert=OPS_PER_LOCAL_EXPERT,
    recompute_selective="attention_core",
    fp8_recipe="fp8_tensorwise_delayed", fp8_recipe_by_generation=(("blackwell", "mxfp8"),),
    hierarchical_all_to_all=False, moe_tp_gathers_copies=True, cross_entropy="megatron_native", fp4_param_gather=True,
    cross_entropy_by_precision=CROSS_ENTROPY_BY_PRECISION, dropout=False,  # render.py: --attention/hidden-dropout 0.0
    source=SOURCE + ARTIFACT_SOURCE, grad_source=GRAD_SOURCE)

# render.py writes this dispatcher; the 'alltoall' dispatcher sends every routed copy of a token over the
# network (megatron/core/transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher), no node-level dedup:
# COST.hierarchical_all_to_all must stay False with it (DeepEP's 'flex' dispatcher would be the hierarchical one)
TOKEN_DISPATCHER = "alltoall"
