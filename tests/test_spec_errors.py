"""Bad specs: every error is located (file:line:col), states the rule and value, and carries a hint.

Each case is tests/cases/errors/<name>/spec.yaml with the exact expected stderr of
`dtc validate` in expected.err (regenerate: pytest tests/test_spec_errors.py --update-golden).
"""
from __future__ import annotations

import re

import pytest

from helpers import REPO, assert_golden, run_cli

CASES = sorted(p.name for p in (REPO / "tests/cases/errors").iterdir() if p.is_dir())


@pytest.mark.parametrize("case", CASES)
def test_error_case(case: str, update_golden: bool) -> None:
    spec = f"tests/cases/errors/{case}/spec.yaml"
    result = run_cli(["validate", spec], exit_code=2)
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(spec + ":"), result.stderr
    assert re.search(r"error(\[\w+\])?:", result.stderr) and "hint:" in result.stderr, result.stderr
    assert_golden(result.stderr, REPO / "tests/cases/errors" / case / "expected.err", update=update_golden,
                  regen=f"pytest tests/test_spec_errors.py --update-golden -k {case}")


def test_no_orphan_goldens() -> None:
    for case in (REPO / "tests/cases/errors").iterdir():
        assert (case / "spec.yaml").exists(), f"orphaned error case folder: {case}"
        assert (case / "expected.err").exists(), f"missing expected.err in {case}"


def test_several_errors_are_all_reported() -> None:
    result = run_cli(["validate", "tests/cases/errors/several_errors/spec.yaml"], exit_code=2)
    assert result.stderr.count("error:") >= 6
    assert result.stderr.rstrip().endswith("errors")


def test_every_example_spec_validates() -> None:
    specs = sorted(str(p.relative_to(REPO)) for p in (REPO / "specs").glob("*.yaml"))
    assert len(specs) >= 5
    result = run_cli(["validate", *specs])
    assert result.stdout.count("ok  ") == len(specs)
