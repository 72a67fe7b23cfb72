"""Hostile spec generation for the fuzz tests (tests/test_fuzz_specs.py) and benchmarks/fuzz.py.

Specs are built as trees (mappings are lists of (key, value) pairs, so duplicate and
non-string keys can be expressed), mutated by Hypothesis, emitted as YAML text by a small
emitter of our own (block, flow or JSON style; plain or quoted scalars; raw YAML fragments for
tags, anchors and odd number forms), then mutated again as bytes (invalid UTF-8, control
characters, truncation, deleted and duplicated lines, alias bombs appended).

``check_spec`` is the oracle: a spec either loads and lowers, or raises ``SpecError`` whose
every diagnostic has a file:line location, a summary and renders. Anything else is a failure.
"""
from __future__ import annotations

import copy
import math
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

REPO = Path(__file__).resolve().parent.parent
SPEC_PATH = "fuzz/spec.yaml"

# --------------------------------------------------------------------------- tree


class M(list):
    """A YAML mapping as [(key, value), ...]: keeps order, allows duplicate and odd keys."""


@dataclass(frozen=True)
class Raw:
    """A YAML fragment emitted verbatim (tags, aliases, anchors, 0x1F, .nan, ...)."""

    text: str


def to_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return M((k, to_tree(v)) for k, v in value.items())
    if isinstance(value, list):
        return [to_tree(v) for v in value]
    return value


def _plain_yaml(path: Path) -> Any:
    from ruamel.yaml import YAML

    return YAML(typ="safe", pure=True).load(path.read_text(encoding="utf-8"))


RICH_SPEC: dict[str, Any] = {
    "name": "rich-8b",
    "description": "Every section of the spec, for fuzzing.",
    "model": {
        "preset": "llama3-8b",
        "num_kv_heads": 8,
        "tied_embeddings": False,
    },
    "training": {
        "tokens": "1T", "sequence_length": 4096, "global_batch": "4M tokens", "global_batch_tolerance": 0.1,
        "precision": "bf16", "optimizer": "adamw", "learning_rate": 3e-4, "min_learning_rate": 3e-5,
        "warmup_tokens": "2B", "weight_decay": 0.1, "grad_clip": 1.0, "adam_beta1": 0.9, "adam_beta2": 0.95,
        "seed": 42,
    },
    "cluster": {
        "gpu": "h100-sxm", "gpus_per_node": 8, "num_gpus": 16, "price_per_gpu_hour": "$2.49",
        "network": {"intra_node_bandwidth": "900GB/s", "inter_node_bandwidth": "400Gb/s"},
    },
    "budget": {"max_cost": "$5M", "deadline": "365d", "objective": "fastest"},
    "layout": {"pipeline_parallel": 1, "context_parallel": 1, "offload_optimizer": "none"},
    "search": {"memory_headroom": 0.1, "allow_cross_node_tp": False, "top_k": 3},
    "targets": ["deepspeed", "fsdp", "megatron", "slurm"],
    "slurm": {
        "job_name": "rich-8b", "partition": "gpu", "account": "ml-team", "qos": "high", "time_limit": "24h",
        "cpus_per_task": 16, "exclusive": True, "output_dir": "logs/rich", "requeue": True,
        "signal_seconds_before_end": 300, "launcher": "torchrun", "container_image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "container_mounts": ["/data:/data", "/scratch:/scratch:ro"], "modules": ["cuda/12.4", "nccl/2.21"],
        "environment": {"NCCL_DEBUG": "WARN", "HF_HOME": "/scratch/hf cache", "MSG": "it's \"quoted\" $HOME `x`"},
        "rdzv_port": 29400, "workdir": "/scratch/runs", "megatron_dir": "/opt/Megatron-LM",
        "train_script": "train.py",
    },
}

CUSTOM_GPU = {
    "name": "my-gpu", "generation": "hopper", "bf16_flops": "989TFLOPS", "fp8_flops": "1979TFLOPS",
    "hbm": "80GiB", "hbm_bandwidth": "3.35TB/s", "intra_node_bandwidth": "450GB/s",
    "inter_node_bandwidth": "400Gb/s", "pcie_bandwidth": "64GB/s", "price_per_gpu_hour": 2.0,
}
SHAPE_MODEL = {
    "num_layers": 16, "hidden_size": 2048, "ffn_hidden_size": 5632, "num_attention_heads": 16, "num_kv_heads": 4,
    "vocab_size": 32000, "mlp": "swiglu", "norm": "rmsnorm", "position": "rope",
    "moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 2816},
}


def base_specs() -> list[tuple[str, Any]]:
    """(label, plain data) for every example spec, the rich spec and two variants of it."""
    out = [(p.stem, _plain_yaml(p)) for p in sorted((REPO / "specs").glob("*.yaml"))]
    out.append(("rich", copy.deepcopy(RICH_SPEC)))
    custom = copy.deepcopy(RICH_SPEC)
    custom["cluster"] = {"gpu": CUSTOM_GPU, "num_gpus": 16}
    custom["model"] = SHAPE_MODEL
    custom["layout"] = {}
    custom["targets"] = ["megatron", "slurm"]
    custom["slurm"]["launcher"] = "srun"
    out.append(("rich-custom", custom))
    listed = copy.deepcopy(RICH_SPEC)
    listed["cluster"] = {"gpu": ["h100-sxm", "a100-80gb"], "min_gpus": 8, "max_gpus": 64}
    listed["model"] = {"params": "7B"}
    out.append(("rich-gpu-list", listed))
    return out


# --------------------------------------------------------------------------- emitter

_PLAIN_OK = re.compile(r"[A-Za-z_/][A-Za-z0-9_./@+-]*( [A-Za-z0-9_./@+-]+)*")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "~", "y", "n"}


