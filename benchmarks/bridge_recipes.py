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

This script reads those files at the Megatron-Bridge release each NeMo container ships, as
Megatron-Bridge's documentation version picker pairs them (docs/versions1.json of v0.6.0: "0.2.0 ·
25.11", "0.3.0 · 26.02", "0.3.1 · 26.02.01", "0.4.0 · 26.04", "0.4.2 · 26.04.01", "0.5.0 · 26.06",
"0.5.1 · 26.06.01", "0.6.0 · 26.08"; docs/releases/software-versions.md agrees for the four it lists).
Every config of those tags is written, one CSV row each; compiler/calibration/bridge_recipes.py picks,
for a published row, the first config of its container whose model, GPU, precision and layout (GPUs,
tp, pp, vp, cp, ep, micro-batch) are the row's.

Up to 0.5.x the workload files import only ``dataclasses.replace`` and ``utils.utils.WorkloadBaseConfig``
(a plain dataclass "because we cannot import MBridge on the headnode"), so each is executed against that
tag's own utils.py. 0.6.0 moved the recipes into Python functions under src/megatron/bridge/perf_recipes
(``<model>_pretrain_<N>gpu_<gpu>_<precision>[_<variant>]_config``) that build a full Megatron-Bridge
config and need megatron to run; they are read statically instead (``PyRecipeReader``): the assignments
of literals to ``cfg.<section>.<field>`` in order, following the package's own helpers the function calls
with ``cfg`` (``_enable_hybridep_full_iteration_mxfp8(cfg)``, ...), with their keyword defaults and
literal arguments bound and ``if``s on them decided; a branch on anything else is not taken, and an
assignment of anything but a literal leaves the field unknown (blank).

