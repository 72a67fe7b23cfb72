#!/usr/bin/env python3
"""Validate DeepSpeed config dicts with DeepSpeed 0.19.8's own config parser, without a job.

Library use::

    from tools.validators.deepspeed_check import validate_ds_config
    errors = validate_ds_config(cfg_dict, dp_world_size=8)   # [] == accepted

CLI (prints one JSON line per config: {"path", "ok", "errors", "warnings", "dp"})::

    python tools/validators/deepspeed_check.py ds.json --dp 8 [ds2.json --dp 4 ...]
    python tools/validators/deepspeed_check.py --batch configs.jsonl     # lines {"path": ..., "dp": N}

Exit status: 0 when every config is accepted, 1 otherwise, 2 on bad usage.

What is checked, in this order (all checks run; one failing does not hide the others,
except that DeepSpeedConfig itself stops at its first failure):

1. Unknown top-level keys. DeepSpeed ignores them silently. The accepted set is derived from
   DeepSpeed itself, see ``_derive_top_level_keys`` for how.
2. Keys DeepSpeed 0.19.8 removed (``_REMOVED_TOP_LEVEL_CONFIG_KEYS``; DeepSpeedConfig raises).
3. Each pydantic-model section parsed on its own with DeepSpeed's model (zero_optimization,
   bf16/fp16, tensor_parallel, ...). These models have ``extra="forbid"``, so unknown sub-keys,
   bad enum values and bad types are reported even when a batch-size error comes first in (4).
4. ``deepspeed.runtime.config.DeepSpeedConfig(cfg, mpu=FakeMPU(dp))``: batch arithmetic
   (train_batch_size == micro * gas * dp), bf16+fp16 exclusivity, ZeRO stage limits, ...
   ``deepspeed.comm.get_rank`` is monkeypatched in that module only, because without a comm
   backend DeepSpeedConfig swallows the error and silently falls back to world_size=1.
5. Checks the engine would make later (in deepspeed.initialize), reproduced from its source:
   optimizer type resolvable (engine.py _configure_basic_optimizer), scheduler type resolvable and
   its params accepted by the scheduler's __init__ (engine.py _scheduler_from_config),
   'max_grad_norm' forbidden in optimizer params, sub-keys of dict-based sections that DeepSpeed
   reads with .get() and so ignores silently when misspelt (activation_checkpointing, optimizer,
   scheduler, pipeline), and types of scalar top-level keys against DeepSpeed's *_DEFAULT
   constants.

AutoTP: when ``tensor_parallel.autotp_size > 1`` the batch check uses dp * autotp_size. That is
what ``deepspeed.initialize`` does: it builds ``DeepSpeedConfig(config, mpu=None)`` (deepspeed/
__init__.py:554) and with no mpu DeepSpeedConfig takes ``dist.get_world_size()``, i.e. every rank
including the TP ranks (runtime/config.py:471). Pass ``mpu_given=True`` if the training script
passes an mpu whose get_data_parallel_world_size() is the real DP size.

No op is JIT-compiled: TORCH_EXTENSIONS_DIR is pointed at a fresh temp dir before deepspeed is
imported, and ``jit_artifacts()`` lists anything that appeared there (the CLI fails if so).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import json
import logging
import os
import sys
import tempfile
from typing import Any, Iterable

_EXT_DIR: str | None = None
_DS: dict[str, Any] | None = None  # lazily imported deepspeed pieces


class FakeMPU:
    """The only mpu method DeepSpeedConfig calls (runtime/config.py:463)."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def _ensure_ext_dir() -> str:
    global _EXT_DIR
    if _EXT_DIR is None:
        _EXT_DIR = tempfile.mkdtemp(prefix="dtc-ds-torch-ext-")
        # Override (not setdefault): an empty private dir proves nothing was compiled.
        os.environ["TORCH_EXTENSIONS_DIR"] = _EXT_DIR
    return _EXT_DIR


def jit_artifacts() -> list[str]:
    """Files that appeared in the private TORCH_EXTENSIONS_DIR (must stay empty)."""
    if _EXT_DIR is None or not os.path.isdir(_EXT_DIR):
        return []
    found = []
    for root, dirs, files in os.walk(_EXT_DIR):
        for name in dirs + files:
            found.append(os.path.relpath(os.path.join(root, name), _EXT_DIR))
    return sorted(found)


