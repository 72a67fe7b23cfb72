#!/usr/bin/env python3
"""Validate Megatron-LM pretrain_gpt.py flag lists with megatron-core 0.19.2's own argument code.

Library use::

    from tools.validators.megatron_check import validate_megatron_flags
    errors = validate_megatron_flags(["--num-layers", "4", ...], world_size=8)   # [] == accepted

CLI (prints one JSON line per flag list: {"path", "ok", "errors", "warnings", "world_size", "derived"})::

    python tools/validators/megatron_check.py args.txt --world-size 8 [args2.txt --world-size 16 ...]
    python tools/validators/megatron_check.py --batch lists.jsonl
        # lines {"path": FILE, "world_size": N} or {"flags": [...], "world_size": N, "name": ...};
        # optional per line: "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, "gpu_arch": 9

A flags FILE is tokenized like a shell (shlex; '#' comments, backslash-newline continuations):
one flag per line, or a whole launch line - tokens up to and including the first '*.py' token
(torchrun ... pretrain_gpt.py) are dropped. A file whose text starts with '[' is a JSON list.
Shell variables are not expanded: a token with '$' is reported as an error.

Exit status: 0 when every list is accepted, 1 otherwise, 2 on bad usage, 3 when megatron-core is
not installed (run tools/validators/install.sh).

What runs, in order, exactly as pretrain_gpt.py would (megatron/training/arguments.py):
1. ``add_megatron_arguments(ArgumentParser(allow_abbrev=False)).parse_args(flags)``: unknown or
   malformed flags -> argparse's own "error: ..." message (SystemExit 2 is caught).
2. ``validate_args(args, {'tokenizer_type': 'GPT2BPETokenizer'})`` (pretrain_gpt.py's
   args_defaults) with args.rank=0, args.world_size=N: divisibility, batch, pipeline, precision,
   FSDP, ... checks. Bare asserts have no message: the failing source statement is reported,
   e.g. "assert args.hidden_size % args.num_attention_heads == 0 (megatron/training/arguments.py:1292)".
   Its full argument table print is suppressed (``_print_args`` is replaced by a no-op).
3. ``core_transformer_config_from_args(args)`` -> TransformerConfig.__post_init__, the checks the
   model provider runs at model build (e.g. num_attention_heads % tensor_model_parallel_size,
   num_query_groups vs TP, MoE bias with ETP>1). Failures that only say this machine lacks
   Transformer Engine / Apex / CUDA / a kernel package are reported as warnings (prefix
   "not checkable here:"), everything else as errors. Disable with model_config=False.

Shims so this runs on Python 3.11 on a CPU-only machine (see shared notes, section 3):
``typing.override`` from typing_extensions; a stub module for
megatron.core.transformer.moe.ops.paged_stash (its only dependency on triton) unless triton
is installed; ``get_device_arch_version`` -> gpu_arch (default 9 = Hopper) and
``torch.cuda.get_device_capability`` -> (gpu_arch, 0); CUDA_DEVICE_MAX_CONNECTIONS is set per
call from ``env`` (default "auto": "1" unless --use-torch-fsdp2/--use-megatron-fsdp, which is
what validate_args requires on pre-Blackwell GPUs; the launch script must export the same).
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import importlib.util
import io
import json
import os
import shlex
import sys
import traceback
import types
import typing
import warnings
from typing import Any, Iterable, Mapping

EXPECTED_VERSION = "0.19.2"
INSTALL_HINT = ("megatron-core 0.19.2 is not installed in this Python ({py}): "
                "run tools/validators/install.sh (it installs megatron-core==0.19.2 with "
                "--ignore-requires-python into the current venv)")
# pretrain_gpt.py: pretrain(..., args_defaults={'tokenizer_type': 'GPT2BPETokenizer'})
PRETRAIN_GPT_ARGS_DEFAULTS = {"tokenizer_type": "GPT2BPETokenizer"}

_ENV_ERR_WORDS = ("transformer engine", "transformer-engine", "transformer_engine", " te ", "te >=", "te>=",
                  "apex", "cuda", "triton", "please install", "not installed", "flashinfer", "nvidia")


class MegatronNotInstalled(ImportError):
    pass


_M: dict[str, Any] | None = None


def _load_megatron(gpu_arch: int = 9) -> dict[str, Any]:
    global _M
    if _M is not None:
        return _M
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.training") is None:
        raise MegatronNotInstalled(INSTALL_HINT.format(py=sys.executable))
    if not hasattr(typing, "override"):  # Python < 3.12
        import typing_extensions
        typing.override = typing_extensions.override
    stub_name = "megatron.core.transformer.moe.ops.paged_stash"
    if importlib.util.find_spec("triton") is None and stub_name not in sys.modules:
        # paged_stash.py is the only module that imports triton at import time; arguments.py
        # needs just these two names from it (GLOBAL_BLOCK_SIZE for a default).
        stub = types.ModuleType(stub_name)
        stub.GLOBAL_BLOCK_SIZE = 1024
        stub.paged_stash_copy_kernel = stub.paged_stash_pop_kernel = None
        sys.modules[stub_name] = stub
    import torch
    # package_info.py runs `git rev-parse` in its own directory and appends the hash of whatever
    # repository the venv lives in (this project's, for .venv inside the checkout).
    os.environ.setdefault("NO_VCS_VERSION", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed" x10
        from megatron.core import package_info
        from megatron.training import arguments as A
    version = package_info.__shortversion__
    if version != EXPECTED_VERSION:
        print(f"megatron_check: warning: megatron-core {version} installed, this checker targets "
              f"{EXPECTED_VERSION}", file=sys.stderr)

    state = {"gpu_arch": gpu_arch}
    A.get_device_arch_version = lambda: state["gpu_arch"]
    torch.cuda.get_device_capability = lambda *a, **k: (state["gpu_arch"], 0)
    A._print_args = lambda *a, **k: None  # the ~800-line argument table

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parser = A.add_megatron_arguments(argparse.ArgumentParser(prog="pretrain_gpt.py", allow_abbrev=False))
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(A.__file__)))  # .../site-packages/megatron
    _M = dict(A=A, torch=torch, version=version, parser=parser, state=state,
              site=os.path.dirname(pkg_root), asserts={})
    return _M


def _assert_source(m, filename: str, lineno: int) -> str | None:
    """Full text of the assert statement starting at filename:lineno (multi-line asserts too)."""
    cache = m["asserts"]
    if filename not in cache:
        table = {}
        try:
            with open(filename, encoding="utf-8") as fh:
                src = fh.read()
            lines = src.splitlines()
            for node in ast.walk(ast.parse(src)):
                if isinstance(node, ast.Assert) and node.end_lineno is not None:
                    # (ast.get_source_segment re-splits the whole file per call: seconds for 3.6k lines)
                    seg = lines[node.lineno - 1:node.end_lineno]
                    seg[-1] = seg[-1][:node.end_col_offset]
                    seg[0] = seg[0][node.col_offset:]
                    table[node.lineno] = " ".join(" ".join(seg).split())
        except (OSError, SyntaxError):
            pass
        cache[filename] = table
    return cache[filename].get(lineno)


def _where(m, tb) -> tuple[str, int, str] | None:
    frames = traceback.extract_tb(tb)
    for fr in reversed(frames):  # innermost frame inside megatron
        if os.sep + "megatron" + os.sep in fr.filename:
            return fr.filename, fr.lineno, os.path.relpath(fr.filename, m["site"])
    if frames:
        fr = frames[-1]
        return fr.filename, fr.lineno, fr.filename
    return None


def _describe(m, e: BaseException) -> str:
    loc = _where(m, e.__traceback__)
    msg = str(e).strip()
    if isinstance(e, AssertionError) and not msg and loc:
        src = _assert_source(m, loc[0], loc[1])
        return f"{src or 'assert (no message)'} ({loc[2]}:{loc[1]})"
    head = msg if isinstance(e, AssertionError) else f"{type(e).__name__}: {msg}"
    return f"{head} ({loc[2]}:{loc[1]})" if loc else head


def _is_env_error(text: str) -> bool:
    t = f" {text.lower()} "
    return any(w in t for w in _ENV_ERR_WORDS)


@contextlib.contextmanager
def _env(overrides: Mapping[str, str | None]):
    saved = {k: os.environ.get(k) for k in overrides}
    try:
        for k, v in overrides.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _clean_warning(msg: str) -> str | None:
    if "Could not determine rank" in msg:
        return None
    if msg.startswith("Overriding default arguments for tokenizer_type:"):
        return None  # pretrain_gpt.py's own default, overridden by --tokenizer-type
    return " ".join(msg.split())


# Fusions whose availability TransformerConfig.__post_init__ checks against installed kernels
# (transformer_config.py:2184 rope fusion needs TE, :2667 fused permutation needs TE >= 2.1).
# On a machine without TE they are switched off for a second try, so the checks after them run.
_ENV_DEPENDENT_KNOBS = {"apply_rope_fusion": False, "moe_permute_fusion": False}


def _model_config_check(m, args, warns: list[str]) -> list[str]:
    A = m["A"]
    try:
        A.core_transformer_config_from_args(copy.copy(args))
        return []
    except Exception as e:  # noqa: BLE001
        text = _describe(m, e)
    if not _is_env_error(text):
        return [text]
    retry = copy.copy(args)
    changed = {k: v for k, v in _ENV_DEPENDENT_KNOBS.items() if getattr(retry, k, v) != v}
    for k, v in changed.items():
        setattr(retry, k, v)
    if changed:
        try:
            A.core_transformer_config_from_args(retry)
            warns.append(f"not checkable here: {text}; the other model-build checks pass with "
                         + ", ".join(f"{k}={v}" for k, v in changed.items()))
            return []
        except Exception as e:  # noqa: BLE001
            text2 = _describe(m, e)
            if not _is_env_error(text2):
                return [text2]
            text = f"{text}; then {text2}"
    warns.append(f"not checkable here: {text}")
    return []


def validate_megatron_flags_full(flags: list[str], world_size: int, *, env: Mapping[str, str | None] | str = "auto",
                                 gpu_arch: int = 9, model_config: bool = True,
                                 args_defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Like validate_megatron_flags, but returns {"errors", "warnings", "derived"}.

    derived: values validate_args computed (data_parallel_size, virtual pipeline size, ...)."""
    m = _load_megatron(gpu_arch)
    m["state"]["gpu_arch"] = gpu_arch
    A = m["A"]
    errors: list[str] = []
    warns: list[str] = []
    flags = [str(f) for f in flags]
    for f in flags:
        if "$" in f:
            errors.append(f"unexpanded shell variable in flag {f!r}")
    if not isinstance(world_size, int) or world_size < 1:
        errors.append(f"world_size must be a positive int, got {world_size!r}")
    if errors:
        return {"errors": errors, "warnings": warns, "derived": {}}

    # 1. argparse
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ns = m["parser"].parse_args(flags)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        msg = next((ln for ln in lines if "error:" in ln), lines[-1] if lines else "argparse error")
        return {"errors": [f"argparse: {msg.split('error:', 1)[-1].strip()}"], "warnings": warns, "derived": {}}
    # The parser is reused: copy so validate_args' in-place edits of list defaults
    # (e.g. high_priority_stream_groups.append) cannot leak into the next validation.
    args = copy.deepcopy(ns)
    args._is_global_batch_size_explicitly_specified = args.global_batch_size is not None
    args.rank = 0
    args.world_size = world_size

    if env == "auto":
        fsdp = getattr(args, "use_torch_fsdp2", False) or getattr(args, "use_megatron_fsdp", False)
        env = {"CUDA_DEVICE_MAX_CONNECTIONS": None if fsdp else "1"}
    env = dict(env or {})

    # 2. validate_args
    out = io.StringIO()
    ok = False
    defaults = dict(PRETRAIN_GPT_ARGS_DEFAULTS if args_defaults is None else args_defaults)
    with _env(env), contextlib.redirect_stdout(out), warnings.catch_warnings(record=True) as wlist:
        warnings.simplefilter("always")
        try:
            from compiler.targets.megatron.smoke import validate_args_past_te_version

            args, skipped = validate_args_past_te_version(A, args, defaults)
            ok = True
            if skipped is not None:
                warns.append(f"not checkable here: {_describe(m, skipped)}; the rest of validate_args passes with that "
                             "Transformer Engine")
        except SystemExit as e:  # e.g. --checkpoint-activations: print_rank_0(...) then exit()
            printed = [ln for ln in out.getvalue().splitlines() if ln.strip()]
            errors.append(f"validate_args exited ({e.code}): {printed[-1] if printed else ''}".rstrip(": "))
        except Exception as e:  # noqa: BLE001 - AssertionError, ValueError, RuntimeError, ...
            errors.append(_describe(m, e))
        # 3. TransformerConfig (model build checks)
        if ok and model_config:
            errors.extend(_model_config_check(m, args, warns))
    for w in wlist:
        c = _clean_warning(str(w.message))
        if c and c not in warns:
            warns.append(c)
    for ln in out.getvalue().splitlines():
        if ln.startswith("WARNING") and ln not in warns:
            warns.append(" ".join(ln.split()))

    derived = {}
    if ok:
        for k in ("data_parallel_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
                  "virtual_pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size",
                  "expert_tensor_parallel_size", "sequence_parallel", "global_batch_size", "micro_batch_size",
                  "recompute_granularity", "params_dtype", "ffn_hidden_size", "kv_channels", "num_query_groups",
                  "padded_vocab_size", "async_save", "ckpt_format", "save_interval"):
            v = getattr(args, k, None)
            derived[k] = v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
        try:
            derived["num_microbatches"] = args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)
        except (TypeError, ZeroDivisionError):
            pass
        if model_config and not errors:
            # the decoder layers megatron-core builds on each chunk, in model order (see megatron_layer_split)
            try:
                with _env(env), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    derived["chunk_layers"] = [c["layers"] for c in config_layer_split(_split_config(A, args))]
            except Exception as e:  # noqa: BLE001
                errors.append(f"building the layer split: {_describe(m, e)}")
    return {"errors": errors, "warnings": warns, "derived": derived}


