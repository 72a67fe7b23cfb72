"""generated/ is the golden output of specs/ (STYLE.md 10.1): `dtc check` must find nothing to do.

Regenerate after an intended change with: dtc compile specs/*.yaml
"""
from __future__ import annotations

from helpers import REPO, run_dtc


def test_generated_matches_specs():
    specs = sorted(p.stem for p in (REPO / "specs").glob("*.yaml"))
    assert specs, "no example specs"
    assert (REPO / "generated").is_dir() and any((REPO / "generated").iterdir()), \
        "generated/ is missing: run dtc compile specs/*.yaml and commit it"
    result = run_dtc(["check"], timeout=600)  # a real process, as CI and pre-commit run it
    assert result.returncode == 0, (
        f"generated/ is stale; run `dtc compile specs/*.yaml` and review the diff\n{result.stdout}\n{result.stderr}")
    assert "Traceback" not in result.stderr
