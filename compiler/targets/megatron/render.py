"""Megatron-LM target: ``megatron_args.sh``, the pretrain_gpt.py arguments for megatron-core 0.19.2.

``megatron_arg_groups(plan)`` computes the flags as data, in a fixed, grouped order
(parallelism, model, batch, optimizer, precision, recompute, data, logging, checkpointing);
``megatron_args(plan)`` is the same list flattened. The template
``megatron/megatron_args.sh.j2`` only places them in a bash array, each token quoted with
``shell_quote`` except the few that must expand at run time (``ShellExpr``: the checkpoint
directory), which are double-quoted. Spellings are megatron-core 0.19.2's own (see
tools/validators/MEGATRON_FLAGS.md); tests parse every generated list with Megatron's own
``arguments.py`` at the plan's world size.

How Megatron runs a dtc layout: zero 0 is DDP; zero 1 the distributed optimizer; zero 2/3
Megatron-FSDP (``--use-megatron-fsdp`` with ``--data-parallel-sharding-strategy``
optim_grads / optim_grads_params); HSDP is ``--num-distributed-optimizer-instances`` =
dp_replicate for both. Megatron has no GPipe schedule, no parameter offload and no NVMe.
The layout rules (compiler.rules: heads and KV heads divisible by tp, experts by ep, sequence
by 2 x cp, Megatron's split, ...) and Megatron's support rules are checked before any flag is
written; a violation raises ``RenderError``.
"""
from __future__ import annotations

import re
import shlex
from typing import Any, Sequence

from compiler import rules
from compiler.errors import RenderError
from compiler.layout import Layout
from compiler.model import ModelShape
from compiler.plan import Plan
from compiler.render.common import lr_schedule_steps, provenance_header
from compiler.targets.megatron import BENCH_STEPS_ENV
from compiler.targets.megatron.cost import TOKEN_DISPATCHER
from compiler.render.environment import render_template
from compiler.split import LayerSplit, PipelineSplit
from compiler.targets.megatron.cost import COST

ARGS_FILE = "megatron_args.sh"
TEMPLATE = "megatron/megatron_args.sh.j2"

CHECKPOINT_DIR = "${CHECKPOINT_DIR:-checkpoints}"  # expands when the script runs, relative to its cwd
# model.init converted by convert_init.sh (Megatron-Bridge's AutoBridge.import_ckpt), relative to the job's cwd
PRETRAINED_DIR = "pretrained-megatron"
PRETRAINED_CHECKPOINT = "${PRETRAINED_CHECKPOINT:-" + PRETRAINED_DIR + "}"
CONVERT_FILE = "convert_init.sh"
# Megatron-Bridge release of megatron-core 0.19.2's month (PyPI, 2026-09); its AutoBridge.import_ckpt writes
# a torch_dist checkpoint megatron-core loads with any parallel layout
MEGATRON_BRIDGE_VERSION = "0.6.2"
ADAM_EPS = 1e-8
SGD_MOMENTUM = 0.9
MAKE_VOCAB_DIVISIBLE_BY = 128  # Megatron's default; the embedding is padded to a multiple of 128 x tp
LOG_INTERVAL = 10
EVAL_INTERVAL = 1000
EVAL_ITERS = 10
DATA_SPLIT = "99,1,0"
MOE_AUX_LOSS_COEFF = 1e-2  # Megatron's MoE examples (Mixtral); its default 0.0 disables balancing
# delayed fp8 scaling: amax over a 1024-step history, as in NVIDIA's Megatron-LM fp8 examples
FP8_AMAX_HISTORY_LEN = 1024
# Short benchmark runs (dtc sweep, compiler/sweep.py): train_megatron.sbatch with BENCH_STEPS_ENV=N set runs N
# iterations on mock data, logged each, with no evaluation and no checkpoint loaded or saved. Megatron's parser
# keeps the last value of a repeated flag, so these are appended to MEGATRON_ARGS; the flags argparse cannot
# unset (a path option has no "none": megatron-core 0.19.2 has no --no-save or --no-load) are removed from it,
# each with its values (the tokens up to the next --flag).
BENCH_DROP_FLAGS = ("--save", "--load", "--pretrained-checkpoint", "--data-path")
BENCH_APPEND_FLAGS = (("--mock-data",), ("--eval-iters", "0"), ("--log-interval", "1"))  # after --train-iters N


