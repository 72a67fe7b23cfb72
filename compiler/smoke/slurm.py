"""`dtc smoke --slurm`: submit the generated sbatch script, rewritten for one local node, and wait.

Only ``#SBATCH`` directives change (``rewrite_sbatch``): GPU requests (``--gpus*``,
``--gres=gpu``) and ``--exclusive`` are dropped, ``--nodes=1``, ``--partition=debug`` (or
``$SLURM_SMOKE_PARTITION``), ``--cpus-per-task`` at most the ranks (or
``$SLURM_SMOKE_CPUS_PER_TASK``), ``--time`` from the smoke timeout, ``--no-requeue``, and the
job's output goes to a private folder. The script body is untouched: the smoke settings
travel in the environment the script already reads (``DTC_NPROC_PER_NODE``,
``DTC_ARTIFACT_DIR``) and the entry point reads (fsdp_train.py's and ds_train.py's options as
``DTC_SMOKE_<OPTION>``, the same options a local smoke run passes on the command line; the
sbatch script's own ``--config`` still wins for ds_train.py). Where the submitting
machine has no ``module`` command, a no-op ``module`` shell function is exported so that the
script's ``module load`` lines do not abort a job on a cluster without environment modules.

The job is polled with ``scontrol show job`` (``sacct`` once it is purged); on timeout it is
cancelled and every process carrying the launch's marker is ended. A job that fails or is
cancelled is reported with its SLURM state, exit code and the end of its log.
"""
from __future__ import annotations

import os
import sys
import re
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from compiler.smoke import launch as L
from compiler.smoke.report import TargetResult
from compiler.smoke.scale import SmokeSetup
from compiler.targets import registry

SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                          "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})
_DROP = re.compile(r"^--(gpus(-per-node|-per-task|-per-socket)?|gres=gpu.*|exclusive|requeue|no-requeue)\b")


def _search_path(env: dict[str, str]) -> str:
    """PATH for the job: this Python's bin folder first, so the script's `torchrun` and `python`
    are the ones dtc runs with even when its virtualenv is not activated; sbin for the daemons."""
    parts = [p for p in env.get("PATH", "").split(os.pathsep) if p]
    own = os.path.dirname(sys.executable)
    return os.pathsep.join([own] + [p for p in parts if p != own] + [d for d in SBIN_DIRS if d not in parts])


def rewrite_sbatch(text: str, *, partition: str, cpus_per_task: int, time_limit_s: float, output_dir: Path,
                   job_name_suffix: str = "-smoke") -> str:
    """The script with its #SBATCH directives fitted to one local node (body unchanged)."""
    out, placed = [], set()
    minutes = max(1, int(time_limit_s // 60) + 1)
    replace = {
        "nodes": "--nodes=1",
        "partition": f"--partition={partition}",
        "cpus-per-task": f"--cpus-per-task={cpus_per_task}",
        "time": f"--time={minutes}",
        "output": f"--output={output_dir}/%x-%j.out",
        "error": f"--error={output_dir}/%x-%j.err",
    }
    last_directive = -1
    for line in text.splitlines():
        if not line.startswith("#SBATCH "):
            out.append(line)
            continue
        directive = line[len("#SBATCH "):].strip()
        if _DROP.match(directive):
            continue
        key = directive[2:].split("=", 1)[0]
        if key in replace:
            directive = replace[key]
            placed.add(key)
        elif key == "job-name":
            directive = f"{directive}{job_name_suffix}"
        out.append(f"#SBATCH {directive}")
        last_directive = len(out) - 1
    extra = [f"#SBATCH {v}" for k, v in replace.items() if k not in placed] + ["#SBATCH --no-requeue"]
    at = last_directive + 1 if last_directive >= 0 else min(1, len(out))
    out[at:at] = extra
    return "\n".join(out) + "\n"


def smoke_env(setup: SmokeSetup, generated_dir: Path, base: dict[str, str], target: str = "fsdp") -> dict[str, str]:
    """The job's environment: the launch environment plus the overrides the script reads
    (DTC_NPROC_PER_NODE, DTC_ARTIFACT_DIR) and the entry point's smoke options as DTC_SMOKE_<OPTION>."""
    from compiler.smoke.targets import as_env, hooks, smoke_options

    env = dict(base)
    env.update({"DTC_NPROC_PER_NODE": str(setup.world_size), "DTC_ARTIFACT_DIR": str(generated_dir)})
    if hooks(target).options is not None:  # megatron's smoke passes its options as a megatron_args.sh instead
        env.update(as_env(smoke_options(setup, target)))
    env["PATH"] = _search_path(env)
    if not _has_module_command(env):
        env["BASH_FUNC_module%%"] = "() {  echo \"dtc smoke: no environment modules here; skipped: module $*\" >&2\n}"
    for k in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) and k != "SLURM_CONF"]:
        del env[k]
    return env


