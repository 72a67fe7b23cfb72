"""The preemption check of a smoke run: SIGUSR1 during step k, the checkpoint, the next job.

``dtc smoke DIR --preempt-at K`` runs each torch target three times on the same reduced setup:

1. uninterrupted, checkpoints elsewhere (the reference losses);
2. with the launch's workers sent SIGUSR1 while step K runs (``Signaller``: when step K-1 is
   reported, i.e. before step K's end-of-step check; what SLURM's ``--signal=B:USR1@lead`` does
   before the time limit) -- the trainers finish the step, save a complete checkpoint and exit 0;
3. again, resuming from that checkpoint.

``compare`` then reports ``{"resumed_from_step": K, "losses_match": true}`` when the resumed run's
losses for steps K+1.. equal the reference's within ``tolerance``. Signals go to the trainer
processes only (found by a marker in their environment and the entry script on their command
line): torchrun itself dies of SIGUSR1 and would take its workers with it. The signalled launch
must see the step lines as they are printed: without torchrun's ``--tee`` (which tails the per-rank
log files late, after a fast CPU run has already passed step K), the workers writing straight to
the launcher's pipe.
"""
from __future__ import annotations

import os
import re
import signal
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

MARK_ENV = "DTC_PREEMPT_MARK"
TOLERANCE = 1e-6
_STEP = re.compile(r"^(?:\[ds_train\] )?step (\d+)/(\d+) loss ")


def new_mark() -> str:
    return uuid.uuid4().hex


def trainer_pids(mark: str, scripts: Sequence[str]) -> list[int]:
    """Live processes carrying ``DTC_PREEMPT_MARK=mark`` whose command line runs one of ``scripts``."""
    marker = f"{MARK_ENV}={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        launcher = any(os.path.basename(a) == "torchrun" or a == "torch.distributed.run" for a in argv[:3])
        if not launcher and any(os.path.basename(a) in scripts for a in argv):
            found.append(int(entry))
    return found


@dataclass
class Signaller:
    """An ``on_line`` callback: SIGUSR1 to the marked trainers once step ``at - 1`` is reported
    (for ``at == 1``: at the first line of the launch)."""

    mark: str
    at: int
    scripts: tuple[str, ...]
    sent_to: list[int] = field(default_factory=list)
    sent: bool = False

    def __call__(self, line: str) -> None:
        if self.sent:
            return
        m = _STEP.match(line)
        if (m and int(m.group(1)) == self.at - 1) or self.at <= 1:
            self.sent_to = trainer_pids(self.mark, self.scripts)
            for pid in self.sent_to:
                try:
                    os.kill(pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
            self.sent = bool(self.sent_to)


@dataclass(frozen=True)
class PreemptionResult:
    requested_at: int
    stopped_after_step: int | None
    resumed_from_step: int | None
    losses_match: bool
    max_abs_diff: float | None
    compared_steps: list[int]
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(reference: dict[str, Any], stopped: dict[str, Any], resumed: dict[str, Any], at: int,
            tolerance: float = TOLERANCE) -> PreemptionResult:
    """Judge the three summaries (the trainers' ``losses``/``loss_steps``/``resumed_from_step``)."""
    ref = dict(zip(reference.get("loss_steps", []), reference.get("losses", []), strict=False))
    stopped_after = stopped.get("last_step") if stopped.get("stopped_by_signal") else None
    resumed_from = resumed.get("resumed_from_step")
    pairs = [(s, ref[s], loss) for s, loss in zip(resumed.get("loss_steps", []), resumed.get("losses", []),
                                                 strict=False) if s in ref]
    diff = max((abs(a - b) for _, a, b in pairs), default=None)
    reason = ""
    if stopped_after is None:
        reason = "the signalled run did not stop on the signal"
    elif resumed_from != stopped_after:
        reason = f"the next run resumed from step {resumed_from}, the checkpoint was at step {stopped_after}"
    elif not pairs:
        reason = "no step after the checkpoint to compare"
    elif diff is not None and diff > tolerance:
        reason = f"losses after the resume differ by up to {diff:.3g} (tolerance {tolerance:g})"
    elif stopped_after != at:
        reason = f"the signal sent during step {at} was acted on after step {stopped_after}"
    return PreemptionResult(requested_at=at, stopped_after_step=stopped_after, resumed_from_step=resumed_from,
                            losses_match=not reason or reason.startswith("the signal sent"),
                            max_abs_diff=diff, compared_steps=[s for s, _, _ in pairs], reason=reason)


__all__ = ["MARK_ENV", "TOLERANCE", "Signaller", "PreemptionResult", "compare", "trainer_pids", "new_mark"]
