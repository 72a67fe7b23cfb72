"""Measured runs of one cluster as cost-model inputs: what ``dtc calibrate RUNS...`` reads.

    load_measured(args) -> Measured (runs, the input files with their sha256, the date the runs give)

Each argument is one of:

* ``FILE.csv``: rows with the calibration set's columns (benchmarks/data/published_runs_dev.csv;
  compiler/calibration/runs.py reads them);
* ``LOG:PLAN``: a training log (compiler/calibration/logs.py: Megatron-LM, DeepSpeed, torchtitan,
  dtc's trainers) and the plan.json of the layout it ran;
* ``DIR``: a folder holding one ``plan.json`` and its logs (``*.log``, ``*.out``; one run each);
* ``FILE.json``: a ``dtc smoke --json`` report (each target that passed and timed its steps).

A log's run is the plan's problem (compiler.recost.problem_of_plan) and layout, costed for the
framework that wrote the log; its measured throughput is the plan's tokens per step over the
median steady step time (the warm-up step left out), per GPU of the layout.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from compiler.calibration.logs import TARGET_OF_FORMAT, LogSteps, parse_log
from compiler.calibration.runs import CSV_COLUMNS, NotACalibrationCsv, PublishedRun, Skip, parse_row, \
    read_checked_rows, regime_features, resolve
from compiler.errors import Diagnostic, DtcError, Location

LOG_SUFFIXES = (".log", ".out", ".txt")


@dataclass(frozen=True)
class InputFile:
    path: str
    kind: str  # csv, log, plan, smoke
    sha256: str


@dataclass
class Measured:
    runs: list[PublishedRun] = field(default_factory=list)
    inputs: list[InputFile] = field(default_factory=list)
    dates: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    devices: set[str] = field(default_factory=set)  # "cpu" when a run was measured on CPU (tests)

    @property
    def date(self) -> str | None:
        return max(self.dates) if self.dates else None


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise DtcError(Diagnostic(summary=f"cannot read the {what} {path}: {exc.strerror}",
                                  location=Location(str(path)),
                                  hint="check the path")) from None


def _load_plan(path: Path):
    from compiler.plan import Plan

    try:
        return Plan.from_json(_read(path, "plan"))
    except ValueError as exc:
        raise DtcError(Diagnostic(summary=f"not a dtc plan: {exc}", location=Location(str(path)),
                                  hint="pair each log with the plan.json of the layout it ran (LOG:PLAN)")) from None


def _cost_profile(fmt: str):
    from compiler.calibration.frameworks import published_profile
    from compiler.costmodel.frameworks import profile_of

    name = TARGET_OF_FORMAT[fmt]
    return published_profile(name) if name == "torchtitan" else profile_of(name)


def run_of_log(log: LogSteps, plan, plan_path: str, *, device: str = "gpu") -> PublishedRun:
    """The run a log measured, on the plan's problem and layout."""
    from compiler.recost import problem_of_plan

    problem = problem_of_plan(plan)
    lay = plan.layout
    tokens_per_step = problem.global_batch * problem.seq_len
    if log.format == "megatron":
        for s in log.steps:
            if s.global_batch is not None and s.global_batch != problem.global_batch:
                raise DtcError(Diagnostic(
                    summary=f"the log's global batch size {s.global_batch} is not the plan's {problem.global_batch}",
                    location=Location(log.path, s.line),
                    hint=f"this log did not run {plan_path}: pair it with the plan it ran"))
    if log.unit == "s/step":
        step_s = log.steady_value
    elif log.unit == "samples/s":
        step_s = problem.global_batch / log.steady_value
    else:  # tokens/s per GPU
        step_s = tokens_per_step / (log.steady_value * lay.world_size)
    measured = tokens_per_step / step_s / lay.world_size
    framework = _cost_profile(log.format)
    gpu = problem.gpu_options[0]
    run = PublishedRun(row_id=f"{log.path}:{log.timed[0].line}", source_id=f"{log.format}-log", model=plan.name,
                       framework=framework, gpu=gpu, problem=problem, layout=lay,
                       measured_tokens_per_s_per_gpu=measured,
                       measured_from=f"{log.format} log: median of {len(log.timed)} timed steps ({log.unit})",
                       convention_flops_per_token=None, recompute_given=True)
    return replace(run, features=dict(regime_features(run), device=device))


