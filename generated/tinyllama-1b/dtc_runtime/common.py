"""What both trainers share: the command line, the environment of a lone process, stop signals,
the batches of a step, step lines and the summary line.

The step line (``step K/N loss L lr R ...``) and the summary JSON line are what ``dtc smoke``
parses (compiler/smoke: STEP_LINE and the summary key); keep their shape.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import data as D
from .config import CheckpointConfig, DataConfig, RunConfig, load_run_config, scaled_model

STOP = {"signal": 0}
_PARAM_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32",
                 "bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


def _on_stop(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    STOP["signal"] = signum


def install_stop_handlers() -> None:
    """SIGUSR1 (SLURM's warning before the time limit, or a preemption notice) and SIGTERM: finish
    the current step, save a checkpoint, exit 0 so the job can be requeued."""
    signal.signal(signal.SIGUSR1, _on_stop)
    signal.signal(signal.SIGTERM, _on_stop)


def add_common_args(p: argparse.ArgumentParser, default_config: Path) -> None:
    p.add_argument("--config", default=str(default_config), help=f"run configuration (default: {default_config})")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps to run (default: the config's)")
    p.add_argument("--layers", type=int, default=None, help="scale the model down: decoder layers")
    p.add_argument("--stage-layers", default=None, metavar="N,N,...",
                   help="decoder layers of each pipeline chunk in model order (the split dtc costed for a scaled "
                        "model: dtc smoke passes it with --layers)")
    p.add_argument("--hidden", type=int, default=None, help="scale the model down: width")
    p.add_argument("--heads", type=int, default=None, help="scale the model down: attention heads")
    p.add_argument("--kv-heads", type=int, default=None, help="scale the model down: KV heads")
    p.add_argument("--ffn", type=int, default=None, help="scale the model down: FFN width")
    p.add_argument("--vocab", type=int, default=None, help="scale the model down: vocabulary")
    p.add_argument("--seq", "--seq-len", dest="seq", type=int, default=None, help="sequence length")
    p.add_argument("--micro-batch", type=int, default=None, help="sequences per rank per micro-step")
    p.add_argument("--grad-accum", type=int, default=None, help="micro-steps per step (= pipeline microbatches)")
    p.add_argument("--checkpoint-dir", default=None, help="checkpoint root (default: the config's)")
    p.add_argument("--save-interval", type=int, default=None, help="save every N steps (0: only on a signal/end)")
    p.add_argument("--no-resume", action="store_true", help="start fresh even if a checkpoint exists")
    p.add_argument("--no-save-at-end", action="store_true", help="no checkpoint after the last step")
    p.add_argument("--init", default=None, help="start from this Hugging Face safetensors folder")
    p.add_argument("--synthetic", action="store_true", help="train on the synthetic stride task instead of data")
    p.add_argument("--fresh-data", action="store_true",
                   help="synthetic: new sequences every step (default: one fixed global batch, repeated)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--dump-logits", default=None, metavar="FILE",
                   help="before training, save the first micro-batch's tokens and logits (rank 0) to FILE "
                        "(torch.save), to check an initialisation against a reference")


def defaults_from_env(parser: argparse.ArgumentParser) -> None:
    """DTC_SMOKE_<OPTION> as an option's default (the command line wins)."""
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        var = "DTC_SMOKE_" + action.dest.upper()
        raw = os.environ.get(var, "").strip()
        if not raw:
            continue
        if isinstance(action, argparse._StoreTrueAction):
            value: object = raw.lower() in ("1", "true", "yes", "on")
        else:
            try:
                value = action.type(raw) if callable(action.type) else raw
            except ValueError:
                parser.error(f"{var}={raw!r} is not a valid {action.dest}")
            if action.choices and value not in action.choices:
                parser.error(f"{var}={raw!r}: choose from {', '.join(map(str, action.choices))}")
        parser.set_defaults(**{action.dest: value})


def apply_args(cfg: RunConfig, args: argparse.Namespace, parallel_overrides: dict[str, int]) -> RunConfig:
    """The config with the command line's changes (a smoke run scales everything down)."""
    par = cfg.parallel
    changes: dict[str, Any] = {axis: value for axis, value in parallel_overrides.items() if value is not None}
    par = replace(par, **changes)
    if par.pp == 1:
        par = replace(par, vpp=1)
    if par.pp * par.vpp != cfg.parallel.pp * cfg.parallel.vpp or args.layers is not None:
        par = replace(par, stage_layers=None)  # the plan's split is for the plan's stages and layers
    if args.stage_layers:  # add_common_args gives both trainers the option
        counts = [int(x) for x in args.stage_layers.split(",")]
        starts = [sum(counts[:i]) for i in range(len(counts))]
        par = replace(par, stage_layers=tuple(tuple(range(a, a + n)) for a, n in zip(starts, counts)))
    model = cfg.model
    if any(getattr(args, k) is not None for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq")):
        model = scaled_model(model, layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
                             ffn=args.ffn, vocab=args.vocab, seq_len=args.seq, tp=par.tp)
    batch = replace(cfg.batch, micro_batch=args.micro_batch or cfg.batch.micro_batch,
                    grad_accum=args.grad_accum or cfg.batch.grad_accum, seq_len=args.seq or cfg.batch.seq_len)
    steps = args.steps or cfg.train_steps
    schedule = cfg.schedule.fitted(steps)
    data = cfg.data
    if args.synthetic:
        data = DataConfig(synthetic=True)
    if data.synthetic and not args.fresh_data and not data.repeat:
        data = replace(data, repeat=batch.micro_batch * batch.grad_accum * par.dp)
    ckpt = cfg.checkpoint
    if args.checkpoint_dir is not None:
        ckpt = replace(ckpt, dir=str(Path(args.checkpoint_dir).resolve()))
    if args.save_interval is not None:
        ckpt = replace(ckpt, interval_steps=args.save_interval)
    if args.no_save_at_end:
        ckpt = replace(ckpt, save_at_end=False)
    return replace(cfg, parallel=par, model=model, batch=batch, train_steps=steps, schedule=schedule, data=data,
                   checkpoint=ckpt, init=args.init if args.init is not None else cfg.init,
                   seed=args.seed if args.seed is not None else cfg.seed)


def read_config(args: argparse.Namespace) -> RunConfig:
    return load_run_config(args.config)


def single_process_env() -> None:
    """Plain ``python train.py`` runs as a world of one."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def param_dtype_name(value: str) -> str:
    return _PARAM_DTYPES[value]


# ------------------------------------------------------------------------------------------- data
def open_run_samples(cfg: RunConfig):
    """The run's sample sequence: the synthetic task or the configured datasets (blended)."""
    if cfg.data.synthetic:
        return D.StrideSamples(cfg.model.vocab_size, cfg.batch.seq_len, cfg.seed, repeat=cfg.data.repeat)
    return D.open_samples(cfg.data.sources, cfg.batch.seq_len, cfg.seed, vocab_size=cfg.model.vocab_size,
                          base_dir=cfg.base_dir)


def step_batch(samples, consumed: int, dp_rank: int, per_rank: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's (inputs, targets) of the step that starts after ``consumed`` samples."""
    start = consumed + dp_rank * per_rank
    inputs, targets = D.batch_arrays(samples, range(start, start + per_rank))
    return (torch.from_numpy(np.ascontiguousarray(inputs)).to(device),
            torch.from_numpy(np.ascontiguousarray(targets)).to(device))


# ------------------------------------------------------------------------------------------- output
def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_root(cfg: RunConfig) -> Path | None:
    return cfg.path(cfg.checkpoint.dir)


def should_save(ckpt: CheckpointConfig, step: int) -> bool:
    return ckpt.dir is not None and ckpt.interval_steps > 0 and step % ckpt.interval_steps == 0


def dump_logits(path: str | Path, tokens: torch.Tensor, logits: torch.Tensor) -> None:
    torch.save({"tokens": tokens.detach().cpu(), "logits": logits.detach().float().cpu()}, path)


def print_json(record: dict[str, Any]) -> None:
    """One write of the line and its newline: print() writes them apart, and torchrun's --tee reader
    (elastic/multiprocessing/tail_log.py) can read the line before its newline, so another rank's
    line lands after it on the same console line and neither parses."""
    sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
    sys.stdout.flush()


def finish(code: int) -> None:
    """Leave without the interpreter's shutdown, where torch's c10d/gloo threads can abort a finished
    rank ("terminate called without an active exception"), after flushing the output."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
