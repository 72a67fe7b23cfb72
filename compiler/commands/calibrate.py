"""`dtc calibrate RUNS... -o profiles/NAME.yaml`: fit a cluster profile on measured runs.

RUNS: calibration CSVs, LOG:PLAN pairs, folders holding a plan.json and its logs, `dtc smoke
--json` reports (compiler/calibration/measured.py). `--sweep DIR` ingests a finished `dtc sweep`
array instead (compiler/sweep.py). Exit 0 when the profile was written, 2 for bad input.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import click

from compiler.errors import Diagnostic, DtcError, Location


def write_text_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _date(value: str | None) -> str | None:
    import datetime

    if value is None:
        return None
    try:
        return datetime.date.fromisoformat(value).isoformat()
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a date (YYYY-MM-DD)") from None


def format_profile(profile, output: str) -> str:
    lines = [f"cluster profile {profile.name!r} on {len(profile.runs)} runs ({', '.join(profile.gpus)}), "
             f"date {profile.date or 'not given'}; the global fit weighs as much as {profile.prior_runs:g} runs"]
    for name, c in profile.constants.items():
        mark = "identified" if c.identified else "kept near the global fit"
        lines.append(f"  {name:<30} {c.value:<10.4g} (global {c.global_value:.4g}; data weight {c.data_weight:.2f}, "
                     f"{mark})")
    for which, label in (("before", "global constants"), ("after", "this profile"),
                         ("loo", "leave-one-out")):
        s = profile.summary(which)
        lines.append(f"  median |error| {s['median_abs_error']:.1%}, p90 {s['p90_abs_error']:.1%}  ({label})")
    from compiler.costmodel.bands import PROFILE_MIN_RUNS, profile_band

    band = profile_band(profile.ref(output, ""))
    if band is not None:
        lines.append(f"  80% band of every estimate a spec costs with it: x{band.low:.3f}-x{band.high:.3f} the predicted "
                     f"step time (its {band.runs} leave-one-out errors)")
    else:
        lines.append(f"  {len(profile.runs)} runs, fewer than {PROFILE_MIN_RUNS}: specs using it keep the published "
                     f"runs' 80% bands")
    lines.extend(f"  note: {n}" for n in profile.notes)
    lines.append(f"Calibrate: wrote {output}.")
    return "\n".join(lines)


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
    from compiler.calibration.measured import load_measured
    from compiler.calibration.profile import fit_profile
    from compiler.costmodel.efficiency import load_efficiency

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
    measured = load_measured(runs)
    notes = []
    if "cpu" in measured.devices:
        notes.append("some runs were measured on CPU (a test of the machinery): the cost model predicts GPUs, so "
                     "these constants describe no real cluster")
    if measured.skipped:
        notes.append("skipped rows: " + ", ".join(f"{v} {k}" for k, v in sorted(measured.skipped.items())))
    profile = fit_profile(measured.runs, name=name or output.stem, base=load_efficiency(),
                          date=given_date or measured.date,
                          inputs=[{"path": i.path, "kind": i.kind, "sha256": i.sha256} for i in measured.inputs],
                          notes=notes)
    try:
        write_text_atomically(output, profile.to_yaml())
    except OSError as exc:
        raise DtcError(Diagnostic(summary=f"cannot write {output}: {exc.strerror}", location=Location(str(output)),
                                  hint="choose a writable path")) from None
    click.echo(format_profile(profile, str(output)))
