"""SLURM target: one sbatch script per framework target, and ``train.sbatch`` (the primary one).

``slurm_context(plan)`` computes everything the templates place (``slurm/*.sbatch.j2``):

- ``train_fsdp.sbatch``: ``srun`` one task per node running ``torchrun`` (c10d rendezvous
  at the first node of the allocation) with ``fsdp_train.py``.
- ``train_deepspeed.sbatch``: the same torchrun launch with ``ds_train.py``. DeepSpeed reads
  RANK/LOCAL_RANK/WORLD_SIZE from torchrun's environment, so no pdsh/ssh (``deepspeed``
  launcher) and no hostfile are involved; ``deepspeed --launcher slurm`` would start its own
  nested ``srun`` with one task per GPU from a single process, without torchrun's rendezvous,
  worker restarts and signal forwarding.
- ``train_megatron.sbatch``: ``srun`` one task per GPU; each task sets RANK, LOCAL_RANK and
  WORLD_SIZE from SLURM_PROCID, SLURM_LOCALID and SLURM_NTASKS and runs ``pretrain_gpt.py``
  with the arguments of ``megatron_args.sh``.

Values from the spec are checked again here (the Plan may come from an edited plan.json):
those placed in ``#SBATCH`` lines, which no shell quotes, must match the spec's patterns in
full; everything that reaches a shell command goes through ``shell_quote``.

Time limit: ``slurm.time_limit`` becomes ``--time``; without it no ``--time`` is written and
the partition's default applies. dtc does not derive one from the estimated time to train:
a run of weeks is split into segments, one job each (compiler.checkpointing.segments; PLAN.md
says how many), chained by requeue: SLURM sends SIGUSR1 ``signal_lead_s`` before the limit
(the step in flight, twice the checkpoint write at the stated storage bandwidth, a minute), the
trainers save and exit, and the script runs ``scontrol requeue`` on its own job, which keeps its
id, its script and its folder and resumes from the latest complete checkpoint. A request above
the partition's MaxTime would leave the job pending forever.

Where the script runs: sbatch copies the script into SLURM's spool, so ``$0`` is not beside the
generated files. The script finds them as DTC_ARTIFACT_DIR if set, else the folder of the script
that was submitted (``scontrol show job``'s ``Command=``, an absolute path; it survives requeues),
so ``sbatch generated/NAME/train.sbatch`` works from any folder. SLURM opens ``--output`` before
the script starts, so the logs go to the submit folder unless ``slurm.output_dir`` names a folder
(which must exist at submission; the header says ``mkdir -p`` it); the script creates its
checkpoint folder itself. With ``slurm.container_image``, ``--container-mounts`` always mounts the
generated folder, the submit folder (checkpoints, logs) and the folders of the spec's datasets,
tokenizer and ``model.init``, each at its own path, so checkpoints persist outside the container.
"""
from __future__ import annotations

import math
import re
from typing import Any

from compiler.errors import Diagnostic, RenderError
from compiler.plan import Plan
from compiler.render.environment import render_template
from compiler.render.common import provenance_header
from compiler.targets import registry
from compiler.targets.base import Target, load
from compiler.spec.models import IMAGE_RE, MODULE_RE, NAME_RE, PATH_RE, SLURM_NAME_RE, env_name_problem

PRIMARY = "train.sbatch"
# Cores of the smallest common 8-GPU training node, split over its GPUs by default: AWS p5.48xlarge has
# 192 vCPUs = 96 physical cores for 8 H100 (aws.amazon.com/ec2/instance-types/p5, "Product details"); NVIDIA
# DGX H100/H200 has 2x Xeon Platinum 8480C = 112 cores (DGX H100 user guide, "Hardware Overview"); DGX A100
# 2x EPYC 7742 = 128 cores (DGX A100 datasheet). 96 fits all three; slurm.cpus_per_task states a node's own.
NODE_CORES = 96
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
# What an #SBATCH value may contain at all (sbatch splits its lines on blanks and quotes).
_SBATCH_SAFE = re.compile(r"[A-Za-z0-9_.%+=@:,/~-]+")


