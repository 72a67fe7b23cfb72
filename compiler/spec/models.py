"""The dtc spec: one YAML file per training run, validated strictly.

Every model is frozen and forbids unknown keys; every field has a description
that flows into ``dtc schema`` and schemas/spec.schema.json. Human units
(``70B``, ``15T``, ``80GiB``, ``400Gb/s``, ``$2.5M``, ``30d``) are parsed here,
once, into SI numbers.
"""
from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from compiler import units
from compiler.model import MAX_LAYERS as _MAX_LAYERS
from compiler.targets import registry as target_registry

if TYPE_CHECKING:
    from compiler.split import PipelineSplit

# ---------------------------------------------------------------------------- empty defaults


def _no_items() -> list:
    """An empty list default. A Python function, not `list`: pydantic inspects a default factory's signature,
    and for a builtin that parses its text signature with tokenize's regex (~8 ms of `dtc validate`'s start)."""
    return []


def _no_entries() -> dict:
    """An empty dict default (see _no_items)."""
    return {}


# ---------------------------------------------------------------------------- unit types


def _unit(parser, kind: str):
    def validate(value: Any) -> Any:
        try:
            return parser(value)
        except units.UnitError as exc:
            raise PydanticCustomError(
                "dtc_unit", "expected {kind}", {"kind": kind, "expected": exc.expected, "reason": str(exc)}
            ) from None

    return BeforeValidator(validate, json_schema_input_type=int | float | str)


