"""compiler/rules.py's CODES describes every reason code dtc can report, in one place: each layout rule's, the
search's, the cost model's and the objective's. A code that some module rejects with but CODES lacks fails here."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

from compiler import rules
from compiler.solver.search import THIN_REGIME

ROOT = Path(__file__).resolve().parents[2] / "compiler"
REJECTS = re.compile(r"\b(?:reject|Rejection)\(\s*([A-Z][A-Z_]+)\s*,")


def rejected_codes() -> dict[str, str]:
    """code -> where it is rejected with, for every ``reject(NAME, ...)`` / ``Rejection(NAME, ...)`` in compiler/."""
    out: dict[str, str] = {}
    for path in sorted(ROOT.rglob("*.py")):
        names = REJECTS.findall(path.read_text(encoding="utf-8"))
        if not names:
            continue
        module = importlib.import_module(".".join(path.relative_to(ROOT.parent).with_suffix("").parts))
        for name in names:
            value = getattr(module, name, None)
            assert isinstance(value, str), f"{path}: {name} is not a code constant of the module"
            out[value] = f"{path.relative_to(ROOT.parent)}:{name}"
    return out


def test_every_rule_code_is_described() -> None:
    assert {r.code for r in rules.RULES} <= set(rules.CODES)


def test_every_code_dtc_rejects_with_is_described() -> None:
    found = rejected_codes()
    assert len(found) >= 15, found  # the scan sees the rules, the search, the cost model and the objective
    # (the search for a well-calibrated alternative turns thin regimes away; no plan or report shows that code)
    missing = {code: where for code, where in found.items() if code not in rules.CODES and code != THIN_REGIME}
    assert not missing, missing
