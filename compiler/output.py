"""Output helpers shared by the commands and review/format.py: plain-text tables and JSON (not a report;
render/report.py and smoke/report.py are the reports)."""
from __future__ import annotations

import json
from typing import Any, Iterable, Sequence


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, align: str | None = None) -> str:
    """A plain-text table; ``align`` is a string of 'l'/'r' per column (default: l then r)."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, r)]
    align = align or ("l" + "r" * (len(headers) - 1))

    def fmt(cells: Sequence[str]) -> str:
        out = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, align)]
        return "  ".join(out).rstrip()

    lines = [fmt(headers), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in rows]
    return "\n".join(lines)