class ShellExpr(str):
    """A token that the shell must expand at run time: written double-quoted, not escaped."""

    def __new__(cls, text: str) -> "ShellExpr":
        assert not set(text) & set('"`\\\n'), f"unsafe inside double quotes: {text!r}"
        return super().__new__(cls, text)


Group = tuple[str, list[list[str]]]  # (comment, [[flag, value...], ...])


# ------------------------------------------------------------------------------ checks
def render_checks(plan: Plan) -> list[str]:
    """What Megatron-LM cannot run for this plan ([] = fine): the layout rules and Megatron's own support
    rules (compiler.rules), each as '[code] message'."""
    return [f"[{r.code}] {r.message}" for r in rules.plan_violations(plan, ("megatron",))]


def _check(plan: Plan) -> None:
    problems = render_checks(plan)
    if problems:
        raise RenderError(f"Megatron-LM cannot run layout {plan.layout.tag}: " + "; ".join(problems),
                          hint="the solver should not have chosen this layout for the megatron target; "
                               "please report, or remove megatron from targets")


def _shape(plan: Plan) -> ModelShape:
    return plan.model.shape


def pipeline_flags(pp: int, vpp: int, split: PipelineSplit) -> list[list[str]]:
    """--pipeline-model-parallel-size, the virtual stages and the split mechanism's own flags.

    An explicit layout fixes vpp itself (arguments.py:907-918 refuses it together with
    --num-virtual-stages-per-pipeline-rank); otherwise vpp is --num-virtual-stages-per-pipeline-rank,
    the only VPP spelling that also works with uneven first/last stages (arguments.py:921)."""
    out = [_f("--pipeline-model-parallel-size", pp)]
    if pp > 1:
        if vpp > 1 and split.mechanism != "layout":
            out.append(_f("--num-virtual-stages-per-pipeline-rank", vpp))
        out += split.megatron_flags()
    return out


# ------------------------------------------------------------------------------ the flags
def megatron_arg_groups(plan: Plan) -> list[Group]:
    """The pretrain_gpt.py arguments, grouped, as data (tokens are strings or ShellExpr)."""
    _check(plan)
    groups = [
        ("parallelism", _parallelism(plan)),
        ("model", _model(plan)),
        ("batch and iterations", _batch(plan)),
        ("optimizer and learning-rate schedule", _optimizer(plan)),
        ("precision", _precision(plan)),
        ("loss", _loss(plan)),
        ("activation recompute", _recompute(plan.layout)),
        ("data and tokenizer", _data(plan)),
        ("logging", _logging(plan)),
        ("checkpointing", _checkpointing(plan)),
    ]
    return [(name, flags) for name, flags in groups if flags]


def megatron_args(plan: Plan) -> list[str]:
    """The arguments as one flat list, in the grouped order of ``megatron_arg_groups``."""
    return [tok for _, flags in megatron_arg_groups(plan) for flag in flags for tok in flag]


def _f(flag: str, *values: Any) -> list[str]:
    return [flag, *(v if isinstance(v, ShellExpr) else _num(v) for v in values)]


def _num(v: Any) -> str:
    if isinstance(v, bool):
        raise TypeError("booleans are flags, not values")
    if isinstance(v, float):
        return repr(v)  # shortest round-trip form: 0.0003 -> '0.0003', 1e-08 -> '1e-08'
    return str(v)


def _parallelism(plan: Plan) -> list[list[str]]:
    lay = plan.layout
    out = [_f("--tensor-model-parallel-size", lay.tp)] + pipeline_flags(lay.pp, lay.vpp, plan.layer_split().split)
    if lay.cp > 1:
        out.append(_f("--context-parallel-size", lay.cp))
    if lay.ep > 1:
        out.append(_f("--expert-model-parallel-size", lay.ep))
    if lay.etp is not None:  # Megatron's default is tp (training/arguments.py)
        out.append(_f("--expert-tensor-parallel-size", lay.etp))
    if lay.sequence_parallel:
        out.append(["--sequence-parallel"])
    out += _data_parallel(lay)
    return out