NeMo 25.09 shipped Megatron-Bridge 0.1.0rc3 (docs/releases/software-versions.md of v0.6.0, "NeMo Framework
25.09": "Megatron-Bridge | 0.1.0rc3"; the version picker's "0.1.0 · 25.09"). That release kept its recipes as
YAML perf matrices (scripts/performance/configs/<family>/<model>_llm_pretrain.yaml: ``perf_matrix.<gpu>.
num_gpus_<N>``, a ``common`` block deep-merged with one block per precision, as utils/helpers.py
apply_perf_matrix_overrides does), read by ``yaml_tag_configs``; ``cuda_graphs: true`` is Megatron-Core's
``enable_cuda_graph``, the per-layer ``local`` implementation (helpers.py set_cuda_graph_overrides), never a
full-iteration graph. Its run_script.py decides a few settings in code, per model and GPU, not in the YAML:
those are ``RUN_SCRIPT_0_1`` below, copied with their lines.

``--check`` exits 1 if the committed CSV differs from what would be written.
"""
from __future__ import annotations

import argparse
import ast
import csv
import io
import re
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
    "25.09": ("v0.1.0rc3",),
    "25.11": ("v0.2.0",),
    "26.02": ("v0.3.0",),
    "26.02.01": ("v0.3.1",),
    "26.04": ("v0.4.0",),
    "26.04.01": ("v0.4.2",),
    "26.06": ("v0.5.0",),
    "26.06.01": ("v0.5.1",),
    "26.08": ("v0.6.0",),
}
PY_RECIPES = "src/megatron/bridge/perf_recipes"  # 0.6.0 on: recipes as functions (read by PyRecipeReader)
PY_RECIPE_NAME = re.compile(r"^(?P<model>.+?)_pretrain_(?P<gpus>\d+)gpu_(?P<gpu>[a-z0-9]+)_"
                            r"(?P<precision>bf16|fp8cs|fp8mx|fp8sc|nvfp4)(?:_(?P<variant>.+))?_config$")
PY_PRECISIONS = {"bf16": "BF16", "fp8cs": "FP8_CS", "fp8mx": "FP8_MX", "fp8sc": "FP8_SC", "nvfp4": "NVFP4"}
PRECISIONS = ("BF16", "FP8_CS", "FP8_MX", "FP8_SC", "NVFP4")
COLUMNS = ("container", "megatron_bridge", "config", "model", "gpu", "precision", "num_gpus", "tp", "pp", "vp", "cp", "ep",
           "etp", "micro_batch", "global_batch", "cuda_graph_impl", "cuda_graph_scope", "moe_a2a_overlap",
           "moe_flex_dispatcher_backend", "recompute_modules", "cpu_offloading_num_layers")


YAML_CONFIGS = re.compile(r"^scripts/performance/configs/[^/]+/(?P<model>.+)_llm_pretrain\.yaml$")  # 0.1.0
YAML_PRECISIONS = {"bf16": "BF16", "fp8_cs": "FP8_CS", "fp8_mx": "FP8_MX", "fp8_ss": "FP8_SC", "fp8_ds": "FP8_DS"}


def _deepseek_v3_0_1(gpu: str) -> dict[str, object]:
    """Megatron-Bridge 0.1.0rc3 scripts/performance/run_script.py main(), DeepSeek-V3: ``enable_deepep =
    bool(args.gpu.lower() in ["h100"])`` (B200 and GB200 run token drop, "disabling DeepEP"), passed to the recipe,
    which then sets ``moe_token_dispatcher_type = "flex"`` and ``moe_enable_deepep = True``
    (src/megatron/bridge/recipes/deepseek/deepseek_v3.py); ``A2A_1F1B = bool(args.gpu.lower() in ["h100"])`` sets
    ``comm_overlap.overlap_moe_expert_parallel_comm`` True on H100 and False elsewhere; ``recompute_modules``
    ["mla_up_proj", "mlp"] on H100 and ["mla_up_proj", "mlp", "moe_act"] on GB200."""
    h100 = gpu == "H100"
    modules = {"H100": ["mla_up_proj", "mlp"], "GB200": ["mla_up_proj", "mlp", "moe_act"]}.get(gpu)
    return {"moe_flex_dispatcher_backend": "deepep" if h100 else None, "moe_a2a_overlap": h100,
            "recompute_modules": modules}


# the settings 0.1.0rc3's run_script.py sets in code, by model (model_key) and GPU
RUN_SCRIPT_0_1 = {"DEEPSEEKV3": _deepseek_v3_0_1}


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


def yaml_tag_configs(repo: Path, tag: str) -> dict[str, dict]:
    """The perf-matrix entries of a 0.1.0-style tag (module docstring) as the columns' settings, by a name that
    says where each one is: '<file>:<gpu>:num_gpus_<N>:<precision block>'; empty for a tag without YAML recipes."""
    import yaml

    out: dict[str, dict] = {}
    for path in sorted(_git(repo, "ls-tree", "-r", "--name-only", tag, "scripts/performance/configs").split()):
        m = YAML_CONFIGS.match(path)
        if not m:
            continue
        model = model_key(m["model"])
        matrix = (yaml.safe_load(_git(repo, "show", f"{tag}:{path}")) or {}).get("perf_matrix") or {}
        for gpu, sizes in matrix.items():
            extra = RUN_SCRIPT_0_1.get(model, lambda g: {})(gpu.upper())
            for size, preset in (sizes or {}).items():
                common = preset.get("common") or {}
                for block, precision in YAML_PRECISIONS.items():
                    if block not in preset:
                        continue
                    c = {**common, **(preset.get(block) or {})}
                    out[f"{path.rsplit('/', 1)[1]}:{gpu}:{size}:{block}"] = {
                        "model": model, "gpu": gpu.upper(), "precision": precision,
                        "num_gpus": int(size.removeprefix("num_gpus_")), "tensor_model_parallel_size": c.get("tp", 1),
                        "pipeline_model_parallel_size": c.get("pp", 1),
                        "virtual_pipeline_model_parallel_size": c.get("vp"),
                        "context_parallel_size": c.get("cp", 1), "expert_model_parallel_size": c.get("ep", 1),
                        "expert_tensor_parallel_size": c.get("etp"), "micro_batch_size": c.get("mbs"),
                        "global_batch_size": c.get("gbs"), "cuda_graph_impl": "local" if c.get("cuda_graphs") else None,
                        "cpu_offloading_num_layers": c.get("cpu_offloading_num_layers"), **extra}
    return out


UNKNOWN = object()  # a field assigned something that is not a literal


class PyRecipeReader:
    """Reads the recipe functions of one tag's perf_recipes package without running them (module docstring)."""

    def __init__(self, repo: Path, tag: str):
        self.defs: dict[str, dict[str, ast.FunctionDef]] = {}  # module -> its top-level functions
        self.imports: dict[str, dict[str, tuple[str, str]]] = {}  # module -> local name -> (module, name)
        for path in _git(repo, "ls-tree", "-r", "--name-only", tag, PY_RECIPES).split():
            if not path.endswith(".py"):
                continue
            module = path[len("src/"):-len(".py")].replace("/", ".").removesuffix(".__init__")
            tree = ast.parse(_git(repo, "show", f"{tag}:{path}"), path)
            self.defs[module] = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
            self.imports[module] = {a.asname or a.name: (n.module, a.name) for n in tree.body
                                    if isinstance(n, ast.ImportFrom) and n.module for a in n.names}

    def recipes(self) -> dict[str, dict]:
        """name -> the settings its body assigns ("model.cuda_graph_impl": "full_iteration", ...)."""
        out = {}
        for module, defs in self.defs.items():
            for name, fn in defs.items():
                if PY_RECIPE_NAME.match(name):
                    settings: dict[str, object] = {}
                    self._run(module, fn, {}, settings)
                    out[name] = settings
        return out

    def _resolve(self, module: str, name: str) -> tuple[str, ast.FunctionDef] | None:
        if name in self.defs.get(module, {}):
            return module, self.defs[module][name]
        source = self.imports.get(module, {}).get(name)
        if source and source[0] in self.defs and source[1] in self.defs[source[0]]:
            return source[0], self.defs[source[0]][source[1]]
        return None

    def _run(self, module: str, fn: ast.FunctionDef, bound: dict[str, object], settings: dict[str, object],
             cfg: str = "cfg") -> None:
        for stmt in fn.body:
            self._stmt(module, stmt, bound, settings, cfg)

    def _value(self, node: ast.expr, bound: dict[str, object]) -> object:
        if isinstance(node, ast.Name) and node.id in bound:
            return bound[node.id]
        try:
            return ast.literal_eval(node)
        except (ValueError, SyntaxError, TypeError):
            return UNKNOWN

    def _path(self, node: ast.expr, cfg: str) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        return ".".join(reversed(parts)) if isinstance(node, ast.Name) and node.id == cfg and parts else None

    def _test(self, node: ast.expr, bound: dict[str, object]) -> bool | None:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = self._test(node.operand, bound)
            return None if inner is None else not inner
        value = self._value(node, bound)
        return None if value is UNKNOWN else bool(value)

    def _stmt(self, module: str, stmt: ast.stmt, bound: dict[str, object], settings: dict[str, object],
              cfg: str) -> None:
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name) and target.id == cfg:  # cfg = another_recipe_config(): its settings
                    value = stmt.value
                    if isinstance(value, ast.Call) and value.args and isinstance(value.args[0], ast.Call):
                        # cfg = _with_global_batch_size(another_recipe_config(), 128): that recipe, then the helper
                        self._call(module, value.args[0], bound, settings, cfg, own_cfg=True)
                        self._call(module, value, bound, settings, cfg, own_cfg=False, cfg_given=True)
                    else:
                        self._call(module, value, bound, settings, cfg, own_cfg=True)
                    continue
                path = self._path(target, cfg)
                if path is None:
                    continue
                call = stmt.value
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id.endswith("Config"):
                    for key in [k for k in settings if k.startswith(path + ".")]:
                        del settings[key]  # a new section object: what was set on the old one is gone
                    for kw in call.keywords:
                        if kw.arg:
                            settings[f"{path}.{kw.arg}"] = self._value(kw.value, bound)
                else:
                    settings[path] = self._value(call, bound)
        elif isinstance(stmt, ast.If):
            decided = self._test(stmt.test, bound)
            if decided is not None:
                for inner in (stmt.body if decided else stmt.orelse):
                    self._stmt(module, inner, bound, settings, cfg)
        elif isinstance(stmt, ast.Expr):
            self._call(module, stmt.value, bound, settings, cfg, own_cfg=False)

    def _call(self, module: str, call: ast.expr, bound: dict[str, object], settings: dict[str, object], cfg: str,
              *, own_cfg: bool, cfg_given: bool = False) -> None:
        """A call of one of the package's functions: a helper taking ``cfg`` first (``own_cfg`` False; ``cfg_given``:
        whatever its first argument's syntax), or a recipe building its own config that this one starts from."""
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
            return
        passes_cfg = cfg_given or (bool(call.args) and isinstance(call.args[0], ast.Name) and call.args[0].id == cfg)
        if passes_cfg == own_cfg:
            return
        found = self._resolve(module, call.func.id)
        if found is None:
            return
        where, helper = found
        params = [a.arg for a in helper.args.args]
        given = call.args if own_cfg else call.args[1:]
        named = params if own_cfg else params[1:]
        defaults = helper.args.defaults
        args: dict[str, object] = {p: self._value(d, {}) for p, d in zip(params[len(params) - len(defaults):],
                                                                        defaults)}
        args.update({p: self._value(a, bound) for p, a in zip(named, given)})
        args.update({kw.arg: self._value(kw.value, bound) for kw in call.keywords if kw.arg})
        self._run(where, helper, args, settings, cfg="cfg" if own_cfg else params[0])


