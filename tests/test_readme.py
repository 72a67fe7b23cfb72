"""The README is part of the product: its commands are the ones CI runs, its reference is current."""
from __future__ import annotations

from compiler.spec.reference import END, START, spec_reference_markdown
from helpers import REPO

README = (REPO / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci/run").read_text()
    command = next(line for line in ci.splitlines() if "pytest" in line).strip()
    assert command in README, f"README must show the CI test command: {command}"


def test_readme_has_the_compile_command():
    assert "dtc compile specs/70b.yaml" in README
    assert (REPO / "specs/70b.yaml").exists()


def test_spec_reference_is_current():
    body = README[README.index(START) + len(START):README.index(END)]
    assert body.strip() == spec_reference_markdown().strip(), (
        "README spec reference is stale: regenerate it from compiler/spec/reference.py")