def _int_only(value: Any) -> Any:
    """Reject floats and booleans where a whole count is meant (YAML `8.0`, `yes`)."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise PydanticCustomError("dtc_int", "expected a whole number", {"expected": "a whole number such as 8"})
    return value


Count = Annotated[int, _unit(units.parse_count, "a count"), Field(json_schema_extra={"examples": ["70B", "15T", 8192]})]
Bytes = Annotated[int, _unit(units.parse_bytes, "a size in bytes"), Field(json_schema_extra={"examples": ["80GiB"]})]
Bandwidth = Annotated[float, _unit(units.parse_bandwidth, "a bandwidth"), Field(json_schema_extra={"examples": ["400Gb/s", "900GB/s"]})]
Flops = Annotated[float, _unit(units.parse_flops, "a FLOP rate"), Field(json_schema_extra={"examples": ["989TFLOPS"]})]
Money = Annotated[float, _unit(units.parse_money, "an amount of money"), Field(json_schema_extra={"examples": ["$2.5M", 2.49]})]
Duration = Annotated[float, _unit(units.parse_duration, "a duration"), Field(json_schema_extra={"examples": ["30d", "12h"]})]
PLAN_DATA = "plan_data"  # validation context: values read back from plan.json (already in SI units)


def _time_limit(value: Any, info: ValidationInfo) -> Any:
    """A spec's time limit: a duration or SLURM's own forms (48:00:00, 2-00:00:00), but not a bare number
    (SLURM reads minutes, a dtc duration seconds); plan.json holds whole seconds."""
    if info.context and info.context.get(PLAN_DATA) and isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return math.ceil(units.parse_slurm_time(value))
    except units.UnitError as exc:
        raise PydanticCustomError(
            "dtc_unit", "expected {kind}", {"kind": "a time limit", "expected": exc.expected, "reason": str(exc)}
        ) from None


# SLURM takes whole seconds (D-HH:MM:SS): a time limit is rounded up once, here, and exact from then on.
WholeSeconds = Annotated[int, BeforeValidator(_time_limit, json_schema_input_type=str),
                         Field(json_schema_extra={"examples": ["4d", "48h", "48:00:00", "2-00:00:00"]})]
PosInt = Annotated[int, BeforeValidator(_int_only), Field(ge=1, le=10_000_000)]
NonNegInt = Annotated[int, BeforeValidator(_int_only), Field(ge=0, le=10_000_000)]

# Upper bounds far beyond any real run, so that a typo (`tokens: 15e30`) is an error, not an
# integer the solver chokes on; lower bounds where zero would be a division by zero.
MAX_PARAMS = 10**14  # 100T
MAX_TOKENS = 10**16  # 10 quadrillion
# Dimensions the solver's work grows with (issue #16: every one capped, so that one spec costs
# seconds, never minutes): the layer count (pipeline splits: pp and vpp range over it) and the
# micro-batch (every micro-batch size up to the cap is a candidate when the batch has a
# tolerance). Both are far beyond any published run (deepest: DeepNet, 1,000 layers; Megatron
# and Llama runs use micro-batches of 1-16 sequences).
MAX_LAYERS = _MAX_LAYERS  # (compiler.model's: every ModelShape holds it)
MAX_PIPELINE_PARALLEL = 128  # pipeline stages (the deepest published: 64, Narayanan et al. 2021's 1T model)
MAX_MICRO_BATCH = 256  # sequences per GPU per micro-step
ParamCount = Annotated[Count, Field(le=MAX_PARAMS)]
TokenCount = Annotated[Count, Field(ge=0, le=MAX_TOKENS)]
PosBytes = Annotated[Bytes, Field(ge=2**30, le=2**50)]  # GPU memory: 1 GiB to 1 PiB
# Lower bounds far below any real part (1 MB/s, 1 GFLOP/s) but high enough that every time the cost
# model derives stays finite (1e-300 FLOP/s overflowed to infinity: issue #16).
PosBandwidth = Annotated[Bandwidth, Field(ge=10**6, le=1e15)]  # 1 MB/s to 1 PB/s
PosFlops = Annotated[Flops, Field(ge=10**9, le=1e18)]  # 1 GFLOP/s to 1 EFLOP/s per GPU
Price = Annotated[Money, Field(ge=0, le=1e6)]  # dollars per GPU-hour
Budget = Annotated[Money, Field(gt=0, le=1e13)]
PosDuration = Annotated[Duration, Field(gt=0, le=100 * 365 * 86400)]  # at most a century
GpuName = Annotated[str, Field(min_length=1, max_length=64)]
MemoryHeadroom = Annotated[float, Field(ge=0.0, le=0.5)]  # fraction of HBM kept free (search.memory_headroom)

# Names that reach shell scripts and file names are restricted to what SLURM and the shell
# accept unquoted; everything is also shell-quoted when rendered.
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
SLURM_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$"
MODULE_RE = r"^[A-Za-z0-9][A-Za-z0-9._+/-]{0,127}$"
IMAGE_RE = r"^[A-Za-z0-9][A-Za-z0-9._:/@#+-]{0,255}$"
ENV_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# Not a leading '-' (a path would read as an option of cd, torchrun or srun) nor '~' (values are
# quoted, so the shell would not expand it).
PATH_RE = r"^[A-Za-z0-9_./%+=@:][A-Za-z0-9_./%~+=@:,-]{0,1023}$"


# Variables bash itself reads, sets or gives special meaning (bash 5.2 manual, "Shell Variables":
# the Bourne shell and Bash variables, plus what `env -i bash -c 'compgen -v'` lists). Assigning
# one of them is never a plain assignment: the integer ones (RANDOM, SECONDS, OPTIND, LINENO,
# HISTCMD, COLUMNS, ...) evaluate the value as arithmetic, which runs `$(...)` inside an array
# subscript even from a single-quoted string; UID, EUID, PPID, ... are read-only (the script dies);
# others change how bash reads the rest of the script (IFS, ENV, PS4, ...). None may be set.
BASH_VARIABLE_NAMES = frozenset({
    # Bourne shell variables
    "CDPATH", "HOME", "IFS", "MAIL", "MAILPATH", "OPTARG", "OPTIND", "PATH", "PS1", "PS2",
    # Bash variables
    "BASH", "BASHOPTS", "BASHPID", "BASH_ALIASES", "BASH_ARGC", "BASH_ARGV", "BASH_ARGV0", "BASH_CMDS",
    "BASH_COMMAND", "BASH_COMPAT", "BASH_ENV", "BASH_EXECUTION_STRING", "BASH_LINENO", "BASH_LOADABLES_PATH",
    "BASH_REMATCH", "BASH_SOURCE", "BASH_SUBSHELL", "BASH_VERSINFO", "BASH_VERSION", "BASH_XTRACEFD",
    "CHILD_MAX", "COLUMNS", "COMP_CWORD", "COMP_KEY", "COMP_LINE", "COMP_POINT", "COMP_TYPE",
    "COMP_WORDBREAKS", "COMP_WORDS", "COMPREPLY", "COPROC", "DIRSTACK", "EMACS", "ENV", "EPOCHREALTIME",
    "EPOCHSECONDS", "EUID", "EXECIGNORE", "FCEDIT", "FIGNORE", "FUNCNAME", "FUNCNEST", "GLOBIGNORE",
    "GROUPS", "HISTCMD", "HISTCONTROL", "HISTFILE", "HISTFILESIZE", "HISTIGNORE", "HISTSIZE",
    "HISTTIMEFORMAT", "HOSTFILE", "HOSTNAME", "HOSTTYPE", "IGNOREEOF", "INPUTRC", "INSIDE_EMACS", "LANG",
    "LC_ALL", "LC_COLLATE", "LC_CTYPE", "LC_MESSAGES", "LC_NUMERIC", "LC_TIME", "LINENO", "LINES",
    "MACHTYPE", "MAILCHECK", "MAPFILE", "OLDPWD", "OPTERR", "OSTYPE", "PIPESTATUS", "POSIXLY_CORRECT",
    "PPID", "PROMPT_COMMAND", "PROMPT_DIRTRIM", "PS0", "PS3", "PS4", "PWD", "RANDOM", "READLINE_ARGUMENT",
    "READLINE_LINE", "READLINE_MARK", "READLINE_POINT", "REPLY", "SECONDS", "SHELL", "SHELLOPTS", "SHLVL",
    "SRANDOM", "TIMEFORMAT", "TMOUT", "TMPDIR", "UID", "auto_resume", "histchars", "TERM", "_",
})
# Prefixes of bash's own families (BASH_*, completion, readline) and of what SLURM and dtc own.
RESERVED_ENV_PREFIXES = ("BASH", "COMP_", "READLINE_", "SLURM_", "SRUN_", "SBATCH_", "DTC_")

# Environment variables a spec may not set: bash's own (above), the generated scripts' own
# variables, and inputs the scripts read from SLURM and the launcher; overriding them would make
# the job run something other than the plan. (tests/test_injection.py checks that every variable
# the rendered scripts use is here or is a plain tuning knob, and runs every bash variable as a
# name under a canary.)
RESERVED_ENV_NAMES = BASH_VARIABLE_NAMES | frozenset({
    # the generated scripts' own variables
    "ARTIFACT_DIR", "MEGATRON_DIR", "MEGATRON_ARGS", "NPROC_PER_NODE", "MASTER_ADDR", "MASTER_PORT",
    "status", "step_pid", "got_usr1", "omp_threads", "CONTAINER_MOUNTS", "artifact_dir", "submitted", "needed",
    "megatron_dir_default", "script", "bench_args", "dropping", "arg",
    # what the launchers hand to each process
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
})


def env_name_problem(name: str) -> str | None:
    """Why ``name`` may not be set by slurm.environment, or None: the one rule the spec and the
    SLURM renderer both apply (a name must match ENV_NAME_RE and be none of the reserved names)."""
    if not re.fullmatch(ENV_NAME_RE, name):
        return f"an environment variable name must match {ENV_NAME_RE}"
    if name in BASH_VARIABLE_NAMES or name.upper().startswith(RESERVED_ENV_PREFIXES[:3]):
        return "the name is one of bash's own variables (assigning it is not a plain assignment)"
    if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
        return "the name is reserved (the generated scripts rely on it)"
    return None


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=False, defer_build=True)


# ---------------------------------------------------------------------------- model


class MoESpec(_Strict):
    """Mixture-of-experts MLP layers."""

    num_experts: PosInt = Field(description="Routed experts per MoE layer.")
    top_k: PosInt = Field(description="Experts each token is routed to.")
    expert_ffn_hidden_size: PosInt = Field(description="FFN hidden size of one routed expert.")
    num_shared_experts: NonNegInt = Field(0, description="Always-active shared experts per MoE layer (DeepSeek).")
    shared_expert_ffn_hidden_size: NonNegInt = Field(0, description="FFN hidden size of one shared expert; 0 means expert_ffn_hidden_size.")
    first_dense_layers: NonNegInt = Field(0, description="The first k layers use a dense MLP (DeepSeek-V3: 3).")
    layer_freq: PosInt = Field(1, description="Every n-th layer after the dense ones is an MoE layer (1: all).")

    @model_validator(mode="after")
    def _check(self) -> "MoESpec":
        if self.top_k > self.num_experts:
            raise PydanticCustomError(
                "dtc_rule", "top_k must be at most num_experts ({n})",
                {"n": self.num_experts, "field": "top_k", "value": self.top_k,
                 "hint": "lower top_k or add experts"})
        return self


class ModelSpec(_Strict):
    """The model: a catalog preset, a bare size, or an explicit shape.

    Give exactly one of ``preset``, ``params`` or the shape fields (``num_layers``,
    ``hidden_size``, ``num_attention_heads`` and the rest). Shape fields given
    with ``preset`` override the preset's. ``params`` alone derives a
    Llama-3-style dense shape (the rule is in the README).
    """

    preset: GpuName | None = Field(None, description="A model from the catalog, e.g. llama3-70b (see `dtc catalog`).")
    params: ParamCount | None = Field(None, description="Just a size, e.g. 70B: dtc derives a dense Llama-3-style shape.")
    num_layers: Annotated[PosInt, Field(le=MAX_LAYERS)] | None = Field(None, description=f"Transformer layers (at most {MAX_LAYERS}).")
    hidden_size: PosInt | None = Field(None, description="Model (embedding) width.")
    ffn_hidden_size: PosInt | None = Field(None, description="MLP hidden width (per matrix; SwiGLU uses three).")
    num_attention_heads: PosInt | None = Field(None, description="Query heads.")
    num_kv_heads: PosInt | None = Field(None, description="Key/value heads (GQA); default: num_attention_heads (MHA).")
    head_dim: PosInt | None = Field(None, description="Per-head width; default hidden_size / num_attention_heads.")
    vocab_size: PosInt | None = Field(None, description="Vocabulary size.")
    mlp: Literal["swiglu", "gelu", "quick_geglu"] | None = Field(
        None, description="MLP type: swiglu (3 matrices), gelu (2), or quick_geglu (3: gpt-oss's gated "
                          "x*sigmoid(1.702x), clamped at 7, +1 on the linear half).")
    norm: Literal["rmsnorm", "layernorm"] | None = Field(None, description="Normalisation layer.")
    position: Literal["rope", "learned"] | None = Field(None, description="Position embedding type.")
    max_position_embeddings: PosInt | None = Field(None, description="Learned position table size (learned positions only).")
    tied_embeddings: bool | None = Field(None, description="Share the input embedding and output layer weights.")
    attention_bias: bool | None = Field(None, description="Biases on the q/k/v projections (Qwen).")
    linear_bias: bool | None = Field(None, description="Biases on every linear layer (GPT-2/3 style).")
    window_size: Annotated[int, Field(ge=0, le=1 << 24)] | None = Field(
        None, description="Sliding-window attention: a windowed layer's query sees itself and this many keys "
                          "before it (gpt-oss: 128); 0: full causal attention everywhere.")
    full_attention_every: Annotated[int, Field(ge=0, le=MAX_LAYERS)] | None = Field(
        None, description="With window_size: every n-th layer attends fully, the rest through the window "
                          "(gpt-oss: 2, alternating); 0: every layer is windowed.")
    attention_sinks: bool | None = Field(
        None, description="A learnable softmax offset per attention head (gpt-oss's attention sinks).")
    moe: MoESpec | None = Field(None, description="Mixture-of-experts settings; absent for a dense model.")
    init: str | None = Field(
        None, pattern=PATH_RE,
        description="Start from these weights: a local Hugging Face Llama-architecture folder (config.json + "
                    "safetensors), loaded sharded by the FSDP2 and DeepSpeed trainers; absent: random init.")

    def shape_fields(self) -> dict[str, Any]:
        """The explicitly given shape fields (not preset/params/init)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("preset", "params", "init") and v is not None}


