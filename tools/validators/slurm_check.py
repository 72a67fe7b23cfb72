#!/usr/bin/env python3
"""Validate a generated folder's sbatch scripts with their real consumers: the slurm target's validator hook.

``validate_folder(folder, plan) -> [error]``: every ``*.sbatch`` passes ``bash -n`` and
``shellcheck -S style`` with no finding (shellcheck must be installed: .ci/install-system-deps.sh).
``sbatch --test-only`` needs a cluster the job fits: tests/test_render_slurm.py runs it against a
private slurmctld with the scripts scaled to it.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any


def validate_folder(folder: str | Path, plan: Any) -> list[str]:
    scripts = sorted(Path(folder).glob("*.sbatch"))
    if not scripts:
        return [f"no sbatch script in {folder}"]
    errors: list[str] = []
    for script in scripts:
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=60)
        if proc.returncode:
            errors.append(f"bash -n {script.name}: {proc.stderr.strip()}")
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        errors.append("shellcheck is not installed (run .ci/install-system-deps.sh)")
    else:
        proc = subprocess.run([shellcheck, "-S", "style", *map(str, scripts)], capture_output=True, text=True,
                              timeout=120, cwd=folder)
        if proc.returncode:
            errors.append(f"shellcheck: {proc.stdout.strip()[-2000:]}")
    return errors
