"""Shared test options: --update-golden rewrites expected files (and still fails the run)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Byte-compile compiler/ once, as any install does: where PYTHONDONTWRITEBYTECODE is set (the shared dev
    machine) every `python -m compiler` a test starts would otherwise compile dtc's sources again (~0.3 s each)."""
    import compileall

    compileall.compile_dir(REPO / "compiler", quiet=2)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden files (tests/cases/**/expected*) and fail, listing what was written")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests run from the repository root so relative spec paths in messages are stable."""
    monkeypatch.chdir(REPO)