# ---------------------------------------------------------------------------- training


class TrainingSpec(_Strict):
    """What to train: tokens, sequence length, batch, precision, optimizer."""

    tokens: TokenCount = Field(description="Total training tokens, e.g. 15T.")
    sequence_length: PosInt = Field(description="Tokens per sequence, e.g. 8192.")
    global_batch: PosInt | Annotated[str, Field(max_length=64)] = Field(
        description="Global batch per optimizer step: sequences (2048) or tokens ('16M tokens', '4Mi tokens'); a "
                    "token batch is a target: dtc uses the count of sequences within 5% of it that splits best "
                    "(the most factors of two) and says so in the plan.")
    global_batch_tolerance: float = Field(
        0.0, ge=0.0, le=0.5,
        description="Allowed relative deviation of the global batch (in sequences; for a token batch, of the count "
                    "dtc chose), so the solver may round it to fit a layout (0: exact).")
    precision: Literal["bf16", "fp16", "fp8", "nvfp4", "fp32"] = Field(
        "bf16", description="Training precision: bf16/fp16 mixed precision with fp32 master weights, fp8 (Transformer Engine, bf16 elsewhere), "
                            "nvfp4 (Transformer Engine NVFP4 GEMMs on Blackwell, Megatron only; bf16 elsewhere), or fp32.")
    optimizer: Literal["adamw", "adam", "sgd"] = Field("adamw", description="Optimizer (adam/adamw keep two fp32 states, sgd one momentum).")
    learning_rate: Annotated[float, Field(gt=0, le=10)] | None = Field(
        None, description="Peak learning rate; default: the published recipe for the model's size "
                          "(compiler/data/recipes.yaml: GPT-3, Llama 2, Llama 3).")
    min_learning_rate: Annotated[float, Field(ge=0, le=10)] | None = Field(
        None, description="Final learning rate of the cosine decay; default: the peak times the recipe's final ratio.")
    warmup_tokens: TokenCount = Field(0, description="Linear warm-up length in tokens (0: 1% of training).")
    weight_decay: float = Field(0.1, ge=0, le=10, description="Decoupled weight decay.")
    grad_clip: float = Field(1.0, ge=0, le=1e6, description="Gradient-norm clipping threshold (0: off).")
    adam_beta1: float = Field(0.9, gt=0, lt=1, description="Adam beta1.")
    adam_beta2: float = Field(0.95, gt=0, lt=1, description="Adam beta2.")
    seed: NonNegInt = Field(1234, description="Random seed written into every artifact.")

    @model_validator(mode="after")
    def _check(self) -> "TrainingSpec":
        if (self.min_learning_rate is not None and self.learning_rate is not None
                and self.min_learning_rate > self.learning_rate):
            raise PydanticCustomError(
                "dtc_rule", "min_learning_rate must not exceed learning_rate ({lr})",
                {"lr": self.learning_rate, "field": "min_learning_rate", "value": self.min_learning_rate,
                 "hint": "lower min_learning_rate"})
        if self.tokens < self.sequence_length:
            raise PydanticCustomError(
                "dtc_rule", "tokens must be at least one sequence ({s})",
                {"s": self.sequence_length, "field": "tokens", "value": self.tokens,
                 "hint": "write tokens with a unit, e.g. 15T"})
        return self


