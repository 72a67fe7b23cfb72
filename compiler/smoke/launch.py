"""Process management for smoke launches: one process group, timeouts, no orphans, the failing rank's error.

``run_launch(spec)`` starts the launcher (torchrun) in a session of its own, streams its
console output (progress lines go to ``on_line``), and ends everything it started when the
launch finishes, fails, times out or is interrupted:

* every process of a launch carries ``DTC_SMOKE_RUN_ID=<uuid>`` in its environment. torchrun
  starts its workers in sessions of their own, and a killed launcher leaves them orphaned, so
  the process group alone does not reach them; the marker does (``/proc/<pid>/environ``), the
  way tests/slurm_cluster.py finds slurmstepd's children.
* three clocks: the whole launch (``timeout_s``), the set-up until the first step line
  (rendezvous, process group, model build: ``setup_timeout_s``, extended once by
  ``jit_timeout_s`` while DeepSpeed JIT-builds an op), and a stall between step lines
  (``stall_timeout_s``). Any of them ends the launch as a hang, reported with the phase.
* per-rank logs come from ``torchrun --log-dir --redirects 3 --tee 3``; the failing rank is
  torchrun's "Root Cause (first observed failure)", and its own error is the last exception
  (or ``error:``) line of that rank's stderr.

DeepSpeed JIT builds go to a private, persistent ``TORCH_EXTENSIONS_DIR``
(``~/.cache/dtc/torch_extensions``, or ``$DTC_TORCH_EXTENSIONS_DIR``); ``clear_stale_locks``
removes a ``lock`` that a killed build left behind (no live process building there), which
would otherwise hang every later run in ``FileBaton.wait``.
"""
from __future__ import annotations

import ctypes
import os
import queue
import re
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

RUN_ID_ENV = "DTC_SMOKE_RUN_ID"
TERM_GRACE_S = 5.0
STEP_LINE = re.compile(r"^(?:\[ds_train\] )?step (\d+)/(\d+)\b|\biteration\s+\d+/\s*\d+ \|")
JIT_LINE = re.compile(r"(Building extension module|Emitting ninja build file|Loading extension module) (\w+)")
_TORCHRUN_PREFIX = re.compile(r"^\[(?:default)?(\d+)\]:")
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)"
                         r".*?exitcode\s*:\s*(-?\d+)", re.S)
_ERROR_LINE = re.compile(r"^(?:\[rank\d+\]:)?\s*(?:[\w.]+(?:Error|Exception|Interrupt|Exit)\b.*"
                         r"|[\w./-]+\.py: .*|[\w./-]+: error: .*)$")


@dataclass(frozen=True)
class LaunchSpec:
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: Path
    log_dir: Path  # torchrun --log-dir (per-rank stdout/stderr)
    timeout_s: float = 600.0
    setup_timeout_s: float = 240.0
    stall_timeout_s: float = 180.0
    jit_timeout_s: float = 900.0


@dataclass
class LaunchResult:
    returncode: int | None
    wall_s: float
    lines: list[str] = field(default_factory=list)  # console lines, rank prefix removed (rank 0 only)
    all_lines: list[str] = field(default_factory=list)  # every console line as printed
    hang: str | None = None  # "setup", "stall", "total" when a clock ran out
    failing_rank: int | None = None
    failing_exitcode: int | None = None
    error: str | None = None  # the failing rank's own error line
    error_tail: str = ""  # the end of the failing rank's stderr
    jit_ops: tuple[str, ...] = ()
    jit_build_s: float | None = None
    killed: int = 0  # processes ended by us after the launcher returned or timed out
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.hang is None


# ------------------------------------------------------------------------------------------- processes
def marked_pids(run_id: str) -> list[int]:
    """Live processes whose environment carries DTC_SMOKE_RUN_ID=run_id."""
    marker = f"{RUN_ID_ENV}={run_id}".encode()
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[-1].split()[0] in (b"Z", b"X"):
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    pids.append(int(entry))
        except (OSError, IndexError):
            continue
    return pids


_PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


