"""Run a runtime trainer under torchrun on CPU for tests, optionally stopping it with SIGUSR1 after a
given step (what SLURM sends before the time limit), and read its summary line."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNTIME = REPO / "compiler" / "runtime"
TORCHRUN = Path(sys.executable).with_name("torchrun")
STEP = re.compile(r"^(?:\[default\d+\]:)?(?:\[ds_train\] )?step (\d+)/(\d+) loss (\S+)")


@dataclass
class Run:
    returncode: int
    lines: list[str] = field(default_factory=list)
    summary: dict | None = None
    signalled_after: int | None = None

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def install_runtime(folder: Path) -> Path:
    """Copy the runtime package verbatim, as the renderer does (``dtc_runtime/``)."""
    target = folder / "dtc_runtime"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(RUNTIME, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[-1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def launch(folder: Path, entry: str, args: list[str], *, nproc: int, stop_after: int | None = None,
           timeout: float = 400, summary_key: str = "dtc_fsdp_summary", extra_env: dict | None = None,
           on_line=None) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTC_SMOKE_")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1",
               PYTHONWARNINGS="ignore", **(extra_env or {}))
    argv = [str(TORCHRUN), "--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0",
            str(folder / "dtc_runtime" / entry), *args]
    proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    run = Run(returncode=-1)
    deadline = time.monotonic() + timeout
    try:
        for line in proc.stdout:
            run.lines.append(line.rstrip("\n"))
            if on_line is not None:
                on_line(line.rstrip("\n"))
            m = STEP.match(line)
            # SIGUSR1 while step `stop_after` runs (sent when the step before it is reported): the
            # trainers check for it at the end of each step, save and exit
            if stop_after is not None and run.signalled_after is None and m and int(m.group(1)) == stop_after - 1:
                for pid in _children(proc.pid):  # torchrun's workers (torchrun itself would die of USR1)
                    os.kill(pid, signal.SIGUSR1)
                run.signalled_after = stop_after
            if time.monotonic() > deadline:
                break
        run.returncode = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for line in reversed(run.lines):
        if line.startswith("{") and summary_key in line:
            run.summary = json.loads(line)
            break
    return run
