"""Published training runs as the cost model sees them: one CSV row -> one ``PublishedRun``.

The CSV has the columns of benchmarks/data/published_runs_dev.csv (its CALIBRATION_README.md
explains them). ``parse_row`` turns a row into the model shape, the layout, the framework
profile that ran it, the precision and fp8 recipe, and the throughput it measured, in tokens/s
per GPU. A row the cost model cannot express raises ``Skip`` with the reason, which callers
count. Every column is read the same way for every source; where a source's convention differs
(FLOP counting, what a "micro-batch" column means) the rule names the source text it reads.

Rules that decide what a cell means, each tested in tests/unit/calibration/test_runs.py:

* framework: from the software_version / source text (Megatron-LM 2021-2022 before Transformer
  Engine; NeMo / Megatron-Bridge / Megatron-Core; torchtitan; llm-foundry; DeepSpeed; FSDP);
  torch.compile, Async TP and Float8 from the row's own words.
* Megatron-Bridge rows: the table leaves out how a run was launched ("Recompute/offload/CUDA-graph
  settings are in the matching scripts/performance recipe of that container", the rows' notes); the
  recipe of the row's container, model, GPU, precision and layout (compiler/calibration/
  bridge_recipes.py) says whether the iteration was one CUDA graph and the MoE all-to-all overlapped.
* ZeRO / FSDP: "ZeRO-N" is stage N; FSDP / FULL_SHARD / Megatron-FSDP are stage 3 (a stated
  "sharding group N" is dp_shard), SHARD_GRAD_OP stage 2; "distributed optimizer" stage 1;
  "FSDP=0" and "none" are not sharded.
* MLP: squared-ReLU (Nemotron-3/4) and GELU (GPT, BLOOM, MPT, OPT, Falcon) MLPs have two
  matrices, not SwiGLU's three; the row's notes win over the model name.
* micro-batch: torchtitan's "local batch size" is the per-data-parallel-rank batch; with
  pipeline parallelism torchtitan splits it into micro-batches of 1
  (pipeline_parallel_microbatch_size default), so the micro-batch is 1 there.
* FLOP conventions (for rows that give only TFLOP/s or MFU): "non-causal" is checked before
  "causal".
* recompute not given: the run is costed without recompute, and its memory checked with the
  least recompute that fits (none, selective, full). The recipes behind such rows save memory in
  ways a layout cannot state and that cost little time (Megatron-Bridge's llama3_70b GB300 recipe
  offloads 20-30 layers' activations to host memory, cpu_offloading_num_layers; DeepSeek-V3's
  recompute only mla_up_proj: megatron/bridge/perf_recipes, github.com/NVIDIA-NeMo/Megatron-Bridge);
  full recompute bounds what they can save. Recorded as a regime feature.
"""
from __future__ import annotations

import csv
import math
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

from compiler.catalog import Catalog, GpuSpec, load_catalog, normalize_name
from compiler.calibration.bridge_recipes import recipe_for
from compiler.calibration.frameworks import published_profile
from compiler.costmodel.bands import layout_features, unsourced_attention
from compiler.costmodel.evaluation import check_layout
from compiler.layout import Layout, Offload, Recompute
from compiler.model import MlpKind, ModelShape, MoEShape, count_params
from compiler.problem import GpuOption, Hyper, Pins, Problem
from compiler.targets.cost import CostProfile

CSV_COLUMNS = (
    "row_id", "source_id", "source", "source_url", "source_location", "software_version", "workload", "model",
    "params_b", "active_params_b", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
    "num_kv_heads", "vocab_size", "seq_len", "moe_experts", "moe_topk", "moe_shared_experts", "gpu_type",
    "num_gpus", "gpus_per_node", "interconnect", "tp", "pp", "dp", "cp", "ep", "etp", "vp", "zero_fsdp",
    "sequence_parallel", "activation_recompute", "micro_batch_size", "global_batch_size", "grad_accum",
    "precision", "tflops_per_gpu", "mfu_pct", "hfu_pct", "tokens_per_sec_per_gpu", "tokens_per_sec_total",
    "step_time_s", "train_tokens", "total_train_time", "gpu_hours", "cost_usd", "peak_tflops_used_by_source",
    "flop_convention", "value_kind", "confidence", "derived_fields", "notes")

# Columns that describe a row for a reader and that parse_row never reads: every other column of CSV_COLUMNS must be
# in a CSV's header (missing_columns; tests/unit/calibration/test_runs.py checks this split against what parse_row
# reads), or each row would silently be read as if those cells were blank (a CSV without `vp` costs every
# interleaved run as 1F1B). An optional column beyond CSV_COLUMNS, peak_memory_gib, is read where present.
DESCRIPTIVE_COLUMNS = frozenset({"source_url", "source_location", "params_b", "active_params_b", "dp", "hfu_pct",
                                 "train_tokens", "total_train_time", "gpu_hours", "cost_usd", "confidence",
                                 "derived_fields"})
