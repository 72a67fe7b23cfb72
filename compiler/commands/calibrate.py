"""`dtc calibrate RUNS... -o profiles/NAME.yaml`: fit a cluster profile on measured runs.

RUNS: calibration CSVs, LOG:PLAN pairs, folders holding a plan.json and its logs, `dtc smoke
--json` reports (compiler/calibration/measured.py). `--sweep DIR` ingests a finished `dtc sweep`
array instead (compiler/sweep.py). Exit 0 when the profile was written, 2 for bad input.
"""
from __future__ import annotations

from pathlib import Path

import click

from compiler.errors import Diagnostic, DtcError


def _date(value: str | None) -> str | None:
    import datetime

    if value is None:
        return None
    try:
        return datetime.date.fromisoformat(value).isoformat()
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a date (YYYY-MM-DD)") from None


@click.command("calibrate")
@click.argument("runs", nargs=-1, type=str)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the profile YAML (profiles/NAME.yaml); with --sweep: DIR/profile.yaml.")
@click.option("--name", default=None, help="The profile's name (default: the output file's stem).")
@click.option("--date", default=None, help="The date the runs were measured (YYYY-MM-DD), when their logs carry "
                                           "none; never the clock, so the output is reproducible.")
@click.option("--sweep", "sweep_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Ingest a finished `dtc sweep` folder: refit on its runs, re-solve, and write its PLAN.md "
                   "section of measured vs predicted.")
def calibrate_command(runs: tuple[str, ...], output: Path | None, name: str | None, date: str | None,
                      sweep_dir: Path | None) -> None:
    """Fit a cluster profile (the cost model's fitted constants for one cluster) on measured runs.

    RUNS are calibration CSVs, LOG:PLAN pairs (a Megatron-LM, DeepSpeed, torchtitan or dtc trainer log
    and the plan.json it ran), folders holding a plan.json and its *.log files, or `dtc smoke --json`
    reports. Each constant stays in its physical range and is shrunk towards the global fit when the
    runs say little about it; the profile reports its own leave-one-out error. Exit 0 when written, 2
    for bad input.
    """
    from compiler.calibration.profile_fit import calibrate_runs

    given_date = _date(date)
    if sweep_dir is not None:
        from compiler.sweep import ingest_sweep

        click.echo(ingest_sweep(sweep_dir, extra_runs=runs, output=output, date=given_date, name=name))
        return
    if not runs:
        raise DtcError(Diagnostic(summary="no runs given", hint="dtc calibrate RUNS... -o profiles/NAME.yaml "
                                                              "(or --sweep DIR)"))
    if output is None:
        raise DtcError(Diagnostic(summary="no output given", hint="add -o profiles/NAME.yaml"))
    click.echo(calibrate_runs(runs, output, name=name, date=given_date))
