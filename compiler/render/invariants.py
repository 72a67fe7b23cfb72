"""Cross-artifact invariants, checked on every compile (STYLE.md 10.4).

All artifacts come from one Plan, so they must agree: the launcher's world equals
tp x pp x cp x dp; every framework trains the plan's global batch with the same
micro-batch and accumulation; the ZeRO stage and the FSDP strategy agree. A
disagreement is a dtc bug, reported as an internal error before anything is written.
"""
from __future__ import annotations

import ast
import json
import re
import shlex

from compiler.errors import Diagnostic, RenderError
from compiler.plan import Plan


class _Checker:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.problems: list[str] = []

    def expect(self, where: str, what: str, got: object, want: object) -> None:
        if got != want:
            self.problems.append(f"{where}: {what} is {got!r}, the plan says {want!r}")


def invariant_problems(plan: Plan, files: dict[str, str]) -> list[str]:
    """Every disagreement between the artifacts and the plan, one line each. Also the check `dtc smoke`
    runs on a folder from disk (issue #16), so an artifact that does not parse is a problem, not a crash."""
    c = _Checker(plan)
    lay = plan.layout
    c.expect("plan", "tp x pp x cp x dp", lay.world_size, plan.cluster["num_gpus"])
    c.expect("plan", "micro x accumulation x dp", lay.global_batch, plan.training["global_batch"])
    checks = [("ds_config.json", lambda text: _check_deepspeed(c, json.loads(text))),
              ("fsdp_config.py", lambda text: _check_fsdp(c, text)),
              ("megatron_args.sh", lambda text: _check_megatron(c, text))]
    checks += [(rel, lambda text, rel=rel: _check_sbatch(c, rel, text)) for rel in files if rel.endswith(".sbatch")]
    for rel, check in checks:
        if rel in files:
            try:
                check(files[rel])
            except (ValueError, TypeError, AttributeError, SyntaxError, RecursionError) as exc:
                c.problems.append(f"{rel}: cannot read it ({type(exc).__name__}: {exc})")
    return c.problems


def check_invariants(plan: Plan, files: dict[str, str]) -> None:
    """Raise RenderError (a bug) listing every disagreement between the artifacts and the plan."""
    problems = invariant_problems(plan, files)
    if problems:
        raise RenderError(Diagnostic(
            summary=f"the generated artifacts for {plan.name} disagree with the plan (a dtc bug)",
            detail="\n".join(problems), hint="please report this with the spec"))


def _check_deepspeed(c: _Checker, cfg: dict) -> None:
    lay = c.plan.layout
    c.expect("ds_config.json", "train_micro_batch_size_per_gpu", cfg.get("train_micro_batch_size_per_gpu"),
             lay.micro_batch)
    c.expect("ds_config.json", "gradient_accumulation_steps", cfg.get("gradient_accumulation_steps"), lay.grad_accum)
    # DeepSpeed's identity: train_batch_size = micro x accumulation x the world it divides by
    # (dp, or dp x tp under AutoTP, which counts every TP rank; see render/deepspeed.py).
    ranks = lay.dp * (lay.tp if lay.tp > 1 else 1)
    c.expect("ds_config.json", "train_batch_size", cfg.get("train_batch_size"),
             lay.micro_batch * lay.grad_accum * ranks)
    c.expect("ds_config.json", "zero_optimization.stage", cfg.get("zero_optimization", {}).get("stage"),
             lay.zero_stage)
    if lay.pp > 1:
        c.expect("ds_config.json", "pipeline.stages", cfg.get("pipeline", {}).get("stages"), lay.pp)
    if lay.tp > 1:
        c.expect("ds_config.json", "tensor_parallel.autotp_size", cfg.get("tensor_parallel", {}).get("autotp_size"),
                 lay.tp)


def _module_constants(text: str) -> dict[str, object]:
    values: dict[str, object] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return values


def _check_fsdp(c: _Checker, text: str) -> None:
    lay = c.plan.layout
    k = _module_constants(text)
    for name, want in (("TP", lay.tp), ("PP", lay.pp), ("CP", lay.cp), ("DP_REPLICATE", lay.dp_replicate),
                       ("DP_SHARD", lay.dp_shard), ("WORLD_SIZE", lay.world_size), ("ZERO_STAGE", lay.zero_stage),
                       ("MICRO_BATCH", lay.micro_batch), ("GRAD_ACCUM", lay.grad_accum),
                       ("GLOBAL_BATCH", c.plan.training["global_batch"])):
        c.expect("fsdp_config.py", name, k.get(name), want)
    mesh = 1
    for name in ("TP", "PP", "CP", "DP_REPLICATE", "DP_SHARD"):
        mesh *= int(k.get(name, 1))  # type: ignore[arg-type]
    c.expect("fsdp_config.py", "the mesh size", mesh, lay.world_size)
    if lay.zero_stage in (2, 3):
        c.expect("fsdp_config.py", "RESHARD_AFTER_FORWARD", k.get("RESHARD_AFTER_FORWARD"), lay.zero_stage == 3)


_ARRAY = re.compile(r"^MEGATRON_ARGS=\($(.*?)^\)$", re.S | re.M)


def megatron_flags(text: str) -> dict[str, str | bool]:
    """--flag value pairs and boolean flags of the MEGATRON_ARGS array (comments stripped)."""
    m = _ARRAY.search(text)
    tokens = shlex.split(m.group(1), comments=True) if m else []
    flags: dict[str, str | bool] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("--"):
            if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                flags[tok] = tokens[i + 1]
                i += 2
                continue
            flags[tok] = True
        i += 1
    return flags


def _check_megatron(c: _Checker, text: str) -> None:
    lay = c.plan.layout
    f = megatron_flags(text)
    as_int = lambda key, default: int(f.get(key, default))  # noqa: E731
    c.expect("megatron_args.sh", "--tensor-model-parallel-size", as_int("--tensor-model-parallel-size", 1), lay.tp)
    c.expect("megatron_args.sh", "--pipeline-model-parallel-size", as_int("--pipeline-model-parallel-size", 1), lay.pp)
    c.expect("megatron_args.sh", "--context-parallel-size", as_int("--context-parallel-size", 1), lay.cp)
    c.expect("megatron_args.sh", "--expert-model-parallel-size", as_int("--expert-model-parallel-size", 1), lay.ep)
    c.expect("megatron_args.sh", "--micro-batch-size", as_int("--micro-batch-size", 0), lay.micro_batch)
    c.expect("megatron_args.sh", "--global-batch-size", as_int("--global-batch-size", 0),
             c.plan.training["global_batch"])
    c.expect("megatron_args.sh", "--seq-length", as_int("--seq-length", 0), c.plan.training["seq_len"])
    c.expect("megatron_args.sh", "--use-distributed-optimizer", bool(f.get("--use-distributed-optimizer")),
             lay.zero_stage == 1)
    c.expect("megatron_args.sh", "--sequence-parallel", bool(f.get("--sequence-parallel")), lay.sequence_parallel)


def _sbatch_directives(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line[len("#SBATCH "):].partition("=")
            out[key.strip()] = value.strip()
    return out


def _check_sbatch(c: _Checker, rel: str, text: str) -> None:
    d = _sbatch_directives(text)
    cl = c.plan.cluster
    c.expect(rel, "--nodes", int(d.get("--nodes", 0)), cl["num_nodes"])
    gpn = min(int(cl["gpus_per_node"]), int(cl["num_gpus"]))
    if "--gpus-per-node" in d:
        c.expect(rel, "--gpus-per-node", int(d["--gpus-per-node"]), gpn)
    m = re.search(r'NPROC_PER_NODE="\$\{DTC_NPROC_PER_NODE:-(\d+)\}"', text)
    per_node = int(m.group(1)) if m else None
    c.expect(rel, "processes per node", per_node, gpn)
    if per_node is not None:
        c.expect(rel, "launcher world (nodes x processes per node)", int(d.get("--nodes", 0)) * per_node,
                 cl["num_gpus"])
    one_task_per_gpu = "megatron" in rel or (rel == "train.sbatch" and "pretrain_gpt.py" in text)
    c.expect(rel, "--ntasks-per-node", int(d.get("--ntasks-per-node", 0)), gpn if one_task_per_gpu else 1)
