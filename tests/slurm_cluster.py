"""A private, throw-away single-node SLURM cluster for tests.

Importable without pytest.  Needs Debian's ``slurm-wlm`` and ``munge``
(``.ci/install-system-deps.sh``) and root (slurmd runs jobs as root).

Layout of the cluster written by :meth:`SlurmCluster.start`:

* ``localhost`` -- the one *real* node.  Its CPUs/sockets/cores/threads come
  from ``slurmd -C`` (falling back to ``nproc``), RealMemory is ~90 % of the
  machine's memory, and it has **no GPUs**.  Partition ``debug`` (Default=YES)
  holds only this node.  Real jobs must go here and must not ask for GPUs
  (``--gpus*``/``--gres=gpu``): such a request is refused with
  "Requested node configuration is not available".  Callers that want to run a
  generated GPU script for real have to rewrite its ``#SBATCH`` directives
  (drop GPU requests, shrink ``--nodes``, switch to ``--partition=debug``).

* ``gpu[001-NNN]`` -- ``fake_gpu_nodes`` nodes that never exist, declared
  ``State=CLOUD`` with ``Gres=gpu:<gpus_per_node>`` (typed if ``gpu_type``),
  ``gpu_node_cpus`` CPUs and ``gpu_node_mem_mb`` of memory, in partition
  ``gpu``.  With power saving configured (``ResumeProgram=/bin/true``) slurmctld
  treats them as idle-but-powered-down (``idle~``), so the scheduler, and hence
  ``sbatch --test-only``, happily places jobs on them:
  ``sbatch: Job N to start at <now> using P processors on nodes gpu[001-016] in
  partition gpu`` with exit 0.  Never submit a *real* job to partition ``gpu``:
  it would sit in CONFIGURING waiting for the node to "boot".

Findings that shaped this (Slurm 22.05.8, Debian 12):

* ``State=FUTURE`` nodes are invisible to the scheduler and ``State=UNKNOWN``
  nodes that never register are skipped too; both give "Requested node
  configuration is not available".  ``State=CLOUD`` + power saving works.
* Fake nodes need no NodeAddr while CLOUD.  An *unresolvable* NodeAddr on a
  non-cloud node makes slurmctld spend ~10 s per node retrying getaddrinfo()
  at start-up and ignore SIGTERM meanwhile.
* ``NodeName=localhost`` must be declared *after* the fake nodes: while it is
  the only node parsed so far, Slurm's "single localhost node" shortcut makes
  every name lookup return it and slurmctld dies with
  ``fatal: Duplicated NodeHostName gpu001 in config file``.
* ``GresTypes=gpu`` plus ``Gres=gpu:8`` on the node line is all slurmctld
  needs; no gres.conf is required (slurmd logs "Can not stat gres.conf file
  ..., using slurm.conf data" and carries on; the real node has no gres).
  ``--gpus-per-node=8``, ``--gres=gpu:8``, ``--gpus=16`` and
  ``--gpus-per-task=1`` are accepted; ``--gpus-per-node=9`` is refused; a typed
  request (``--gpus-per-node=h100:8``) is refused unless ``gpu_type="h100"``,
  in which case both typed and untyped requests are accepted.
* Without slurmdbd (``AccountingStorageType=accounting_storage/none``)
  ``--account`` and ``--qos`` are accepted by ``--test-only`` and by real
  submission with any value; nothing is validated.  The account is recorded
  (``Account=myacct``), the QOS is dropped (``QOS=(null)`` in ``scontrol show
  job``).  So the cluster cannot tell you that an account/QOS does not exist.
* Every ``--test-only`` call consumes a job id.
* Finished jobs stay in ``scontrol show job`` for MinJobAge (300 s); after
  that :meth:`SlurmCluster.wait` falls back to ``sacct -c`` (jobcomp/filetxt).
* A relative ``-f slurm.conf`` breaks slurmctld (it chdirs); paths are
  absolute here.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterable, Sequence

__all__ = ["SlurmCluster", "SlurmNotInstalled", "missing_slurm_tools", "INSTALL_HINT"]

SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")
REQUIRED_TOOLS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo", "sacct",
                  "slurmctld", "slurmd", "munged", "munge")
INSTALL_HINT = ("SLURM/munge not installed: run `sudo bash .ci/install-system-deps.sh` "
                "(installs slurm-wlm, munge and shellcheck on Debian 12)")

FINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
    "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED",
})

CMD_TIMEOUT_S = 30.0      # any single slurm client call
START_TIMEOUT_S = 30.0    # daemons up and the real node idle
STOP_TIMEOUT_S = 10.0     # SIGTERM grace before SIGKILL
# One cluster at a time on a machine: clusters share munged (started by the first, stopped by its starter),
# so pytest-xdist workers queue on this lock rather than start or stop munged under another's cluster.
LOCK_PATH = Path("/tmp/dtc-test-slurm-cluster.lock")
LOCK_TIMEOUT_S = 1800.0


class SlurmNotInstalled(RuntimeError):
    pass


def _search_path() -> str:
    parts = os.environ.get("PATH", "").split(os.pathsep)
    parts += [d for d in SBIN_DIRS if d not in parts]
    return os.pathsep.join(p for p in parts if p)


def _which(name: str) -> str | None:
    return shutil.which(name, path=_search_path())


def missing_slurm_tools() -> list[str]:
    """Names of the executables this module needs that are not installed."""
    return [t for t in REQUIRED_TOOLS if _which(t) is None]


def _free_tcp_ports(n: int) -> list[int]:
    """n distinct ports that are free right now on all interfaces."""
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"<{path}: not readable>"
    # mpi/pmix noise is logged at every start; it only hides the real cause.
    text = [l for l in text if "pmix" not in l.lower() and "MPI: Cannot create" not in l]
    return "\n".join(text[-lines:])


def _machine_node_config() -> dict[str, int]:
    """Hardware as slurmd sees it (so the node is never drained for 'Low CPUs')."""
    cfg: dict[str, int] = {}
    slurmd = _which("slurmd")
    if slurmd:
        try:
            out = subprocess.run([slurmd, "-C"], capture_output=True, text=True,
                                 timeout=CMD_TIMEOUT_S).stdout
            for key in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket",
                        "ThreadsPerCore", "RealMemory"):
                m = re.search(rf"\b{key}=(\d+)", out)
                if m:
                    cfg[key] = int(m.group(1))
        except (OSError, subprocess.SubprocessError):
            pass
    if "CPUs" not in cfg:
        cfg = {"CPUs": len(os.sched_getaffinity(0))}
    if "RealMemory" not in cfg:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        cfg["RealMemory"] = pages // (1024 * 1024)
    return cfg


class SlurmCluster:
    """A running private cluster.  Create with :meth:`start`; end with :meth:`stop`
    (or use it as a context manager)."""

    def __init__(self, workdir: Path, conf_path: Path, env: dict[str, str]):
        self.workdir = workdir
        self.conf_path = conf_path
        self.env = env
        self.log_dir = workdir / "log"
        self.ctld_port = 0
        self.slurmd_port = 0
        self.fake_gpu_nodes = 0
        self.gpus_per_node = 0
        self.real_node_cpus = 0
        self.gpu_node_names = ""
        self._procs: dict[str, subprocess.Popen] = {}
        self._started_munged = False
        self._stopped = False
        self._lock_fd: int | None = None

    # ------------------------------------------------------------------ start
    @classmethod
    def start(cls, workdir: Path, *, fake_gpu_nodes: int = 64, gpus_per_node: int = 8,
              gpu_type: str | None = None, gpu_node_cpus: int = 128,
              gpu_node_mem_mb: int = 2_000_000,
              timeout_s: float = START_TIMEOUT_S) -> "SlurmCluster":
        """Write ``workdir/slurm.conf``, start munged (unless one answers
        already), slurmctld and slurmd, and wait until ``localhost`` is idle."""
        missing = missing_slurm_tools()
        if missing:
            raise SlurmNotInstalled(f"{INSTALL_HINT}; missing: {', '.join(missing)}")
        if os.geteuid() != 0:
            raise RuntimeError("SlurmCluster needs root (slurmd must run as root)")
        workdir = Path(workdir).resolve()
        # slurmd/slurmstepd put Unix sockets in the spool dir (sun_path <= 107 bytes).
        if len(str(workdir / "spool" / "localhost_4294967292.4294967292")) > 100:
            raise ValueError(f"workdir path too long for slurmd's Unix sockets: {workdir}")
        for sub in ("state", "spool", "log"):
            (workdir / sub).mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PATH"] = _search_path()
        env["SLURM_CONF"] = str(workdir / "slurm.conf")
        # Stray SLURM_* variables (e.g. tests run inside a job) would leak into sbatch.
        for k in list(env):
            if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) and k != "SLURM_CONF":
                del env[k]

        cluster = cls(workdir, workdir / "slurm.conf", env)
        cluster._lock()
        deadline = time.monotonic() + timeout_s
        try:
            cluster._ensure_munged(deadline)
            for attempt in range(2):        # a port may be grabbed between pick and bind
                cluster._write_conf(fake_gpu_nodes=fake_gpu_nodes, gpus_per_node=gpus_per_node,
                                    gpu_type=gpu_type, gpu_node_cpus=gpu_node_cpus,
                                    gpu_node_mem_mb=gpu_node_mem_mb)
                try:
                    cluster._start_daemons(deadline)
                    break
                except RuntimeError as exc:
                    cluster._kill_daemons()
                    if attempt == 0 and "Address already in use" in str(exc) \
                            and time.monotonic() < deadline - 5:
                        continue
                    raise
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _lock(self) -> None:
        """Wait for the machine's one-cluster lock (another test process's cluster to stop)."""
        fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o666)
        end = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._lock_fd = fd
                return
            except BlockingIOError:
                if time.monotonic() >= end:
                    os.close(fd)
                    raise RuntimeError(f"another test cluster held {LOCK_PATH} for {LOCK_TIMEOUT_S:.0f} s")
                time.sleep(0.2)

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _write_conf(self, *, fake_gpu_nodes: int, gpus_per_node: int, gpu_type: str | None,
                    gpu_node_cpus: int, gpu_node_mem_mb: int) -> None:
        w = self.workdir
        self.ctld_port, self.slurmd_port = _free_tcp_ports(2)
        self.fake_gpu_nodes = fake_gpu_nodes
        self.gpus_per_node = gpus_per_node
        hw = _machine_node_config()
        cpus = hw["CPUs"]
        self.real_node_cpus = cpus
        real_mem = max(256, int(hw["RealMemory"] * 0.9))
        topo = ""
        if all(k in hw for k in ("SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")):
            topo = (f" Boards={hw.get('Boards', 1)} SocketsPerBoard={hw['SocketsPerBoard']}"
                    f" CoresPerSocket={hw['CoresPerSocket']} ThreadsPerCore={hw['ThreadsPerCore']}")
        # Without a default, every job would get all of the node's memory
        # (CR_Core_Memory), serialising jobs that only need a core each.
        def_mem_per_cpu = max(64, min(1024, real_mem // max(cpus, 1)))
        user = pwd.getpwuid(os.geteuid()).pw_name
        width = max(3, len(str(fake_gpu_nodes)))
        lines = [
            "# Written by tests/slurm_cluster.py -- private single-node test cluster",
            "ClusterName=dtctest",
            "SlurmctldHost=localhost",
            f"SlurmUser={user}",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            f"StateSaveLocation={w}/state",
            f"SlurmdSpoolDir={w}/spool",
            f"SlurmctldPidFile={w}/slurmctld.pid",
            f"SlurmdPidFile={w}/slurmd.pid",
            f"SlurmctldLogFile={w}/log/slurmctld.log",
            f"SlurmdLogFile={w}/log/slurmd.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            # Schedule batch jobs at submit time (default batch_sched_delay=3 s).
            "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
            "ReturnToService=2",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={w}/log/jobcomp.txt",
            "MailProg=/bin/true",
            "GresTypes=gpu",
            # Power saving makes CLOUD nodes schedulable while "powered down".
            "SuspendProgram=/bin/true",
            "ResumeProgram=/bin/true",
            "SuspendTime=600",
            "ResumeTimeout=600",
            "SuspendExcNodes=localhost",
            "PrivateData=cloud",      # (sic) makes sinfo/scontrol *show* cloud nodes
        ]
        # Fake nodes first: see the module docstring (localhost lookup shortcut).
        if fake_gpu_nodes > 0:
            gres = f"gpu:{gpu_type}:{gpus_per_node}" if gpu_type else f"gpu:{gpus_per_node}"
            names = (f"gpu{1:0{width}d}" if fake_gpu_nodes == 1
                     else f"gpu[{1:0{width}d}-{fake_gpu_nodes:0{width}d}]")
            self.gpu_node_names = names
            lines.append(f"NodeName={names} CPUs={gpu_node_cpus} RealMemory={gpu_node_mem_mb}"
                         f" Gres={gres} State=CLOUD")
        lines.append(f"NodeName=localhost CPUs={cpus}{topo} RealMemory={real_mem} State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE"
                     f" DefMemPerCPU={def_mem_per_cpu} State=UP")
        if fake_gpu_nodes > 0:
            lines.append(f"PartitionName=gpu Nodes={names} MaxTime=INFINITE State=UP")
        self.conf_path.write_text("\n".join(lines) + "\n")

    def _ensure_munged(self, deadline: float) -> None:
        if self._munge_ok():
            return
        munged = _which("munged")
        assert munged is not None
        run_dir = Path("/run/munge")
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            mu = pwd.getpwnam("munge")
            os.chown(run_dir, mu.pw_uid, mu.pw_gid)
        except KeyError:
            mu = None
        out = open(self.log_dir / "munged.out", "ab")
        kwargs = dict(user=mu.pw_uid, group=mu.pw_gid, extra_groups=[]) if mu else {}
        # -F: stay in the foreground so we own the pid; --force: ignore a stale
        # socket lock left by a dead munged (a live one answered _munge_ok()).
        self._procs["munged"] = subprocess.Popen(
            [munged, "-F", "--force"], stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, **kwargs)
        out.close()
        self._started_munged = True
        while time.monotonic() < deadline:
            if self._munge_ok():
                return
            if self._procs["munged"].poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError("munged did not come up:\n" + _tail(self.log_dir / "munged.out")
                           + "\n" + _tail(Path("/var/log/munge/munged.log")))

    def _munge_ok(self) -> bool:
        munge = _which("munge")
        if not munge:
            return False
        try:
            return subprocess.run([munge, "-n"], capture_output=True, timeout=5,
                                  env=self.env).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False

    def _start_daemons(self, deadline: float) -> None:
        conf = str(self.conf_path)
        # Fresh state: a cluster is never resumed from a previous run.
        for sub in ("state", "spool"):
            shutil.rmtree(self.workdir / sub, ignore_errors=True)
            (self.workdir / sub).mkdir()
        for name, argv in (("slurmctld", [_which("slurmctld"), "-D", "-f", conf]),
                           ("slurmd", [_which("slurmd"), "-D", "-f", conf, "-N", "localhost"])):
            log = self.log_dir / f"{name}.log"
            log.write_text("")
            out = open(self.log_dir / f"{name}.out", "wb")
            self._procs[name] = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, cwd=self.workdir, start_new_session=True)
            out.close()
        while time.monotonic() < deadline:
            for name in ("slurmctld", "slurmd"):
                if self._procs[name].poll() is not None:
                    raise RuntimeError(f"{name} exited with {self._procs[name].returncode} "
                                       "during start-up\n" + self.logs_tail())
            try:
                r = self._run(["sinfo", "-h", "-n", "localhost", "-o", "%t"], timeout=5)
                state = r.stdout.strip()
                if r.returncode == 0 and state in ("idle", "mix", "alloc"):
                    return
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.1)
        raise RuntimeError("node localhost not idle within the start timeout\n" + self.logs_tail())

    # ------------------------------------------------------------ commands
    def _run(self, argv: Sequence[str], *, timeout: float = CMD_TIMEOUT_S,
             cwd: Path | None = None, check: bool = False) -> subprocess.CompletedProcess:
        exe = _which(argv[0]) or argv[0]
        r = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, env=self.env,
                           timeout=timeout, cwd=cwd or self.workdir)
        if check and r.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)} failed ({r.returncode}):\n"
                               f"{r.stdout}{r.stderr}")
        return r

    def run(self, argv: Sequence[str], *, timeout: float = CMD_TIMEOUT_S,
            cwd: Path | None = None, check: bool = False) -> subprocess.CompletedProcess:
        """Run any Slurm client (``["squeue", ...]``) against this cluster."""
        return self._run(argv, timeout=timeout, cwd=cwd, check=check)

    def test_only(self, script: Path, *, extra_args: Iterable[str] = (),
                  timeout: float = CMD_TIMEOUT_S) -> subprocess.CompletedProcess:
        """``sbatch --test-only script``.  Exit 0 and stderr ``sbatch: Job N to
        start at ... in partition P`` when the request fits; exit 1 and
        ``allocation failure: ...`` when it cannot ever run.  (Uses up a job id.)"""
        script = Path(script).resolve()
        return self._run(["sbatch", "--test-only", *extra_args, str(script)],
                         timeout=timeout, cwd=script.parent)

    def submit(self, script: Path, *, extra_args: Iterable[str] = (),
               cwd: Path | None = None, timeout: float = CMD_TIMEOUT_S) -> int:
        """Submit for real (``sbatch --parsable``); returns the job id.  sbatch
        runs in ``cwd`` (default: the script's directory), which is also where
        the default ``slurm-%j.out`` goes."""
        script = Path(script).resolve()
        r = self._run(["sbatch", "--parsable", *extra_args, str(script)],
                      timeout=timeout, cwd=cwd or script.parent)
        m = re.match(r"\s*(\d+)", r.stdout)
        if r.returncode != 0 or not m:
            raise RuntimeError(f"sbatch {script} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
        return int(m.group(1))

    def job_info(self, job_id: int) -> dict[str, str] | None:
        """``scontrol show job -o`` as a dict, or None once the job is purged."""
        r = self._run(["scontrol", "show", "job", "-o", str(job_id)], timeout=10)
        if r.returncode != 0 or "JobId=" not in r.stdout:
            return None
        info: dict[str, str] = {}
        # One line of space-separated Key=Value (values may contain '=', e.g. TRES).
        for tok in r.stdout.splitlines()[0].split():
            key, sep, value = tok.partition("=")
            if sep:
                info.setdefault(key, value)
        return info

    def _sacct_final(self, job_id: int) -> dict[str, str] | None:
        r = self._run(["sacct", "-c", "-j", str(job_id), "-n", "-P",
                       "-o", "JobID,State,ExitCode"], timeout=10)
        for line in r.stdout.splitlines():
            parts = line.split("|")
            if len(parts) >= 3 and parts[0] == str(job_id):
                return {"JobState": parts[1].split()[0], "ExitCode": parts[2]}
        return None

    def wait(self, job_id: int, timeout_s: float = 60.0, *, poll_s: float = 0.2) -> dict:
        """Wait for the job to reach a final state.  Returns ``{'state': 'COMPLETED',
        'exit_code': 0, 'signal': 0, 'stdout_path': '/.../slurm-7.out' | None,
        'stderr_path': ...}``.  On timeout the job is scancel'led and TimeoutError
        raised."""
        deadline = time.monotonic() + timeout_s
        last: dict[str, str] | None = None
        while True:
            info = self.job_info(job_id)
            if info is None:
                info = self._sacct_final(job_id)
            if info is not None:
                last = info
                state = info.get("JobState", "").split()[0] if info.get("JobState") else ""
                if state in FINAL_STATES:
                    code, _, sig = info.get("ExitCode", "0:0").partition(":")
                    return {
                        "state": state,
                        "exit_code": int(code or 0),
                        "signal": int(sig or 0),
                        "stdout_path": info.get("StdOut"),
                        "stderr_path": info.get("StdErr"),
                        "reason": info.get("Reason"),
                        "nodes": info.get("NodeList"),
                    }
            if time.monotonic() >= deadline:
                self._run(["scancel", str(job_id)], timeout=10)
                raise TimeoutError(
                    f"job {job_id} not finished after {timeout_s:.0f}s (cancelled); last seen: "
                    f"{(last or {}).get('JobState')} reason={(last or {}).get('Reason')}")
            time.sleep(poll_s)

    # ------------------------------------------------------------------ stop
    def logs_tail(self, lines: int = 30) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmctld.out", "slurmd.log", "slurmd.out"):
            p = self.log_dir / name
            if p.exists():
                parts.append(f"--- {p} ---\n{_tail(p, lines)}")
        return "\n".join(parts)

    def _kill_daemons(self, grace_s: float = STOP_TIMEOUT_S) -> None:
        names = [n for n in ("slurmd", "slurmctld") if n in self._procs]
        if self._started_munged and self._stopped:
            names.append("munged")
        for n in names:
            p = self._procs[n]
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for n in names:
            p = self._procs.pop(n)
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # SIGKILL whatever is left of the daemon's own session (slurmctld's
            # slurmscriptd child, a wedged daemon).
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def stop(self) -> None:
        """Cancel all jobs, stop slurmd and slurmctld (and munged if we started it)
        and wait for them to exit.  Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        ctld = self._procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            try:
                # Cancel jobs so slurmstepd processes (own sessions) end too.
                r = self._run(["squeue", "-h", "-o", "%i"], timeout=10)
                ids = r.stdout.split()
                if ids:
                    self._run(["scancel", *ids], timeout=10)
                    end = time.monotonic() + 10
                    while time.monotonic() < end:
                        if not self._run(["squeue", "-h", "-t", "R,CG,CF",
                                          "-o", "%i"], timeout=10).stdout.strip():
                            break
                        time.sleep(0.2)
            except (subprocess.SubprocessError, OSError):
                pass
        self._kill_daemons()
        self._kill_leftovers()
        self._unlock()

    def _leftover_pids(self) -> list[int]:
        """Live processes of this cluster: slurmstepd and job processes carry our
        SLURM_CONF in their environment (they run in sessions of their own)."""
        marker = f"SLURM_CONF={self.conf_path}".encode()
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

    def _kill_leftovers(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            pids = self._leftover_pids()
            if not pids or time.monotonic() >= deadline:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.1)

    def __enter__(self) -> "SlurmCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self):  # best effort; never rely on it
        try:
            if not self._stopped and self._procs:
                self.stop()
        except Exception:
            pass