def _dq(text: str) -> str:
    out = ['"']
    for ch in text:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif o < 0x20 or o == 0x7F or 0x80 <= o < 0xA0 or 0xD800 <= o <= 0xDFFF or o in (0xFEFF, 0xFFFE, 0xFFFF):
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def scalar(value: Any, quote: bool = False) -> str:
    if isinstance(value, Raw):
        return value.text
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        return repr(value)
    text = str(value)
    if not quote and _PLAIN_OK.fullmatch(text) and text.lower() not in _RESERVED and len(text) < 200:
        return text
    return _dq(text)


def _key(key: Any, quote: bool) -> str:
    if isinstance(key, (list, M)):
        return emit_flow(key, quote)
    return scalar(key, quote)


def emit_flow(node: Any, quote: bool = False) -> str:
    if isinstance(node, M):
        return "{" + ", ".join(f"{_key(k, quote)}: {emit_flow(v, quote)}" for k, v in node) + "}"
    if isinstance(node, list):
        return "[" + ", ".join(emit_flow(v, quote) for v in node) + "]"
    return scalar(node, quote)


def emit_block(node: Any, indent: int = 0, quote: bool = False) -> str:
    pad = " " * indent
    if isinstance(node, M):
        if not node:
            return pad + "{}\n"
        lines = []
        for k, v in node:
            head = f"{pad}{_key(k, quote)}:"
            if isinstance(v, (M, list)) and v:
                lines.append(head + "\n" + emit_block(v, indent + 2, quote))
            else:
                lines.append(f"{head} {emit_flow(v, quote)}\n")
        return "".join(lines)
    if isinstance(node, list):
        if not node:
            return pad + "[]\n"
        lines = []
        for v in node:
            if isinstance(v, (M, list)) and v:
                lines.append(f"{pad}-\n" + emit_block(v, indent + 2, quote))
            else:
                lines.append(f"{pad}- {emit_flow(v, quote)}\n")
        return "".join(lines)
    return pad + scalar(node, quote) + "\n"


def emit(node: Any, style: str) -> str:
    if style == "flow":
        return emit_flow(node) + "\n"
    if style == "quoted":
        return emit_block(node, quote=True)
    return emit_block(node)


# --------------------------------------------------------------------------- tree mutations

KNOWN_KEYS = sorted({
    "name", "description", "model", "training", "cluster", "budget", "layout", "search", "targets", "slurm",
    "preset", "params", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads",
    "head_dim", "vocab_size", "mlp", "norm", "position", "moe", "num_experts", "top_k", "expert_ffn_hidden_size",
    "tokens", "sequence_length", "global_batch", "precision", "optimizer", "learning_rate", "seed", "gpu",
    "gpus_per_node", "num_gpus", "max_gpus", "min_gpus", "price_per_gpu_hour", "network", "max_cost", "deadline",
    "objective", "tensor_parallel", "pipeline_parallel", "virtual_pipeline_stages", "pipeline_schedule",
    "context_parallel", "expert_parallel", "data_parallel", "data_parallel_shard", "zero_stage", "micro_batch_size",
    "recompute", "sequence_parallel", "offload_optimizer", "offload_params", "memory_headroom", "job_name",
    "partition", "account", "qos", "time_limit", "environment", "modules", "container_image", "container_mounts",
    "workdir", "megatron_dir", "train_script", "output_dir", "launcher", "rdzv_port", "hbm",
    "bf16_flops", "generation", "inter_node_bandwidth", "intra_node_bandwidth", "first_dense_layers",
})

HOSTILE_NUMBERS: list[Any] = [
    0, -1, 1, 2, 3, 7, 8, 16, 4096, 10**7, 10**7 + 1, 2**31, 2**63, 10**30, -(10**30), 10**400,
    0.0, -0.0, 0.5, 1.5, 1e-300, 5e-324, 1e300, 1.7976931348623157e308, -1e308,
    float("nan"), float("inf"), float("-inf"),
    Raw(".nan"), Raw(".NaN"), Raw("-.inf"), Raw(".Inf"), Raw("0x1F"), Raw("0o17"), Raw("017"), Raw("1_000"),
    Raw("190:20:30"), Raw("1e400"), Raw("-1e400"), Raw("+12"), Raw("0b101"), Raw("9" * 5000),
    Raw("1" + "0" * 300), Raw("1.0e+3"), Raw(".5"), Raw("5."),
]
HOSTILE_UNITS: list[str] = [
    "80GiB", "80 GiB", "80gib", "80XB", "-5GiB", "1e400B", "nan GiB", "inf", "-inf", "NaN", "0GiB", "0",
    "1e-300GiB", "400Gb/s", "400 Gbps", "-400Gb/s", "0Gb/s", "900GB/s", "1.2PFLOPS", "-1TFLOPS", "0TFLOPS",
    "$2.5M", "$-3", "$", "$nan", "2.49 USD", "30d", "0s", "-12h", "1e9w", "12 fortnights", "15T", "15 T", "1.5",
    "70B", "70b", "1e30T", "0.5", "16M tokens", "0 tokens", "-1 tokens", "1e300 tokens", "2048 sequences",
    "nan tokens", "tokens", "1,000", "1_000_000", "", " ", "∞", "七十B", "70B; rm -rf ~", "$(reboot)GiB",
]
HOSTILE_STRINGS: list[str] = [
    "", " ", "a", "-", "--help", "-x", "..", "../../etc", "/", "/etc/passwd", "~", "~root", ".hidden",
    "a b", "a\tb", "a\nb", "a\rb", "a\x00b", "a\x1b[31mred", "\u202e", "é", "😀", "\ufeff", "\u2028",
    "$(touch CANARY)", "`touch CANARY`", "; touch CANARY", "' ; touch CANARY; '", "\"; touch CANARY; \"",
    "\n#SBATCH --account=evil", "${HOME}", "$HOME", "*", "?", "[a]", "{a}", "a|b", "a&b", "a>b", "a<b",
    "\\", "%x", "%j", "!!python/object", "&anchor", "*alias", "null", "true", "yes", "no", "0", "1.5",
    "h100-sxm", "llama3-8b", "a" * 64, "a" * 65, "a" * 129, "a" * 5000, "x" * 100_000,
]
HOSTILE_VALUES: list[Any] = [None, True, False, [], M(), ["a"], M([("a", 1)]), [[[]]], M([("k", M())])]

