"""The reference a spec and its plan keep to a cluster profile (``cluster.profile``; compiler/calibration/profile.py
writes and reads the files). A leaf module: the Problem, the plan and the cost model all hold it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class ProfileRef:
    """The cluster profile a spec uses (``cluster.profile``, written by ``dtc calibrate``): its name, the path the
    spec gives, the file's sha256, and the fitted constants it sets (kept in plan.json, so a plan re-costs
    without the file)."""

    name: str
    path: str
    sha256: str
    constants: Mapping[str, float]
    # the profile's own leave-one-out residuals, log(measured / predicted step time) per run: a calibrated profile's
    # estimates take their 80% band from these (compiler/costmodel/bands.py profile_band)
    loo_log_errors: tuple[float, ...] = ()

    def __hash__(self) -> int:
        return hash((self.name, self.path, self.sha256, tuple(sorted(self.constants.items())), self.loo_log_errors))
