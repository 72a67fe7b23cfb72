#!/usr/bin/env python3
"""Extract Megatron-Bridge's performance recipes into compiler/data/bridge_perf_recipes.csv.

    python benchmarks/bridge_recipes.py MEGATRON_BRIDGE_GIT_DIR [--check]

Megatron-Bridge's performance summary (the megatron_bridge_perf rows of the calibration set) gives
each run's parallel layout, but not how the run was launched: "Recompute/offload/CUDA-graph
settings are in the matching scripts/performance recipe of that container, not in the table"
(the rows' own notes). Those recipes are public, one set per release:
scripts/performance/configs/<family>/*workload_base_configs.py holds one ``WorkloadBaseConfig``
per (model, GPU, precision, variant) with the layout and the launch settings (cuda_graph_impl,
cuda_graph_scope, moe_a2a_overlap, moe_flex_dispatcher_backend, ...).

This script reads those files at the Megatron-Bridge release each NeMo container ships
(docs/releases/software-versions.md of Megatron-Bridge: NeMo 25.11 -> 0.2.0, 26.02 -> 0.3.0,
26.04 -> 0.4.0, 26.06 -> 0.5.0). The point containers (26.02.01, 26.04.01, 26.06.01) are not in that
table; their recipes are looked for in the minor release's patch tags first (v0.X.1, v0.X.2), then
in v0.X.0. Every config of those tags is written, in that order of preference, one CSV row each;
compiler/calibration/bridge_recipes.py picks, for a published row, the first config of its container
whose model, GPU, precision and layout (GPUs, tp, pp, vp, cp, ep, micro-batch) are the row's.

Not covered: NeMo 25.09 (Megatron-Bridge 0.1.0rc3 kept its recipes as YAML perf matrices) and 26.08
(0.6.0 moved them into Python functions under src/megatron/bridge/perf_recipes that need
megatron to evaluate): their rows keep the framework profile's defaults.

The workload files import only ``dataclasses.replace`` and ``utils.utils.WorkloadBaseConfig`` (a plain
dataclass "because we cannot import MBridge on the headnode"), so each is executed against that tag's
own utils.py. ``--check`` exits 1 if the committed CSV differs from what would be written.
"""
from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
import types
from dataclasses import asdict, is_dataclass
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from compiler.calibration.bridge_recipes import GPU_TOKENS, RECIPES_FILE, model_key  # noqa: E402

OUT = ROOT / "compiler" / "data" / RECIPES_FILE

# NeMo container -> Megatron-Bridge tags, in order of preference (see the module docstring)
CONTAINERS = {
    "25.11": ("v0.2.0",),
    "26.02": ("v0.3.0",),
    "26.02.01": ("v0.3.1", "v0.3.0"),
    "26.04": ("v0.4.0",),
    "26.04.01": ("v0.4.1", "v0.4.2", "v0.4.0"),
    "26.06": ("v0.5.0",),
    "26.06.01": ("v0.5.1", "v0.5.0"),
}
PRECISIONS = ("BF16", "FP8_CS", "FP8_MX", "FP8_SC", "NVFP4")
COLUMNS = ("container", "megatron_bridge", "config", "model", "gpu", "precision", "num_gpus", "tp", "pp", "vp", "cp", "ep",
           "etp", "micro_batch", "global_batch", "cuda_graph_impl", "cuda_graph_scope", "moe_a2a_overlap",
           "moe_flex_dispatcher_backend", "recompute_modules", "cpu_offloading_num_layers")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def tag_configs(repo: Path, tag: str) -> dict[str, dict]:
    """Every WorkloadBaseConfig of one tag's workload files, by its variable name."""
    utils = types.ModuleType("utils.utils")
    package = types.ModuleType("utils")
    package.utils = utils  # type: ignore[attr-defined]
    with mock.patch.dict(sys.modules, {"utils": package, "utils.utils": utils}):
        exec(compile(_git(repo, "show", f"{tag}:scripts/performance/utils/utils.py"), "utils.py", "exec"),
             utils.__dict__)
        out: dict[str, dict] = {}
        for path in sorted(_git(repo, "ls-tree", "-r", "--name-only", tag, "scripts/performance/configs").split()):
            if not path.endswith("workload_base_configs.py"):
                continue
            namespace: dict = {}
            exec(compile(_git(repo, "show", f"{tag}:{path}"), path, "exec"), namespace)
            for name, value in namespace.items():
                if ("_CONFIG_" in name or name.endswith("_BASE_CONFIG")) and is_dataclass(value) \
                        and not isinstance(value, type) and not name.startswith("_"):
                    out[name] = asdict(value)
        return out


def _token(name: str, options: tuple[str, ...]) -> str:
    parts = f"_{name}_"
    return next((o for o in options if f"_{o}_" in parts), "")


def _model(name: str, gpu: str) -> str:
    cut = name.find("_PRETRAIN") if "_PRETRAIN" in name else name.find(f"_{gpu}_") if gpu else -1
    return model_key(name[:cut] if cut > 0 else name)


def _cell(x) -> str:
    if x is None:
        return ""
    if isinstance(x, (list, tuple)):
        return " ".join(str(v) for v in x) if x else "[]"
    if isinstance(x, bool):
        return "true" if x else "false"
    return str(x)


def rows(repo: Path) -> list[dict[str, str]]:
    out = []
    cache: dict[str, dict[str, dict]] = {}
    for container, tags in CONTAINERS.items():
        for tag in tags:
            configs = cache.setdefault(tag, tag_configs(repo, tag))
            for name in sorted(configs):
                if "PRETRAIN" not in name and not name.endswith("_BASE_CONFIG"):
                    continue  # SFT / LoRA presets
                c = configs[name]
                gpu = _token(name, GPU_TOKENS)
                out.append({
                    "container": container, "megatron_bridge": tag, "config": name, "model": _model(name, gpu),
                    "gpu": gpu,
                    "precision": _token(name, PRECISIONS), "num_gpus": _cell(c.get("num_gpus")),
                    "tp": _cell(c.get("tensor_model_parallel_size")), "pp": _cell(c.get("pipeline_model_parallel_size")),
                    "vp": _cell(c.get("virtual_pipeline_model_parallel_size")),
                    "cp": _cell(c.get("context_parallel_size")), "ep": _cell(c.get("expert_model_parallel_size")),
                    "etp": _cell(c.get("expert_tensor_parallel_size")), "micro_batch": _cell(c.get("micro_batch_size")),
                    "global_batch": _cell(c.get("global_batch_size")), "cuda_graph_impl": _cell(c.get("cuda_graph_impl")),
                    "cuda_graph_scope": _cell(c.get("cuda_graph_scope")),
                    "moe_a2a_overlap": _cell(c.get("moe_a2a_overlap")),
                    "moe_flex_dispatcher_backend": _cell(c.get("moe_flex_dispatcher_backend")),
                    "recompute_modules": _cell(c.get("recompute_modules")),
                    "cpu_offloading_num_layers": _cell(c.get("cpu_offloading_num_layers")),
                })
    return out


def render(table: list[dict[str, str]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", type=Path, help="a git clone (or mirror) of github.com/NVIDIA-NeMo/Megatron-Bridge")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the committed CSV differs")
    args = parser.parse_args(argv)
    text = render(rows(args.repo))
    if args.check:
        same = OUT.exists() and OUT.read_text(encoding="utf-8") == text
        print(f"{OUT.relative_to(ROOT)}: {'up to date' if same else 'differs'}")
        return 0 if same else 1
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)} ({text.count(chr(10)) - 1} configs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
