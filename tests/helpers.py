"""Test helpers: golden comparison with a unified diff, and the CLI runner."""
from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

REPO = Path(__file__).resolve().parent.parent


def assert_golden(actual: str, expected_path: Path, *, update: bool, regen: str) -> None:
    """Byte-exact comparison; a missing golden is written and fails; --update-golden rewrites and fails."""
    if update or not expected_path.exists():
        expected_path.parent.mkdir(parents=True, exist_ok=True)
        expected_path.write_text(actual, encoding="utf-8")
        pytest.fail(f"wrote golden {expected_path.relative_to(REPO)}; review it and re-run without --update-golden")
    expected = expected_path.read_text(encoding="utf-8")
    if actual != expected:
        obtained = expected_path.with_name(expected_path.name + ".obtained")
        obtained.write_text(actual, encoding="utf-8")
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            str(expected_path.relative_to(REPO)), "actual"))
        pytest.fail(f"golden mismatch (actual written to {obtained.name}); regenerate with: {regen}\n{diff}")


def run_cli(args: list[str], *, exit_code: int | None = 0) -> Result:
    """Invoke the dtc CLI in-process; on an unexpected exit code, show everything."""
    from compiler.cli import cli

    result = CliRunner().invoke(cli, args, catch_exceptions=True)
    if exit_code is not None and result.exit_code != exit_code:
        pytest.fail(f"dtc {' '.join(args)} exited {result.exit_code}, expected {exit_code}\n"
                    f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}\n--- exception\n{result.exception!r}")
    return result


def run_dtc(args: list[str], *, cwd: Path = REPO, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `python -m compiler ...` as a real process (exit codes, no traceback on stderr)."""
    return subprocess.run([sys.executable, "-m", "compiler", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def refresh_manifest(folder: Path) -> None:
    """Rewrite MANIFEST.sha256 to match the folder's files, as someone who edits a generated folder on
    purpose would (the manifest is a guard against mistakes, not a signature)."""
    from compiler.artifacts import MANIFEST, ArtifactSet, read_artifacts

    files = {rel: text for rel, text in read_artifacts(folder).files.items() if rel != MANIFEST}
    (folder / MANIFEST).write_text(ArtifactSet(files).with_manifest()[MANIFEST], encoding="utf-8")


def slurm_test_cluster(workdir: Path, **options):
    """A module fixture's body: the local SLURM cluster of tests/slurm_cluster.py started in ``workdir`` with
    ``options`` (SlurmCluster.start's), stopped afterwards. Fails (never skips) where SLURM, munge or root is
    missing: CI installs them (.ci/install-system-deps.sh)."""
    import os

    from slurm_cluster import INSTALL_HINT, SlurmCluster, missing_slurm_tools

    missing = missing_slurm_tools()
    if missing:
        pytest.fail(f"{INSTALL_HINT} (missing: {', '.join(missing)})", pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("the SLURM test cluster needs root (slurmd runs as root)", pytrace=False)
    cluster = SlurmCluster.start(workdir, **options)
    try:
        yield cluster
    finally:
        cluster.stop()
