"""`dtc sweep SPEC --top N -o DIR`: the N most promising candidates as one SLURM job array of short benchmarks.

Exit 0 when the folder was written (and, with --submit, the array submitted), 2 for bad input. Ingest the
finished array with `dtc calibrate --sweep DIR`.
"""
from __future__ import annotations

from pathlib import Path

import click


@click.command("sweep")
@click.argument("spec", type=click.Path(dir_okay=False, path_type=str))
@click.option("--top", type=click.IntRange(1, 32), default=4, show_default=True,
              help="How many candidates: the pick, one of each other layout family, then the closest to the pick.")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The sweep folder (candidates/, sweep.sbatch, sweep.json; logs/ once it ran).")
@click.option("--steps", type=click.IntRange(2, 1000), default=5, show_default=True,
              help="Timed steps per candidate (after one warm-up step).")
@click.option("--local-cpu", is_flag=True, help="Scale each candidate down to this machine's CPUs as dtc smoke "
                                                "does (tests the machinery on a local SLURM node; no GPU figures).")
@click.option("--submit", is_flag=True, help="Submit the job array with sbatch now.")
def sweep_command(spec: str, top: int, output: Path, steps: int, local_cpu: bool, submit: bool) -> None:
    """Render the TOP most promising candidates of SPEC as one SLURM job array of short benchmark runs.

    Each candidate is compiled into DIR/candidates/NN and runs through its target's generated
    launcher: a warm-up step, then --steps timed steps on synthetic data, no checkpoints; its log
    goes to DIR/logs/NN.log. `dtc calibrate --sweep DIR` fits a profile on them and re-solves.
    """
    from compiler.sweep import ARRAY_SCRIPT, render_sweep, submit_sweep

    manifest = render_sweep(spec, output, top=top, steps=steps, local_cpu=local_cpu)
    for c in manifest["candidates"]:
        click.echo(f"  {c['id']}  {c['layout']}  predicted step {c['predicted_step_time_s']:.4g} s  ({c['why']})")
    line = f"Sweep: {len(manifest['candidates'])} candidates in {output}; "
    if submit:
        job = submit_sweep(output)
        click.echo(line + f"submitted job array {job}; then: dtc calibrate --sweep {output}")
    else:
        click.echo(line + f"submit with: (cd {output} && sbatch {ARRAY_SCRIPT}); then: dtc calibrate --sweep {output}")