# ---------------------------------------------------------------------------- data


class DatasetSpec(_Strict):
    """One tokenized dataset of the blend."""

    path: str = Field(pattern=PATH_RE, description="Dataset prefix written by `dtc data prepare` (PREFIX.bin and "
                                                   "PREFIX.idx, Megatron's indexed format), as the jobs see it.")
    weight: float = Field(1.0, gt=0, le=1e9, description="Blend weight, relative to the other datasets.")


class DataSpec(_Strict):
    """What to train on: prepared datasets with blend weights and the tokenizer that made them, or
    the synthetic task (only when asked for: PLAN.md then says so in its first lines)."""

    datasets: list[DatasetSpec] = Field(default_factory=_no_items, max_length=1024,
                                        description="Prepared datasets (`dtc data prepare`), blended by weight.")
    tokenizer: str | None = Field(
        None, pattern=PATH_RE,
        description="The tokenizer the datasets were prepared with: a local Hugging Face tokenizer folder, or a "
                    "tiktoken / SentencePiece model file (Megatron's --tokenizer-model).")
    synthetic: bool = Field(False, description="Train on a synthetic task instead of data (smoke tests, benchmarks).")

    @model_validator(mode="after")
    def _check(self) -> "DataSpec":
        if self.synthetic and (self.datasets or self.tokenizer):
            raise PydanticCustomError(
                "dtc_rule", "synthetic: true takes no datasets or tokenizer",
                {"field": "synthetic", "value": True, "hint": "remove synthetic, or remove datasets and tokenizer"})
        if not self.synthetic and not self.datasets:
            raise PydanticCustomError(
                "dtc_rule", "data needs datasets (prepared with `dtc data prepare`) or synthetic: true",
                {"field": "datasets", "value": [], "hint": "add datasets: [{path: /data/corpus_text_document}]"})
        if self.datasets and self.tokenizer is None:
            raise PydanticCustomError(
                "dtc_rule", "datasets need the tokenizer that prepared them",
                {"field": "tokenizer", "value": None, "hint": "add tokenizer: /path/to/tokenizer (a folder or file)"})
        return self