def validate_megatron_flags(flags: list[str], world_size: int, **kw) -> list[str]:
    """Validate a pretrain_gpt.py flag list for a world size. Returns error strings; [] = accepted.

    Keywords (see validate_megatron_flags_full): env="auto"|{VAR: value|None}, gpu_arch=9,
    model_config=True, args_defaults=None (pretrain_gpt.py's)."""
    return validate_megatron_flags_full(flags, world_size, **kw)["errors"]


# ----------------------------------------------------------------------------- the layer split
def megatron_layer_split(flags: list[str], world_size: int, **kw) -> dict[str, Any]:
    """What megatron-core builds on every (pipeline rank, virtual stage) for a flag list.

    Runs the full check (argparse, validate_args, core_transformer_config_from_args), then asks
    megatron-core's own functions, rank by rank, with parallel_state's pipeline rank and sizes set as
    its unit tests set them (no processes): transformer_block.get_num_layers_to_build and
    transformer_layer.get_transformer_layer_offset for the decoder layers, and
    parallel_state.is_pipeline_first_stage / is_pipeline_last_stage(ignore_virtual=False), which is
    how training.get_model places the embedding (pre_process) and the loss (post_process); with
    --pipeline-model-parallel-layout, the layout's own embedding/loss entries.

    Returns {"errors": [...], "chunks": [{"rank", "vstage", "offset", "layers", "embedding", "loss"}, ...]}
    in model order (virtual stage major), "chunks" empty when the flags are refused."""
    m = _load_megatron(kw.pop("gpu_arch", 9))
    A = m["A"]
    errors: list[str] = []
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = copy.deepcopy(m["parser"].parse_args([str(f) for f in flags]))
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()] or ["argparse error"]
        return {"errors": [f"argparse: {lines[-1].split('error:', 1)[-1].strip()}"], "chunks": []}
    args._is_global_batch_size_explicitly_specified = args.global_batch_size is not None
    args.rank, args.world_size = 0, world_size
    fsdp = getattr(args, "use_torch_fsdp2", False) or getattr(args, "use_megatron_fsdp", False)
    out = io.StringIO()
    with _env({"CUDA_DEVICE_MAX_CONNECTIONS": None if fsdp else "1"}), contextlib.redirect_stdout(out), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            A.validate_args(args, dict(PRETRAIN_GPT_ARGS_DEFAULTS))
            chunks = config_layer_split(_split_config(A, args))  # the model builder's own asserts (e.g. layers per rank)
            if any(c["layers"] < 0 for c in chunks):
                raise ValueError("megatron-core would build a negative number of layers on some stage: "
                                 + ", ".join(f"rank {c['rank']} vstage {c['vstage']}: {c['layers']}" for c in chunks
                                             if c["layers"] < 0))
        except Exception as e:  # noqa: BLE001 - AssertionError, ValueError, ...
            errors.append(_describe(m, e))
            return {"errors": errors, "chunks": []}
        return {"errors": [], "chunks": chunks}