class _RecordingDict(dict):
    """A dict that records every key DeepSpeed looks up in it.

    DeepSpeedConfig reads the user dict with get(), [], `in` and `in d.keys()`; copy.copy()
    must return the same recorder (config.py:477 copies the dict before parsing)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen: set[str] = set()

    def __getitem__(self, k):
        self.seen.add(k)
        return super().__getitem__(k)

    def get(self, k, default=None):
        self.seen.add(k)
        return super().get(k, default)

    def __contains__(self, k):
        self.seen.add(k)
        return super().__contains__(k)

    def __copy__(self):
        return self

    def keys(self):
        outer = self

        class _Keys:
            def __contains__(self, k):
                outer.seen.add(k)
                return dict.__contains__(outer, k)

            def __iter__(self):
                return iter(dict.keys(outer))

            def __len__(self):
                return dict.__len__(outer)

        return _Keys()


def _load_deepspeed() -> dict[str, Any]:
    global _DS
    if _DS is not None:
        return _DS
    _ensure_ext_dir()
    import deepspeed  # noqa: F401  (import once; sets the accelerator, builds nothing)
    import deepspeed.runtime.config as dsc
    import deepspeed.runtime.constants as dsconst
    from deepspeed.runtime import lr_schedules
    from deepspeed.runtime.zero.config import get_zero_config
    from deepspeed.runtime.precision_config import get_bfloat16_config, get_float16_config
    from deepspeed.runtime.tensor_parallel.config import get_tensor_parallel_config
    from deepspeed.runtime.activation_checkpointing import config as act_cfg
    from deepspeed.utils import logger as ds_logger
    import pydantic
    import torch

    # Without a comm backend get_rank() raises inside DeepSpeedConfig.__init__, which then
    # silently uses world_size=1 (config.py:472-474). Patch it in that module only.
    dsc.dist.get_rank = lambda group=None: 0

    _DS = dict(
        deepspeed=deepspeed, dsc=dsc, const=dsconst, lr_schedules=lr_schedules,
        get_zero_config=get_zero_config, get_bf16=get_bfloat16_config, get_fp16=get_float16_config,
        get_tp=get_tensor_parallel_config, act_cfg=act_cfg, logger=ds_logger,
        pydantic=pydantic, torch=torch, version=deepspeed.__version__,
    )
    _DS["top_level_keys"] = _derive_top_level_keys(_DS)
    return _DS


# Keys read from the user's dict outside DeepSpeedConfig (found with
#   grep -rn "sequence_parallel_size\|data_parallel_size" deepspeed/ --include=*.py ):
#   deepspeed/__init__.py:543-545  config["data_parallel_size"], config["sequence_parallel_size"]
#   runtime/config.py:468-469      config["sequence_parallel_size"] (only when mpu is None)
_KEYS_READ_OUTSIDE_DEEPSPEEDCONFIG = ("sequence_parallel_size", "data_parallel_size")


def _derive_top_level_keys(ds: dict[str, Any]) -> frozenset[str]:
    """The top-level keys DeepSpeed 0.19.8 accepts, derived from DeepSpeed itself.

    How: DeepSpeedConfig.__init__ is run on probe configs wrapped in _RecordingDict; every
    top-level key it looks up (get / [] / in / in keys()) is recorded. That is exactly the set
    of keys some DeepSpeed parser reads - constants in runtime/constants.py (TRAIN_BATCH_SIZE,
    GRADIENT_CLIPPING, ...), literals in runtime/config.py ('hybrid_engine', 'compile',
    'weight_quantization', 'tensor_parallel', 'expert_parallel', 'pipeline', ...), and the
    section names used by sub-parsers (activation_checkpointing/config.py ACT_CHKPT,
    comm/config.py 'comms_logger', monitor/config.py 'tensorboard'/'wandb'/'csv_monitor'/'comet',
    profiling/config.py 'flops_profiler', autotuning, aio, data_efficiency, datastates_ckpt,
    checkpoint, data_types, timers, ...). It cannot go stale when DeepSpeed is upgraded.
    Probes: a minimal config (unconditional reads) and the legacy boolean zero_optimization form
    (zero/config.py:60-64 then reads 'allgather_size'). The removed keys in
    _REMOVED_TOP_LEVEL_CONFIG_KEYS are recorded too (config.py:133-136 tests them) and are
    subtracted: DeepSpeedConfig rejects them. Added by hand, with the grep that found them:
    _KEYS_READ_OUTSIDE_DEEPSPEEDCONFIG. The 0.19.8 result is listed in DEEPSPEED_KEYS.md.
    """
    dsc = ds["dsc"]
    seen: set[str] = set()
    probes = [
        {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1},
        {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "zero_optimization": True},
    ]
    with _quiet_ds_logger(ds):
        for probe in probes:
            rec = _RecordingDict(probe)
            try:
                dsc.DeepSpeedConfig(rec, mpu=FakeMPU(8))
            except Exception:  # a probe failing late still recorded what was read before
                pass
            seen |= rec.seen
    seen = {k for k in seen if isinstance(k, str)}
    seen -= set(getattr(dsc, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {}))
    seen |= set(_KEYS_READ_OUTSIDE_DEEPSPEEDCONFIG)
    return frozenset(seen)


def accepted_top_level_keys() -> list[str]:
    return sorted(_load_deepspeed()["top_level_keys"])


class _ListHandler(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _quiet_ds_logger(ds, sink: _ListHandler | None = None):
    """Silence DeepSpeed's stdout logger; collect its warnings into `sink`."""
    lg = ds["logger"]
    saved = lg.handlers[:]
    lg.handlers = [sink] if sink is not None else [logging.NullHandler()]
    try:
        yield
    finally:
        lg.handlers = saved