def _data_parallel(lay: Layout) -> list[list[str]]:
    """zero 0: DDP; 1: distributed optimizer; 2/3: Megatron-FSDP; HSDP: optimizer instances."""
    out: list[list[str]] = []
    if lay.zero_stage == 1:
        out.append(["--use-distributed-optimizer"])
    elif lay.zero_stage >= 2:
        strategy = "optim_grads" if lay.zero_stage == 2 else "optim_grads_params"
        out += [["--use-megatron-fsdp"], _f("--data-parallel-sharding-strategy", strategy),
                _f("--ckpt-format", "fsdp_dtensor")]  # Megatron-FSDP requires it (arguments.py:1146)
    if lay.zero_stage > 0 and lay.dp_replicate > 1:
        out.append(_f("--num-distributed-optimizer-instances", lay.dp_replicate))
    if lay.dp > 1:
        out.append(["--overlap-grad-reduce"])
        if lay.zero_stage > 0:
            out.append(["--overlap-param-gather"])
    if lay.offload_optimizer == "cpu":
        out += [["--optimizer-cpu-offload"], ["--use-precision-aware-optimizer"],
                _f("--optimizer-offload-fraction", 1.0)]
    return out


def _model(plan: Plan) -> list[list[str]]:
    s = _shape(plan)
    seq = int(plan.training.seq_len)
    out = [
        _f("--num-layers", s.num_layers),
        _f("--hidden-size", s.hidden_size),
        _f("--ffn-hidden-size", s.ffn_hidden_size),
        _f("--num-attention-heads", s.num_attention_heads),
    ]
    if s.mla is not None:
        m = s.mla
        out.append(["--multi-latent-attention"])
        if m.q_lora_rank:
            out.append(_f("--q-lora-rank", m.q_lora_rank))
        out += [_f("--kv-lora-rank", m.kv_lora_rank), _f("--qk-head-dim", m.qk_nope_head_dim),
                _f("--qk-pos-emb-head-dim", m.qk_rope_head_dim), _f("--v-head-dim", m.v_head_dim)]
        # RoPE for MLA stays Megatron's MLA default (YaRN, as in DeepSeek-V3's published config);
        # --rope-type rope would also need --no-rope-fusion (transformer_config.py:2967)
    else:
        if s.num_kv_heads != s.num_attention_heads:
            out += [["--group-query-attention"], _f("--num-query-groups", s.num_kv_heads)]
        if s.kv_channels != s.hidden_size // s.num_attention_heads:
            out.append(_f("--kv-channels", s.kv_channels))
    out.append(_f("--seq-length", seq))
    out.append(_f("--max-position-embeddings", max(seq, s.max_position_embeddings)))
    out.append(_f("--position-embedding-type", _position_type(plan)))
    out.append(_f("--normalization", "RMSNorm" if s.norm == "rmsnorm" else "LayerNorm"))
    out += _hyperparameters(plan)
    if s.mlp == "swiglu":
        out.append(["--swiglu"])
    elif s.mlp == "quick_geglu":
        # gpt-oss's gated activation (Megatron-Bridge GPTOSSProvider: quick_gelu, glu_linear_offset 1.0,
        # activation_func_clamp_value 7.0; openai/gpt-oss's swiglu: alpha 1.702, limit 7.0, (up + 1))
        out += [["--quick-geglu"], _f("--glu-linear-offset", 1.0), _f("--activation-func-clamp-value", 7.0)]
    out += _attention_kind(s)
    if not s.tied_embeddings:
        out.append(["--untie-embeddings-and-output-weights"])
    if not s.linear_bias:
        out.append(["--disable-bias-linear"])
        if s.attention_bias:
            out.append(["--add-qkv-bias"])
    # no dropout in LLM pretraining (Megatron's default is 0.1)
    out += [_f("--attention-dropout", 0.0), _f("--hidden-dropout", 0.0)]
    out += _moe(s, plan.layout)
    # explicit although it is 0.19.2's default: fp8, CP and MLA all need Transformer Engine
    out.append(_f("--transformer-impl", "transformer_engine"))
    return out


def _position_type(plan: Plan) -> str:
    s, scaling = _shape(plan), plan.model.hyperparameters.rope_scaling
    if s.position != "rope":
        return "learned_absolute"
    return "yarn" if s.mla is None and scaling is not None and scaling.kind == "yarn" else "rope"