READ_COLUMNS = tuple(c for c in CSV_COLUMNS if c not in DESCRIPTIVE_COLUMNS)


class NotACalibrationCsv(ValueError):
    """A CSV whose header lacks columns parse_row reads (``missing``: them, in CSV_COLUMNS order)."""

    def __init__(self, path: str, missing: list[str]):
        self.path, self.missing = path, missing
        super().__init__(f"{path}: not a calibration CSV: missing columns {', '.join(missing)}")


def missing_columns(header: Iterable[str]) -> list[str]:
    """The columns parse_row reads that ``header`` lacks (extra columns and column order do not matter)."""
    have = set(header)
    return [c for c in READ_COLUMNS if c not in have]


# Architectures ModelShape cannot express (matched on the model name, case-insensitive): skipped, counted.
UNMODELLED_ARCHITECTURES = {
    "nemotron-h": "architecture not modelled (hybrid Mamba-Transformer)",
    "nemotron 3": "architecture not modelled (hybrid Mamba-Transformer)",
    "nemotron 3.5": "architecture not modelled (hybrid Mamba-Transformer)",
}
# The rows of a model whose attention no kernel benchmark describes (compiler.costmodel.bands.unsourced_attention:
# gpt-oss's learnable sinks over alternating 128-token windows, costed as FlashAttention) are kept out of the fit
# and the figures, with this reason; benchmarks/accuracy.py --unsourced shows them.
UNSOURCED_ATTENTION = "attention kernel without a benchmark (gpt-oss: learnable sinks, sliding windows; --unsourced)"
NON_GATED_MODELS = ("gpt", "bloom", "mpt", "opt-", "falcon", "nemotron")  # two-matrix MLPs (GELU or squared ReLU)


class Skip(Exception):
    """A row the cost model cannot evaluate; the message is the counted reason."""


def _text(row: dict, *keys: str) -> str:
    return " ".join((row.get(k) or "") for k in keys).lower()


def _num(row: dict, key: str) -> float | None:
    text = (row.get(key) or "").strip().replace(",", "")
    m = re.match(r"^-?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?", text)
    return float(m.group(0)) if m else None


def _int(row: dict, key: str) -> int | None:
    x = _num(row, key)
    return None if x is None else int(round(x))


# --- framework ----------------------------------------------------------------------------------------


# torchtitan's train configs when its 2024 performance tables were published (pytorch/torchtitan commit 1ea476e9f,
# 2024-04-24, "update readme.md and performance.md"): train_configs/llama3_8b.toml, llama2_13b.toml and
# llama2_7b.toml set norm_type = "fused_rmsnorm", llama3_70b.toml and llama2_70b.toml norm_type = "rmsnorm"
TORCHTITAN_2024_FUSED_RMSNORM = frozenset({"llama 3 8b", "llama 2 13b", "llama 2 7b"})
TORCHTITAN_2024_SOURCE = ("norm_type = fused_rmsnorm in the model's shipped train config (pytorch/torchtitan "
                          "1ea476e9f train_configs/, the commit of the performance tables): one Triton kernel that "
                          "saves x, weight and rstd (torchtitan/models/norms.py FusedRMSNorm)")
# NeMo 24.07's launcher configs fuse the cross entropy for its Llama 3 and Nemotron models only
# (NVIDIA/NeMo-Framework-Launcher 24.07 launcher_scripts/conf/training/llama/llama3_*.yaml and nemotron/*.yaml:
# cross_entropy_loss_fusion: true; Megatron-Core 0.8 then runs its jit-fused steps, the te impl came later);
# its GPT-3 and Llama 2 configs leave Megatron-Core's unfused fp32 default
NEMO_2407_FUSED_CROSS_ENTROPY = ("llama3", "nemotron")
# torchtitan's composite RMSNorm launches 8 kernels (x.float(), pow, mean, + eps, rsqrt, *, type_as, * weight:
# torchtitan/models/norms.py RMSNorm._norm / forward); the fused one launches 1
EAGER_RMSNORM_KERNELS = 8


