"""What a target is: one object per folder under compiler/targets/, registered in registry.py.

A ``Target`` carries everything dtc knows about one output framework: its name in specs, its
display name, the versions its artifacts are written for, its support rules (what layouts it
can run, judged by compiler.rules under the code ``framework_unsupported``), its notes for
PLAN.md, its renderer and templates, the invariants its files must keep with the plan, the
real-consumer validator the tests run on its files, how SLURM launches it, its smoke
runner, and its cost profile (what the cost model must know about how its artifacts run a
layout: gradient dtypes, overlaps, kernels, activation profile, fp8 recipe). Heavy pieces (renderers, smoke runners, validators) are named by ``module:function``
strings and imported only when used, so that reading the registry costs nothing.

Adding a target: docs/adding-a-target.md.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeGuard

if TYPE_CHECKING:
    from compiler.layout import Layout
    from compiler.rules import Knobs
    from compiler.targets.cost import CostProfile

SupportRule = Callable[["Knobs", str], "tuple[str, str] | None"]  # (knobs, precision) -> (field, reason) | None

# The training precisions whose GEMMs run quantised (FP8, NVFP4): in dtc's stacks only NVIDIA Transformer Engine runs
# them (Megatron's --fp8-format / --fp4-format); the DeepSpeed engine config and dtc's reference trainers have no path
TE_PRECISIONS = ("fp8", "nvfp4")


def gt1(value: int | None) -> TypeGuard[int]:
    """A degree that is known and more than 1 (support rules say nothing about unknown knobs)."""
    return value is not None and value > 1


def expert_tp_differs(knobs: Any) -> bool:
    """An expert tensor-parallel degree known and other than the known tp (Megatron's --expert-tensor-parallel-size;
    the torch targets split experts as every other matrix, by tp)."""
    return knobs.etp is not None and knobs.tp is not None and knobs.etp != knobs.tp


def load(ref: str) -> Any:
    """The object a 'package.module:name' string names."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class SlurmLaunch:
    """How the slurm target launches a framework target: one sbatch script per framework."""

    script: str  # e.g. "train_fsdp.sbatch"
    template: str  # e.g. "slurm/torchrun.sbatch.j2"
    launcher: str  # "torchrun" (one task per node) or "srun" (one task per GPU)
    framework: str  # how the script names it, e.g. "FSDP2"
    needs: tuple[str, ...]  # the files the script runs, next to it
    # slurm.launcher values that pick this target for train.sbatch, with a rank (lower first)
    launchers: Mapping[str, int] = field(default_factory=dict)
    program_default: str | None = None  # the generated entry point (torchrun launches)
    config_flag: tuple[str | None, str | None] = (None, None)  # (for the generated entry, for slurm.train_script)
    context: str | None = None  # 'module:function(plan, check) -> dict' adding what the script needs
    # the environment variable through which the script runs a short benchmark itself (iteration count;
    # synthetic data, no checkpoints), for `dtc sweep`; None: the launched entry reads dtc's smoke options
    bench_steps_env: str | None = None


@dataclass(frozen=True)
class SmokeHooks:
    """How `dtc smoke` runs a target at reduced scale (compiler/smoke)."""

    runner: str  # 'module:function(ctx) -> TargetResult'
    entry: str | None = None  # the generated script torchrun starts (the shared torchrun runner)
    summary_key: str | None = None  # the key of the JSON summary line the entry prints
    options: str | None = None  # 'module:function(setup) -> {option: value | None}' (the entry's options)
    skip: str | None = None  # 'module:function(plan, gpu_count) -> reason | None' (what this machine lacks)
    preflight: str | None = None  # 'module:function(folder, plan)': raise SmokeError on files that contradict the plan
    rope_only: bool = False  # its built-in reference model has RoPE positions only
    jit_extensions: bool = False  # it may JIT-build torch extensions (a private TORCH_EXTENSIONS_DIR, stale locks)
    notes: str | None = None  # 'module:function(setup, summary) -> [str]': its remarks on a smoke run
    # the runner does everything itself (locally and with --slurm), called as runner(ctx, target, slurm=...):
    # the shared torchrun/sbatch runners, memory prediction and judging are not used
    complete: bool = False


@dataclass(frozen=True)
class Target:
    name: str  # as written in a spec's targets
    display_name: str  # in messages: "DeepSpeed: ..."
    versions: Mapping[str, str]  # the releases its artifacts are written for (plan.json provenance)
    files: tuple[str, ...] = ()  # the files it renders (a generated folder holds the target iff it has them)
    support: tuple[SupportRule, ...] = ()  # what it can run (compiler.rules: framework_unsupported)
    # 'module:function(shape, hyperparameters | None) -> reason | None': a model it cannot build (None: any)
    model_support: str | None = None
    # 'module:function(shape, knobs) -> (field, reason) | None': a layout it cannot run for this model (knobs as the
    # support rules take them); None: the support rules say it all
    layout_model_support: str | None = None
    notes: Callable[["Layout"], tuple[str, ...]] | None = None  # how it runs a layout (PLAN.md)
    renderer: str | None = None  # 'module:function(plan) -> {path: text}'
    templates: str | None = None  # its Jinja templates, a folder of the target's package, named "<name>/..."
    check_artifacts: str | None = None  # 'module:function(checker, files)': its files agree with the plan
    validator: str | None = None  # 'module:function(folder, plan) -> [error]': the real consumer (tests)
    slurm: SlurmLaunch | None = None  # how the slurm target launches it (a framework target)
    smoke: SmokeHooks | None = None
    launches_others: bool = False  # it launches framework targets (slurm): a spec must also name one
    # how it runs a layout, as the cost model needs it (compiler/targets/cost.py); None: not a framework (slurm)
    cost: "CostProfile | None" = None

    def reason(self, knobs: "Knobs", precision: str, shape: Any = None) -> tuple[str, str] | None:
        """(field, why) this target cannot run ``knobs`` (all failing rules joined; with ``shape``, the model's
        layout_model_support too), or None (so far)."""
        hits = [r for r in (rule(knobs, precision) for rule in self.support) if r]
        if shape is not None and self.layout_model_support:
            hit = load(self.layout_model_support)(shape, knobs)
            if hit:
                hits.append(hit)
        if not hits:
            return None
        return hits[0][0], "; ".join(reason for _, reason in hits)

    def render(self, plan: Any) -> dict[str, str]:
        return load(self.renderer)(plan) if self.renderer else {}
