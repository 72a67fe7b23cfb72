"""How a Megatron-Bridge performance run was launched: its recipe's settings the published table leaves out.

Megatron-Bridge's performance summary gives each run's layout; the rows' notes say "Recompute/offload/
CUDA-graph settings are in the matching scripts/performance recipe of that container, not in the table".
compiler/data/bridge_perf_recipes.csv holds those recipes, one row per config, extracted from the
Megatron-Bridge release of each NeMo container by benchmarks/bridge_recipes.py (its docstring names the
releases and files; NeMo 26.08's 0.6.0 recipes are read statically from Python). ``recipe_for`` finds a
published row's recipe: the first config of the row's container
whose model, GPU and precision are the row's and whose layout (GPUs, tp, pp, vp, cp, ep, micro-batch) equals
the row's, preferring the variant whose global batch is the row's (a recipe's V1 / V2 / LARGE_SCALE differ in
their global batch, and may differ in how they were launched); a config without a precision in its name (DeepSeek-V3's ``*_B300_V1``) is taken when no config
of the row's precision matches. A row whose container or layout has no such config gets ``None`` and keeps
the framework profile's defaults.

What dtc reads from a recipe (compiler.calibration.runs.framework_of applies it):

* full-iteration CUDA graphs (``cuda_graph_impl: full_iteration``, or ``local`` with a ``full_iteration``
  scope): the whole iteration replayed as one CUDA graph (cost profile ``cuda_graphs``);
* ``moe_a2a_overlap: true``: Megatron-Core's ``--overlap-moe-expert-parallel-comm``, the EP all-to-all of one
  micro-batch under another's computation (cost profile ``ep_overlap``, as DualPipe).
"""
from __future__ import annotations

import csv
import functools
import io
import re
from dataclasses import dataclass
from importlib import resources

RECIPES_FILE = "bridge_perf_recipes.csv"
# the GPUs as the recipes' names spell them (GB before B: "B200" is in "GB200"); benchmarks/bridge_recipes.py
# labels each config with them
GPU_TOKENS = ("GB300", "GB200", "B300", "B200", "H100", "VR200", "R100")


@dataclass(frozen=True)
class BridgeRecipe:
    container: str
    megatron_bridge: str  # the release the config was read from (a git tag of NVIDIA-NeMo/Megatron-Bridge)
    config: str  # the WorkloadBaseConfig's name in scripts/performance/configs/
    cuda_graph_impl: str
    cuda_graph_scope: str
    moe_a2a_overlap: bool
    etp: int | None = None  # model.expert_tensor_parallel_size (None: not set, Megatron's default tp)
    moe_flex_dispatcher_backend: str = ""  # deepep / hybridep (node-aware dispatch); "": not set

    @property
    def full_iteration_cuda_graph(self) -> bool:
        """Megatron-Bridge's own rule (src/megatron/bridge/utils/cuda_graph.py is_full_iteration_cuda_graph, and
        training/train.py before it): cuda_graph_impl full_iteration, or local with full_iteration in the scope."""
        return self.cuda_graph_impl == "full_iteration" or (
            self.cuda_graph_impl == "local" and "full_iteration" in self.cuda_graph_scope.split())

    @property
    def node_aware_dispatch(self) -> bool:
        """Whether the MoE tokens go through a node-aware dispatcher (a token crosses the network once per
        destination node): the flex dispatcher with DeepEP or HybridEP. A config that sets no flex backend runs
        Megatron's NCCL all-to-all: the Qwen3-235B-A22B H100 and B200 recipes set moe_token_dispatcher_type
        "alltoall" beside an unset backend (Megatron-Bridge scripts/performance/configs/qwen/qwen3_llm_pretrain.py,
        v0.3.0-v0.5.1), as do the library recipes they start from (recipes/qwen/qwen3_moe.py)."""
        return self.moe_flex_dispatcher_backend in ("deepep", "hybridep")

    def describe(self) -> str:
        return f"Megatron-Bridge {self.megatron_bridge} scripts/performance {self.config}"