# ---------------------------------------------------------------------------- cluster


class CustomGpuSpec(_Strict):
    """A GPU that is not in the catalog, described by its datasheet numbers."""

    name: str = Field(pattern=NAME_RE, description="A name for reports.")
    generation: Literal["ampere", "hopper", "blackwell", "cdna3", "ada"] = Field(
        description="Architecture generation; selects the achievable-efficiency curve.")
    bf16_flops: PosFlops = Field(description="Dense bf16 peak, e.g. 989TFLOPS.")
    fp8_flops: PosFlops | None = Field(None, description="Dense fp8 peak; absent if unsupported.")
    fp4_flops: PosFlops | None = Field(None, description="Dense fp4 peak (nvfp4 training); absent if unsupported.")
    fp32_flops: PosFlops | None = Field(None, description="Dense fp32 (TF32 tensor-core) peak; default bf16_flops / 2.")
    hbm: PosBytes = Field(description="Memory per GPU, e.g. 80GiB.")
    hbm_bandwidth: PosBandwidth = Field(description="Memory bandwidth, e.g. 3.35TB/s.")
    intra_node_bandwidth: PosBandwidth = Field(description="GPU-to-GPU bandwidth inside a node, per direction.")
    inter_node_bandwidth: PosBandwidth = Field(description="Network bandwidth per GPU, per direction, e.g. 400Gb/s.")
    pcie_bandwidth: PosBandwidth = Field("64GB/s", validate_default=True, description="Host link per direction (offload traffic).")
    price_per_gpu_hour: Price = Field(description="Dollars per GPU-hour.")


class NetworkSpec(_Strict):
    """Overrides of the catalog's link bandwidths (per GPU, per direction)."""

    intra_node_bandwidth: PosBandwidth | None = Field(None, description="NVLink/xGMI bandwidth per GPU per direction.")
    inter_node_bandwidth: PosBandwidth | None = Field(None, description="Network bandwidth per GPU per direction, e.g. 400Gb/s.")


class ClusterSpec(_Strict):
    """Where it runs."""

    gpu: GpuName | Annotated[list[GpuName], Field(max_length=16)] | CustomGpuSpec = Field(
        description="GPU type from the catalog (h100-sxm), a list to choose from, or a custom GPU.")
    gpus_per_node: Annotated[PosInt, Field(le=1024)] | None = Field(None, description="GPUs per node; default from the catalog (8 for HGX).")
    num_gpus: PosInt | None = Field(None, description="Use exactly this many GPUs.")
    max_gpus: PosInt | None = Field(None, description="Use at most this many GPUs (whole nodes). A spec gives this, "
                                   "num_gpus, budget.max_cost or budget.deadline; with only a budget or deadline the "
                                   "search goes up to 16384.")
    min_gpus: PosInt | None = Field(None, description="Use at least this many GPUs.")
    price_per_gpu_hour: Price | None = Field(None, description="Dollars per GPU-hour; default from the catalog.")
    network: NetworkSpec | None = Field(None, description="Link bandwidth overrides.")
    host_memory: PosBytes | None = Field(None, description="Host (CPU) memory per node, e.g. 2TiB: offloaded "
                                         "optimizer states and parameters must fit in it; default from the "
                                         "catalog's reference system.")
    profile: Annotated[str, Field(min_length=1, max_length=4096)] | None = Field(
        None, description="A cluster profile written by `dtc calibrate` (path relative to this spec): the cost "
                          "model's fitted constants measured on this cluster.")

    @model_validator(mode="after")
    def _check(self) -> "ClusterSpec":
        if self.num_gpus is not None and (self.max_gpus is not None or self.min_gpus is not None):
            raise PydanticCustomError(
                "dtc_rule", "give num_gpus, or min_gpus/max_gpus, not both",
                {"field": "num_gpus", "value": self.num_gpus, "hint": "remove num_gpus to let the solver choose"})
        if self.min_gpus is not None and self.max_gpus is not None and self.min_gpus > self.max_gpus:
            raise PydanticCustomError(
                "dtc_rule", "min_gpus must not exceed max_gpus ({m})",
                {"m": self.max_gpus, "field": "min_gpus", "value": self.min_gpus, "hint": "raise max_gpus"})
        if isinstance(self.gpu, list) and not self.gpu:
            raise PydanticCustomError("dtc_rule", "gpu list must not be empty",
                                      {"field": "gpu", "value": [], "hint": "name at least one GPU, e.g. h100-sxm"})
        return self