def _has_module_command(env: dict[str, str]) -> bool:
    try:
        r = subprocess.run(["bash", "-c", "command -v module || [[ -r /etc/profile.d/modules.sh ]]"],
                           capture_output=True, env=env, timeout=10)
        return r.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _run(argv: list[str], env: dict[str, str], *, cwd: Path | None = None, timeout: float = 30) \
        -> subprocess.CompletedProcess:
    exe = shutil.which(argv[0], path=env.get("PATH")) or argv[0]
    return subprocess.run([exe, *argv[1:]], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def slurm_unavailable(env: dict[str, str] | None = None) -> str | None:
    """Why ``--slurm`` cannot run here (no sbatch on PATH, no controller answering), or None. A smoke run
    that cannot start is a usage problem (exit 2), not a failed check (exit 1)."""
    env = dict(os.environ if env is None else env)
    for tool in ("sbatch", "scontrol"):
        if shutil.which(tool, path=env.get("PATH")) is None:
            return f"{tool} is not on PATH"
    try:
        r = _run(["scontrol", "ping"], env, timeout=15)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"scontrol ping failed: {exc}"
    if r.returncode != 0 or "UP" not in r.stdout:
        said = [line for line in (r.stdout + "\n" + r.stderr).splitlines() if line.strip()]
        return f"no SLURM controller answers (scontrol ping: {said[-1].strip() if said else f'exit {r.returncode}'})"
    return None


def job_state(job_id: int, env: dict[str, str]) -> dict[str, str] | None:
    r = _run(["scontrol", "show", "job", "-o", str(job_id)], env, timeout=15)
    if r.returncode == 0 and "JobId=" in r.stdout:
        info: dict[str, str] = {}
        for tok in r.stdout.splitlines()[0].split():
            key, sep, value = tok.partition("=")
            if sep:
                info.setdefault(key, value)
        return info
    for args in (["sacct", "-c"], ["sacct"]):
        r = _run([*args, "-j", str(job_id), "-n", "-P", "-o", "JobID,State,ExitCode"], env, timeout=15)
        for line in r.stdout.splitlines():
            parts = line.split("|")
            if len(parts) >= 3 and parts[0] == str(job_id):
                return {"JobState": parts[1].split()[0], "ExitCode": parts[2]}
    return None


def wait_job(job_id: int, env: dict[str, str], timeout_s: float, run_id: str) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    last: dict[str, str] = {}
    while True:
        info = job_state(job_id, env)
        if info:
            last = info
            if info.get("JobState", "").split()[0] in FINAL_STATES:
                return info
        if time.monotonic() > deadline:
            _run(["scancel", str(job_id)], env, timeout=15)
            end = time.monotonic() + 15
            while time.monotonic() < end:
                info = job_state(job_id, env) or {}
                if info.get("JobState", "") in FINAL_STATES:
                    break
                time.sleep(0.5)
            L.end_processes(None, run_id)
            return {**last, "JobState": "CANCELLED", "dtc_timeout": "1"}
        time.sleep(0.5)


def _drop_launcher_traceback(rows: list[str]) -> list[str]:
    """torchrun's own traceback (run.py -> ChildFailedError) says nothing the ranks did not; keep
    only its summary line and the "Root Cause" block that follows."""
    out, i = [], 0
    while i < len(rows):
        if rows[i].startswith("Traceback (most recent call last):"):
            j = i + 1
            while j < len(rows) and (rows[j].startswith(" ") or not rows[j].strip()):
                j += 1
            frames = "\n".join(rows[i:j])
            if "torch/distributed/run.py" in frames or "torch/distributed/launcher" in frames:
                i = j
                continue
        out.append(rows[i])
        i += 1
    return out


def _tail(path: Path, lines: int = 40) -> str:
    try:
        rows = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    rows = [r for r in rows if "Warning" not in r and "warnings.warn" not in r and "pmix" not in r.lower()]
    return "\n".join(_drop_launcher_traceback(rows)[-lines:])


def run_slurm_target(ctx, target: str) -> TargetResult:
    """Submit ``train_<target>.sbatch`` (rewritten) and report like a local launch."""
    from compiler.smoke import targets as T

    setup: SmokeSetup = ctx.setup
    entry = T.hooks(target).entry
    launch = registry.get(target).slurm
    if entry is None or launch is None:
        return TargetResult(target, "skipped", reason=(
            "--slurm runs the fsdp and deepspeed targets: the sbatch script passes the smoke overrides through "
            "the environment, and pretrain_gpt.py reads no DTC_SMOKE_* variables"))
    script = ctx.generated_dir / launch.script
    if not script.is_file():
        return TargetResult(target, "skipped", reason=f"{script.name} not generated (add slurm to the targets)")
    out_dir = ctx.workdir / "slurm"
    out_dir.mkdir(parents=True, exist_ok=True)
    cpus = int(os.environ.get("SLURM_SMOKE_CPUS_PER_TASK") or min(setup.world_size, os.cpu_count() or 1))
    text = rewrite_sbatch(script.read_text(), partition=os.environ.get("SLURM_SMOKE_PARTITION") or "debug",
                          cpus_per_task=cpus, time_limit_s=ctx.timeout_s, output_dir=out_dir)
    job_script = out_dir / script.name
    job_script.write_text(text)
    if T.hooks(target).jit_extensions:
        L.clear_stale_locks(L.extensions_dir())
    run_id = uuid.uuid4().hex
    env = smoke_env(setup, ctx.generated_dir, T.rank_env(ctx, target), target)
    env[L.RUN_ID_ENV] = run_id
    result = TargetResult(target, "failed", launched=True, command=f"sbatch {job_script}",
                          steps_requested=setup.steps)
    job = submit_and_wait(ctx, job_script, text, env, run_id, result)
    if job is None:
        return result
    lines = [re.sub(r"^\[(?:default)?\d+\]:", "", l) for l in _read_lines(job.out_path)]
    summary = T.read_result(result, lines, setup)
    T.target_notes(result, setup, summary)
    result.slurm = job.summary()
    if not job.completed:
        job.explain_failure(result)
        return result
    if (why := T.run_verdict(result)) is not None:
        result.reason = why
    elif not summary:
        result.reason = f"{entry} printed no {T.hooks(target).summary_key} line"
    else:
        result.status = "passed"
    return result


@dataclass(frozen=True)
class SlurmJob:
    """A smoke job SLURM ran to its end (or cancelled at the smoke timeout), as ``scontrol show job`` left it."""

    job_id: int
    state: str  # JobState's first word: COMPLETED, FAILED, TIMEOUT, CANCELLED, ...
    exit_code: str
    signal: str
    out_path: Path
    err_path: Path
    cancelled_at_timeout: bool

    @property
    def completed(self) -> bool:
        return self.state == "COMPLETED"

    def summary(self) -> dict:
        """The report's ``slurm`` record: job id, final state, exit code and signal, the tails of its logs."""
        return {"job_id": self.job_id, "state": self.state, "exit_code": int(self.exit_code or 0),
                "signal": int(self.signal or 0),
                "log_tail": "\n".join(x for x in (_tail(self.out_path, 15), _tail(self.err_path, 30)) if x)}

    def explain_failure(self, result: TargetResult) -> None:
        """Why a job that did not complete failed: its state and exit, and the error its logs end with."""
        why = "cancelled after the smoke timeout" if self.cancelled_at_timeout else f"ended {self.state}"
        result.reason = f"SLURM job {self.job_id} {why} (exit {self.exit_code}:{self.signal})"
        result.error, result.error_tail = L.own_error(_tail(self.err_path, 200) + "\n" + _tail(self.out_path, 50))


def submit_and_wait(ctx, job_script: Path, text: str, env: dict[str, str], run_id: str,
                    result: TargetResult) -> SlurmJob | None:
    """``sbatch`` the rewritten ``job_script`` (its ``text``) and wait for the job (wait_job: cancelled at the smoke
    timeout); ``result.wall_s`` is the time from submission to its end. None, with ``result`` saying why, when sbatch
    refuses the job."""
    start = time.monotonic()
    r = _run(["sbatch", "--parsable", str(job_script)], env, cwd=ctx.generated_dir)
    m = re.match(r"\s*(\d+)", r.stdout)
    if r.returncode != 0 or not m:
        result.reason = f"sbatch refused the job: {(r.stderr or r.stdout).strip()}"
        result.slurm = {"state": "NOT_SUBMITTED", "script": text}
        return None
    job_id = int(m.group(1))
    info = wait_job(job_id, env, ctx.timeout_s, run_id)
    result.wall_s = time.monotonic() - start
    code, _, sig = info.get("ExitCode", "0:0").partition(":")
    out_dir = job_script.parent
    return SlurmJob(job_id, info.get("JobState", "?").split()[0], code, sig,
                    Path(info.get("StdOut") or out_dir / f"{_job_name(text)}-{job_id}.out"),
                    Path(info.get("StdErr") or out_dir / f"{_job_name(text)}-{job_id}.err"),
                    bool(info.get("dtc_timeout")))


def _job_name(text: str) -> str:
    m = re.search(r"^#SBATCH --job-name=(\S+)", text, re.M)
    return m.group(1) if m else "slurm"


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []
