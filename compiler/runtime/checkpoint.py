"""Checkpoint folders that are either complete or invisible.

Layout under the checkpoint root::

    step_000000120/            a complete checkpoint (renamed into place after its last byte)
        COMPLETE               written last inside the temporary folder, before the rename
        meta.json              step, samples consumed, schedule, layout, the writer's versions
        ...                    the trainer's files (torch.distributed.checkpoint shards, DeepSpeed's)
    .tmp-step_000000130/       a save in progress (or one a kill interrupted): never loaded

A save writes everything into ``.tmp-step_N``; rank 0 then writes ``meta.json`` and ``COMPLETE``,
fsyncs them and renames the folder to ``step_N`` (``os.rename`` is atomic on a POSIX file
system), then deletes the oldest complete checkpoints beyond ``keep``. ``latest(root)`` is the
highest ``step_N`` that holds ``COMPLETE``, so a job killed while saving resumes from the previous
complete checkpoint, and a leftover temporary folder is cleared by the next save of that step.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

COMPLETE = "COMPLETE"
META = "meta.json"
_STEP_DIR = re.compile(r"^step_(\d{9})$")


@dataclass(frozen=True)
class Found:
    step: int
    path: Path
    meta: dict[str, Any]


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:09d}"


def tmp_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f".tmp-step_{step:09d}"


def complete_steps(root: str | Path) -> list[int]:
    root = Path(root)
    if not root.is_dir():
        return []
    steps = []
    for entry in root.iterdir():
        m = _STEP_DIR.match(entry.name)
        if m and entry.is_dir() and (entry / COMPLETE).is_file():
            steps.append(int(m.group(1)))
    return sorted(steps)


def latest(root: str | Path | None) -> Found | None:
    """The newest complete checkpoint under ``root`` (None: start fresh)."""
    if root is None:
        return None
    steps = complete_steps(root)
    if not steps:
        return None
    path = step_dir(root, steps[-1])
    return Found(steps[-1], path, json.loads((path / META).read_text()))


def _fsync_write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def prepare(root: str | Path, step: int) -> Path:
    """(rank 0, before the save) a fresh temporary folder for ``step``."""
    tmp = tmp_dir(root, step)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def commit(root: str | Path, step: int, meta: dict[str, Any], keep: int = 0) -> Path:
    """(rank 0, after every rank finished writing) mark complete and rename into place."""
    tmp, final = tmp_dir(root, step), step_dir(root, step)
    _fsync_write(tmp / META, json.dumps(meta, indent=2, sort_keys=True) + "\n")
    _fsync_write(tmp / COMPLETE, f"{step}\n")
    _fsync_dir(tmp)
    if final.exists():  # the same step saved again (a resumed run stopped at once): replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(Path(root))
    if keep > 0:
        for old in complete_steps(root)[:-keep]:
            shutil.rmtree(step_dir(root, old), ignore_errors=True)
    return final


def save(root: str | Path, step: int, meta: dict[str, Any], write: Callable[[Path], None], *,
         rank: int, barrier: Callable[[], None], keep: int = 0) -> Path:
    """The whole protocol for a group of ranks: rank 0 prepares, every rank ``write(tmp)``s, rank 0
    commits; barriers in between."""
    if rank == 0:
        prepare(root, step)
    barrier()
    write(tmp_dir(root, step))
    barrier()
    if rank == 0:
        commit(root, step, meta, keep)
    barrier()
    return step_dir(root, step)


__all__ = ["Found", "latest", "save", "prepare", "commit", "complete_steps", "step_dir", "tmp_dir", "COMPLETE",
           "META"]
