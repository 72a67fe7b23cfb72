"""Per-step times from training logs, in the exact formats the frameworks print.

    parse_log(text, path) -> LogSteps   (DtcError with path:line when no format matches)

Each parser reads one framework's per-iteration line, as its source prints it:

* Megatron-LM / megatron-core 0.19 (megatron/training/training.py ``training_log``, printed by
  ``print_rank_last``)::

     [2026-12-01 15:20:36.123456] iteration       10/     100 | consumed samples:  160 |
     elapsed time per iteration (ms): 1234.5 | ... | global batch size:    16 | lm loss: ... |

  The elapsed time is the mean over the iterations since the previous line (``log_interval``).
* DeepSpeed 0.19 (deepspeed/utils/timer.py ``ThroughputTimer.stop``, through DeepSpeed's logger
  ``[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s``)::

     [2026-12-01 15:20:36,123] [INFO] [timer.py:264:stop] epoch=0/micro_step=20/global_step=10,
     RunningAvgSamplesPerSec=12.3, CurrSamplesPerSec=12.5, MemAllocated=1.2GB, MaxMemAllocated=3.4GB

  ``CurrSamplesPerSec`` is train_batch_size / the last optimizer step's time (every
  ``steps_per_print`` steps); the line does not carry the batch: it comes from the plan.
* torchtitan (torchtitan/components/metrics.py ``MetricsProcessor.log``; logger format
  ``[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s``, ANSI colours stripped)::

     [titan] 2026-12-01 15:20:36,123 - root - INFO - step: 10  loss:  7.12345  grad_norm:  1.2345
     memory: 30.12GiB(38.05%)  tps: 1,234  tflops: 56.78  mfu: 5.74%

  ``tps`` is tokens per second per device since the previous line.
* dtc's generated trainers (compiler/runtime/fsdp_train.py, compiler/runtime/deepspeed_train.py)::

     step 3/10 loss 5.1234 lr 1.000e-04 grad_norm 0.1234 time 0.123s tokens/s 1234
     [ds_train] step 3/10 loss 5.1234 lr 1.000e-04 time 0.12s tokens/s 1234

Lines may carry a launcher's prefix (srun --label '0: ', torchrun's '[default0]:').

Megatron's second line averages its first two logging windows (``_megatron_unaveraged``).

Warm-up: the first logged step of a run (compilation, allocator growth, NCCL set-up) is never
used; ``steady_step_s`` is the median of the rest.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from compiler.errors import Diagnostic, DtcError, Location

ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)"

MEGATRON = re.compile(
    r"\[(\d{4}-\d\d-\d\d) [0-9:.]+\] iteration\s+(\d+)/\s*(\d+) \|.*?"
    r"elapsed time per iteration \(ms\): " + _NUM + r" \|(?:.*? global batch size:\s+(\d+) \|)?")
DEEPSPEED = re.compile(
    r"\[(\d{4}-\d\d-\d\d) [0-9:,]+\] \[INFO\] \[timer\.py:\d+:stop\] epoch=\d+/micro_step=\d+/global_step=(\d+), "
    r"RunningAvgSamplesPerSec=" + _NUM + r", CurrSamplesPerSec=" + _NUM + r",")
TORCHTITAN = re.compile(
    r"\[titan\] (\d{4}-\d\d-\d\d) [0-9:,]+ - \S+ - INFO - step:\s*(\d+)\s+loss:.*?\btps: " + _NUM + r"\b")
DTC_FSDP = re.compile(r"(?:^|[\s:])step (\d+)/(\d+) loss \S+ lr \S+ grad_norm \S+ time " + _NUM + r"s tokens/s " + _NUM)
DTC_DEEPSPEED = re.compile(r"\[ds_train\] step (\d+)/(\d+) loss \S+ lr \S+ time " + _NUM + r"s tokens/s " + _NUM)

FORMATS = ("megatron", "deepspeed", "torchtitan", "dtc-fsdp", "dtc-deepspeed")
# the dtc target whose cost profile a log's framework is costed with (torchtitan: its own published profile)
TARGET_OF_FORMAT = {"megatron": "megatron", "deepspeed": "deepspeed", "torchtitan": "torchtitan",
                    "dtc-fsdp": "fsdp", "dtc-deepspeed": "deepspeed"}


@dataclass(frozen=True)
class LogStep:
    line: int  # 1-based line of the log
    step: int
    value: float  # seconds per step (megatron, dtc), samples/s (deepspeed) or tokens/s per GPU (torchtitan)
    global_batch: int | None = None  # Megatron prints it


@dataclass(frozen=True)
class LogSteps:
    path: str
    format: str  # one of FORMATS
    unit: str  # "s/step", "samples/s", "tokens/s/gpu"
    steps: tuple[LogStep, ...]
    date: str | None  # the last timestamp's date (YYYY-MM-DD), where the format prints one

    @property
    def timed(self) -> tuple[LogStep, ...]:
        """The steps after the warm-up (the first logged step is never timed)."""
        return self.steps[1:]

    @property
    def steady_value(self) -> float:
        return statistics.median(s.value for s in self.timed)


def _f(text: str) -> float:
    return float(text.replace(",", ""))


def _parse_line(line: str) -> tuple[str, LogStep, str | None] | None:
    """(format, step, date) of one line, or None when it is no per-step line of a known format."""
    line = ANSI.sub("", line).rstrip("\r\n")
    if m := MEGATRON.search(line):
        gb = int(m.group(5)) if m.group(5) else None
        return "megatron", LogStep(0, int(m.group(2)), _f(m.group(4)) / 1000.0, gb), m.group(1)
    if m := DEEPSPEED.search(line):
        return "deepspeed", LogStep(0, int(m.group(2)), _f(m.group(4))), m.group(1)
    if m := TORCHTITAN.search(line):
        return "torchtitan", LogStep(0, int(m.group(2)), _f(m.group(3))), m.group(1)
    if m := DTC_FSDP.search(line):
        return "dtc-fsdp", LogStep(0, int(m.group(1)), _f(m.group(3))), None
    if m := DTC_DEEPSPEED.search(line):
        return "dtc-deepspeed", LogStep(0, int(m.group(1)), _f(m.group(3))), None
    return None


UNITS = {"megatron": "s/step", "deepspeed": "samples/s", "torchtitan": "tokens/s/gpu", "dtc-fsdp": "s/step",
         "dtc-deepspeed": "s/step"}
HINT = ("dtc calibrate reads Megatron-LM's 'iteration N/M | ... elapsed time per iteration (ms): X |' lines, "
        "DeepSpeed's 'CurrSamplesPerSec=' lines (steps_per_print), torchtitan's 'step: N  loss: ...  tps: N' lines "
        "and dtc's trainers' 'step N/M ... time Xs' lines")


def parse_log(text: str, path: str) -> LogSteps:
    """The per-step lines of one log; DtcError (with the file and line) when none or several formats match, or
    a value is not positive, or only the warm-up step was logged."""
    found: list[tuple[str, LogStep, str | None]] = []
    for i, line in enumerate(text.splitlines(), start=1):
        hit = _parse_line(line)
        if hit is not None:
            fmt, step, date = hit
            found.append((fmt, LogStep(i, step.step, step.value, step.global_batch), date))
    if not found:
        raise DtcError(Diagnostic(summary="no per-step training line of a known format in this log",
                                  location=Location(path), hint=HINT))
    formats = sorted({f for f, _, _ in found})
    if len(formats) > 1:
        first_other = next(s for f, s, _ in found if f != found[0][0])
        raise DtcError(Diagnostic(summary=f"this log mixes per-step lines of {' and '.join(formats)}",
                                  location=Location(path, first_other.line),
                                  hint="give each run's log separately"))
    for _, s, _ in found:
        if not s.value > 0:
            raise DtcError(Diagnostic(summary=f"step {s.step} logs a non-positive time or throughput ({s.value:g})",
                                      location=Location(path, s.line), hint="a timed step must take time"))
    fmt = formats[0]
    steps = tuple(s for _, s, _ in found)
    if len(steps) < 2:
        raise DtcError(Diagnostic(
            summary="only one step was logged: the first logged step is warm-up and is never timed",
            location=Location(path, steps[0].line), hint="run at least two logged steps (more are better)"))
    if fmt == "megatron":
        steps = _megatron_unaveraged(steps)
    dates = [d for _, _, d in found if d]
    return LogSteps(path=path, format=fmt, unit=UNITS[fmt], steps=steps, date=max(dates) if dates else None)


def _megatron_unaveraged(steps: tuple[LogStep, ...]) -> tuple[LogStep, ...]:
    """Megatron's second line averages the process's first two logging windows (its timer is not reset after
    the first: compiler/targets/megatron/smoke.py ``_unaverage_second_line`` is the one home of that rule, for
    --log-interval 1). With a longer interval the second line cannot be recovered and is left out as warm-up
    too, when later lines exist."""
    from compiler.targets.megatron.smoke import MegatronLog, _unaverage_second_line

    if len(steps) < 2:
        return steps
    if steps[1].step == steps[0].step + 1:
        log = MegatronLog()
        log.iterations = [s.step for s in steps]
        log.step_times_s = [s.value for s in steps]
        log.losses = [0.0] * len(steps)
        _unaverage_second_line(log)
        return tuple(LogStep(s.line, s.step, v, s.global_batch) for s, v in zip(steps, log.step_times_s))
    return steps[:1] + steps[2:] if len(steps) >= 3 else steps