def _pair(arg: str) -> tuple[Path, Path] | None:
    """LOG:PLAN (the last ':' splits; a path with ':' in it is given as a folder instead)."""
    if ":" not in arg:
        return None
    log, plan = arg.rsplit(":", 1)
    return (Path(log), Path(plan)) if log and plan else None


def _add_log(out: Measured, log_path: Path, plan_path: Path, *, device: str = "gpu") -> None:
    plan = _load_plan(plan_path)
    log = parse_log(_read(log_path, "log"), str(log_path))
    out.runs.append(run_of_log(log, plan, str(plan_path), device=device))
    out.inputs += [InputFile(str(log_path), "log", _sha(log_path)), InputFile(str(plan_path), "plan", _sha(plan_path))]
    if log.date:
        out.dates.append(log.date)
    if device == "cpu":
        out.devices.add("cpu")


def _add_csv(out: Measured, path: Path) -> None:
    def not_calibration(what: str) -> DtcError:
        return DtcError(Diagnostic(summary=f"not a calibration CSV: {what}", location=Location(str(path), 1, 1),
                                   hint=f"use the columns of benchmarks/data/published_runs_dev.csv ({len(CSV_COLUMNS)} "
                                        "columns, see benchmarks/data/CALIBRATION_README.md)"))

    try:
        rows = read_checked_rows(path)
    except NotACalibrationCsv as exc:
        raise not_calibration("missing columns " + ", ".join(exc.missing)) from None
    if not rows:
        raise not_calibration("no rows")
    for i, row in enumerate(rows):
        try:
            out.runs.append(resolve(parse_row(row)))
        except Skip as exc:
            out.skipped[str(exc)] = out.skipped.get(str(exc), 0) + 1
        except (ValueError, KeyError, TypeError, ZeroDivisionError) as exc:
            # csv.DictReader rows: the header is line 1 (a quoted cell with a line break shifts this)
            raise DtcError(Diagnostic(summary=f"cannot read row {row.get('row_id') or i + 1} of the calibration CSV: "
                                              f"{type(exc).__name__}: {exc}",
                                      location=Location(str(path), i + 2),
                                      hint="check the row against benchmarks/data/CALIBRATION_README.md")) from None
    out.inputs.append(InputFile(str(path), "csv", _sha(path)))


def _setup_of(data: dict[str, Any], plan_name: str):
    """A SmokeSetup from its to_dict() (a smoke report's or a --local-cpu sweep's)."""
    from compiler.layout import Layout
    from compiler.model import ModelShape
    from compiler.smoke.scale import SmokeDegrees, SmokeSetup

    layout = Layout.from_dict(data["layout"])
    return SmokeSetup(plan_name=plan_name, device=data["device"], backend=data["backend"],
                      world_size=int(data["world_size"]), degrees=SmokeDegrees(**data["degrees"]), layout=layout,
                      shape=ModelShape.from_dict(data["shape"]), seq_len=int(data["seq_len"]),
                      precision=data["precision"], plan_precision=data["plan_precision"], optimizer="adamw",
                      learning_rate=3e-4, seed=0, steps=int(data["steps"]), gpu=layout.gpu)


def _run_of_setup(setup, target: str, step_s: float, row_id: str, how: str) -> PublishedRun:
    """The reduced run a smoke (or a --local-cpu sweep) timed, costed as dtc smoke costs it (the reduced model on
    the plan's GPU type: compiler/smoke/predict.py reduced_spec)."""
    from compiler.costmodel.frameworks import profile_of
    from compiler.problem import problem_from_data
    from compiler.smoke.predict import reduced_spec

    problem = problem_from_data(reduced_spec(setup, setup.shape, target), path=f"<smoke {setup.plan_name}>")
    measured = setup.global_batch * setup.seq_len / step_s / setup.world_size
    run = PublishedRun(row_id=row_id, source_id="smoke" if how.startswith("dtc smoke") else "sweep",
                       model=setup.plan_name, framework=profile_of(target), gpu=problem.gpu_options[0],
                       problem=problem, layout=setup.layout, measured_tokens_per_s_per_gpu=measured,
                       measured_from=how, convention_flops_per_token=None, recompute_given=True)
    return replace(run, features=dict(regime_features(run), device=setup.device))