def window_values(s: ModelShape) -> dict[str, Any]:
    """--window-size and --window-attn-skip-freq for the sliding-window layers of ``s`` (Megatron's
    is_layer_window_attention: 1-based layer numbers divisible by the skip frequency attend fully); None: the flag
    is left out. dtc smoke writes the reduced model's from it too."""
    windowed = bool(s.window_size)
    return {"--window-size": f"{s.window_size},0" if windowed else None,
            "--window-attn-skip-freq": (s.full_attention_every or None) if windowed else None}


def _attention_kind(s: ModelShape) -> list[list[str]]:
    """Sliding-window layers (window_values) and attention sinks (a learnable softmax offset per head)."""
    out = [_f(flag, value) for flag, value in window_values(s).items() if value is not None]
    if s.attention_sinks:
        out.append(_f("--softmax-type", "learnable"))
    return out


def _hyperparameters(plan: Plan) -> list[list[str]]:
    """The catalog's rope base and scaling, norm epsilon and init std (plan.model.hyperparameters, each
    with its source in compiler/data/models.yaml); Megatron's defaults (10000, 1e-5, 0.02) are right
    for few models."""
    h, s = plan.model.hyperparameters, _shape(plan)
    out = [_f("--norm-epsilon", h.norm_eps), _f("--init-method-std", h.init_std)]
    if s.position == "rope" and s.mla is None and h.rope_theta is not None:
        out.append(_f("--rotary-base", int(h.rope_theta)))  # an int flag in megatron-core 0.19.2
        if h.rope_scaling is not None and h.rope_scaling.kind == "llama3":
            # Megatron's apply_rope_scaling: Llama 3.1's low/high frequency factors 1 and 4, original 8192
            out += [["--use-rope-scaling"], _f("--rope-scaling-factor", h.rope_scaling.factor)]
        elif h.rope_scaling is not None and h.rope_scaling.kind == "yarn":
            # a non-MLA YaRN model (gpt-oss): training/argument_utils.py _apply_yarn_config_from_args maps these;
            # the mscale defaults (1, 0) give YaRN's 0.1 ln(factor) + 1 attention factor, as openai/gpt-oss's
            # RotaryEmbedding applies it
            sc = h.rope_scaling
            out += [_f("--rotary-scaling-factor", sc.factor),
                    _f("--yarn-original-max-position-embeddings", sc.original_max_position_embeddings),
                    _f("--yarn-beta-fast", sc.beta_fast), _f("--yarn-beta-slow", sc.beta_slow)]
            if not sc.round_correction_range:
                out.append(["--no-yarn-correction-range-round-to-int"])
    return out


def tokenizer_type(path: str) -> list[list[str]]:
    """Megatron's tokenizer flags for the tokenizer that prepared the data (judged by its name: the
    renderer never reads the cluster's files): a ``.tiktoken`` file -> TikTokenizer with Llama 3's
    pattern (v2), a ``.model`` file -> SentencePiece, anything else (a folder, a tokenizer.json) ->
    HuggingFaceTokenizer."""
    if path.endswith(".tiktoken"):
        return [_f("--tokenizer-type", "TikTokenizer"), _f("--tokenizer-model", path), _f("--tiktoken-pattern", "v2")]
    if path.endswith(".model"):
        return [_f("--tokenizer-type", "GPTSentencePieceTokenizer"), _f("--tokenizer-model", path)]
    return [_f("--tokenizer-type", "HuggingFaceTokenizer"), _f("--tokenizer-model", path)]


def _moe(s: ModelShape, lay: Layout) -> list[list[str]]:
    if s.moe is None:
        return []
    m = s.moe
    out = [_f("--num-experts", m.num_experts), _f("--moe-router-topk", m.top_k),
           _f("--moe-ffn-hidden-size", m.expert_ffn_hidden_size)]
    if m.num_shared_experts:
        out.append(_f("--moe-shared-expert-intermediate-size", m.num_shared_experts * m.shared_ffn))
    pattern = [int(s.is_moe_layer(i)) for i in range(s.num_layers)]
    if not all(pattern):
        out.append(_f("--moe-layer-freq", moe_layer_pattern(pattern)))
    out += [_f("--moe-router-load-balancing-type", "aux_loss"), _f("--moe-aux-loss-coeff", MOE_AUX_LOSS_COEFF),
            # fp32 routing: Megatron warns that many experts without it are numerically fragile
            _f("--moe-router-dtype", "fp32"),
            _f("--moe-token-dispatcher-type", TOKEN_DISPATCHER), ["--moe-grouped-gemm"]]
    return out