def framework_of(row: dict) -> CostProfile:
    """The framework profile that ran the row, with the variations the row states."""
    text = _text(row, "source_id", "source", "software_version", "zero_fsdp", "notes")
    version = _text(row, "software_version", "source_id")
    year = re.search(r"\((20\d\d)\)", version)
    if "deepspeed" in _text(row, "zero_fsdp"):
        base = published_profile("deepspeed_defaults")
        if year and int(year.group(1)) <= 2022:  # DeepSpeed on Megatron's GPT before FlashAttention
            # DeepSpeed 0.3-0.4 ZeRO-3 (2021): fetch_sub_module all-gathers a submodule's partitioned parameters and
            # synchronises before the submodule runs ('This call is blocking'; overlap_comm False by default;
            # deepspeed/runtime/zero/stage3.py), and parameters under param_persistence_threshold (1e5 elements:
            # biases, norms) stay gathered: a Megatron GPT layer gathers its 4 weight matrices (fused QKV, attention
            # out, h-to-4h, 4h-to-h) one collective each, on the critical path
            base = replace(base, name="deepspeed+megatron_gpt_2021", attention="unfused",
                           activations=published_profile("megatron_lm_2021").activations,
                           cross_entropy=published_profile("megatron_lm_2021").cross_entropy,
                           zero3_gathers_per_layer=4, zero3_blocking=True,
                           source=base.source + "; DeepSpeed 0.3-0.4 ZeRO-3 (2021, deepspeed/runtime/zero/stage3.py): "
                           "blocking per-submodule fetches, one all-gather per weight matrix (parameters under "
                           "param_persistence_threshold 1e5 stay gathered), overlap_comm False by default")
    elif "torchtitan" in text:
        base = published_profile("torchtitan")
        if "fused_rmsnorm" in text or "fused rmsnorm" in text or (
                "2024" in version and _text(row, "model") in TORCHTITAN_2024_FUSED_RMSNORM):
            base = replace(base, name=base.name + "+fused_rmsnorm", fused_norm=True,
                           ops_per_dense_layer=base.ops_per_dense_layer - 2 * (EAGER_RMSNORM_KERNELS - 1),
                           source=base.source + "; " + TORCHTITAN_2024_SOURCE)
    elif "llm-foundry" in text or "composer" in text or "mosaic" in version:
        base = published_profile("llm_foundry")
    elif "megatron" in text or "nemo" in text:
        old = (year and int(year.group(1)) <= 2022) or row.get("source_id", "").startswith(("narayanan", "korthikanti"))
        bridge = "megatron-bridge" in text or re.search(r"nemo ?2\.0|nemo2|nemo (2[5-9]|[3-9]\d)\.", text)
        nemo1 = "nemo" in text
        base = published_profile("megatron_lm_2021" if old else "megatron_bridge" if bridge
                                 else "nemo_2407" if nemo1 else "megatron")
        if base.name == "nemo_2407" and _text(row, "model").replace(" ", "").startswith(NEMO_2407_FUSED_CROSS_ENTROPY):
            base = replace(base, cross_entropy="megatron_native", source=base.source + "; cross_entropy_loss_fusion: "
                           "true in its launcher config (NeMo-Framework-Launcher 24.07 conf/training)")
    elif "deepspeed" in text:
        base = published_profile("deepspeed_defaults")
    elif "fsdp" in text:
        base = published_profile("fsdp")
    else:
        base = published_profile("megatron")
    if base.elementwise == "eager" and re.search(r"torch\.compile|\bcompile[d]?\b", text):
        base = replace(base, name=base.name + "+compile", elementwise="fused",
                       ops_per_dense_layer=max(8, base.ops_per_dense_layer // 3))
    if "async tp" in text or "async-tp" in text:
        base = replace(base, name=base.name + "+async_tp", tp_overlap="full")
    return base


def with_bridge_recipe(framework: CostProfile, row: dict, layout: Layout, precision: str, fp8_recipe: str
                       ) -> tuple[CostProfile, Layout]:
    """A Megatron-Bridge row's profile with the launch settings of its recipe (compiler.calibration.bridge_recipes):
    full-iteration CUDA graphs, the EP all-to-all overlapped with another micro-batch (as DualPipe) and its
    dispatcher (node-aware or plain NCCL all-to-all, BridgeRecipe.node_aware_dispatch); and its
    layout with the recipe's expert tensor-parallel degree where the row does not give one (the published tables
    leave it out; the DeepSeek-V3 and Qwen3 recipes set 1)."""
    if framework.name != "megatron_bridge":
        return framework, layout
    if precision == "nvfp4" and framework.tp_overlap == "full":
        framework = replace(framework, name=framework.name + "+nvfp4", tp_overlap="backward", source=framework.source + (
            "; NVFP4 runs without Transformer Engine userbuffers: the NVFP4 performance recipes set tp_comm_overlap "
            "False (Megatron-Bridge scripts/performance llama3_llm_pretrain.py: 'tp_comm_overlap = False if precision "
            "== \"nvfp4\"'; perf_recipes/llama/gb200, gb300), so only Megatron's own backward overlap remains"))
    recipe = recipe_for(software_version=row.get("software_version") or "", model=row.get("model") or "",
                        gpu_type=row.get("gpu_type") or "", precision=precision, fp8_recipe=fp8_recipe,
                        num_gpus=layout.world_size, tp=layout.tp, pp=layout.pp, vp=layout.vpp, cp=layout.cp,
                        ep=layout.ep, micro_batch=layout.micro_batch, global_batch=layout.global_batch)
    if recipe is None:
        return framework, layout
    if recipe.etp is not None and _int(row, "etp") is None:
        layout = replace(layout, etp=recipe.etp)
    name = framework.name + ("+full_cuda_graph" if recipe.full_iteration_cuda_graph else "") \
        + ("+a2a_overlap" if recipe.moe_a2a_overlap and layout.ep > 1 else "")
    return replace(framework, name=name,
                   cuda_graphs="full_iteration" if recipe.full_iteration_cuda_graph else framework.cuda_graphs,
                   ep_overlap=framework.ep_overlap or (recipe.moe_a2a_overlap and layout.ep > 1),
                   hierarchical_all_to_all=recipe.node_aware_dispatch if layout.ep > 1 else framework.hierarchical_all_to_all,
                   source=framework.source + f"; launch settings from {recipe.describe()}"), layout


# --- model shape --------------------------------------------------------------------------------------


def mlp_kind(row: dict) -> MlpKind:
    """'swiglu' or 'gelu' (two-matrix MLPs: GELU and squared ReLU have the same parameters and FLOPs)."""
    notes = _text(row, "notes")
    if re.search(r"squared[- ]relu|relu2|relu\^2|not gated|non-gated", notes) or re.search(r"\bgelu\b", notes):
        return "gelu"
    if re.search(r"swiglu|gated silu|geglu", notes):
        return "swiglu"
    model = _text(row, "model")
    if "gpt-oss" not in model and any(model.startswith(m) or f" {m}" in model for m in NON_GATED_MODELS):
        return "gelu"
    return "swiglu"


def shape_of(row: dict, catalog: Catalog) -> ModelShape:
    layers, hidden, heads = _int(row, "num_layers"), _int(row, "hidden_size"), _int(row, "num_attention_heads")
    vocab = _int(row, "vocab_size")
    preset = catalog.find_model(row.get("model", ""))
    if not (layers and hidden and heads and vocab):
        # a vendor table often names the model and gives no architecture: the catalog's preset of that name,
        # unless a dimension the row does give contradicts it
        given = {"num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads, "vocab_size": vocab}
        if preset is not None and all(v is None or v == getattr(preset.shape, k) for k, v in given.items()):
            return preset.shape
        raise Skip("architecture not given")
    if preset is not None and (preset.shape.num_layers, preset.shape.hidden_size) == (layers, hidden):
        return preset.shape  # the catalog knows details the CSV lacks (MLA, dense first layers)
    model = _text(row, "model")
    mlp = mlp_kind(row)
    gpt_like = mlp == "gelu" and "nemotron" not in model
    ffn = _int(row, "ffn_hidden_size") or 4 * hidden
    kv = _int(row, "num_kv_heads") or heads
    if min(layers, hidden, heads, vocab, ffn, kv) < 1 or heads % kv:
        raise Skip("architecture not consistent (a dimension below 1, or kv heads not dividing the heads)")
    experts = _int(row, "moe_experts")
    moe = None
    if experts and experts > 1:
        shared = _int(row, "moe_shared_experts") or 0
        moe = MoEShape(num_experts=experts, top_k=_int(row, "moe_topk") or 1, expert_ffn_hidden_size=ffn,
                       num_shared_experts=shared)
    megatron_gpt = gpt_like and row.get("source_id", "").startswith(("narayanan", "korthikanti"))
    # MPT attends with ALiBi (a bias inside the attention kernel: no position parameters, no RoPE kernels;
    # llm-foundry mpt configs, attn_config.alibi): written as learned positions with no embedding rows
    alibi = model.startswith("mpt")
    try:
        return ModelShape(
            num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads, num_kv_heads=kv,
            vocab_size=vocab, mlp=mlp, norm="layernorm" if gpt_like or "nemotron" in model else "rmsnorm",
            position="learned" if megatron_gpt or alibi else "rope",
            max_position_embeddings=_int(row, "seq_len") or 2048 if megatron_gpt else 0,
            tied_embeddings="mpt" in model, linear_bias=megatron_gpt, moe=moe)
    except ValueError as exc:  # ModelShape's own limits (MAX_LAYERS: the cost model walks the layers one by one)
        raise Skip(f"architecture beyond dtc's limits ({exc})") from None


# --- GPU and precision ---------------------------------------------------------------------------------


def find_gpu(catalog: Catalog, name: str) -> GpuSpec:
    """The catalog entry of a CSV gpu_type such as 'H100-SXM-80GB', 'GB200 (NVL72)' or 'NVIDIA H100 80GB HBM3' (the
    device name torch reports: a vendor or brand word in front is not part of the part's name)."""
    base = re.sub(r"^(?:(?:nvidia|amd|tesla|instinct)-+)+", "", normalize_name(re.sub(r"\(.*?\)", "", name)))
    parts = [p for p in base.split("-") if p]
    tries = [base, f"{parts[0]}-{parts[-1]}" if len(parts) > 1 else base]
    tries += ["-".join(parts[:i]) for i in range(len(parts), 0, -1)]
    paren = re.findall(r"\((.*?)\)", name)
    if paren and parts:  # 'H100 (96GB HBM2e)' -> h100-96gb-hbm2e, h100-96gb, h100-hbm2e
        words = [w for w in re.split(r"[\s,/;]+", normalize_name(paren[0]).replace("-", " ")) if w]
        tries[:0] = [normalize_name(f"{parts[0]}-{paren[0]}")] + [f"{parts[0]}-{w}" for w in words]
    for key in tries:
        spec = catalog.find_gpu(key)
        if spec is not None:
            return spec
    raise Skip("gpu not in catalog")


def power_limit_of(row: dict, spec: GpuSpec) -> float | None:
    """A stated power limit below the part's TDP ('500W power limit', 'capped at 500 W')."""
    text = _text(row, "gpu_type", "interconnect", "notes")
    for m in re.finditer(r"(\d{3,4})\s*w\b", text):
        around = text[max(0, m.start() - 40):m.end() + 40]
        watts = float(m.group(1))
        if re.search(r"limit|cap|power|tdp", around) and spec.tdp_w and watts < spec.tdp_w:
            return watts
    return None


def precision_of(row: dict) -> tuple[str, str]:
    """(precision, fp8 recipe): bf16/fp16/fp32/fp8/nvfp4 and, for fp8, the scaling recipe ('' = framework default)."""
    text = _text(row, "precision")
    if "fp4" in text:
        if "nvfp4" not in text:
            raise Skip("precision not modelled (fp4 other than NVFP4)")
        return "nvfp4", ""
    if "fp8" in text or "float8" in text or "mxfp8" in text:
        gpu = _text(row, "gpu_type")
        if "block" in text or ("fp8-mx" in text and gpu.startswith("h")):
            return "fp8", "fp8_blockwise"  # Megatron-Bridge: FP8-MX on H100 means 128x128 / 1x128 blocks
        if "mx" in text:
            return "fp8", "mxfp8"
        if "current" in text or "fp8-cs" in text or "float8" in text or "dynamic" in text:
            return "fp8", "fp8_tensorwise_current"
        if "delayed" in text:
            return "fp8", "fp8_tensorwise_delayed"
        year = re.search(r"(20\d\d)|\b(2[5-9])\.\d\d\b", _text(row, "software_version"))
        recent = year and (int(year.group(1)) >= 2025 if year.group(1) else True)
        return "fp8", "fp8_tensorwise_current" if recent else "fp8_tensorwise_delayed"
    if "fp16" in text and "bf16" not in text:
        return "fp16", ""
    if "fp32" in text and "bf16" not in text:
        return "fp32", ""
    return "bf16", ""


# --- layout -------------------------------------------------------------------------------------------


def zero_of(row: dict, dp: int) -> tuple[int, int]:
    """(zero_stage, dp_shard) from the row's zero_fsdp text."""
    text = _text(row, "zero_fsdp")
    group = re.search(r"(?:sharding group|shard(?:ing)? size|hsdp[^0-9]{0,10})\s*(\d+)", text)
    shard = int(group.group(1)) if group and dp % int(group.group(1)) == 0 else dp
    if re.search(r"fsdp\s*[=:]?\s*0\b", text):
        stage = 1 if "distributed optimizer" in text else 0
    else:
        m = re.search(r"zero[- _]?(?:stage[- ]?)?([0-3])", text)
        if m:
            stage = int(m.group(1))
        elif re.search(r"shard_grad_op|grad[- ]op", text):
            stage = 2
        elif re.search(r"fsdp|full_shard|full shard|hybrid_shard|hsdp", text):
            stage = 3
        elif "distributed optimizer" in text or "distributed optimiser" in text:
            stage = 1
        elif text.strip() == "" and not row.get("source_id", "").startswith(("narayanan", "korthikanti", "mosaic",
                                                                             "torchtitan")):
            stage = 1  # Megatron-family recipes default to the distributed optimizer
        else:
            stage = 0
    if stage == 0 or dp == 1:
        return 0, 1
    return stage, (shard if stage == 3 else dp)


def recompute_of(row: dict) -> Recompute | None:
    """none / selective / full, or None when the row does not say."""
    text = _text(row, "activation_recompute").strip()
    if not text:
        return None
    if text.startswith("full") or "full" in text.split("(")[0]:
        return "full"
    if text.startswith("selective") or "sac" in text:
        return "selective"
    return "none"


def micro_batch_of(row: dict, framework: CostProfile, pp: int) -> int:
    mbs = _int(row, "micro_batch_size") or 1
    if framework.name.startswith("torchtitan") and pp > 1 and "microbatch" not in _text(row, "notes"):
        return 1  # torchtitan's local batch is split into pipeline micro-batches of 1 (default)
    return mbs


def layout_of(row: dict, gpu: GpuSpec, framework: CostProfile, recompute: Recompute) -> Layout:
    n = _int(row, "num_gpus")
    tp, pp = _int(row, "tp"), _int(row, "pp")
    if not n or tp is None or pp is None:
        raise Skip("layout not given")
    cp, ep, vp = _int(row, "cp") or 1, _int(row, "ep") or 1, _int(row, "vp") or 1
    etp = _int(row, "etp")
    if min(n, tp, pp, cp, ep, vp, 1 if etp is None else etp) < 1:
        raise Skip("layout degree below 1")
    dp = n // (tp * pp * cp)
    if tp * pp * cp * dp != n:
        raise Skip("layout does not multiply to num_gpus")
    mbs = micro_batch_of(row, framework, pp)
    gbs = _int(row, "global_batch_size")
    if not gbs:
        raise Skip("global batch not given")
    if mbs < 1 or gbs < 1:  # (dp is at least 1: the degrees multiply to num_gpus)
        raise Skip("layout degree below 1")
    ga = _int(row, "grad_accum") or max(1, round(gbs / (mbs * dp)))
    if mbs * ga * dp != gbs:
        ga = max(1, round(gbs / (mbs * dp)))
    zero, shard = zero_of(row, dp)
    sp_text = _text(row, "sequence_parallel").strip()
    sp_default = framework.name != "megatron_lm_2021"
    sp = tp > 1 and (sp_text == "yes" or (sp_text == "" and sp_default))
    if vp > 1 and ga % pp:
        raise Skip("interleaved schedule with micro-batches not a multiple of pp")
    text = _text(row, "notes", "zero_fsdp")
    offload_opt: Offload = "cpu" if re.search(r"optimi[sz]er (?:cpu )?offload(?! false)|cpu offload(?:ing)? (?:of )?optim", text) \
        else "none"
    gpn = _int(row, "gpus_per_node") or gpu.default_gpus_per_node
    return Layout(gpu=gpu.name, gpus_per_node=min(gpn, n), tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, dp_replicate=dp // shard,
                  dp_shard=shard, zero_stage=zero, micro_batch=mbs, grad_accum=ga, vpp=vp,
                  schedule="interleaved_1f1b" if vp > 1 else "1f1b", recompute=recompute,
                  sequence_parallel=sp, offload_optimizer=offload_opt)


# --- what the row measured ------------------------------------------------------------------------------


def convention_flops_per_token(row: dict, shape: ModelShape) -> float | None:
    """FLOPs per token as the row's source counts them (CALIBRATION_README.md)."""
    from compiler.costmodel.compute import attention_core_flops_per_token_forward, model_flops_per_token

    conv = _text(row, "flop_convention")
    s, l, h, v = _int(row, "seq_len") or 0, shape.num_layers, shape.hidden_size, shape.vocab_size
    pc = count_params(shape)
    if conv.startswith("narayanan"):
        return 96 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    if conv.startswith("korthikanti"):
        return 72 * l * h * h * (1 + s / (6 * h) + v / (12 * h * l))
    if conv.startswith("mosaicml"):
        return 6 * pc.total + 12 * l * h * s
    if conv.startswith("torchtitan"):
        return 6 * pc.non_embedding + 12 * l * h * s
    causal = model_flops_per_token(shape, pc, s)
    if "non-causal" in conv or "no causal discount" in conv or "full attention" in conv:
        return causal + 3 * attention_core_flops_per_token_forward(shape, s)
    if "causal" in conv or "megatron-bridge" in conv:
        return causal
    if conv.startswith("nemo"):
        return causal + 3 * attention_core_flops_per_token_forward(shape, s)
    return None


def measured_tokens_per_s_per_gpu(row: dict, shape: ModelShape) -> tuple[float, str]:
    n = _int(row, "num_gpus") or 1
    x = _num(row, "tokens_per_sec_per_gpu")
    if x:
        return x, "tokens_per_sec_per_gpu"
    x = _num(row, "tokens_per_sec_total")
    if x:
        return x / n, "tokens_per_sec_total"
    step, gbs, s = _num(row, "step_time_s"), _int(row, "global_batch_size"), _int(row, "seq_len")
    if step and gbs and s:
        return gbs * s / step / n, "step_time_s"
    fpt = convention_flops_per_token(row, shape)
    tflops = _num(row, "tflops_per_gpu")
    if tflops and fpt:
        return tflops * 1e12 / fpt, "tflops_per_gpu / convention"
    mfu, peak = _num(row, "mfu_pct"), _num(row, "peak_tflops_used_by_source")
    if mfu and peak and fpt:
        return mfu / 100 * peak * 1e12 / fpt, "mfu_pct / convention"
    raise Skip("no measured throughput")


def measured_peak_memory_gib(row: dict) -> float | None:
    """A published peak memory per GPU: a 'peak_memory_gib' column, or 'memory ... N GiB/GB' in the notes."""
    x = _num(row, "peak_memory_gib")
    if x:
        return x
    m = re.search(r"(?:peak )?memory[^0-9.]{0,30}(\d+(?:\.\d+)?)\s*(gib|gb)\b", _text(row, "notes"))
    return float(m.group(1)) if m else None


# --- the run ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PublishedRun:
    row_id: str
    source_id: str
    model: str
    framework: CostProfile
    gpu: GpuOption
    problem: Problem
    layout: Layout
    measured_tokens_per_s_per_gpu: float
    measured_from: str
    convention_flops_per_token: float | None
    recompute_given: bool
    measured_peak_memory_gib: float | None = None
    memory_layout: Layout | None = None  # the layout whose memory is checked (recompute inferred), else layout
    features: dict[str, Any] = field(default_factory=dict)


def make_problem(shape: ModelShape, gpu: GpuOption, *, seq_len: int, global_batch: int, tokens: int,
                 precision: str, num_gpus: int, name: str = "benchmark", fp8_recipe: str = "",
                 targets: tuple[str, ...] = ()) -> Problem:
    return Problem(
        name=name, description="", spec_path="", spec_sha256="", model_name=name, shape=shape,
        params=count_params(shape), tokens=tokens, seq_len=seq_len, global_batch=global_batch,
        global_batch_tolerance=0.0, batch_note="", precision=precision, optimizer="adamw",
        hyper=Hyper(3e-4, 3e-5, 0, 0.1, 1.0, 0.9, 0.95, 1234), gpu_options=(gpu,), num_gpus=num_gpus,
        min_gpus=num_gpus, max_gpus=num_gpus, max_cost_usd=None, deadline_s=None, objective="fastest", pins=Pins(),
        memory_headroom=0.0, allow_cross_node_tp=True, top_k=1, targets=targets, fp8_recipe=fp8_recipe)


def gpu_option(spec: GpuSpec, gpus_per_node: int, power_limit_w: float | None = None) -> GpuOption:
    return GpuOption(spec=spec, gpus_per_node=gpus_per_node, price_per_gpu_hour_usd=spec.price_per_gpu_hour_usd,
                     intra_node_bandwidth_bytes_per_s=spec.intra_node_bandwidth_bytes_per_s,
                     inter_node_bandwidth_bytes_per_s=spec.inter_node_bandwidth_bytes_per_s,
                     power_limit_w=power_limit_w)


def seq_bucket(s: int) -> str:
    return "<=2k" if s <= 2048 else "4k" if s <= 4096 else "8k" if s <= 8192 else "16-32k" if s <= 32768 else ">32k"


def regime_features(run: "PublishedRun") -> dict[str, Any]:
    """What issue #12's error bands group by: framework, GPU generation, precision / fp8 recipe, PP/VPP, CP,
    EP, FSDP/ZeRO-3, offload, scale (compiler.costmodel.bands.layout_features, the same function a dtc layout's
    band is looked up with), sequence length, dense/MoE, recompute."""
    lay, p = run.layout, run.problem
    return {
        "source": run.source_id, "framework": run.framework.name.split("+")[0], "framework_variant": run.framework.name,
        "gpu": run.gpu.name, "gpu_generation": run.gpu.spec.kernel_family, "precision": p.precision,
        "fp8_recipe": p.fp8_recipe or "", **layout_features(lay), "zero_stage": lay.zero_stage,
        "recompute": lay.recompute, "recompute_inferred": not run.recompute_given,
        "memory_recompute": (run.memory_layout or lay).recompute, "num_gpus": lay.world_size,
        "seq_len": p.seq_len, "seq": seq_bucket(p.seq_len),
        "moe": p.shape.moe is not None, "tp": lay.tp, "power_limited": run.gpu.power_limit_w is not None,
    }


def parse_row(row: dict, catalog: Catalog | None = None, *, unsourced: bool = False) -> PublishedRun:
    """The run of one CSV row (recompute not yet inferred when the row leaves it out: see ``resolve``);
    ``unsourced``: also a row of a model whose attention no kernel benchmark describes (UNSOURCED_ATTENTION)."""
    catalog = catalog or load_catalog()
    if not _text(row, "workload").startswith("pretrain"):
        raise Skip("not a pretraining run (SFT/LoRA)")
    if (row.get("value_kind") or "measured").strip() not in ("measured", ""):
        raise Skip("not a measurement")
    if "DOUBT:" in (row.get("notes") or ""):
        # the curator could not read the source's figures unambiguously and says which reading was guessed
        raise Skip("the row's own notes doubt its reading")
    for marker, reason in UNMODELLED_ARCHITECTURES.items():
        if marker in _text(row, "model"):
            raise Skip(reason)
    if re.search(r"\bmuon\b", _text(row, "notes", "zero_fsdp")):
        # Newton-Schulz orthogonalisation every step and one momentum state: dtc costs Adam, AdamW and SGD
        raise Skip("optimizer not modelled (Muon)")
    spec = find_gpu(catalog, row.get("gpu_type", ""))
    shape = shape_of(row, catalog)
    if not unsourced and unsourced_attention(shape):
        raise Skip(UNSOURCED_ATTENTION)
    measured, how = measured_tokens_per_s_per_gpu(row, shape)
    if not (measured > 0 and math.isfinite(measured)):
        raise Skip("measured throughput not positive")
    precision, recipe = precision_of(row)
    try:
        spec.peak_flops_for(precision)
    except KeyError:
        raise Skip(f"{precision} on a GPU without {precision} tensor cores") from None
    framework = framework_of(row)
    n = _int(row, "num_gpus") or 1
    gpn = _int(row, "gpus_per_node") or spec.default_gpus_per_node
    seq = _int(row, "seq_len") or 2048
    if min(n, gpn, seq) < 1:
        raise Skip("GPU count, GPUs per node or sequence length below 1")
    option = gpu_option(spec, min(gpn, n), power_limit_of(row, spec))
    given = recompute_of(row)
    layout = layout_of(row, spec, framework, given or "none")
    framework, layout = with_bridge_recipe(framework, row, layout, precision, recipe)
    problem = make_problem(shape, option, seq_len=seq, global_batch=layout.global_batch, tokens=10**12,
                           precision=precision, num_gpus=n, fp8_recipe=recipe)
    broken = check_layout(problem, layout, option)  # the rules the cost model needs (compiler.rules)
    if broken is not None:
        raise Skip(f"layout breaks a layout rule ({broken.code})")
    run = PublishedRun(row_id=row.get("row_id", ""), source_id=row.get("source_id", ""), model=row.get("model", ""),
                       framework=framework, gpu=option, problem=problem, layout=layout,
                       measured_tokens_per_s_per_gpu=measured, measured_from=how,
                       convention_flops_per_token=convention_flops_per_token(row, shape),
                       recompute_given=given is not None, measured_peak_memory_gib=measured_peak_memory_gib(row))
    return replace(run, features=regime_features(run))


def resolve(run: PublishedRun, efficiency=None) -> PublishedRun:
    """A run whose row leaves recompute out: costed without recompute; its memory checked with the least
    recompute that fits (see the module docstring). Rows that state it are returned as they are."""
    if run.recompute_given:
        return run
    from compiler.costmodel.evaluation import evaluate
    from compiler.costmodel.efficiency import prior_efficiency
    from compiler.estimate import Estimate

    # memory reads no fitted constant: the priors do (and the fit does not read the file it writes)
    efficiency = efficiency or prior_efficiency()
    for mode in ("none", "selective", "full"):
        layout = replace(run.layout, recompute=mode)
        est = evaluate(run.problem, layout, gpu=run.gpu, target=run.framework,
                       pipeline_events=False, check_memory=True, efficiency=efficiency)
        if isinstance(est, Estimate):
            break
    out = replace(run, layout=replace(run.layout, recompute="none"), memory_layout=layout)
    return replace(out, features=regime_features(out))


def read_rows(path: str | Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def read_checked_rows(path: str | Path) -> list[dict]:
    """read_rows of a CSV whose header has every column parse_row reads, else NotACalibrationCsv (an empty file
    too: it has no header)."""
    with open(path, newline="", encoding="utf-8-sig") as fh:  # (a byte-order mark is not part of the first name)
        reader = csv.DictReader(fh)
        missing = missing_columns(reader.fieldnames or ())
        if missing:
            raise NotACalibrationCsv(str(path), missing)
        return list(reader)


def load_runs(path: str | Path, *, catalog: Catalog | None = None, unsourced: bool = False
              ) -> tuple[list[PublishedRun], Counter[str]]:
    """Every modellable run of a CSV (recompute resolved) and the reasons the others were skipped; ``unsourced``:
    with the rows of UNSOURCED_ATTENTION models too. NotACalibrationCsv: the header lacks a column parse_row reads."""
    runs: list[PublishedRun] = []
    skipped: Counter[str] = Counter()  # why a row was skipped -> rows
    for row in read_checked_rows(path):
        try:
            runs.append(resolve(parse_row(row, catalog, unsourced=unsourced)))
        except Skip as exc:
            skipped[str(exc)] += 1
    return runs, skipped


def iter_errors(values: Iterable[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]