def _split_config(A, args) -> Any:
    """The TransformerConfig of validated ``args``, with the kernel fusions this machine lacks switched
    off (they do not touch the layer split)."""
    built = copy.copy(args)
    for knob, value in _ENV_DEPENDENT_KNOBS.items():
        setattr(built, knob, value)
    return A.core_transformer_config_from_args(built)


def config_layer_split(config: Any) -> list[dict[str, Any]]:
    """Per (virtual stage, pipeline rank), in model order: the decoder layers megatron-core builds
    for ``config`` (a TransformerConfig), with the embedding and loss placement (see
    megatron_layer_split)."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    pp = config.pipeline_model_parallel_size
    vpp = config.virtual_pipeline_model_parallel_size
    saved = (ps._MPU_PIPELINE_MODEL_PARALLEL_WORLD_SIZE, ps._MPU_PIPELINE_MODEL_PARALLEL_RANK,
             ps._VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE)
    ps.set_pipeline_model_parallel_world_size(pp)
    ps.set_virtual_pipeline_model_parallel_world_size(vpp)
    layout = config.pipeline_model_parallel_layout
    chunks = []
    try:
        for v in range(vpp or 1):
            vp_stage = v if vpp is not None else None
            for r in range(pp):
                ps.set_pipeline_model_parallel_rank(r)
                entry = {"rank": r, "vstage": v,
                         "offset": get_transformer_layer_offset(config, vp_stage=vp_stage, pp_rank=r),
                         "layers": get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=r)}
                if layout is not None:
                    held = layout.layout[r][v]
                    entry["embedding"] = LayerType.embedding in held
                    entry["loss"] = LayerType.loss in held
                else:
                    entry["embedding"] = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
                    entry["loss"] = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
                chunks.append(entry)
    finally:
        ps._MPU_PIPELINE_MODEL_PARALLEL_WORLD_SIZE, ps._MPU_PIPELINE_MODEL_PARALLEL_RANK, \
            ps._VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE = saved
    return chunks


def validate_folder(folder: str, plan: Any) -> list[str]:
    """The megatron target's validator hook (compiler/targets/megatron: Target.validator): the folder's
    megatron_args.sh, sourced by bash, through megatron-core's parser and checks at the plan's world size and
    GPU generation; and megatron-core must build the decoder layers per chunk the plan is costed with."""
    import subprocess

    path = os.path.join(str(folder), "megatron_args.sh")
    script = (f'source {shlex.quote(path)} || exit 9; printf "%s\\0" "${{MEGATRON_ARGS[@]}}"; '
              'printf "%s" "${CUDA_DEVICE_MAX_CONNECTIONS-<unset>}"')
    env = {k: v for k, v in os.environ.items() if k not in ("CHECKPOINT_DIR", "CUDA_DEVICE_MAX_CONNECTIONS")}
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    if proc.returncode != 0:
        return [f"bash could not source {path}: {proc.stderr.strip()}"]
    *flags, conn = proc.stdout.split("\0")
    arch = {"ampere": 8, "ada": 8, "hopper": 9, "blackwell": 10}.get(str(plan.cluster.generation), 9)
    result = validate_megatron_flags_full(flags, plan.layout.world_size, gpu_arch=arch,
                                          env={"CUDA_DEVICE_MAX_CONNECTIONS": None if conn == "<unset>" else conn})
    errors = list(result["errors"])
    built = result["derived"].get("chunk_layers")
    if not errors and built is not None and tuple(built) != plan.layer_split().chunk_layers:
        errors.append(f"megatron-core builds {built} decoder layers per chunk, the plan is costed with "
                      f"{list(plan.layer_split().chunk_layers)}")
    return errors


# ----------------------------------------------------------------------------- flag files
def read_flags_file(path: str) -> list[str]:
    text = open(path, encoding="utf-8").read()
    if text.lstrip().startswith("["):
        return [str(x) for x in json.loads(text)]
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    toks = shlex.split(text, comments=True, posix=True)
    for i, t in enumerate(toks):
        if t.endswith(".py"):
            return toks[i + 1:]
    return toks


def _split_items(argv: list[str]) -> tuple[list[tuple[str, int]], list[str]]:
    """'FILE --world-size N' pairs; a --world-size before any file is the default."""
    items: list[list] = []
    rest: list[str] = []
    default = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--world-size", "--ws") or a.startswith("--world-size="):
            val = a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else None)
            i += 1 if "=" in a else 2
            if val is None:
                raise SystemExit("--world-size needs a value")
            if items and items[-1][1] is None:
                items[-1][1] = int(val)
            else:
                default = int(val)
            continue
        if a.startswith("-"):
            rest.append(a)
            if a in ("--batch", "--gpu-arch") and i + 1 < len(argv):
                rest.append(argv[i + 1])
                i += 2
                continue
            i += 1
            continue
        items.append([a, None])
        i += 1
    out = []
    for path, ws in items:
        ws = ws if ws is not None else default
        if ws is None:
            raise SystemExit(f"no --world-size given for {path}")
        out.append((path, ws))
    return out, rest


def _jobs(ns) -> Iterable[dict[str, Any]]:
    if ns.batch:
        with open(ns.batch, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                try:
                    rec = json.loads(line)
                    assert isinstance(rec, dict) and ("path" in rec or "flags" in rec) and "world_size" in rec
                    yield rec
                except (ValueError, AssertionError):
                    yield {"bad": f"{ns.batch}:{lineno}"}
    for path, ws in ns.items:
        yield {"path": path, "world_size": ws}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    items, rest = _split_items(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", help='JSONL, one {"path": FILE, "world_size": N} (or "flags": [...]) per line')
    ap.add_argument("--gpu-arch", type=int, default=9, help="pretend GPU major arch (8 Ampere, 9 Hopper, 10 Blackwell)")
    ap.add_argument("--no-model-config", action="store_true", help="skip the TransformerConfig (model build) checks")
    ns = ap.parse_args(rest)
    ns.items = items
    if not ns.batch and not items:
        ap.print_usage(sys.stderr)
        return 2

    out = sys.stdout
    sys.stdout = sys.stderr  # anything Megatron prints goes to stderr; stdout is JSON only
    try:
        try:
            _load_megatron(ns.gpu_arch)
        except MegatronNotInstalled as e:
            print(f"megatron_check: {e}", file=sys.stderr)
            print(json.dumps({"path": None, "ok": False, "errors": [str(e)]}), file=out)
            return 3
        all_ok = True
        for job in _jobs(ns):
            name = job.get("name") or job.get("path") or job.get("bad")
            res: dict[str, Any] = {"path": name, "ok": False, "world_size": job.get("world_size")}
            try:
                if "bad" in job:
                    raise ValueError('bad batch line: need {"path" or "flags", "world_size"}')
                flags = job["flags"] if "flags" in job else read_flags_file(job["path"])
                r = validate_megatron_flags_full(
                    flags, int(job["world_size"]), env=job.get("env", "auto"),
                    gpu_arch=int(job.get("gpu_arch", ns.gpu_arch)), model_config=not ns.no_model_config)
                res.update(ok=not r["errors"], errors=r["errors"], warnings=r["warnings"], derived=r["derived"])
            except Exception as e:  # noqa: BLE001 - unreadable file, bad line
                res.update(errors=[f"cannot check: {type(e).__name__}: {e}"], warnings=[], derived={})
            all_ok &= res["ok"]
            print(json.dumps(res, default=str), file=out, flush=True)
        return 0 if all_ok else 1
    finally:
        sys.stdout = out


if __name__ == "__main__":
    sys.exit(main())