def _fmt_exc(e: BaseException, ds) -> list[str]:
    pyd = ds["pydantic"]
    if isinstance(e, pyd.ValidationError):
        out = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err.get("loc", ())) or "<root>"
            inp = err.get("input")
            inp_s = "" if isinstance(inp, dict) else f" (got {inp!r})"
            out.append(f"{e.title}: {loc}: {err.get('msg')}{inp_s}")
        return out
    msg = str(e).strip() or "(no message)"
    return [f"{type(e).__name__}: {msg}"]


def _scalar_default_types(ds) -> dict[str, type]:
    """Top-level key -> expected Python type, from the NAME / NAME_DEFAULT pairs in
    deepspeed/runtime/constants.py (only where the default is a bool/int/float/str)."""
    const = ds["const"]
    out: dict[str, type] = {}
    for name, val in vars(const).items():
        if not name.isupper() or not isinstance(val, str):
            continue
        dflt = getattr(const, name + "_DEFAULT", None)
        if isinstance(dflt, (bool, int, float, str)) and val in ds["top_level_keys"]:
            out.setdefault(val, type(dflt))
    return out


def _type_ok(value, typ) -> bool:
    if typ is bool:
        return isinstance(value, bool)
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if typ is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, typ)


def _engine_level_checks(cfg: dict, ds) -> list[str]:
    """Checks deepspeed.initialize makes after DeepSpeedConfig (reproduced from its source)."""
    errs: list[str] = []
    const, dsc, torch = ds["const"], ds["dsc"], ds["torch"]

    # Scalar types (DeepSpeedConfig stores them unchecked).
    for key, typ in sorted(_scalar_default_types(ds).items()):
        if key in cfg and cfg[key] is not None and not _type_ok(cfg[key], typ):
            errs.append(f"{key}: expected {typ.__name__}, got {type(cfg[key]).__name__} {cfg[key]!r}")

    # optimizer: {"type", "params", "legacy_fusion"} (constants.py TYPE/OPTIMIZER_PARAMS/LEGACY_FUSION)
    opt = cfg.get(const.OPTIMIZER)
    if opt is not None:
        if not isinstance(opt, dict):
            errs.append(f"{const.OPTIMIZER}: expected an object, got {type(opt).__name__}")
        else:
            allowed = {const.TYPE, const.OPTIMIZER_PARAMS, const.LEGACY_FUSION}
            for k in sorted(set(opt) - allowed):
                errs.append(f"{const.OPTIMIZER}.{k}: unknown key (DeepSpeed reads only {sorted(allowed)})")
            name = opt.get(const.TYPE)
            if name is not None:
                # engine.py _configure_basic_optimizer: DeepSpeed optimizers by lower-case
                # name, anything else via getattr(torch.optim, name).
                if not (str(name).lower() in dsc.DEEPSPEED_OPTIMIZERS or hasattr(torch.optim, str(name))):
                    errs.append(f"{const.OPTIMIZER}.type: {name!r} is neither a DeepSpeed optimizer "
                                f"{dsc.DEEPSPEED_OPTIMIZERS} nor a torch.optim class")
            params = opt.get(const.OPTIMIZER_PARAMS) or {}
            if isinstance(params, dict) and const.MAX_GRAD_NORM in params:
                errs.append(f"{const.OPTIMIZER}.params.{const.MAX_GRAD_NORM}: not supported by the engine "
                            "(engine.py raises ValueError); use top-level 'gradient_clipping'")

    # scheduler: {"type", "params"}; engine.py _scheduler_from_config resolves the type in
    # deepspeed.runtime.lr_schedules, then torch.optim.lr_scheduler, and calls cls(optimizer, **params).
    sch = cfg.get(const.SCHEDULER)
    if sch is not None:
        if not isinstance(sch, dict):
            errs.append(f"{const.SCHEDULER}: expected an object, got {type(sch).__name__}")
        else:
            allowed = {const.TYPE, const.SCHEDULER_PARAMS}
            for k in sorted(set(sch) - allowed):
                errs.append(f"{const.SCHEDULER}.{k}: unknown key (DeepSpeed reads only {sorted(allowed)})")
            name = sch.get(const.TYPE)
            cls = None
            if name is not None:
                if hasattr(ds["lr_schedules"], str(name)):
                    cls = getattr(ds["lr_schedules"], str(name))
                elif hasattr(torch.optim.lr_scheduler, str(name)):
                    cls = getattr(torch.optim.lr_scheduler, str(name))
                else:
                    errs.append(f"{const.SCHEDULER}.type: DeepSpeed does not recognize LR scheduler {name!r} "
                                f"(DeepSpeed: {ds['lr_schedules'].VALID_LR_SCHEDULES}, or torch.optim.lr_scheduler)")
            params = sch.get(const.SCHEDULER_PARAMS) or {}
            if cls is not None and isinstance(params, dict):
                try:
                    sig = inspect.signature(cls.__init__)
                    ps = list(sig.parameters.values())[2:]  # drop self, optimizer
                    if not any(p.kind == p.VAR_KEYWORD for p in ps):
                        names = {p.name for p in ps}
                        for k in sorted(set(params) - names):
                            errs.append(f"{const.SCHEDULER}.params.{k}: not a parameter of {name} "
                                        f"(accepts {sorted(names)})")
                    for p in ps:
                        if (p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                                and p.name not in params):
                            errs.append(f"{const.SCHEDULER}.params.{p.name}: required by {name}")
                except (TypeError, ValueError):
                    pass

    # activation_checkpointing: read with get_scalar_param from ACT_CHKPT_DEFAULT's keys
    # (runtime/activation_checkpointing/config.py:47-94); anything else is ignored silently.
    act = ds["act_cfg"]
    sec = cfg.get(act.ACT_CHKPT)
    if isinstance(sec, dict):
        for k in sorted(set(sec) - set(act.ACT_CHKPT_DEFAULT)):
            errs.append(f"{act.ACT_CHKPT}.{k}: unknown key (DeepSpeed reads only {sorted(act.ACT_CHKPT_DEFAULT)})")

    # zero_optimization offload, beyond what the pydantic model checks:
    #  - device "nvme" needs nvme_path: zero/partition_parameters.py:1229 asserts it for params,
    #    zero/stage3.py:840 os.path.join()s it for the optimizer.
    #  - offload_param is used only by the stage-3 optimizer (engine.py:2731 passes it to
    #    DeepSpeedZeroOptimizer_Stage3 only); at stage 0-2 it is ignored silently.
    zero = cfg.get("zero_optimization")
    if isinstance(zero, dict):
        stage = zero.get("stage", 0)
        for sec in ("offload_param", "offload_optimizer"):
            off = zero.get(sec)
            if not isinstance(off, dict):
                continue
            dev = off.get("device", "none")
            if dev == "nvme" and not off.get("nvme_path"):
                errs.append(f"zero_optimization.{sec}: device 'nvme' needs 'nvme_path'")
            if sec == "offload_param" and dev not in (None, "none") and isinstance(stage, int) and stage < 3:
                errs.append(f"zero_optimization.offload_param (device {dev!r}) has no effect at ZeRO stage {stage}: "
                            "only stage 3 offloads parameters")

    # pipeline: get_pipeline_config (config.py:272) merges any key over its defaults; the
    # PipelineEngine reads those defaults plus 'use_reentrant' (runtime/pipe/engine.py:210).
    pipe = cfg.get("pipeline")
    if isinstance(pipe, dict):
        known = set(dsc.get_pipeline_config({})) | {"use_reentrant"}
        for k in sorted(set(pipe) - known):
            errs.append(f"pipeline.{k}: unknown key (DeepSpeed reads only {sorted(known)})")
    return errs