def _fail(summary: str, hint: str = "fix the slurm section of the spec and recompile") -> RenderError:
    return RenderError(Diagnostic(summary=summary, detail="refusing to write it into an sbatch script", hint=hint))


def _check(field: str, value: Any, pattern: str, *, sbatch: bool = False) -> str:
    if not isinstance(value, str) or re.fullmatch(pattern, value) is None:
        raise _fail(f"slurm.{field} {value!r} does not match {pattern}")
    if sbatch and _SBATCH_SAFE.fullmatch(value) is None:
        raise _fail(f"slurm.{field} {value!r} cannot be placed in an #SBATCH line")
    return value


def _int(field: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(f"slurm.{field} must be an integer in [{low}, {high}], got {value!r}")
    return value


def format_time(seconds: float) -> str:
    """SLURM's D-HH:MM:SS, rounded up to whole seconds."""
    total = max(1, math.ceil(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


def _common(plan: Plan) -> dict[str, Any]:
    """Validated values shared by every script."""
    s, lay = plan.slurm, plan.layout
    nodes = lay.num_nodes
    if lay.world_size % nodes:
        raise _fail(f"world size {lay.world_size} does not split evenly over {nodes} nodes of "
                    f"{lay.gpus_per_node} GPUs",
                    hint="use a GPU count that is a multiple of the node size (or below one node)")
    job_name = _check("job_name", s.job_name or plan.name, NAME_RE, sbatch=True)
    optional = {key: _check(key, getattr(s, key), SLURM_NAME_RE, sbatch=True)
                for key in ("partition", "account", "qos") if getattr(s, key) is not None}
    output_dir = (_check("output_dir", s.output_dir, PATH_RE, sbatch=True).rstrip("/") or "/"
                  if s.output_dir is not None else None)
    time_limit = s.time_limit
    if time_limit is not None and (isinstance(time_limit, bool) or not isinstance(time_limit, (int, float))
                                   or not 0 < time_limit < 10**9):
        raise _fail(f"slurm.time_limit must be a positive number of seconds, got {time_limit!r}")
    env = dict(s.environment)
    if not isinstance(env, dict):
        raise _fail(f"slurm.environment must be a mapping, got {type(env).__name__}")
    for name, value in env.items():
        problem = env_name_problem(name) if isinstance(name, str) else "a name must be a string"
        if problem is not None:
            raise _fail(f"slurm.environment name {name!r} cannot be set: {problem}")
        if not isinstance(value, str) or any(ch in value for ch in "\n\r\x00"):
            raise _fail(f"slurm.environment.{name} must be a one-line string, got {value!r}")
    image = s.container_image
    return {
        "header": provenance_header(plan),
        "job_name": job_name,
        "nodes": nodes,
        "gpus_per_node": lay.world_size // nodes,
        "world_size": lay.world_size,
        "optional": optional,
        "time": format_time(time_limit) if time_limit is not None else None,
        "exclusive": bool(s.exclusive),
        "requeue": bool(s.requeue),
        "output": f"{output_dir}/%x-%j.out" if output_dir else "%x-%j.out",
        "error": f"{output_dir}/%x-%j.err" if output_dir else "%x-%j.err",
        "output_dir": output_dir,
        "modules": [_check("modules", m, MODULE_RE) for m in s.modules],
        "environment": [{"name": k, "value": env[k]} for k in sorted(env)],
        # ShellCheck notes '$' and '`' inside single quotes (SC2016) and a backslash before a
        # closing quote (SC1003): here the literal, unexpanded value is the point.
        "environment_shellcheck_disables": ",".join(
            code for code, hit in (("SC1003", any("\\" in v for v in env.values())),
                                   ("SC2016", any("$" in v or "`" in v for v in env.values()))) if hit),
        "container_image": _check("container_image", image, IMAGE_RE) if image is not None else None,
        "container_mounts": _container_mounts(plan) if image is not None else "",
        "workdir": _check("workdir", s.workdir, PATH_RE) if s.workdir is not None else None,
        "port": _int("rdzv_port", s.rdzv_port, 1, 65535),
        "train_script": (_check("train_script", s.train_script, PATH_RE)
                         if s.train_script is not None else None),
        "describe": plan.layout.describe(),
        "gpu": str(plan.cluster.display_name or plan.cluster.gpu),
    }


def _container_mounts(plan: Plan) -> str:
    """The fixed part of --container-mounts: the spec's own mounts, then each absolute data, tokenizer and
    model.init folder at its own path (a dataset prefix or a tokenizer file mounts its folder). The script
    prepends the generated folder and the submit folder, which are known only when the job runs."""
    import posixpath

    mounts = [_check("container_mounts", m, PATH_RE) for m in plan.slurm.container_mounts]
    data = plan.data
    paths: list[tuple[str, bool]] = []  # (path, is a folder itself)
    if data is not None and not data.synthetic:
        paths += [(d.path, False) for d in data.datasets]
        if data.tokenizer is not None:
            paths.append((str(data.tokenizer), False))
    if plan.model.init is not None:
        paths.append((str(plan.model.init), True))
    for path, is_dir in paths:
        if not path.startswith("/"):
            continue  # relative: under the submit or generated folder, both mounted
        folder = posixpath.normpath(path if is_dir else posixpath.dirname(path) or "/")
        mount = f"{_check('data path', folder, PATH_RE)}:{folder}"
        if folder != "/" and mount not in mounts:
            mounts.append(mount)
    return ",".join(mounts)


def _cpus_per_task(plan: Plan, tasks_per_node: int, gpus_per_node: int) -> int:
    """CPUs of one SLURM task. ``slurm.cpus_per_task`` counts CPUs per training process (per GPU):
    srun's task under Megatron, G of them in torchrun's one task per node. Default: NODE_CORES split
    over the node's GPUs (the catalog's GPUs per node, so a job on part of a node asks for its share).
    One value then asks every script for the same CPUs per node, never more than a node has."""
    per_process = plan.slurm.cpus_per_task
    node_gpus = max(int(plan.cluster.gpus_per_node), gpus_per_node)
    per_process = (max(1, NODE_CORES // node_gpus) if per_process is None
                   else _int("cpus_per_task", per_process, 1, 1024))
    return per_process * gpus_per_node // tasks_per_node


def signal_seconds(plan: Plan, target: str) -> int:
    """Seconds before the time limit SLURM sends SIGUSR1 (0: none): slurm.signal_seconds_before_end if the spec
    sets it, else the checkpoint policy's lead for ``target`` (compiler.checkpointing.signal_lead_s)."""
    from compiler.checkpointing import plan_policy

    given = plan.slurm.signal_seconds_before_end
    if given is not None:
        return _int("signal_seconds_before_end", given, 0, 65535)
    return plan_policy(plan, target).signal_lead_s


def launched(plan: Plan) -> list[Target]:
    """The plan's framework targets, each with its own sbatch script (Target.slurm), in registry order."""
    return [t for t in registry.targets() if t.slurm is not None and t.name in plan.targets]


def _script_context(plan: Plan, target: Target, common: dict[str, Any]) -> dict[str, Any]:
    launch = target.slurm
    assert launch is not None
    gpn = common["gpus_per_node"]
    tasks_per_node = 1 if launch.launcher == "torchrun" else gpn
    ctx = dict(common, target=target.name, script=launch.script, template=launch.template, launcher=launch.launcher,
               tasks_per_node=tasks_per_node, cpus_per_task=_cpus_per_task(plan, tasks_per_node, gpn),
               signal_seconds=signal_seconds(plan, target.name),
               torchrun_signals=TORCHRUN_SIGNALS, env_exports=[], env_unsets=[], framework=launch.framework,
               needs=list(launch.needs))
    own = common["train_script"]
    if launch.program_default is not None:  # a torchrun entry point: the generated one, or slurm.train_script
        ctx.update(program=own, program_default=launch.program_default,
                   config_flag=launch.config_flag[1] if own else launch.config_flag[0])
    if launch.context is not None:  # what the target's own script needs (Megatron: its directory and environment)
        ctx.update(load(launch.context)(plan, _check))
    directives = [f"--job-name={common['job_name']}", f"--nodes={common['nodes']}",
                  f"--ntasks-per-node={tasks_per_node}", f"--gpus-per-node={gpn}",
                  f"--cpus-per-task={ctx['cpus_per_task']}"]
    if common["time"]:
        directives.append(f"--time={common['time']}")
    directives += [f"--{key}={value}" for key, value in common["optional"].items()]
    if common["exclusive"]:
        directives.append("--exclusive")
    directives += [f"--output={common['output']}", f"--error={common['error']}",
                   "--requeue" if common["requeue"] else "--no-requeue"]
    if ctx["signal_seconds"]:
        directives.append(f"--signal=B:USR1@{ctx['signal_seconds']}")
    for d in directives:  # internal invariant: every value was checked above
        assert _SBATCH_SAFE.fullmatch(d.lstrip("-")), d
    ctx["directives"] = directives
    return ctx


def primary_target(plan: Plan) -> str:
    """The framework ``train.sbatch`` launches: slurm.launcher's (the best ranked target it can mean), else the
    first framework target of the plan."""
    present = [t.name for t in launched(plan)]
    if not present:
        names = [t.name for t in registry.targets() if t.slurm is not None]
        raise _fail(f"the slurm target needs a framework target ({', '.join(names)})",
                    hint="add a framework to targets")
    launcher = plan.slurm.launcher
    if launcher is None:
        return next(t for t in plan.targets if t in present)
    ranked = sorted((t.slurm.launchers[launcher], t.name) for t in launched(plan)
                    if t.slurm is not None and launcher in t.slurm.launchers)
    if ranked:
        return ranked[0][1]
    means: dict[str, list[str]] = {}
    for t in registry.targets():
        for name in (t.slurm.launchers if t.slurm else {}):
            means.setdefault(name, []).append(t.name)
    raise _fail(f"slurm.launcher {launcher!r} launches none of the targets {', '.join(present)}",
                hint="; ".join(f"{name}: {' or '.join(ts)}" for name, ts in means.items()))


def slurm_context(plan: Plan) -> dict[str, Any]:
    """{"scripts": {target: context}, "primary": target}: every value the sbatch templates place."""
    common = _common(plan)
    scripts = {t.name: _script_context(plan, t, common) for t in launched(plan)}
    return {"scripts": scripts, "primary": primary_target(plan)}


def render_slurm(plan: Plan) -> dict[str, str]:
    """One sbatch script per framework target, plus train.sbatch (a copy of the primary one)."""
    context = slurm_context(plan)
    files = {ctx["script"]: render_template(ctx["template"], **ctx) for ctx in context["scripts"].values()}
    files[PRIMARY] = files[context["scripts"][context["primary"]]["script"]]
    return files


# ------------------------------------------------------------------------------ invariants
def _sbatch_directives(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line[len("#SBATCH "):].partition("=")
            out[key.strip()] = value.strip()
    return out


def _check_sbatch(c: Any, rel: str, text: str) -> None:
    d = _sbatch_directives(text)
    cl = c.plan.cluster
    c.expect(rel, "--nodes", int(d.get("--nodes", 0)), cl.num_nodes)
    gpn = min(int(cl.gpus_per_node), int(cl.num_gpus))
    if "--gpus-per-node" in d:
        c.expect(rel, "--gpus-per-node", int(d["--gpus-per-node"]), gpn)
    m = re.search(r'NPROC_PER_NODE="\$\{DTC_NPROC_PER_NODE:-(\d+)\}"', text)
    per_node = int(m.group(1)) if m else None
    c.expect(rel, "processes per node", per_node, gpn)
    if per_node is not None:
        c.expect(rel, "launcher world (nodes x processes per node)", int(d.get("--nodes", 0)) * per_node,
                 cl.num_gpus)
    one_task_per_gpu = "megatron" in rel or (rel == "train.sbatch" and "pretrain_gpt.py" in text)
    c.expect(rel, "--ntasks-per-node", int(d.get("--ntasks-per-node", 0)), gpn if one_task_per_gpu else 1)


def check_artifacts(c: Any, files: dict[str, str]) -> None:
    """Every sbatch script launches the plan's world (compiler.render.invariants)."""
    for rel, text in files.items():
        if rel.endswith(".sbatch"):
            _check_sbatch(c, rel, text)
