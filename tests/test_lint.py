"""ruff and mypy over the repository, with the configuration in pyproject.toml ([tool.ruff], [tool.mypy]): CI runs
them through the README's test command. Marked slow: they launch external tools. mypy keeps its incremental cache
in the repository's (git-ignored) .mypy_cache: a cold run costs about 13 s of CPU, a warm one about 1 s. Without
mypy or ruff installed the tests fail, not skip (scripts/setup.sh installs both with the test extras)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_ruff_is_clean() -> None:
    got = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr


@pytest.mark.slow
def test_mypy_is_clean() -> None:
    # a subprocess, not mypy.api: mypy's command line skips freeing its ~1 GB of state at exit, which in-process
    # costs as much CPU again as the check itself
    got = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(REPO / ".mypy_cache")], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stdout + got.stderr