def moe_layer_pattern(pattern: Sequence[int]) -> str:
    """A Python list expression for --moe-layer-freq, run-length encoded: '([0]*3+[1]*58)'."""
    runs: list[list[int]] = []
    for bit in pattern:
        if runs and runs[-1][0] == bit:
            runs[-1][1] += 1
        else:
            runs.append([bit, 1])
    return "(" + "+".join(f"[{bit}]*{n}" for bit, n in runs) + ")"


def _batch(plan: Plan) -> list[list[str]]:
    lay = plan.layout
    return [_f("--micro-batch-size", lay.micro_batch),
            _f("--global-batch-size", int(plan.training.global_batch)),
            _f("--train-iters", int(plan.training.num_steps))]


def _optimizer(plan: Plan) -> list[list[str]]:
    t = plan.training
    warmup, total = lr_schedule_steps(plan)
    out = []
    if t.optimizer == "sgd":
        out += [_f("--optimizer", "sgd"), _f("--sgd-momentum", SGD_MOMENTUM)]
    else:
        # Megatron's "adam" applies decoupled weight decay (AdamW) for both adam and adamw
        out += [_f("--optimizer", "adam"), _f("--adam-beta1", float(t.adam_beta1)),
                _f("--adam-beta2", float(t.adam_beta2)), _f("--adam-eps", ADAM_EPS)]
    out += [
        _f("--lr", float(t.learning_rate)),
        _f("--min-lr", float(t.min_learning_rate)),
        _f("--lr-decay-style", "cosine"),
        _f("--lr-warmup-iters", warmup),
        _f("--lr-decay-iters", total),
        _f("--weight-decay", float(t.weight_decay)),
        _f("--clip-grad", float(t.grad_clip)),
    ]
    return out


def _loss(plan: Plan) -> list[list[str]]:
    """Megatron-Core's jit-fused cross entropy where the cost profile says it runs (cost.py ARTIFACT_SOURCE)."""
    if COST.cross_entropy_for(plan.training.precision) == "megatron_native":
        return [["--cross-entropy-loss-fusion"], _f("--cross-entropy-fusion-impl", "native")]
    return []


def _precision(plan: Plan) -> list[list[str]]:
    p = plan.training.precision
    if p == "fp16":
        return [["--fp16"]]
    if p == "bf16":
        return [["--bf16"]]
    if p == "fp8":
        # fp8 GEMMs through Transformer Engine, bf16 elsewhere, with the recipe the cost model costs
        # (compiler/targets/megatron/cost.py: MXFP8 on Blackwell, delayed per-tensor scaling elsewhere)
        recipe = COST.fp8_recipe_on(plan.cluster.generation)
        if recipe == "mxfp8":
            return [["--bf16"], _f("--fp8-format", "e4m3"), _f("--fp8-recipe", "mxfp8")]
        assert recipe == "fp8_tensorwise_delayed", recipe
        return [["--bf16"], _f("--fp8-format", "hybrid"), _f("--fp8-recipe", "delayed"),
                _f("--fp8-amax-history-len", FP8_AMAX_HISTORY_LEN), _f("--fp8-amax-compute-algo", "max")]
    if p == "nvfp4":
        # all three GEMMs of every layer's linear layers in NVFP4 through Transformer Engine (NVFP4BlockScaling), bf16
        # elsewhere; no layer kept in bf16 (Megatron-Bridge's bf16_with_nvfp4_mixed for Llama 3 70B / 405B), as costed
        out = [["--bf16"], _f("--fp4-format", "e2m1"), _f("--fp4-recipe", "nvfp4")]
        if COST.fp4_param_gather and plan.layout.zero_stage >= 1:  # weights kept and gathered in NVFP4 (costed)
            out.append(["--fp4-param-gather"])
        return out
    return []  # fp32