def _section_checks(cfg: dict, ds) -> list[str]:
    """Parse pydantic-model sections on their own so their errors are not hidden behind an
    earlier failure in DeepSpeedConfig (e.g. the batch assertion)."""
    errs: list[str] = []
    sections = [
        ("zero_optimization", ds["get_zero_config"]),
        ("bf16", ds["get_bf16"]),
        ("bfloat16", ds["get_bf16"]),
        ("fp16", ds["get_fp16"]),
        ("tensor_parallel", ds["get_tp"]),
    ]
    for key, parse in sections:
        if key not in cfg:
            continue
        sub = cfg[key]
        if key != "zero_optimization" and not isinstance(sub, dict):
            errs.append(f"{key}: expected an object, got {type(sub).__name__}")
            continue
        try:
            parse({key: copy.deepcopy(sub)})
        except Exception as e:  # noqa: BLE001 - report whatever DeepSpeed raises
            errs.extend(f"[{key}] {m}" for m in _fmt_exc(e, ds))
    return errs


def validate_ds_config_full(cfg: dict, dp_world_size: int, *, mpu_given: bool = False) -> dict[str, Any]:
    """Like validate_ds_config, but returns {"errors": [...], "warnings": [...], "world_size": n}."""
    ds = _load_deepspeed()
    errors: list[str] = []
    warnings: list[str] = []
    if not isinstance(cfg, dict):
        return {"errors": [f"config must be a JSON object, got {type(cfg).__name__}"], "warnings": [], "world_size": None}
    if not isinstance(dp_world_size, int) or dp_world_size < 1:
        return {"errors": [f"dp_world_size must be a positive int, got {dp_world_size!r}"], "warnings": [], "world_size": None}

    # 1. unknown / removed top-level keys
    removed = getattr(ds["dsc"], "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {})
    for k in cfg:
        if k in removed:
            continue  # DeepSpeedConfig raises for these (step 4), with DeepSpeed's own message
        if k not in ds["top_level_keys"]:
            errors.append(f"unknown top-level key {k!r} (DeepSpeed {ds['version']} ignores it silently)")

    # 2./3. pydantic sections on their own
    section_errs = _section_checks(cfg, ds)
    errors.extend(section_errs)

    # 4. DeepSpeedConfig itself
    world = dp_world_size
    tp = cfg.get("tensor_parallel") if isinstance(cfg.get("tensor_parallel"), dict) else {}
    autotp = tp.get("autotp_size", 0)
    if not mpu_given and isinstance(autotp, int) and autotp > 1:
        world = dp_world_size * autotp
        warnings.append(f"AutoTP autotp_size={autotp}: deepspeed.initialize (no mpu) checks the batch against "
                        f"the full world size {world} = dp {dp_world_size} x autotp {autotp}")
    sink = _ListHandler()
    with _quiet_ds_logger(ds, sink):
        try:
            ds["dsc"].DeepSpeedConfig(copy.deepcopy(cfg), mpu=FakeMPU(world))
        except Exception as e:  # noqa: BLE001
            for m in _fmt_exc(e, ds):
                if not any(m in s for s in section_errs):  # same pydantic error already reported
                    if world != dp_world_size and "train_batch_size" in m:
                        m += f" [world_size here = dp {dp_world_size} x autotp_size {autotp}]"
                    errors.append(f"DeepSpeedConfig: {m}")
    warnings.extend(sink.messages)

    # 5. engine-level checks
    try:
        errors.extend(_engine_level_checks(cfg, ds))
    except Exception as e:  # noqa: BLE001 - a malformed section must not crash the batch
        errors.extend(f"check crashed: {m}" for m in _fmt_exc(e, ds))
    return {"errors": errors, "warnings": warnings, "world_size": world}


def validate_ds_config(cfg: dict, dp_world_size: int, *, mpu_given: bool = False) -> list[str]:
    """Validate one DeepSpeed config dict for a data-parallel size. Returns error strings; [] = accepted."""
    return validate_ds_config_full(cfg, dp_world_size, mpu_given=mpu_given)["errors"]


def validate_folder(folder, plan) -> list[str]:
    """The deepspeed target's validator hook (compiler/targets/deepspeed: Target.validator): the folder's
    ds_config.json through DeepSpeed's own DeepSpeedConfig at the plan's data-parallel size."""
    from pathlib import Path

    cfg = json.loads((Path(folder) / "ds_config.json").read_text())
    return validate_ds_config(cfg, plan.layout.dp)  # (multiplied by autotp_size here, as DeepSpeed does)


# ----------------------------------------------------------------------------- CLI
def _load_json(path: str):
    from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys  # same as DeepSpeed's loader
    with open(path) as f:
        return json.load(f, object_pairs_hook=dict_raise_error_on_duplicate_keys)


def _iter_jobs(ns) -> Iterable[tuple[str, int]]:
    if ns.batch:
        with open(ns.batch) as f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                try:
                    rec = json.loads(line)
                    yield str(rec["path"]), int(rec["dp"])
                except (ValueError, KeyError, TypeError):
                    yield f"{ns.batch}:{lineno}", -1
    yield from ns.items  # CONFIG --dp N pairs from the command line (see _split_items)


def _split_items(argv: list[str]) -> tuple[list[tuple[str, int]], list[str]]:
    """Pairs 'CONFIG.json --dp N' (a --dp applies to the config before it; a leading --dp is
    the default for configs without their own)."""
    items: list[list] = []
    rest: list[str] = []
    default_dp = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--dp" or a.startswith("--dp="):
            val = a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else None)
            i += 1 if "=" in a else 2
            if val is None:
                raise SystemExit("--dp needs a value")
            if items and items[-1][1] is None:
                items[-1][1] = int(val)
            else:
                default_dp = int(val)
            continue
        if a.startswith("-"):
            rest.append(a)
            if a in ("--batch",) and i + 1 < len(argv):
                rest.append(argv[i + 1])
                i += 2
                continue
            i += 1
            continue
        items.append([a, None])
        i += 1
    out = []
    for path, dp in items:
        dp = dp if dp is not None else default_dp
        if dp is None:
            raise SystemExit(f"no --dp given for {path}")
        out.append((path, dp))
    return out, rest


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    items, rest = _split_items(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", help="JSONL file, one {\"path\": ..., \"dp\": N} per line")
    ap.add_argument("--list-keys", action="store_true", help="print the accepted top-level keys and exit")
    ap.add_argument("--mpu-given", action="store_true", help="AutoTP: the script passes an mpu (see module doc)")
    ns = ap.parse_args(rest)
    ns.items = items
    if not ns.batch and not items and not ns.list_keys:
        ap.print_usage(sys.stderr)
        return 2

    # Everything DeepSpeed prints goes to stderr; stdout carries only our JSON lines.
    out = sys.stdout
    sys.stdout = sys.stderr
    try:
        ds = _load_deepspeed()
        if ns.list_keys:
            print(json.dumps({"deepspeed": ds["version"], "top_level_keys": sorted(ds["top_level_keys"])}), file=out)
            return 0
        all_ok = True
        for path, dp in _iter_jobs(ns):
            if dp < 0:
                res = {"path": path, "ok": False, "dp": None,
                       "errors": ["bad batch line: need {\"path\": str, \"dp\": int}"], "warnings": []}
            else:
                try:
                    cfg = _load_json(path)
                    r = validate_ds_config_full(cfg, dp, mpu_given=ns.mpu_given)
                    res = {"path": path, "ok": not r["errors"], "dp": dp, "errors": r["errors"], "warnings": r["warnings"]}
                except Exception as e:  # noqa: BLE001 - unreadable file, bad JSON, duplicate keys
                    res = {"path": path, "ok": False, "dp": dp, "errors": [f"cannot load: {type(e).__name__}: {e}"], "warnings": []}
            all_ok &= res["ok"]
            print(json.dumps(res), file=out, flush=True)
        jit = jit_artifacts()
        if jit:
            all_ok = False
            print(json.dumps({"path": None, "ok": False, "errors": [f"JIT build output appeared in TORCH_EXTENSIONS_DIR={_EXT_DIR}: {jit}"]}), file=out)
        return 0 if all_ok else 1
    finally:
        sys.stdout = out


if __name__ == "__main__":
    sys.exit(main())