# ---------------------------------------------------------------------------- budget


class BudgetSpec(_Strict):
    """Limits and what to optimise."""

    max_cost: Budget | None = Field(None, description="Dollar budget for the whole run, e.g. $2.5M.")
    deadline: PosDuration | None = Field(None, description="Wall-clock limit for the whole run, e.g. 60d.")
    objective: Literal["fastest", "cheapest", "throughput"] = Field(
        "fastest",
        description="fastest: least time to train within the budget; cheapest: least cost within the deadline "
                    "(costs within 1% of the cheapest are ties, and the fastest of them wins); throughput: most "
                    "tokens/s per GPU on the given GPUs.")
    confidence: Literal["expected", "p80", "p90"] = Field(
        "p80",
        description="Which step time the objective ranks layouts by: p80 (the time 8 runs in 10 beat, from "
                    "the 80% band every estimate carries: the published runs of the layout's regime), p90 (the "
                    "band's upper end), or expected (the cost model's point estimate). A layout in a regime "
                    "no published run covers has a wide band, so it must beat a well-calibrated one by more "
                    "than its uncertainty.")


# ---------------------------------------------------------------------------- layout


class PipelineSplitSpec(_Strict):
    """One of Megatron's pipeline split mechanisms (compiler/split.py); give exactly one of them."""

    account: list[Literal["embedding", "loss"]] | None = Field(
        None, min_length=1, max_length=2, description="Count the embedding and/or the loss as one layer each "
        "(--account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split).")
    first: PosInt | None = Field(None, description="Layers on the first pipeline stage "
                                                   "(--decoder-first-pipeline-num-layers).")
    last: PosInt | None = Field(None, description="Layers on the last pipeline stage (--decoder-last-pipeline-num-layers).")
    layout: str | None = Field(None, max_length=10_000, description="An explicit --pipeline-model-parallel-layout, "
                               "e.g. 'Et|(tt|)*62,tL': E embedding, t a decoder layer, L the loss, | between chunks.")

    @model_validator(mode="after")
    def _check(self) -> "PipelineSplitSpec":
        given = [k for k in ("account", "first", "layout") if getattr(self, k) is not None] + \
            (["last"] if self.last is not None and self.first is None else [])
        if len(given) != 1 or (self.last is not None and self.first is None and "account" in given):
            raise PydanticCustomError(
                "dtc_rule", "pipeline_split takes exactly one mechanism: account, first/last or layout",
                {"field": given[-1] if given else "layout", "value": ", ".join(given) or "none",
                 "hint": "e.g. {account: [embedding, loss]}, {first: 7, last: 7} or {layout: 'Et|(tt|)*62,tL'}"})
        if self.layout is not None:
            from compiler.split import SplitError, parse_layout_string

            try:
                parse_layout_string(self.layout)
            except SplitError as exc:
                raise PydanticCustomError("dtc_rule", "{why}", {"why": str(exc), "field": "layout",
                                                                 "value": self.layout,
                                                                 "hint": "E first, L last, t per decoder layer, | "
                                                                         "between chunks"}) from None
        return self

    def to_split(self) -> "PipelineSplit":
        from compiler.split import PipelineSplit, parse_layout_string

        if self.account is not None:
            return PipelineSplit("account", embedding="embedding" in self.account, loss="loss" in self.account)
        if self.layout is not None:
            return PipelineSplit("layout", chunks=parse_layout_string(self.layout))
        return PipelineSplit("uneven", first=self.first or 0, last=self.last or 0)