def _recompute(lay: Layout) -> list[list[str]]:
    if lay.recompute == "selective":
        return [_f("--recompute-granularity", "selective")]  # recompute_modules default: core_attn
    if lay.recompute == "full":
        return [_f("--recompute-granularity", "full"), _f("--recompute-method", "uniform"),
                _f("--recompute-num-layers", 1)]
    return []


# Megatron builds a (micro_batch, 1, seq, seq) boolean mask per sample by default (GPTDataset,
# create_attention_mask_in_dataloader); the causal attention dtc renders (Transformer Engine's, attn_mask_type causal;
# megatron-core's local softmax builds its own cached causal mask when given none, fused_softmax.py
# get_default_causal_mask) never reads it, yet it is built on the host, copied to the GPU and, under full recompute,
# kept as a checkpoint input: seq^2 bytes per micro-batch (64 MiB at 8K, 1 GiB at 32K). Megatron-LM's own long-context
# and DeepSeek-V3 recipes turn it off the same way.
NO_DATALOADER_MASK = ["--no-create-attention-mask-in-dataloader"]


def _data(plan: Plan) -> list[list[str]]:
    s = _shape(plan)
    data = plan.data
    if data is not None and not data.synthetic and data.tokenizer is not None:
        # the spec's prepared datasets (dtc data prepare: Megatron's .bin/.idx) and their tokenizer;
        # blends as "weight prefix" pairs (megatron/training/arguments.py --data-path)
        paths = [item for d in data.datasets for item in (repr(float(d.weight)), d.path)] \
            if len(data.datasets) > 1 else [data.datasets[0].path]
        return (tokenizer_type(data.tokenizer)
                + [_f("--make-vocab-size-divisible-by", MAKE_VOCAB_DIVISIBLE_BY), ["--data-path", *paths],
                   _f("--split", DATA_SPLIT), _f("--eval-interval", EVAL_INTERVAL), _f("--eval-iters", EVAL_ITERS),
                   NO_DATALOADER_MASK])
    # NullTokenizer: ids 0..V-1, eod = V-1 (megatron/core/tokenizers null_tokenizer.py); no vocab files
    out = [_f("--tokenizer-type", "NullTokenizer"), _f("--vocab-size", s.vocab_size),
           _f("--make-vocab-size-divisible-by", MAKE_VOCAB_DIVISIBLE_BY)]
    # --eval-interval even without evaluation: training.py:4481 divides train_iters by it
    return out + [["--mock-data"], NO_DATALOADER_MASK, _f("--eval-interval", EVAL_INTERVAL), _f("--eval-iters", 0)]


def _logging(plan: Plan) -> list[list[str]]:
    return [_f("--log-interval", LOG_INTERVAL), ["--log-throughput"], _f("--seed", int(plan.training.seed))]


def _checkpointing(plan: Plan) -> list[list[str]]:
    """--save/--load in the job's folder (mounted into the container by the sbatch script), every
    ``interval_steps`` of the checkpoint policy (compiler.checkpointing: Young's interval from the
    checkpoint's bytes, the stated write bandwidth and the job's failure rate). Saves are asynchronous
    where megatron-core supports it: the torch_dist format (its default; Megatron-FSDP's fsdp_dtensor has
    no async save), which validate_args silently turns off without a persistent worker
    (arguments.py:1740-1746); the mcore strategy needs no nvidia-resiliency-ext."""
    from compiler.checkpointing import plan_policy

    total = int(plan.training.num_steps)
    policy = plan_policy(plan, "megatron")
    out = [_f("--save", ShellExpr(CHECKPOINT_DIR)), _f("--load", ShellExpr(CHECKPOINT_DIR)),
           _f("--save-interval", max(1, min(policy.interval_steps, total)))]
    if plan.model.init is not None:
        # read only while the run's own --load folder is empty; then Megatron resets the iteration and the
        # optimizer as for fine-tuning (megatron/training/checkpointing.py:2096-2104)
        out.append(_f("--pretrained-checkpoint", ShellExpr(PRETRAINED_CHECKPOINT)))
    if plan.layout.zero_stage < 2:
        out += [_f("--ckpt-format", "torch_dist"), ["--async-save"], ["--use-persistent-ckpt-worker"],
                _f("--async-strategy", "mcore")]
    if plan.slurm.signal_seconds_before_end != 0:
        # the sbatch script asks SLURM for SIGUSR1 before the time limit: save and exit cleanly
        out += [["--exit-signal-handler"], _f("--exit-signal", "SIGUSR1")]
    return out


