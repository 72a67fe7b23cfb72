"""Plain-text pieces of PLAN.md: Markdown cell escaping, number formats, the block-character
memory chart and the ASCII pipeline timeline.

Everything here is a pure function of its arguments and uses fixed-precision
formatting only, so the report is byte-stable (STYLE 10.3).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from compiler.estimate import PipelineEvent

BAR_WIDTH = 40  # characters for the largest value in the text bar chart
_EIGHTHS = " ▏▎▍▌▋▊▉"  # partial blocks, index = eighths of one character
TIMELINE_MAX_COLUMNS = 120  # the ASCII timeline is cut after this many columns
TIMELINE_MAX_STAGES = 8  # pp above this gets only the SVG


# ---------------------------------------------------------------------------------------- formats
def cell(text: object) -> str:
    """A Markdown table cell: pipes escaped, newlines folded."""
    return " ".join(str(text).split("\n")).replace("|", "\\|").strip()


def code(text: object) -> str:
    """An inline code span that survives backticks (``cell`` escapes pipes when it lands in a table)."""
    s = " ".join(str(text).split("\n")).strip()
    if not s:
        return ""
    fence = "`"
    while fence in s:
        fence += "`"
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> dict[str, Any]:
    """A Markdown table as data for the ``report/_table.md.j2`` macro: escaped cells, 'l'/'r' alignment."""
    assert len(headers) == len(align) and all(len(r) == len(headers) for r in rows)
    return {"headers": [cell(h) for h in headers],
            "separators": [":---" if a == "l" else "---:" for a in align],
            "rows": [[cell(c) for c in r] for r in rows]}


def percent(x: float, digits: int = 1) -> str:
    return f"{100.0 * float(x):.{digits}f}%"


def thousands(x: float) -> str:
    """12345.6 -> '12,346' (integers, comma-grouped)."""
    return f"{round(float(x)):,d}"


def flops_rate(x: float) -> str:
    """FLOP/s in TFLOP/s with one decimal: 4.1e14 -> '410.0 TFLOP/s'."""
    return f"{float(x) / 1e12:.1f} TFLOP/s"


def bandwidth(x: float) -> str:
    return f"{float(x) / 1e9:.0f} GB/s"


def days(s: float) -> str:
    return f"{float(s) / 86400.0:.2f}"


# ----------------------------------------------------------------------------------- bar chart
def block_bar(value: float, scale: float, width: int = BAR_WIDTH) -> str:
    """A left-aligned bar of full and partial block characters, padded to ``width``."""
    if scale <= 0 or value <= 0:
        return " " * width
    eighths = min(width * 8, int(round(float(value) / float(scale) * width * 8)))
    full, part = divmod(eighths, 8)
    bar = "█" * full + (_EIGHTHS[part] if part else "")
    return bar.ljust(width)


def bar_chart(rows: Sequence[tuple[str, float, str]], scale: float, width: int = BAR_WIDTH) -> list[str]:
    """``rows`` = (label, value, formatted value); one line each, bars scaled to ``scale``."""
    label_w = max((len(r[0]) for r in rows), default=0)
    value_w = max((len(r[2]) for r in rows), default=0)
    return [f"{label.ljust(label_w)}  {block_bar(value, scale, width)}  {text.rjust(value_w)}".rstrip()
            for label, value, text in rows]


# ----------------------------------------------------------------------------- ascii timeline
def event_label(e: PipelineEvent, vpp: int) -> str:
    """F3 / B3, with the chunk as a letter under interleaving (F3a, F3b, ...)."""
    chunk = chr(ord("a") + e.chunk % 26) if vpp > 1 else ""
    return f"{e.kind}{e.microbatch}{chunk}"


def ascii_timeline(events: Sequence[PipelineEvent], pp: int, vpp: int,
                   max_columns: int = TIMELINE_MAX_COLUMNS) -> tuple[list[str], str]:
    """Rows ``stage s |...|``, one character per time column; '.' is idle time (the bubble).

    Three scales, the first that fits ``max_columns``: labelled boxes ``[F0-][B0===]``
    (the shortest event just fits its label); compact, one letter per column with the
    case alternating by microbatch (``FFffBBbb``); compact with one column per shortest
    event, cut after ``max_columns`` (the note says how much of the step is shown).
    """
    durations = [e.end_s - e.start_s for e in events if e.end_s > e.start_s]
    if not events or not durations:
        return [], ""
    t0 = min(e.start_s for e in events)
    span = max(e.end_s for e in events) - t0
    shortest = min(durations)
    widest = max(len(event_label(e, vpp)) for e in events) + 2
    labelled = _columns(span, shortest / widest) <= max_columns
    if labelled:
        unit = shortest / widest
    else:  # the shortest event spans a whole number of columns, so boxes keep equal widths
        unit = shortest / max(1, int(shortest * max_columns / span))
    total = _columns(span, unit)
    cols = min(total, max_columns)
    grid = [["."] * cols for _ in range(pp)]
    for e in sorted(events, key=lambda e: (e.start_s, e.stage, e.chunk, e.microbatch, e.kind)):
        c0 = int(round((e.start_s - t0) / unit))
        c1 = max(c0 + 1, int(round((e.end_s - t0) / unit)))
        if labelled:
            text = _box(event_label(e, vpp), c1 - c0, "-" if e.kind == "F" else "=")
        else:
            text = (e.kind if e.microbatch % 2 == 0 else e.kind.lower()) * (c1 - c0)
        for i, ch in enumerate(text):
            if 0 <= c0 + i < cols and 0 <= e.stage < pp:
                grid[e.stage][c0 + i] = ch
    digits = len(str(pp - 1))
    tail = " ..." if cols < total else ""
    lines = [f"stage {s:>{digits}} |{''.join(row)}|{tail}" for s, row in enumerate(grid)]
    note = f"one column = {_seconds_fixed(unit)}; '.' = idle (bubble)"
    if not labelled:
        note += "; F/B = forward/backward, lower case for odd microbatches"
    if cols < total:
        note += f"; first {_seconds_fixed(cols * unit)} of {_seconds_fixed(span)} shown"
    return lines, note


def _columns(span: float, unit: float) -> int:
    return max(1, int(math.ceil(span / unit - 1e-9)))


def _box(label: str, width: int, fill: str) -> str:
    if width >= len(label) + 2:
        return "[" + label + fill * (width - len(label) - 2) + "]"
    return label[:width]


def _seconds_fixed(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.3f} s"


def grouped_counts(counts: tuple[int, ...]) -> str:
    """'15, 16 x 6, 15': equal neighbours grouped."""
    runs: list[list[int]] = []
    for n in counts:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ", ".join(f"{n} x {k}" if k > 1 else str(n) for n, k in runs)