TAGS = ["!foo", "!!python/object/apply:os.system", "!!python/name:os.system", "!!binary", "!!set", "!!omap",
        "!!timestamp", "!!float", "!!int", "!!str", "!!null", "!!bool", "!!map", "!!seq", "!<tag:evil>", "!e!x"]


# Plausible values per section and key: most mutated specs should stay valid, so that the
# checks after parsing (lower, and the solver in the compile sample) get exercised too.
PLAUSIBLE: dict[str, dict[str, list[Any]]] = {
    "model": {"preset": ["llama3-8b", "llama2-7b", "mixtral-8x7b", "llama3-70b", "qwen2.5-7b", "nope-1b"],
              "num_kv_heads": [1, 2, 4, 8, 3], "tied_embeddings": [True, False], "linear_bias": [True, False],
              "attention_bias": [True, False], "vocab_size": [32000, 128256], "num_layers": [2, 16, 32, 80]},
    "training": {"tokens": ["1T", "100B", "15T", 10**9, "2M"], "sequence_length": [512, 2048, 4096, 8192, 3000],
                 "global_batch": [1, 256, 512, 1024, "4M tokens", "16M tokens", "1000 sequences"],
                 "precision": ["bf16", "fp16", "fp8", "fp32"], "optimizer": ["adamw", "adam", "sgd"],
                 "global_batch_tolerance": [0.0, 0.1, 0.5], "learning_rate": [1e-4, 3e-4, 1.0],
                 "min_learning_rate": [0.0, 1e-5], "warmup_tokens": [0, "1B"], "seed": [0, 1, 99999]},
    "cluster": {"gpu": ["h100-sxm", "a100-80gb", "a100-40gb", "h200", "mi300x", "b200", ["h100-sxm", "a100-80gb"]],
                "num_gpus": [1, 4, 8, 16, 32, 64, 128, 12], "gpus_per_node": [1, 4, 8], "max_gpus": [64, 1024],
                "min_gpus": [8, 16], "price_per_gpu_hour": ["$2", 0, 3.5]},
    "budget": {"objective": ["fastest", "cheapest", "throughput"], "max_cost": ["$1M", "$100K", "$10"],
               "deadline": ["30d", "90d", "1h"]},
    "layout": {"tensor_parallel": [1, 2, 4, 8], "pipeline_parallel": [1, 2, 4], "context_parallel": [1, 2],
               "expert_parallel": [1, 2, 8], "data_parallel": [1, 2, 4, 8], "data_parallel_shard": [1, 2, 8],
               "zero_stage": [0, 1, 2, 3], "micro_batch_size": [1, 2, 4], "recompute": ["none", "selective", "full"],
               "sequence_parallel": [True, False], "offload_optimizer": ["none", "cpu", "nvme"],
               "offload_params": ["none", "cpu"], "virtual_pipeline_stages": [1, 2],
               "pipeline_schedule": ["gpipe", "1f1b", "interleaved_1f1b"]},
    "search": {"memory_headroom": [0.0, 0.1, 0.5], "top_k": [1, 5, 50], "allow_cross_node_tp": [True, False]},
    "slurm": {"partition": ["gpu", "batch.q", "a+b"], "account": ["ml", "proj_1"], "qos": ["normal"],
              "time_limit": ["1h", "2d", 3600, "90min"], "modules": [["cuda/12.4"], []], "exclusive": [True, False],
              "requeue": [True, False], "launcher": ["torchrun", "deepspeed", "srun"], "rdzv_port": [1, 29500, 65535],
              "environment": [{"A": "1"}, {"NCCL_DEBUG": "INFO", "X": "a b 'c' $d"}], "cpus_per_task": [1, 8, 1024],
              "signal_seconds_before_end": [0, 60], "container_image": ["nvcr.io/nvidia/pytorch:24.05-py3"],
              "workdir": ["/scratch", "runs/x"], "output_dir": ["logs", "/tmp/l"]},
    "": {"targets": [["deepspeed"], ["fsdp", "slurm"], ["megatron", "slurm"], ["deepspeed", "fsdp", "megatron", "slurm"],
                     ["fsdp"], ["slurm"]], "description": ["", "x" * 2000], "name": ["a", "run-1.2_x"]},
}


def _plausible(draw: st.DrawFn, tree: Any) -> Any:
    if not isinstance(tree, M):
        return tree
    section = draw(st.sampled_from(sorted(PLAUSIBLE)))
    key = draw(st.sampled_from(sorted(PLAUSIBLE[section])))
    value = to_tree(copy.deepcopy(draw(st.sampled_from(PLAUSIBLE[section][key]))))
    target = tree
    if section:
        found = [v for k, v in tree if k == section and isinstance(v, M)]
        if not found:
            target = M()
            tree.append((section, target))
        else:
            target = found[0]
    for i, (k, _) in enumerate(target):
        if k == key:
            target[i] = (k, value)
            return tree
    target.append((key, value))
    return tree


def paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value (indices into M pairs and lists)."""
    out = [prefix]
    if isinstance(node, M):
        for i, (_, v) in enumerate(node):
            out += paths(v, prefix + (i,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += paths(v, prefix + (i,))
    return out


def _get(node: Any, path: tuple) -> Any:
    for i in path:
        node = node[i][1] if isinstance(node, M) else node[i]
    return node


def _set(node: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    parent = _get(node, path[:-1])
    i = path[-1]
    if isinstance(parent, M):
        parent[i] = (parent[i][0], value)
    else:
        parent[i] = value
    return node


def _wrap_deep(value: Any, depth: int, kind: str) -> Any:
    for _ in range(depth):
        value = [value] if kind == "list" else M([("k", value)])
    return value


@st.composite
def replacement_values(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["number", "unit", "string", "value", "deep", "text", "int", "float", "tag"]))
    if kind == "number":
        return draw(st.sampled_from(HOSTILE_NUMBERS))
    if kind == "unit":
        return draw(st.sampled_from(HOSTILE_UNITS))
    if kind == "string":
        return draw(st.sampled_from(HOSTILE_STRINGS))
    if kind == "value":
        return copy.deepcopy(draw(st.sampled_from(HOSTILE_VALUES)))
    if kind == "deep":
        return _wrap_deep("x", draw(st.integers(1, 60)), draw(st.sampled_from(["list", "map"])))
    if kind == "text":
        return draw(st.text(max_size=40))
    if kind == "int":
        return draw(st.integers(min_value=-(2**70), max_value=2**70))
    if kind == "float":
        return draw(st.floats(allow_nan=True, allow_infinity=True))
    tag = draw(st.sampled_from(TAGS))
    return Raw(f"{tag} {draw(st.sampled_from(['x', '1', '[a]', '{a: 1}', 'aGVsbG8=', '2001-12-14']))}")


@st.composite
def mutated_tree(draw: st.DrawFn, bases: list[tuple[str, Any]]) -> tuple[str, Any]:
    label, data = draw(st.sampled_from(bases))
    tree = to_tree(copy.deepcopy(data))
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.integers(0, 9)) < 5:
            tree = _plausible(draw, tree)
            continue
        everything = paths(tree)
        path = draw(st.sampled_from(everything))
        parent = _get(tree, path[:-1]) if path else None
        op = draw(st.sampled_from(["delete", "duplicate", "rename", "retype", "retype", "retype", "add", "wrap"]))
        if op == "delete" and path and parent is not None and len(parent) > 0:
            del parent[path[-1]]
        elif op == "duplicate" and path and isinstance(parent, (M, list)):
            parent.insert(path[-1], copy.deepcopy(parent[path[-1]]))
        elif op == "rename" and path and isinstance(parent, M):
            key, value = parent[path[-1]]
            new = draw(st.one_of(
                st.sampled_from(KNOWN_KEYS),
                st.just(str(key).upper()), st.just(str(key) + "s"), st.just(str(key)[:-1]),
                st.sampled_from([1, 1.5, True, None, "", " ", "a b", "<<", "$x", "é", Raw("[a, b]"), Raw("? x")]),
                st.text(max_size=12)))
            parent[path[-1]] = (new, value)
        elif op == "add" and isinstance(_get(tree, path), M):
            target = _get(tree, path)
            target.append((draw(st.sampled_from(KNOWN_KEYS)), draw(replacement_values())))
        elif op == "wrap":
            tree = _set(tree, path, [_get(tree, path)] if draw(st.booleans()) else M([("x", _get(tree, path))]))
        else:
            tree = _set(tree, path, draw(replacement_values()))
    return label, tree


# --------------------------------------------------------------------------- byte mutations

BYTE_SNIPPETS = [b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x00", b"\x1b", b"\x07",
                 b"\r", b"\r\n", b"\t", b"\xef\xbb\xbf", b"\xc2\x85", b"\xe2\x80\xa8", b":", b"- ", b"[", b"{",
                 b"]", b"}", b'"', b"'", b"&a ", b"*a", b"!!", b"%YAML 1.1\n", b"---\n", b"...\n", b"|", b">", b"#",
                 b"? ", b"<<: *a\n", b"@", b"`", b"\\", b"\n", b"  ", b"\n\n\n"]

ALIAS_BOMB = (b"bomb0: &b0 [x, x, x, x, x, x, x, x, x, x]\n"
              + b"".join(b"bomb%d: &b%d [" % (i, i) + b", ".join(b"*b%d" % (i - 1) for _ in range(10)) + b"]\n"
                         for i in range(1, 8)))
MERGE_BOMB = (b"m0: &m0 {" + b", ".join(b"k%d: 1" % i for i in range(50)) + b"}\n"
              + b"m1: {<<: [" + b", ".join(b"*m0" for _ in range(120)) + b"]}\n")
APPENDIX = [
    ALIAS_BOMB, MERGE_BOMB, b"self: &s [*s]\n", b"x: *undefined\n", b"x: &a 1\ny: *a\n", b"<<: {name: merged}\n",
    b"model: &m {preset: llama3-8b}\nother: *m\n", b"---\nname: second\n", b"name: dup\n", b"? [a, b]\n: 1\n",
    b"x: !!python/object/apply:os.system ['touch CANARY']\n", b"x: !!binary aGVsbG8=\n", b"x: 2001-12-14\n",
    b"x: " + b"[" * 200 + b"]" * 200 + b"\n", b"x: " + b"{a: " * 100 + b"1" + b"}" * 100 + b"\n",
    b"x:\n" + b"".join(b" " * i + b"- a\n" for i in range(0, 80, 2)), b"x: " + b"- " * 100 + b"a\n",
    b"%TAG !e! tag:example.com,2000:\n", b"x: \"\\ud800\"\n", b"x: \"\\x00\"\n", b"x: " + b"y" * 70_000 + b"\n",
]


@st.composite
def mutated_bytes(draw: st.DrawFn, data: bytes) -> bytes:
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["insert", "delete", "dupline", "dropline", "truncate", "append", "flip",
                                   "indent", "prepend"]))
        pos = draw(st.integers(0, max(0, len(data))))
        lines = data.split(b"\n")
        line_i = draw(st.integers(0, max(0, len(lines) - 1)))
        if op == "insert":
            data = data[:pos] + draw(st.sampled_from(BYTE_SNIPPETS)) + data[pos:]
        elif op == "delete":
            data = data[:pos] + data[pos + draw(st.integers(1, 8)):]
        elif op == "dupline":
            data = b"\n".join(lines[:line_i + 1] + [lines[line_i]] + lines[line_i + 1:])
        elif op == "dropline":
            data = b"\n".join(lines[:line_i] + lines[line_i + 1:])
        elif op == "truncate":
            data = data[:pos]
        elif op == "append":
            data = data + (b"" if data.endswith(b"\n") else b"\n") + draw(st.sampled_from(APPENDIX))
        elif op == "prepend":
            data = draw(st.sampled_from(APPENDIX)) + data
        elif op == "flip":
            if data:
                i = min(pos, len(data) - 1)
                data = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1:]
        else:
            lines[line_i] = b" " * draw(st.integers(1, 3)) + lines[line_i]
            data = b"\n".join(lines)
    return data


@st.composite
def fuzz_specs(draw: st.DrawFn, bases: list[tuple[str, Any]], *, byte_level: bool) -> bytes:
    _, tree = draw(mutated_tree(bases))
    text = emit(tree, draw(st.sampled_from(["block", "block", "flow", "quoted"])))
    data = text.encode("utf-8", errors="surrogatepass")
    if byte_level:
        data = draw(mutated_bytes(data))
    return data


# --------------------------------------------------------------------------- real processes, with limits

HOSTILE_CASES = REPO / "tests/cases/hostile"  # specs that once cost minutes or gigabytes (issue #16)
CASE_CPU_S = 10.0  # CPU seconds per case (RLIMIT_CPU: the kernel ends a runaway, however loaded the machine)
CASE_RSS_MB = 500.0  # the child's own peak RSS (wait4's ru_maxrss)
CASE_AS_BYTES = 1 << 30  # RLIMIT_AS: address space
CASE_WALL_S = 60.0  # a backstop for a child that sleeps or blocks (CPU time does not grow then)


@dataclass
class Limited:
    """What one limited child did: exit code (None: ended by a limit), stderr, seconds, its own usage."""

    code: int | None
    stderr: str
    wall_s: float
    cpu_s: float
    rss_mb: float
    signal: int | None = None


# The launcher between the test process and the measured child. Linux records the pre-exec address
# space's high-water RSS in the exec'ing process (fs/exec.c exec_mmap: setmax_mm_hiwater_rss), so a
# child forked straight from a pytest process that has imported torch reports that process's RSS as
# its own peak. A small `python -S` launcher forks the child from its own ~10 MB image, applies the
# limits, waits for it and writes its wait4 usage as JSON: the figures are the child's alone.
_LAUNCHER = r"""
import json, math, os, resource, sys
cpu_s, address_space, out = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
pid = os.fork()
if pid == 0:
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    whole = max(1, math.ceil(cpu_s))
    resource.setrlimit(resource.RLIMIT_CPU, (whole, whole + 1))
    try:
        os.execv(sys.argv[4], sys.argv[4:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(out, "w") as f:
    json.dump({"status": status, "cpu_s": usage.ru_utime + usage.ru_stime, "maxrss_kb": usage.ru_maxrss}, f)
"""


def run_limited(args: list[str], cwd: Path, *, cpu_s: float = CASE_CPU_S, wall_s: float = CASE_WALL_S,
                address_space: int = CASE_AS_BYTES, stdin: Any = None) -> Limited:
    """Run ``args`` under RLIMIT_CPU and RLIMIT_AS; CPU seconds and peak RSS are the child's own
    (``wait4`` in a small launcher, see _LAUNCHER), not the machine's nor the test process's, so the
    figures hold whatever else runs alongside."""
    import json
    import os
    import shutil
    import subprocess

    exe = args[0] if os.path.isabs(args[0]) else shutil.which(args[0]) or args[0]
    stamp = f"{os.getpid()}-{time.monotonic_ns()}"
    err_path, usage_path = cwd / f"stderr-{stamp}.txt", cwd / f"usage-{stamp}.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    launcher = [sys.executable, "-S", "-c", _LAUNCHER, str(cpu_s), str(address_space), str(usage_path), exe,
                *args[1:]]
    with open(err_path, "wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(launcher, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, stdin=stdin, env=env,
                                start_new_session=True)
        try:
            proc.wait(timeout=wall_s)
        except subprocess.TimeoutExpired:  # a child that sleeps or blocks: end the launcher's whole group
            os.killpg(proc.pid, 9)
            proc.wait()
        elapsed = time.perf_counter() - start
    text = err_path.read_text(errors="replace")
    err_path.unlink()
    if not usage_path.exists():  # the launcher itself was killed (wall-clock backstop)
        return Limited(None, text, elapsed, 0.0, 0.0, 9)
    usage = json.loads(usage_path.read_text())
    usage_path.unlink()
    code = os.waitstatus_to_exitcode(usage["status"])
    signal = -code if code < 0 else None
    return Limited(None if signal else code, text, elapsed, usage["cpu_s"], usage["maxrss_kb"] / 1024, signal)


def hostile_cases() -> list[Path]:
    return sorted(HOSTILE_CASES.glob("*.yaml"))


# --------------------------------------------------------------------------- concurrent compiles

RACE_NAME = "race"


def race_spec(partition: str) -> str:
    return (f"name: {RACE_NAME}\nmodel: {{preset: llama2-7b}}\n"
            "training: {tokens: 100B, sequence_length: 4096, global_batch: 1024}\n"
            "cluster: {gpu: h100-sxm, num_gpus: 8}\nbudget: {objective: throughput}\n"
            f"slurm: {{partition: {partition}, time_limit: 2h}}\n")


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() or p.is_symlink()}


@dataclass
class RaceFigures:
    pairs: int = 0
    runs: int = 0
    exit_0: int = 0
    clean_errors: int = 0  # exit 2 with an error that says what happened
    complete: int = 0  # pairs that ended with a complete folder (one of the known sets, manifest matching)
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"concurrent compiles: {self.pairs} pairs ({self.runs} real processes writing one folder at once): "
                f"{self.exit_0} exit 0, {self.clean_errors} clean errors, {self.complete} complete folders, "
                f"{len(self.problems)} partial or broken")


def race_pairs(root: Path, pairs: int, *, seed: int = 0, figures: RaceFigures | None = None) -> RaceFigures:
    """``pairs`` times, two real ``dtc compile --out OUT`` of one spec name started together (the same
    spec, or two versions of it; into a new folder or over an existing one). Every run must exit 0,
    or 2 with a clean error; the folder must end as one complete set, and no staging folder may stay."""
    import os
    import random
    import subprocess
    import sys

    rng = random.Random(seed)
    figures = figures or RaceFigures()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    refs: dict[str, dict[str, bytes]] = {}
    for part in ("pa", "pb"):
        spec = root / f"{part}.yaml"
        spec.write_text(race_spec(part))
        ref = root / f"ref-{part}"
        subprocess.run([sys.executable, "-m", "compiler", "compile", str(spec), "--out", str(ref)], env=env,
                       check=True, capture_output=True, timeout=300)
        refs[part] = folder_bytes(ref / RACE_NAME)
    for i in range(pairs):
        out = root / f"out-{i}"
        if i % 2:  # over an existing folder
            subprocess.run([sys.executable, "-m", "compiler", "compile", str(root / "pa.yaml"), "--out", str(out)],
                           env=env, check=True, capture_output=True, timeout=300)
        specs = ["pa", "pa"] if i % 4 < 2 else ["pa", "pb"]
        procs = []
        for j, part in enumerate(specs):
            if j:
                time.sleep(rng.uniform(0, 0.005))
            procs.append(subprocess.Popen([sys.executable, "-m", "compiler", "compile", str(root / f"{part}.yaml"),
                                           "--out", str(out)], env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True))
        figures.pairs += 1
        for proc in procs:
            _, err = proc.communicate(timeout=300)
            figures.runs += 1
            if proc.returncode == 0:
                figures.exit_0 += 1
            elif proc.returncode == 2 and "error:" in err and "Traceback" not in err:
                figures.clean_errors += 1
            else:
                figures.problems.append(f"pair {i}: exit {proc.returncode}: {err[-2000:]}")
        state = folder_bytes(out / RACE_NAME) if (out / RACE_NAME).is_dir() else {}
        if state in (refs["pa"], refs["pb"]):
            figures.complete += 1
        else:
            figures.problems.append(f"pair {i}: {out / RACE_NAME} is not a complete set: {sorted(state)}")
        left = sorted(p.name for p in out.iterdir() if p.name.startswith((".dtc-tmp-", ".dtc-old-")))
        if left:
            figures.problems.append(f"pair {i}: left {left}")
    return figures


# --------------------------------------------------------------------------- oracle


@dataclass
class Stats:
    """Figures printed at the end of a run."""

    specs: int = 0
    valid: int = 0
    rejected: int = 0
    failures: list[str] = field(default_factory=list)
    max_s: float = 0.0  # CPU seconds of this thread (what the spec costs, whatever else the machine runs)
    max_s_spec: bytes = b""
    max_wall_s: float = 0.0
    max_mb: float = 0.0
    memory_samples: int = 0

    def line(self, label: str = "fuzz") -> str:
        return (f"{label}: {self.specs} specs, {self.valid} valid, {self.rejected} rejected with a location, "
                f"{len(self.failures)} failures, max {self.max_s:.2f} s CPU ({self.max_wall_s:.2f} s wall), "
                f"max {self.max_mb:.0f} MB (traced on {self.memory_samples})")


class FuzzFailure(AssertionError):
    pass


def check_diagnostics(exc: Any, path: str) -> None:
    """Every diagnostic: located at path:line, with a one-line summary, and the error renders."""
    text = exc.render()
    assert isinstance(text, str) and re.search(r"error(\[\w+\])?:", text), text
    assert exc.diagnostics, "SpecError without diagnostics"
    for d in exc.diagnostics:
        assert d.summary and d.summary.strip(), f"empty summary in {text!r}"
        assert d.location is not None, f"no location: {d.summary!r}"
        assert d.location.path == path, f"wrong path {d.location.path!r}: {d.summary!r}"
        assert d.location.line is not None and d.location.line >= 1, f"no line: {d.summary!r}"
        rendered = d.render()
        assert rendered.startswith(f"{path}:{d.location.line}"), rendered
        assert "Traceback" not in rendered
        assert len(rendered) < 5000, f"diagnostic of {len(rendered)} characters: {rendered[:300]!r}"


def check_spec(data: bytes, stats: Stats, *, trace_memory: bool = False, max_s: float = 3.0,
               max_mb: float = 300.0) -> str:
    """Load + lower one spec in-process; 'valid' or 'rejected', else raise FuzzFailure."""
    import tracemalloc

    from compiler.errors import SpecError
    from compiler.problem import lower
    from compiler.spec.load import load_spec_bytes

    stats.specs += 1
    if trace_memory:  # measured on a second run: tracemalloc slows allocation-heavy code several times
        tracemalloc.start()
        try:
            lower(load_spec_bytes(data, SPEC_PATH))
        except Exception:  # noqa: BLE001 - judged on the timed run below
            pass
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        stats.memory_samples += 1
        stats.max_mb = max(stats.max_mb, peak)
    start, start_cpu = time.perf_counter(), time.thread_time()
    try:
        lower(load_spec_bytes(data, SPEC_PATH))
        outcome = "valid"
    except SpecError as exc:
        outcome = "rejected"
        try:
            check_diagnostics(exc, SPEC_PATH)
        except AssertionError as bad:
            stats.failures.append(repr(data[:200]))
            raise FuzzFailure(f"badly located error: {bad}\nspec: {data[:500]!r}") from None
    except Exception as exc:  # noqa: BLE001 - any other exception is the bug we hunt
        stats.failures.append(repr(data[:200]))
        raise FuzzFailure(f"{type(exc).__name__} instead of a SpecError:\n"
                          f"{''.join(traceback.format_exception(exc))}\nspec: {data[:500]!r}") from None
    finally:
        elapsed = time.thread_time() - start_cpu
        stats.max_wall_s = max(stats.max_wall_s, time.perf_counter() - start)
        if elapsed > stats.max_s:
            stats.max_s, stats.max_s_spec = elapsed, data
    if outcome == "valid":
        stats.valid += 1
    else:
        stats.rejected += 1
    if elapsed > max_s:
        stats.failures.append(repr(data[:200]))
        raise FuzzFailure(f"one spec took {elapsed:.2f} s of CPU (limit {max_s} s): {data[:300]!r}")
    if trace_memory and stats.max_mb > max_mb:
        stats.failures.append(repr(data[:200]))
        raise FuzzFailure(f"one spec allocated {stats.max_mb:.0f} MB (limit {max_mb} MB): {data[:300]!r}")
    return outcome


# --------------------------------------------------------------------------- hand-written corpus

_HEAD = b"name: t\nmodel: {params: 70B}\ntraining: {tokens: 1T, sequence_length: 4096, global_batch: 512}\n"
_GPU = b"cluster: {gpu: h100-sxm, num_gpus: 8}\n"


def _custom_gpu(**over: bytes) -> bytes:
    fields = {b"name": b"x", b"generation": b"hopper", b"bf16_flops": b"1e15", b"hbm": b"80GiB",
              b"hbm_bandwidth": b"3TB/s", b"intra_node_bandwidth": b"450GB/s", b"inter_node_bandwidth": b"400Gb/s",
              b"price_per_gpu_hour": b"2"}
    fields.update({k.encode(): v for k, v in over.items()})
    return b"cluster: {num_gpus: 8, gpu: {" + b", ".join(k + b": " + v for k, v in fields.items()) + b"}}\n"


def hostile_corpus() -> list[tuple[str, bytes]]:
    """Specs written to hurt: each must load and lower, or fail located, in well under a few seconds."""
    laughs = [b"a: &a [x, x, x, x, x, x, x, x, x]"]
    for i, c in enumerate("bcdefghi"):
        laughs.append(c.encode() + b": &" + c.encode() + b" [" + b", ".join(b"*" + "abcdefghi"[i].encode()
                                                                            for _ in range(9)) + b"]")
    merge_chain = [b"a0: &a0 {" + b", ".join(b"k0_%d: 1" % j for j in range(10)) + b"}"]
    merge_chain += [b"a%d: &a%d {<<: *a%d, " % (i, i, i - 1) + b", ".join(b"k%d_%d: 1" % (i, j) for j in range(10))
                    + b"}" for i in range(1, 90)]
    cases: list[tuple[str, bytes]] = [
        ("empty", b""), ("only-comment", b"# nothing\n"), ("null-doc", b"null\n"), ("scalar-doc", b"hello\n"),
        ("list-doc", b"- a\n- b\n"), ("two-docs", b"name: a\n---\nname: b\n"), ("doc-end", b"---\n...\n"),
        ("bom", b"\xef\xbb\xbf" + _HEAD + _GPU), ("utf16", (_HEAD + _GPU).decode().encode("utf-16")),
        ("latin1", b"name: caf\xe9\n"), ("overlong-utf8", b"name: \xc0\xaf\n"), ("nul", _HEAD + b"\x00" + _GPU),
        ("escape-seq", b"name: \x1b[31mred\n"), ("crlf", (_HEAD + _GPU).replace(b"\n", b"\r\n")),
        ("cr-only", (_HEAD + _GPU).replace(b"\n", b"\r")), ("tab-indent", b"model:\n\tparams: 70B\n"),
        ("nel-ls-ps", b"name: a\xc2\x85b\xe2\x80\xa8c\xe2\x80\xa9\n"), ("lone-surrogate", b'name: "\\ud800"\n'),
        ("nan-params", _HEAD.replace(b"70B", b".nan") + _GPU), ("inf-tokens", _HEAD.replace(b"1T", b".inf") + _GPU),
        ("neg-inf", _HEAD.replace(b"1T", b"-.inf") + _GPU), ("huge-int", _HEAD.replace(b"70B", b"9" * 44) + _GPU),
        ("5000-digit-int", _HEAD.replace(b"70B", b"9" * 5000) + _GPU),
        ("5000-digit-str", _HEAD.replace(b"1T", b"'" + b"9" * 5000 + b"'") + _GPU),
        ("1e400", _HEAD.replace(b"1T", b"1e400") + _GPU), ("1e300-tokens", _HEAD.replace(b"1T", b"1e300") + _GPU),
        ("batch-1e300-tokens", _HEAD.replace(b"512", b"'1e300 tokens'") + _GPU),
        ("batch-nan-tokens", _HEAD.replace(b"512", b"'nan tokens'") + _GPU),
        ("zero-everything", _HEAD + _custom_gpu(bf16_flops=b"0", hbm=b"0", hbm_bandwidth=b"0",
                                                intra_node_bandwidth=b"0", inter_node_bandwidth=b"0")),
        ("negative-gpu", _HEAD + _custom_gpu(hbm=b"-80GiB", price_per_gpu_hour=b"-1")),
        ("tiny-gpu", _HEAD + _custom_gpu(hbm=b"1", bf16_flops=b"1", hbm_bandwidth=b"1", intra_node_bandwidth=b"1",
                                         inter_node_bandwidth=b"1")),
        ("slow-gpu", _HEAD + _custom_gpu(bf16_flops=b"1", hbm_bandwidth=b"1", intra_node_bandwidth=b"1",
                                         inter_node_bandwidth=b"1", pcie_bandwidth=b"1")),
        ("1gib-gpu", _HEAD + _custom_gpu(hbm=b"1GiB")), ("1pib-gpu", _HEAD + _custom_gpu(hbm=b"1PiB")),
        ("fast-gpu", _HEAD + _custom_gpu(bf16_flops=b"1e18", hbm_bandwidth=b"1e15", intra_node_bandwidth=b"1e15",
                                         inter_node_bandwidth=b"1e15", price_per_gpu_hour=b"0")),
        ("free-gpu-cheapest", _HEAD + _custom_gpu(price_per_gpu_hour=b"0") + b"budget: {objective: cheapest}\n"),
        ("one-gpu", _HEAD.replace(b"70B", b"10M") + b"cluster: {gpu: h100-sxm, num_gpus: 1}\n"),
        ("max-headroom", _HEAD + _GPU + b"search: {memory_headroom: 0.5, top_k: 50}\n"),
        ("tiny-budget", _HEAD + _GPU + b"budget: {max_cost: 0.01, deadline: 1s}\n"),
        ("giant-int-gpu", _HEAD + _custom_gpu(hbm=b"9" * 400)),
        ("shape-max", b"name: t\nmodel: {num_layers: 10000000, hidden_size: 10000000, num_attention_heads: 10000000,"
                      b" vocab_size: 10000000, ffn_hidden_size: 10000000, num_kv_heads: 10000000}\n"
                      b"training: {tokens: 1T, sequence_length: 10000000, global_batch: 10000000}\n"
                      b"cluster: {gpu: h100-sxm, num_gpus: 10000000}\n"
                      b"layout: {tensor_parallel: 10000000, data_parallel_shard: 10000000, context_parallel: 5000000}\n"),
        ("prime-heads", b"name: t\nmodel: {num_layers: 4, hidden_size: 9999991, num_attention_heads: 9999991,"
                        b" vocab_size: 10, ffn_hidden_size: 10, num_kv_heads: 3}\n"
                        b"training: {tokens: 1T, sequence_length: 4096, global_batch: 5}\n" + _GPU +
                        b"layout: {tensor_parallel: 2}\n"),
        ("moe-max", b"name: t\nmodel: {preset: mixtral-8x7b, moe: {num_experts: 10000000, top_k: 10000000,"
                    b" expert_ffn_hidden_size: 10000000}}\ntraining: {tokens: 1T, sequence_length: 4096,"
                    b" global_batch: 512}\n" + _GPU),
        ("params-100T", _HEAD.replace(b"70B", b"100T") + _GPU), ("params-1", _HEAD.replace(b"70B", b"1") + _GPU),
        ("alias-bomb", b"\n".join(laughs) + b"\n"), ("merge-chain", b"\n".join(merge_chain) + b"\n"),
        ("merge-many", b"x: &x {" + b", ".join(b"k%d: 1" % j for j in range(200)) + b"}\ny: {<<: ["
                       + b", ".join(b"*x" for _ in range(2000)) + b"]}\n"),
        ("recursive-list", b"a: &a [*a]\n"), ("recursive-map", b"&a {a: *a}\n"), ("undefined-alias", b"a: *nope\n"),
        ("alias-key", b"a: &k x\n*k : 1\n"), ("list-key", b"? [a, b]\n: 1\n"), ("map-key", b"? {a: b}\n: 1\n"),
        ("unhashable-key", b"? {a: [1]}\n: 1\n"), ("bool-key", b"true: 1\n"), ("null-key", b"~: 1\n"),
        ("float-key", b"1.5: 1\n"), ("tag-python", b"name: !!python/object/apply:os.system ['touch CANARY']\n"),
        ("tag-set", b"name: !!set {a, b}\n"), ("tag-set-scalar", b"name: !!set 1\n"), ("tag-binary", b"name: !!binary aGk=\n"),
        ("tag-omap", b"name: !!omap [a: 1]\n"), ("tag-custom", b"name: !foo bar\n"), ("tag-verbatim", b"name: !<x> y\n"),
        ("tag-directive", b"%TAG !e! tag:example.com,2000:\n---\nname: !e!foo t\n"),
        ("yaml-directive", b"%YAML 1.1\n---\nname: yes\n"), ("timestamp", b"name: 2001-12-14t21:59:43.10-05:00\n"),
        ("deep-flow-list", b"name: t\nmodel: " + b"[" * 5000 + b"]" * 5000 + b"\n"),
        ("deep-flow-map", b"name: t\nmodel: " + b"{a: " * 3000 + b"1" + b"}" * 3000 + b"\n"),
        ("deep-block", b"a:\n" + b"".join(b" " * (2 * i) + b"k:\n" for i in range(1, 300))),
        ("deep-compact", b"a:\n" + b"- " * 3000 + b"x\n"),
        ("unclosed", b"name: [a, b\n"), ("too-large", b"name: " + b"a" * 900_000 + b"\n"),
        ("long-line", b"name: t\ndescription: " + b"word " * 26_000 + b"\n"),
        ("long-name", b"name: " + b"a" * 100_000 + b"\n"), ("long-key", b"name: t\n" + b"k" * 10_000 + b": 1\n"),
        ("long-preset", b"name: t\nmodel: {preset: '" + b"x" * 100_000 + b"'}\n"),
        ("many-comments", b"name: t\n" + b"# c\n" * 9_990), ("too-many-lines", b"\n" * 20_000),
        ("many-keys", b"name: t\nslurm:\n  environment:\n" + b"".join(b"    K%d: v\n" % i for i in range(30_000))),
        ("many-values", b"name: t\nslurm:\n  modules: [" + b",".join(b"m" for _ in range(50_000)) + b"]\n"),
        ("many-errors", _HEAD + _GPU + b"slurm:\n  environment:\n" + b"".join(b"    K%d: 1\n" % i for i in range(950))),
        ("many-unknown", b"name: t\n" + b"".join(b"k%d: 1\n" % i for i in range(990))),
        ("many-anchors", b"name: t\nslurm:\n  modules: [" + b", ".join(b"&a%d m" % i for i in range(2000)) + b"]\n"),
        ("env-newline", _HEAD + _GPU + b'slurm: {environment: {A: "x\\n#SBATCH --account=evil"}}\n'),
        ("env-types", _HEAD + _GPU + b"slurm: {environment: {A: 1, B: true, C: null, D: [1], E: 1.5}}\n"),
        ("gpu-list-empty", _HEAD + b"cluster: {gpu: [], num_gpus: 8}\n"),
        ("gpu-list-long", _HEAD + b"cluster: {gpu: [" + b", ".join([b"h100-sxm"] * 100) + b"], num_gpus: 8}\n"),
        ("targets-empty", _HEAD + _GPU + b"targets: []\n"), ("targets-dup", _HEAD + _GPU + b"targets: [fsdp, fsdp]\n"),
        ("yes-no-on-off", b"name: t\nlayout: {sequence_parallel: yes, zero_stage: on}\n"),
        ("sexagesimal", _HEAD.replace(b"512", b"190:20:30") + _GPU), ("hex-octal", _HEAD.replace(b"512", b"0x200") + _GPU),
    ]
    return cases