class LayoutSpec(_Strict):
    """Optional pins; whatever is absent is searched by the solver."""

    tensor_parallel: PosInt | None = Field(None, description="Tensor-parallel degree (tp).")
    pipeline_parallel: Annotated[PosInt, Field(le=MAX_PIPELINE_PARALLEL)] | None = Field(
        None, description=f"Pipeline-parallel degree (pp), at most {MAX_PIPELINE_PARALLEL}.")
    virtual_pipeline_stages: PosInt | None = Field(None, description="Model chunks per pipeline rank (interleaved 1F1B when > 1).")
    pipeline_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] | None = Field(None, description="Pipeline schedule.")
    context_parallel: PosInt | None = Field(None, description="Context-parallel degree (cp): the sequence split across GPUs.")
    expert_parallel: PosInt | None = Field(None, description="Expert-parallel degree (ep), MoE only; carved out of data parallel.")
    expert_tensor_parallel: PosInt | None = Field(
        None, description="Expert tensor-parallel degree (etp), MoE only: how the expert layers split each expert "
                          "(Megatron --expert-tensor-parallel-size; default tensor_parallel). Below tensor_parallel, "
                          "the experts see whole sequence-parallel shards and ep x etp divides tp x dp x cp.")
    data_parallel: PosInt | None = Field(None, description="Data-parallel degree (dp = dp_replicate x dp_shard).")
    data_parallel_shard: PosInt | None = Field(
        None, description="ZeRO/FSDP sharding group size; less than data_parallel means hybrid sharding (HSDP).")
    zero_stage: Literal[0, 1, 2, 3] | None = Field(
        None, description="0: replicate (DDP); 1: shard optimizer states (Megatron distributed optimizer); "
                          "2: + gradients (FSDP SHARD_GRAD_OP); 3: + parameters (FSDP FULL_SHARD / HYBRID_SHARD).")
    micro_batch_size: Annotated[PosInt, Field(le=MAX_MICRO_BATCH)] | None = Field(
        None, description=f"Sequences per GPU per micro-step, at most {MAX_MICRO_BATCH} (a larger batch runs as more "
                          "micro-batches).")
    recompute: Literal["none", "selective", "full"] | None = Field(
        None, description="Activation recomputation: none, selective (attention core, Korthikanti et al. 2022) or full.")
    sequence_parallel: bool | None = Field(None, description="Megatron sequence parallelism (with tp > 1).")
    offload_optimizer: Literal["none", "cpu", "nvme"] | None = Field(None, description="Where optimizer states live.")
    offload_params: Literal["none", "cpu", "nvme"] | None = Field(None, description="Where parameters live (ZeRO-3 only).")
    pipeline_split: Literal["even"] | PipelineSplitSpec | None = Field(
        None, description="How Megatron splits the layers over the pipeline stages (default: the most balanced split "
                          "Megatron can build); 'even', or one mechanism: account, first/last or layout.")

    def split(self) -> "PipelineSplit | None":
        """The pinned split mechanism (compiler.split), or None."""
        if self.pipeline_split is None:
            return None
        if self.pipeline_split == "even":
            from compiler.split import PipelineSplit

            return PipelineSplit()
        return self.pipeline_split.to_split()


# ---------------------------------------------------------------------------- search


class SearchSpec(_Strict):
    """Solver settings."""

    memory_headroom: MemoryHeadroom = Field(
        0.05, description="Fraction of HBM kept free on top of the modelled allowances.")
    allow_cross_node_tp: bool = Field(False, description="Allow tensor parallel groups to span nodes.")
    top_k: PosInt = Field(5, le=50, description="Alternatives kept in the plan.")


# ---------------------------------------------------------------------------- slurm


class SlurmSpec(_Strict):
    """SLURM job settings for the sbatch scripts. Values are validated and shell-quoted."""

    job_name: str | None = Field(None, pattern=NAME_RE, description="Job name; default: the spec's name.")
    partition: str | None = Field(None, pattern=SLURM_NAME_RE, description="Partition (-p).")
    account: str | None = Field(None, pattern=SLURM_NAME_RE, description="Account (-A).")
    qos: str | None = Field(None, pattern=SLURM_NAME_RE, description="Quality of service (--qos).")
    time_limit: Annotated[WholeSeconds, Field(gt=0, le=3650 * 86400)] | None = Field(None, description="Per-job time limit (SLURM --time): 24h, 4d, or SLURM's own 48:00:00 or 2-00:00:00.")
    cpus_per_task: PosInt | None = Field(None, le=1024, description="CPUs per training process (per GPU); default: 96 cores (the smallest common 8-GPU node) split over the node's GPUs.")
    exclusive: bool = Field(True, description="Request whole nodes (--exclusive).")
    output_dir: str | None = Field(None, pattern=PATH_RE, description="Folder for the job logs (relative to the submit directory; it must exist when you submit); default: the submit directory.")
    requeue: bool = Field(True, description="Requeue the job on node failure or preemption (--requeue).")
    checkpoint_write_bandwidth: PosBandwidth | None = Field(
        None, description="Sustained write bandwidth of the checkpoint storage per node, e.g. 2GB/s; default: 1 GB/s "
                          "(Llama 3's Tectonic store, 2 TB/s over 2,048 nodes). Sizes the signal lead and the save "
                          "interval.")
    signal_seconds_before_end: Annotated[NonNegInt, Field(le=65535)] | None = Field(
        None, description="Send SIGUSR1 this many seconds before the time limit, to checkpoint (0: off); default: one "
                          "step plus twice the checkpoint's write time plus a minute (PLAN.md's checkpoint table).")
    launcher: Literal["torchrun", "deepspeed", "srun"] | None = Field(
        None, description="Launcher of the primary train.sbatch; default: the first target's own launcher.")
    container_image: str | None = Field(None, pattern=IMAGE_RE, description="Container image for pyxis/enroot (srun --container-image).")
    container_mounts: list[Annotated[str, Field(pattern=PATH_RE)]] = Field(
        default_factory=_no_items, description="Container mounts, SRC:DST.")
    modules: list[Annotated[str, Field(pattern=MODULE_RE)]] = Field(default_factory=_no_items, description="Environment modules to load.")
    environment: dict[Annotated[str, Field(pattern=ENV_NAME_RE)], Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=_no_entries, description="Extra environment variables exported in the script.")
    rdzv_port: PosInt = Field(29500, le=65535, description="Rendezvous / master port.")
    workdir: str | None = Field(None, pattern=PATH_RE, description="cd here before launching.")
    megatron_dir: str = Field("/opt/Megatron-LM", pattern=PATH_RE, description="Megatron-LM checkout holding pretrain_gpt.py (inside the container, if any); the job's MEGATRON_DIR overrides it.")
    train_script: str | None = Field(
        None, pattern=PATH_RE, description="Your training entry for torchrun/deepspeed; default: the generated fsdp_train.py / ds_train.py.")

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("data_path") is not None:  # superseded by the data: section
            raise PydanticCustomError(
                "dtc_rule", "retired: the data: section names the datasets for every target",
                {"field": "data_path", "value": data["data_path"], "at_key": True,
                 "hint": "move it to data: {tokenizer: /path/to/tokenizer, datasets: [{path: PREFIX}]} "
                         "(prepared by `dtc data prepare`) and remove slurm.data_path"})
        if isinstance(data, dict) and "data_path" in data:  # a plan.json written before it was retired: null
            data = {k: v for k, v in data.items() if k != "data_path"}
        return data

    @model_validator(mode="after")
    def _check(self) -> "SlurmSpec":
        for key, value in self.environment.items():
            problem = env_name_problem(key)
            if problem is not None:
                raise PydanticCustomError(
                    "dtc_rule", problem,
                    {"field": "environment", "key": key, "value": key, "at_key": True,
                     "hint": "remove it; SLURM, shell and launcher settings come from the other slurm fields"})
            if "\n" in value or "\r" in value or "\x00" in value:
                raise PydanticCustomError(
                    "dtc_rule", "environment values must be one line",
                    {"field": "environment", "key": key, "value": value, "hint": f"remove the newline from {key}"})
        for item in self.container_mounts:
            if ".." in item.split("/"):
                raise PydanticCustomError("dtc_rule", "container mounts must not use '..'",
                                          {"field": "container_mounts", "value": item, "hint": "use absolute paths"})
        return self


ALL_TARGETS: tuple[str, ...] = target_registry.names()  # compiler/targets/registry.py
# a Literal built at run time from the registry (one home for the names): pydantic reads it, mypy cannot
TargetName = Literal[ALL_TARGETS]  # type: ignore[valid-type]


class Spec(_Strict):
    """A dtc spec: one training run."""

    name: str = Field(pattern=NAME_RE, description="Run name; also the generated/ folder name and the SLURM job name.")
    description: str | None = Field(None, max_length=2000, description="Free text for PLAN.md.")
    model: ModelSpec = Field(description="The model.")
    training: TrainingSpec = Field(description="What to train.")
    data: DataSpec | None = Field(
        None, description="Training data (prepared datasets and their tokenizer) or synthetic: true.")
    cluster: ClusterSpec = Field(description="Where it runs.")
    budget: BudgetSpec = Field(default_factory=BudgetSpec, description="Money, time and the objective.")
    layout: LayoutSpec = Field(default_factory=LayoutSpec, description="Pinned layout knobs; the rest is solved.")
    search: SearchSpec = Field(default_factory=SearchSpec, description="Solver settings.")
    targets: list[TargetName] = Field(
        default_factory=lambda: list(ALL_TARGETS), min_length=1,
        description=f"Artifacts to emit: {', '.join(ALL_TARGETS)}.")
    slurm: SlurmSpec = Field(default_factory=SlurmSpec, description="SLURM settings for the sbatch scripts.")

    @model_validator(mode="after")
    def _check(self) -> "Spec":
        if len(set(self.targets)) != len(self.targets):
            raise PydanticCustomError("dtc_rule", "targets must not repeat",
                                      {"field": "targets", "value": self.targets, "hint": "list each target once"})
        launched = [t.name for t in target_registry.targets() if t.slurm is not None]
        launchers = [t for t in self.targets if target_registry.get(t).launches_others]
        if launchers and not set(self.targets) & set(launched):
            raise PydanticCustomError(
                "dtc_rule", "slurm needs a framework target to launch",
                {"field": "targets", "value": self.targets, "hint": f"add {', '.join(launched[:-1])} or {launched[-1]}"})
        return self


def parse_global_batch(value: int | str) -> tuple[str, int]:
    """('sequences', n) or ('tokens', n) from 2048, '2048 sequences', '16M tokens' or '4Mi tokens'.

    A number with a size suffix and no unit ('4M') is refused: 4M sequences is 4,000 times a usual
    batch, and '4M' almost always means tokens."""
    expected = "2048 (sequences), '2048 sequences', '16M tokens' or '4Mi tokens'"
    if isinstance(value, int):
        return "sequences", value
    m = re.fullmatch(r"\s*(\S+?)\s*(tokens?|sequences?|seqs?|samples?)?\s*", value)
    if not m:
        raise units.UnitError(f"not a batch size: {value!r}", expected)
    n = units.parse_count(m.group(1))
    if m.group(2) is None and not re.fullmatch(r"[0-9_,]+", m.group(1)):
        raise units.UnitError(f"a batch with a size suffix needs a unit: {value!r}",
                              f"'{m.group(1)} tokens' or '{m.group(1)} sequences' (a plain number such as 2048 "
                              "counts sequences)")
    kind = "tokens" if (m.group(2) or "").startswith("token") else "sequences"
    if n < 1:
        raise units.UnitError(f"batch must be positive: {value!r}", expected)
    return kind, n
