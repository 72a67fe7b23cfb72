"""ruff over the repository, with the configuration in pyproject.toml ([tool.ruff]): CI runs it through the
README's test command. Marked slow: it launches an external tool."""
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