def become_subreaper() -> bool:
    """Make this process adopt orphaned descendants (Linux prctl PR_SET_CHILD_SUBREAPER), so a
    launch's process that scrubs its environment and starts its own session is still found."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def child_pids() -> set[int]:
    """Live direct children of this process (adopted orphans included), from /proc."""
    me, out = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) > 1 and int(fields[1]) == me and fields[0] not in (b"Z", b"X"):
            out.add(int(entry))
    return out


def end_processes(proc: subprocess.Popen | None, run_id: str, *, grace_s: float = TERM_GRACE_S,
                  children_before: set[int] | None = None) -> int:
    """SIGTERM the launcher's group, every marked process and every process this (subreaper)
    process adopted since ``children_before``; then SIGKILL what is left; reap.
    Returns how many processes had to be signalled."""
    def adopted() -> set[int]:
        if children_before is None:
            return set()
        return child_pids() - children_before - ({proc.pid} if proc is not None else set())

    targets = set(marked_pids(run_id)) | adopted()
    if proc is not None and proc.poll() is None:
        targets.add(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in targets:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if (proc is None or proc.poll() is not None) and not marked_pids(run_id):
            break
        time.sleep(0.1)
    for _ in range(50):
        left = set(marked_pids(run_id)) | adopted()
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not left:
            break
        for pid in left:
            _signal(pid, signal.SIGKILL)
        time.sleep(0.1)
    if proc is not None:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    if children_before is not None:
        _reap_zombie_children_except(children_before)
    return len(targets)


def _reap_zombie_children_except(keep: set[int]) -> None:
    """waitpid() the adopted processes that ended (not children the caller still owns)."""
    for pid in list(_zombie_children()):
        if pid not in keep:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def _zombie_children() -> set[int]:
    me, out = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[-1].split()
            except OSError:
                continue
            if len(fields) > 1 and int(fields[1]) == me and fields[0] == b"Z":
                out.add(int(entry))
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


DRAIN_GRACE_S = 5.0  # output still read after the launcher exits, before stragglers are ended


def _reader(stream, out: "queue.Queue[str | None]") -> None:
    for raw in iter(stream.readline, b""):
        out.put(raw.decode("utf-8", errors="replace").rstrip("\n"))
    out.put(None)


# ------------------------------------------------------------------------------------------- launch
def run_launch(spec: LaunchSpec, *, on_line: Callable[[str], None] | None = None,
               watch: Callable[[str], None] | None = None) -> LaunchResult:
    """Run ``spec.argv`` to completion under the three clocks; never leaves a process behind."""
    run_id = uuid.uuid4().hex
    env = dict(spec.env)
    env[RUN_ID_ENV] = run_id
    spec.log_dir.mkdir(parents=True, exist_ok=True)
    become_subreaper()
    children_before = child_pids()
    start = time.monotonic()
    result = LaunchResult(returncode=None, wall_s=0.0)
    proc = subprocess.Popen(list(spec.argv), cwd=spec.cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    lines: "queue.Queue[str | None]" = queue.Queue()
    thread = threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True)
    thread.start()
    setup_deadline = start + spec.setup_timeout_s
    total_deadline = start + spec.timeout_s
    last_step = None
    jit_started: float | None = None
    jit_ops: list[str] = []
    exited_at: float | None = None
    try:
        eof = False
        while not eof:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > DRAIN_GRACE_S:
                break  # the launcher is gone; a straggler still holds its output: end it below
            if now > total_deadline:
                result.hang = "total"
                break
            if last_step is None and now > setup_deadline:
                result.hang = "setup"
                break
            if last_step is not None and now - last_step > spec.stall_timeout_s:
                result.hang = "stall"
                break
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                if proc.poll() is not None and not thread.is_alive() and lines.empty():
                    eof = True
                continue
            if line is None:
                eof = True
                continue
            result.all_lines.append(line)
            m = _TORCHRUN_PREFIX.match(line)
            rank = int(m.group(1)) if m else None
            text = line[m.end():] if m else line
            jit = JIT_LINE.search(text)
            if jit:
                if jit_started is None:
                    jit_started = time.monotonic()
                    setup_deadline += spec.jit_timeout_s
                if jit.group(2) not in jit_ops:
                    jit_ops.append(jit.group(2))
                if jit.group(1) == "Loading extension module" and result.jit_build_s is None:
                    result.jit_build_s = time.monotonic() - jit_started
            if STEP_LINE.search(text):
                last_step = time.monotonic()
            if rank in (None, 0):
                result.lines.append(text)
                if on_line is not None and m is not None:
                    on_line(text)
                if watch is not None:  # every rank-0 line, prefixed or not (the preemption signaller)
                    watch(text)
        if result.hang is None:
            result.returncode = proc.wait(timeout=60)
    except KeyboardInterrupt:
        result.interrupted = True
        raise
    finally:
        result.killed = end_processes(proc, run_id, children_before=children_before)
        if result.returncode is None and proc.poll() is not None and result.hang is None:
            result.returncode = proc.returncode
        thread.join(timeout=5)
        result.wall_s = time.monotonic() - start
        result.jit_ops = tuple(jit_ops)
    if result.returncode != 0 or result.hang is not None:
        _find_failure(result, spec.log_dir)
    return result


# ------------------------------------------------------------------------------------------- errors
def rank_logs(log_dir: Path, stream: str = "stderr") -> dict[int, Path]:
    """local rank -> its stderr.log (or stdout.log) under torchrun's --log-dir (the last attempt)."""
    logs: dict[int, Path] = {}
    for path in sorted(log_dir.glob(f"*/attempt_*/*/{stream}.log")):
        try:
            logs[int(path.parent.name)] = path
        except ValueError:
            continue
    return logs


