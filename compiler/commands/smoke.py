"""`dtc smoke GENERATED_DIR`: run the generated configs for real at reduced scale.

Exit 0 when every requested target passed (with --target all: none failed and at least one
passed; a target this machine cannot run, such as Megatron-LM without GPUs, is reported as
skipped); 1 when a target failed (a failing rank, a hang or a timeout, the loss not falling);
2 for a folder or config dtc refuses before launching anything.
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from compiler.errors import ExitCode
from compiler.targets import registry

SMOKE_TARGETS = [t.name for t in registry.targets() if t.smoke is not None]


def _targets(value: str) -> str:
    names = [n.strip() for n in value.split(",") if n.strip()]
    bad = [n for n in names if n not in (*SMOKE_TARGETS, "all")] or (["all"] if "all" in names and len(names) > 1
                                                                    else [])
    if not names or bad:
        raise click.BadParameter(f"{value!r}: give one of {', '.join([*SMOKE_TARGETS, 'all'])}, or a comma-separated "
                                 "list of targets")
    return ",".join(names)


@click.command("smoke")
@click.argument("generated_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--target", "target", default="all", show_default=True, metavar="|".join([*SMOKE_TARGETS, "all"]),
              callback=lambda ctx, param, value: _targets(value),
              help="Which generated frameworks to run, comma-separated (all: every one the folder holds).")
@click.option("--steps", type=click.IntRange(2, 1000), default=4, show_default=True,
              help="Optimizer steps per target (the loss must fall between the first and the last).")
@click.option("--slurm", is_flag=True, help="Submit the generated sbatch script (rewritten for one local node) "
                                            "to the SLURM cluster on PATH and wait for it.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--preempt-at", "preempt_at", type=click.IntRange(1, 999), default=None,
              help="Also stop each torch target with SIGUSR1 during this step, relaunch it and check that it "
                   "resumes from the checkpoint with the uninterrupted run's losses.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(10, 86400), default=600, show_default=True,
              help="Seconds per target before every process of the launch is ended.")
@click.option("--allow-edited", is_flag=True,
              help="Run a folder edited after dtc wrote it (refused otherwise); every edit is a warning in the report.")
def smoke_command(generated_dir: Path, target: str, steps: int, slurm: bool, as_json: bool, timeout_s: float,
                  allow_edited: bool, preempt_at: int | None) -> None:
    """Run GENERATED_DIR's training scripts for real on a scaled-down world.

    Same ZeRO stage / sharding, precision, recompute, micro-batch and accumulation as the plan; a
    few layers, a narrow model, 2-4 ranks (CPU: gloo; GPUs: NCCL), a learnable synthetic task.
    Reports per target the loss first -> last, step time, memory per rank measured against the
    cost model's prediction for the same reduced model and world, and writes smoke.json into
    GENERATED_DIR. Exit 0 all passed; 1 a target failed; 2 the folder cannot be run.
    """
    from compiler.smoke import run_smoke
    from compiler.smoke.report import format_report

    def progress(line: str) -> None:
        if not as_json:
            click.echo(line, err=True)

    report = run_smoke(generated_dir, target=target, steps=steps, slurm=slurm, timeout_s=timeout_s,
                       on_line=progress, allow_edited=allow_edited, preempt_at=preempt_at)
    if as_json:
        click.echo(report.to_json(), nl=False)
    else:
        click.echo(format_report(report), nl=False)
    sys.exit(int(ExitCode.OK) if report.ok else int(ExitCode.DIFFERENCES))