def py_tag_configs(repo: Path, tag: str) -> dict[str, dict]:
    """The recipe functions of a 0.6.0-style tag as the columns' settings, by function name."""
    out = {}
    for name, got in PyRecipeReader(repo, tag).recipes().items():
        def get(key: str) -> object:
            value = got.get(key)
            return None if value is UNKNOWN else value
        m = PY_RECIPE_NAME.match(name)
        assert m
        out[name] = {
            "num_gpus": int(m["gpus"]), "tensor_model_parallel_size": get("model.tensor_model_parallel_size"),
            "pipeline_model_parallel_size": get("model.pipeline_model_parallel_size"),
            "virtual_pipeline_model_parallel_size": get("model.virtual_pipeline_model_parallel_size"),
            "context_parallel_size": get("model.context_parallel_size"),
            "expert_model_parallel_size": get("model.expert_model_parallel_size"),
            "expert_tensor_parallel_size": get("model.expert_tensor_parallel_size"),
            "micro_batch_size": get("train.micro_batch_size"), "global_batch_size": get("train.global_batch_size"),
            "cuda_graph_impl": get("model.cuda_graph_impl"), "cuda_graph_scope": get("model.cuda_graph_scope"),
            "moe_a2a_overlap": get("comm_overlap.overlap_moe_expert_parallel_comm"),
            "moe_flex_dispatcher_backend": get("model.moe_flex_dispatcher_backend"),
            "recompute_modules": get("model.recompute_modules"),
            "cpu_offloading_num_layers": get("model.cpu_offloading_num_layers"),
        }
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


def rows(repo: Path, containers: dict[str, tuple[str, ...]] | None = None) -> list[dict[str, str]]:
    out = []
    cache: dict[str, tuple[str, dict[str, dict]]] = {}  # tag -> (how its recipes are kept, its configs)
    for container, tags in (CONTAINERS if containers is None else containers).items():
        for tag in tags:
            if tag not in cache:
                if _git(repo, "ls-tree", "--name-only", tag, PY_RECIPES).strip():
                    cache[tag] = ("python", py_tag_configs(repo, tag))
                elif yaml_configs := yaml_tag_configs(repo, tag):
                    cache[tag] = ("yaml", yaml_configs)
                else:
                    cache[tag] = ("workload", tag_configs(repo, tag))
            kind, configs = cache[tag]
            for name in sorted(configs):
                if kind == "workload" and "PRETRAIN" not in name and not name.endswith("_BASE_CONFIG"):
                    continue  # SFT / LoRA presets
                c = configs[name]
                if kind == "yaml":
                    gpu, model, precision = c["gpu"], c["model"], c["precision"]
                elif kind == "python":
                    m = PY_RECIPE_NAME.match(name)
                    assert m
                    gpu, model, precision = m["gpu"].upper(), model_key(m["model"]), PY_PRECISIONS[m["precision"]]
                else:
                    gpu = _token(name, GPU_TOKENS)
                    model, precision = _model(name, gpu), _token(name, PRECISIONS)
                out.append({
                    "container": container, "megatron_bridge": tag, "config": name, "model": model,
                    "gpu": gpu,
                    "precision": precision, "num_gpus": _cell(c.get("num_gpus")),
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