# ------------------------------------------------------------------------------ environment
def cuda_arch(generation: str) -> int:
    """The CUDA compute capability (major) of a GPU generation, as Megatron-Core's get_device_arch_version reads it
    (core/utils.py): Ampere and Ada 8, Hopper 9, Blackwell 10 (B300/GB300 are sm_103). Others answer 9 (the
    Hopper rules)."""
    return {"ampere": 8, "ada": 8, "hopper": 9, "blackwell": 10}.get(generation, 9)


def megatron_env(plan: Plan) -> dict[str, str | None]:
    """Environment the launch needs: CUDA_DEVICE_MAX_CONNECTIONS (None = must be unset).

    validate_args requires 1 with tp > 1 or cp > 1 below compute capability 10 (arguments.py:1413-1439)
    and forbids 1 with Megatron-FSDP (arguments.py:1143)."""
    lay = plan.layout
    if lay.zero_stage >= 2:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": None}
    if (lay.tp > 1 or lay.cp > 1) and cuda_arch(plan.cluster.generation) < 10:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return {}


def slurm_context(plan: Plan, check: Any) -> dict[str, Any]:
    """What train_megatron.sbatch needs besides the common SLURM values (compiler.targets.slurm): the
    Megatron-LM checkout and the environment of megatron_env; ``check`` validates a spec value."""
    from compiler.spec.models import PATH_RE

    env = megatron_env(plan)
    return {"megatron_dir": check("megatron_dir", plan.slurm.megatron_dir, PATH_RE),
            "megatron_core": plan.provenance.frameworks["megatron-core"],
            "env_exports": [{"name": k, "value": v} for k, v in sorted(env.items()) if v is not None],
            "env_unsets": [k for k, v in sorted(env.items()) if v is None],
            "bench_env": BENCH_STEPS_ENV, "bench_drop": list(BENCH_DROP_FLAGS),
            "bench_append": [tok for flag in BENCH_APPEND_FLAGS for tok in flag]}


def megatron_notes(plan: Plan) -> list[str]:
    """Remarks for the plan's notes (PLAN.md)."""
    lay = plan.layout
    notes = []
    if lay.zero_stage >= 2:
        strategy = "optim_grads" if lay.zero_stage == 2 else "optim_grads_params"
        notes.append(f"Megatron-LM runs zero_stage={lay.zero_stage} with Megatron-FSDP "
                     f"(--data-parallel-sharding-strategy {strategy}), which saves checkpoints in the "
                     "fsdp_dtensor format.")
    if lay.pp > 1:
        split = plan.layer_split()
        if split.split.mechanism != "even":
            notes.append(f"Megatron-LM splits the layers {split_phrase(split)}.")
    if plan.training.optimizer == "adam":
        notes.append("Megatron-LM's adam optimizer applies decoupled weight decay (AdamW).")
    if plan.training.precision == "nvfp4":
        # megatron-core 0.19.2 training/arguments.py validate_args: "--fp4-format requires Transformer Engine >=
        # 2.7.0.dev0 for NVFP4BlockScaling support"; the first Transformer Engine release with the recipe is v2.8
        # (transformer_engine/common/recipe/__init__.py NVFP4BlockScaling); TE docs nvfp4.rst: training on SM 10.0, 10.3
        notes.append("nvfp4 needs Transformer Engine 2.8 or later (NVFP4BlockScaling) and a Blackwell data-center GPU "
                     "(SM 10.0 / 10.3); Megatron-LM keeps attention and the output layer in bf16.")
    return notes


def split_phrase(split: LayerSplit) -> str:
    """'with --account-for-embedding-in-pipeline-split ...: 15, 16 x 6, 15 layers per pipeline rank'."""
    from compiler.render.report_text import grouped_counts

    flags = " ".join(tok for flag in split.split.megatron_flags() for tok in flag)
    return f"with {flags}: {grouped_counts(split.rank_layers)} layers per pipeline rank"