def run_of_setup(setup_data: dict[str, Any], plan_name: str, target: str, log: LogSteps, *,
                 row_id: str) -> PublishedRun:
    """A --local-cpu sweep task: its log (dtc's trainers, or Megatron-LM's) on the scaled setup it ran."""
    if log.unit != "s/step" or TARGET_OF_FORMAT[log.format] != target:
        raise DtcError(Diagnostic(summary=f"the sweep ran {target}, but this is a {log.format} log",
                                  location=Location(log.path), hint="rerun the sweep"))
    return _run_of_setup(_setup_of(setup_data, plan_name), target, log.steady_value, row_id,
                         f"dtc sweep --local-cpu {target}: median of {len(log.timed)} timed steps")


def _add_smoke(out: Measured, path: Path, data: dict[str, Any]) -> None:
    where = Location(str(path))
    try:
        setup = _setup_of(data["setup"], str(data["plan"]))
        targets = list(data["targets"])
    except (KeyError, TypeError, ValueError, AssertionError) as exc:
        raise DtcError(Diagnostic(summary=f"not a `dtc smoke --json` report ({type(exc).__name__}: {exc})",
                                  location=where, hint="write it with: dtc smoke DIR --json > report.json")) from None
    used = 0
    for t in targets:
        if t.get("status") != "passed" or not t.get("step_time_s"):
            continue
        out.runs.append(_run_of_setup(setup, t["target"], float(t["step_time_s"]), f"{path}:{t['target']}",
                                      f"dtc smoke {t['target']}: mean step after the first"))
        used += 1
        if setup.device == "cpu":
            out.devices.add("cpu")
    if not used:
        raise DtcError(Diagnostic(summary="the smoke report has no target that passed with a timed step",
                                  location=where, hint="calibrate from a smoke run that passed"))
    out.inputs.append(InputFile(str(path), "smoke", _sha(path)))


def logs_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in LOG_SUFFIXES)


def load_measured(args: Sequence[str]) -> Measured:
    out = Measured()
    for arg in args:
        path = Path(arg)
        pair = None if path.exists() else _pair(arg)
        if pair is not None:
            for p in pair:
                if not p.is_file():
                    raise DtcError(Diagnostic(summary=f"no such file: {p}", location=Location(arg),
                                              hint="give LOG:PLAN, a folder with plan.json and its logs, a CSV or "
                                                   "a dtc smoke --json report"))
            _add_log(out, *pair)
        elif path.is_dir():
            plan = path / "plan.json"
            logs = logs_in(path)
            if not plan.is_file() or not logs:
                raise DtcError(Diagnostic(
                    summary=f"the folder {arg} must hold a plan.json and its logs (*.log, *.out, *.txt)",
                    location=Location(arg), hint="or pair them explicitly: LOG:PLAN"))
            for log in logs:
                _add_log(out, log, plan)
        elif path.is_file() and path.suffix == ".csv":
            _add_csv(out, path)
        elif path.is_file() and path.suffix == ".json":
            try:
                data = json.loads(_read(path, "report"))
            except ValueError as exc:
                raise DtcError(Diagnostic(summary=f"not JSON: {exc}", location=Location(arg),
                                          hint="give a `dtc smoke --json` report")) from None
            if not isinstance(data, dict) or "targets" not in data or "setup" not in data:
                raise DtcError(Diagnostic(summary="not a `dtc smoke --json` report (no setup and targets)",
                                          location=Location(arg),
                                          hint="a plan.json goes with its log: LOG:PLAN"))
            _add_smoke(out, path, data)
        elif path.is_file():
            raise DtcError(Diagnostic(summary="a log needs the plan.json it ran", location=Location(arg),
                                      hint=f"give {arg}:PATH/plan.json, or a folder holding both"))
        else:
            raise DtcError(Diagnostic(summary=f"no such file or folder: {arg}", location=Location(arg),
                                      hint="give a CSV, LOG:PLAN, a folder with plan.json and logs, or a smoke report"))
    bad = [r for r in out.runs
           if not (r.measured_tokens_per_s_per_gpu > 0 and math.isfinite(r.measured_tokens_per_s_per_gpu))]
    if bad:
        raise DtcError(Diagnostic(summary=f"run {bad[0].row_id} has no positive throughput", hint="check its input"))
    return out