def model_key(text: str) -> str:
    """A model name as both sides spell it: 'Qwen3 30B-A3B' and QWEN3_30B_A3B are QWEN330BA3B."""
    return "".join(ch for ch in text.upper() if ch.isalnum())


@functools.lru_cache(maxsize=1)
def _table() -> tuple[dict[str, str], ...]:
    text = resources.files("compiler.data").joinpath(RECIPES_FILE).read_text(encoding="utf-8")
    return tuple(csv.DictReader(io.StringIO(text, newline="")))


def container_of(software_version: str) -> str:
    """'NeMo 26.04.01 container (...)' -> '26.04.01'; '' when the text names no NeMo container."""
    m = re.search(r"\bnemo (\d\d\.\d\d(?:\.\d\d)?)\b", software_version.lower())
    return m.group(1) if m else ""


def gpu_token(gpu_type: str) -> str:
    text = gpu_type.upper()
    return next((g for g in GPU_TOKENS if g in text), "")


def precision_token(precision: str, fp8_recipe: str) -> str:
    """The recipe names' precision: BF16, FP8_CS (per-tensor current scaling), FP8_MX, FP8_SC (blockwise), NVFP4."""
    if precision == "nvfp4":
        return "NVFP4"
    if precision != "fp8":
        return "BF16"
    return {"mxfp8": "FP8_MX", "fp8_tensorwise_current": "FP8_CS", "fp8_blockwise": "FP8_SC"}.get(fp8_recipe, "")


def _n(cell: str) -> int:
    return int(cell) if cell.strip() else 1


def _layout(row: dict[str, str]) -> tuple[int, ...] | None:
    """(GPUs, tp, pp, vp, cp, ep, micro-batch) of a config; None when it leaves tp, pp, cp, ep or the micro-batch
    to its base recipe (a 0.6.0 recipe read statically that does not assign them: unknown, so never matched).
    An unset vp is no interleaving."""
    if any(not row[k].strip() for k in ("tp", "pp", "cp", "ep", "micro_batch")):
        return None
    return (_n(row["num_gpus"]), _n(row["tp"]), _n(row["pp"]), _n(row["vp"]), _n(row["cp"]), _n(row["ep"]),
            _n(row["micro_batch"]))


def recipe_for(*, software_version: str, model: str, gpu_type: str, precision: str, fp8_recipe: str,
               num_gpus: int, tp: int, pp: int, vp: int, cp: int, ep: int, micro_batch: int,
               global_batch: int | None = None) -> BridgeRecipe | None:
    container = container_of(software_version)
    if not container:
        return None
    want = (model_key(model), gpu_token(gpu_type))
    layout = (num_gpus, tp, pp, vp or 1, cp, ep, micro_batch)
    prec = precision_token(precision, fp8_recipe)
    exact, named, fallback = None, None, None
    for row in _table():
        if row["container"] != container or (row["model"], row["gpu"]) != want:
            continue
        if _layout(row) != layout:
            continue
        if row["precision"] == prec:
            if global_batch is not None and row["global_batch"].strip() == str(global_batch):
                exact = exact or row  # the variant that ran the published global batch (V1 / V2 / LARGE_SCALE)
            named = named or row
        elif not row["precision"] and fallback is None:
            fallback = row
    found = exact or named or fallback
    return _recipe(found) if found else None


def _recipe(row: dict[str, str]) -> BridgeRecipe:
    return BridgeRecipe(container=row["container"], megatron_bridge=row["megatron_bridge"], config=row["config"],
                        cuda_graph_impl=row["cuda_graph_impl"], cuda_graph_scope=row["cuda_graph_scope"],
                        moe_a2a_overlap=row["moe_a2a_overlap"] == "true",
                        etp=int(row["etp"]) if row["etp"].strip() else None,
                        moe_flex_dispatcher_backend=row["moe_flex_dispatcher_backend"].strip())