# ------------------------------------------------------------------------------ rendering
def megatron_context(plan: Plan) -> dict[str, Any]:
    """What megatron_args.sh shows; each token is {"text", "expand"} (expand: double-quote, no escaping)."""
    lay = plan.layout
    groups = [{"name": name,
               "flags": [[{"text": str(t), "expand": isinstance(t, ShellExpr)} for t in flag] for flag in flags]}
              for name, flags in megatron_arg_groups(plan)]
    env = megatron_env(plan)
    return {
        "header": provenance_header(plan),
        "megatron_core": plan.provenance.frameworks["megatron-core"],
        "layout": lay.describe(),
        "tag": lay.tag,
        "world_size": lay.world_size,
        "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "dp": lay.dp,
        "exports": [{"name": k, "value": v} for k, v in sorted(env.items()) if v is not None],
        "unsets": [k for k, v in sorted(env.items()) if v is None],
        "groups": groups,
    }


def init_conversion_command(plan: Plan) -> str | None:
    """The command that converts model.init for Megatron (PLAN.md shows it), or None without model.init."""
    if plan.model.init is None:
        return None
    return (f"pip install megatron-bridge=={MEGATRON_BRIDGE_VERSION} && bash {CONVERT_FILE} "
            f"(AutoBridge.import_ckpt({plan.model.init}, {PRETRAINED_DIR}))")


def render_megatron(plan: Plan) -> dict[str, str]:
    """{"megatron_args.sh": ...} for ``plan``, and convert_init.sh with model.init."""
    files = {ARGS_FILE: render_template(TEMPLATE, **megatron_context(plan))}
    if plan.model.init is not None:
        files[CONVERT_FILE] = render_template(
            "megatron/convert_init.sh.j2", header=provenance_header(plan), init=str(plan.model.init),
            output=PRETRAINED_DIR, bridge_version=MEGATRON_BRIDGE_VERSION,
            megatron_core=plan.provenance.frameworks["megatron-core"])
    return files


# ------------------------------------------------------------------------------ invariants
_ARRAY = re.compile(r"^MEGATRON_ARGS=\($(.*?)^\)$", re.S | re.M)


def megatron_flags(text: str) -> dict[str, str | bool]:
    """--flag value pairs and boolean flags of the MEGATRON_ARGS array (comments stripped)."""
    m = _ARRAY.search(text)
    tokens = shlex.split(m.group(1), comments=True) if m else []
    flags: dict[str, str | bool] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("--"):
            if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                flags[tok] = tokens[i + 1]
                i += 2
                continue
            flags[tok] = True
        i += 1
    return flags


def check_artifacts(c: Any, files: dict[str, str]) -> None:
    """megatron_args.sh's flags agree with the plan (compiler.render.invariants)."""
    text = files[ARGS_FILE]
    lay = c.plan.layout
    f = megatron_flags(text)

    def as_int(key: str, default: int) -> int:
        return int(f.get(key, default))

    c.expect("megatron_args.sh", "--tensor-model-parallel-size", as_int("--tensor-model-parallel-size", 1), lay.tp)
    c.expect("megatron_args.sh", "--pipeline-model-parallel-size", as_int("--pipeline-model-parallel-size", 1), lay.pp)
    c.expect("megatron_args.sh", "--context-parallel-size", as_int("--context-parallel-size", 1), lay.cp)
    c.expect("megatron_args.sh", "--expert-model-parallel-size", as_int("--expert-model-parallel-size", 1), lay.ep)
    c.expect("megatron_args.sh", "--expert-tensor-parallel-size",
             as_int("--expert-tensor-parallel-size", lay.tp), lay.expert_tp)
    c.expect("megatron_args.sh", "--micro-batch-size", as_int("--micro-batch-size", 0), lay.micro_batch)
    c.expect("megatron_args.sh", "--global-batch-size", as_int("--global-batch-size", 0),
             c.plan.training.global_batch)
    c.expect("megatron_args.sh", "--seq-length", as_int("--seq-length", 0), c.plan.training.seq_len)
    c.expect("megatron_args.sh", "--use-distributed-optimizer", bool(f.get("--use-distributed-optimizer")),
             lay.zero_stage == 1)
    c.expect("megatron_args.sh", "--sequence-parallel", bool(f.get("--sequence-parallel")), lay.sequence_parallel)