def _clean(line: str) -> str:
    return re.sub(r"^\[rank\d+\]:", "", line).rstrip()


def own_error(stderr_text: str) -> tuple[str | None, str]:
    """(the last error line, the tail) of one rank's stderr; warnings are left out of the tail."""
    rows = [_clean(l) for l in stderr_text.splitlines()]
    rows = [r for r in rows if r.strip() and "Warning" not in r and "warnings.warn" not in r
            and "return func(*args, **kwargs)" not in r]
    error = None
    for row in reversed(rows):
        if _ERROR_LINE.match(row.strip()) and "ChildFailedError" not in row:
            error = row.strip()
            break
    return error, "\n".join(rows[-25:])


def _find_failure(result: LaunchResult, log_dir: Path) -> None:
    """The failing rank (torchrun's root cause) and its own error; when that rank wrote nothing
    (it may have been killed, or only local rank 0 prints), the first other rank that did."""
    console = "\n".join(result.all_lines)
    m = _ROOT_CAUSE.search(console)
    logs = rank_logs(log_dir)
    first = None
    if m:
        result.failing_rank = int(m.group(1))
        result.failing_exitcode = int(m.group(3))
        first = int(m.group(2))
    order = ([first] if first is not None else []) + [r for r in sorted(logs) if r != first]
    for local in order:
        path = logs.get(local)
        if path is None:
            continue
        try:
            error, tail = own_error(path.read_text(errors="replace"))
        except OSError:
            continue
        if error:
            if result.failing_rank is None:
                result.failing_rank = local
            result.error = error if local == first or first is None else f"(rank {local}) {error}"
            result.error_tail = tail
            return
        if tail and not result.error_tail:
            result.error_tail = tail
    if result.hang is None:
        # no rank wrote an error: the launcher itself failed (bad arguments, port in use)
        error, tail = own_error(console)
        result.error = error
        result.error_tail = result.error_tail or tail


# ------------------------------------------------------------------------------------------- DeepSpeed JIT
def extensions_dir() -> Path:
    """The persistent private TORCH_EXTENSIONS_DIR for DeepSpeed's JIT-built ops."""
    given = os.environ.get("DTC_TORCH_EXTENSIONS_DIR")
    return Path(given) if given else Path.home() / ".cache" / "dtc" / "torch_extensions"


def _busy_dirs() -> set[str]:
    """Working directories and command-line paths of live processes (a build's ninja / cc1plus)."""
    busy: set[str] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            busy.add(os.readlink(f"/proc/{entry}/cwd"))
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                busy.update(a.decode(errors="replace") for a in f.read().split(b"\0") if a.startswith(b"/"))
        except OSError:
            continue
    return busy


def clear_stale_locks(ext_dir: Path, *, min_age_s: float = 30.0) -> list[Path]:
    """Remove ``<ext_dir>/**/lock`` files no live build owns (older than ``min_age_s``, and no live
    process runs in or names that op's folder). Returns the removed paths."""
    if not ext_dir.is_dir():
        return []
    removed = []
    busy = None
    for lock in ext_dir.glob("**/lock"):
        try:
            age = time.time() - lock.stat().st_mtime
        except OSError:
            continue
        if age < min_age_s:
            continue
        if busy is None:
            busy = _busy_dirs()
        op_dir = str(lock.parent)
        if any(b == op_dir or b.startswith(op_dir + os.sep) for b in busy):
            continue
        try:
            lock.unlink()
            removed.append(lock)
        except OSError:
            continue
    return removed
