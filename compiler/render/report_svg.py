"""Hand-built, deterministic SVG pictures for PLAN.md: the pipeline timeline and the memory bar.

No plotting library: every coordinate is printed with two decimals and every
colour comes from a fixed palette, so the same Plan gives the same bytes on
every machine (STYLE 10.3). A small schedule draws each pipeline event as exactly
one ``<rect class="ev ...">``; a large one is summarised per stage (``class="busy"``
bins coloured by forward, backward or both). Idle time, and only idle time, is
drawn as ``<rect class="idle">`` (hatched), so the bubble is visible and countable.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence
from xml.sax.saxutils import escape

from compiler.estimate import LineItem, MemoryBreakdown, PipelineEvent
from compiler.units import format_bytes

MAX_PIPELINE_BOXES = 2000  # beyond this, only the first microbatches get their own box
PLOT_W = 960.0
LEFT = 84.0
RIGHT = 24.0
FONT = "font-family=\"monospace\" font-size=\"11\""
# Tableau 10, fixed order
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
           "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
KIND_COLOUR = {"F": "#4e79a7", "B": "#f28e2b"}


def _f(x: float) -> str:
    """Coordinates with fixed precision; '-0.00' never appears."""
    s = f"{float(x):.2f}"
    return "0.00" if s == "-0.00" else s


def _text(x: float, y: float, body: str, *, anchor: str = "start", extra: str = "") -> str:
    return (f"<text x=\"{_f(x)}\" y=\"{_f(y)}\" text-anchor=\"{anchor}\" {FONT}{extra}>"
            f"{escape(body)}</text>")


def _rect(x: float, y: float, w: float, h: float, fill: str, *, cls: str = "", title: str = "",
          extra: str = "") -> str:
    attrs = f"x=\"{_f(x)}\" y=\"{_f(y)}\" width=\"{_f(max(w, 0.0))}\" height=\"{_f(h)}\" fill=\"{fill}\""
    if cls:
        attrs = f"class=\"{cls}\" " + attrs
    if title:
        return f"<rect {attrs}{extra}><title>{escape(title)}</title></rect>"
    return f"<rect {attrs}{extra}/>"


def _document(width: float, height: float, title: str, body: list[str]) -> str:
    head = (f"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{_f(width)}\" height=\"{_f(height)}\" "
            f"viewBox=\"0 0 {_f(width)} {_f(height)}\">")
    lines = [head, f"<title>{escape(title)}</title>",
             _rect(0, 0, width, height, "#ffffff")] + body + ["</svg>"]
    return "\n".join(lines) + "\n"


def shade(colour: str, amount: float) -> str:
    """Blend ``colour`` towards white by ``amount`` in [0, 1]."""
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    mixed = [int(round(c + (255 - c) * amount)) for c in rgb]
    return "#" + "".join(f"{c:02x}" for c in mixed)


# ------------------------------------------------------------------------------ time axis
def nice_step(raw: float) -> float:
    """The 1-2-5 step at or above ``raw``."""
    if raw <= 0:
        return 1.0
    exp = math.floor(math.log10(raw))
    for m in (1.0, 2.0, 5.0, 10.0):
        if m * 10.0 ** exp >= raw * (1 - 1e-9):
            return m * 10.0 ** exp
    return 10.0 ** (exp + 1)


def axis_ticks(span: float, target: int = 8) -> tuple[list[tuple[float, str]], str]:
    """Ticks (seconds, label) over [0, span]; labels in ms below one second, else s."""
    step = nice_step(span / target)
    scale, unit = (1e3, "ms") if span < 1 else (1.0, "s")
    decimals = max(0, -int(math.floor(math.log10(step * scale) + 1e-9)))
    count = int(math.floor(span / step + 1e-9))
    return [(k * step, f"{k * step * scale:.{decimals}f}") for k in range(count + 1)], unit


# ------------------------------------------------------------------------------ pipeline
@dataclass(frozen=True)
class PipelinePicture:
    svg: str
    num_events: int
    num_drawn: int  # events drawn as a box of their own (all of them, or none when summarised)
    microbatches_drawn: int  # microbatches drawn one by one (all, or 0 when summarised)
    idle_fraction: float  # idle area / (stages x span): the real gaps between events

    @property
    def summarised(self) -> bool:
        return self.num_drawn < self.num_events


def idle_intervals(intervals: Sequence[tuple[float, float]], t0: float, t1: float) -> list[tuple[float, float]]:
    """Gaps in [t0, t1] not covered by ``intervals``."""
    gaps, cursor = [], t0
    for a, b in sorted(intervals):
        if a > cursor:
            gaps.append((cursor, min(a, t1)))
        cursor = max(cursor, b)
    if cursor < t1:
        gaps.append((cursor, t1))
    return [(a, b) for a, b in gaps if b > a]


def _merge(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


MIN_BOX_PX = 3.0  # events narrower than this on average are summarised, not drawn one by one
BIN_PX = 4.0  # the summary's resolution
STEADY_COLOUR = "#8c6bb1"  # forward and backward interleaved (1F1B steady state)


def pipeline_svg(events: Sequence[PipelineEvent], *, pp: int, vpp: int, title: str,
                 cap: int = MAX_PIPELINE_BOXES) -> PipelinePicture:
    """One row per stage, time on x, a seconds axis and a legend of a few swatches.

    Few enough events (at most ``cap``, each at least MIN_BOX_PX wide on average): one box per event, F
    blue and B orange, chunks told apart by two shades (even and odd chunks). More: each stage's busy time
    is drawn in BIN_PX bins coloured by what fills them (forward only, backward only, or both interleaved:
    the steady state). Either way the hatched gaps are exactly the time a stage waits (the bubble), and
    only the stage rows carry tooltips."""
    t0 = min(e.start_s for e in events)
    span = max(max(e.end_s for e in events) - t0, 1e-12)
    row_h, gap, top = 26.0, 8.0, 44.0
    width = LEFT + PLOT_W + RIGHT
    x = lambda t: LEFT + (t - t0) / span * PLOT_W  # noqa: E731
    mean_px = sum(e.end_s - e.start_s for e in events) / len(events) / span * PLOT_W
    one_by_one = len(events) <= cap and mean_px >= MIN_BOX_PX
    body = ["<defs><pattern id=\"idle\" patternUnits=\"userSpaceOnUse\" width=\"6\" height=\"6\" "
            "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#ffffff\"/>"
            "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#9a9a9a\" stroke-width=\"2\"/></pattern></defs>",
            _text(LEFT, 20, title, extra=" font-weight=\"bold\"")]
    by_stage: dict[int, list[PipelineEvent]] = {}
    for e in events:
        by_stage.setdefault(e.stage, []).append(e)
    idle_total = 0.0
    drawn = 0
    for s in range(pp):
        y = top + s * (row_h + gap)
        mine = sorted(by_stage.get(s, []), key=lambda e: (e.start_s, e.chunk, e.microbatch, e.kind))
        gaps = idle_intervals([(e.start_s, e.end_s) for e in mine], t0, t0 + span)
        idle = sum(b - a for a, b in gaps)
        idle_total += idle
        busy = 1 - idle / span
        body.append(f"<g class=\"stage\"><title>stage {s}: busy {busy:.1%}, idle {_ms(idle)} of {_ms(span)}</title>")
        body.append(_text(LEFT - 8, y + row_h / 2 + 4, f"stage {s}", anchor="end"))
        for a, b in gaps:
            body.append(_rect(x(a), y, x(b) - x(a), row_h, "url(#idle)", cls="idle"))
        if one_by_one:
            for e in mine:
                drawn += 1
                body.extend(_event(e, x(e.start_s), y, x(e.end_s) - x(e.start_s), row_h, vpp))
        else:
            body.extend(_summary_row(mine, y, row_h, t0, span, x))
        body.append("</g>")
    axis_y = top + pp * (row_h + gap)
    body.extend(_axis(axis_y, span, x, t0))
    legend_y = axis_y + 56
    legend, rows = _pipeline_legend(legend_y, vpp, one_by_one)
    body.extend(legend)
    svg = _document(width, legend_y + rows * 20 + 8, title, body)
    return PipelinePicture(svg=svg, num_events=len(events), num_drawn=drawn,
                           microbatches_drawn=1 + max(e.microbatch for e in events) if one_by_one else 0,
                           idle_fraction=idle_total / (pp * span))


def _summary_row(mine: Sequence[PipelineEvent], y: float, h: float, t0: float, span: float, x) -> list[str]:
    """A stage's busy time in bins, each coloured by the kinds that fill it; runs of one colour merged."""
    bins = max(1, int(PLOT_W / BIN_PX))
    width = span / bins
    f_time = [0.0] * bins
    b_time = [0.0] * bins
    for e in mine:
        a, b = e.start_s - t0, e.end_s - t0
        i = min(bins - 1, int(a / width))
        while a < b and i < bins:
            cut = min(b, (i + 1) * width)
            (f_time if e.kind == "F" else b_time)[i] += cut - a
            a, i = cut, i + 1
    runs: list[tuple[int, int, str]] = []  # (first bin, last bin + 1, colour)
    for i in range(bins):
        f, b = f_time[i], b_time[i]
        if f + b <= 0:
            continue
        colour = KIND_COLOUR["F"] if b < 0.1 * (f + b) else KIND_COLOUR["B"] if f < 0.1 * (f + b) else STEADY_COLOUR
        if runs and runs[-1][1] == i and runs[-1][2] == colour:
            runs[-1] = (runs[-1][0], i + 1, colour)
        else:
            runs.append((i, i + 1, colour))
    out = []
    busy = _merge([(e.start_s - t0, e.end_s - t0) for e in mine])
    for first, last, colour in runs:
        lo, hi = first * width, last * width
        for a, b in busy:  # only where the stage is really busy: the gaps stay hatched
            a, b = max(a, lo), min(b, hi)
            if b > a:
                out.append(_rect(x(t0 + a), y, x(t0 + b) - x(t0 + a), h, colour, cls="busy"))
    return out


def _ms(t: float) -> str:
    return f"{t * 1e3:.3f} ms"


def _event(e: PipelineEvent, x0: float, y: float, w: float, h: float, vpp: int) -> list[str]:
    stroke = " stroke=\"#ffffff\" stroke-width=\"0.5\"" if w >= 3.0 else ""  # thin boxes: no outline
    out = [_rect(x0, y, w, h, event_colour(e.kind, e.chunk, vpp), cls=f"ev {e.kind}", extra=stroke)]
    label = str(e.microbatch)
    if w >= 7.0 * len(label) + 4:
        out.append(_text(x0 + w / 2, y + h / 2 + 4, label, anchor="middle", extra=" fill=\"#ffffff\""))
    return out


def event_colour(kind: str, chunk: int, vpp: int) -> str:
    """F blue, B orange; with virtual stages, odd chunks a lighter shade, so neighbours differ."""
    base = KIND_COLOUR.get(kind, PALETTE[6])
    return base if vpp <= 1 or chunk % 2 == 0 else shade(base, 0.35)


def _axis(y: float, span: float, x, t0: float) -> list[str]:
    ticks, unit = axis_ticks(span)
    out = [f"<line x1=\"{_f(LEFT)}\" y1=\"{_f(y)}\" x2=\"{_f(LEFT + PLOT_W)}\" y2=\"{_f(y)}\" stroke=\"#333333\"/>"]
    for t, label in ticks:
        px = x(t0 + t)
        out.append(f"<line x1=\"{_f(px)}\" y1=\"{_f(y)}\" x2=\"{_f(px)}\" y2=\"{_f(y + 5)}\" stroke=\"#333333\"/>")
        out.append(_text(px, y + 17, label, anchor="middle"))
    out.append(_text(LEFT + PLOT_W, y + 32, f"time ({unit})", anchor="end"))
    return out


def _pipeline_legend(y: float, vpp: int, one_by_one: bool) -> tuple[list[str], int]:
    """A few swatches left to right, wrapped at the plot width; returns (elements, number of rows)."""
    entries: list[tuple[str, str]] = []
    if one_by_one and vpp > 1:
        entries += [(event_colour(kind, chunk, vpp), f"{name}, {parity} chunk")
                    for kind, name in (("F", "forward"), ("B", "backward"))
                    for chunk, parity in ((0, "even"), (1, "odd"))]
    else:
        entries += [(KIND_COLOUR["F"], "forward"), (KIND_COLOUR["B"], "backward")]
    if not one_by_one:
        entries.append((STEADY_COLOUR, "forward and backward interleaved (steady state)"))
    entries.append(("url(#idle)", "idle (bubble)"))
    out, cx, cy, rows = [], LEFT, y, 1
    for fill, label in entries:
        w = 16 + 7.0 * len(label) + 18
        if cx > LEFT and cx + w > LEFT + PLOT_W:
            cx, cy, rows = LEFT, cy + 20, rows + 1
        out.append(_rect(cx, cy - 10, 12, 12, fill, extra=" stroke=\"#666666\" stroke-width=\"0.5\""))
        out.append(_text(cx + 16, cy, label))
        cx += w
    return out, rows


# ------------------------------------------------------------------------------ memory
def memory_svg(memory: MemoryBreakdown, *, title: str) -> str:
    """A horizontal stacked bar of the memory line items against usable and total HBM."""
    items = [i for i in memory.items if i.value > 0]
    scale = float(max(memory.hbm_bytes_per_gpu, memory.total_bytes_per_gpu,
                      sum(float(i.value) for i in items), 1))
    width = LEFT + PLOT_W + RIGHT
    x = lambda b: LEFT + float(b) / scale * PLOT_W  # noqa: E731
    bar_y, bar_h = 64.0, 40.0
    body = [_text(LEFT, 20, title, extra=" font-weight=\"bold\"")]
    body.append(_rect(LEFT, bar_y, PLOT_W, bar_h, "#f4f4f4", extra=" stroke=\"#bbbbbb\""))
    cursor = 0.0
    for n, item in enumerate(items):
        colour = PALETTE[n % len(PALETTE)]
        x0, x1 = x(cursor), x(cursor + float(item.value))
        body.append(_rect(x0, bar_y, x1 - x0, bar_h, colour, cls="item",
                          title=f"{item.name}: {format_bytes(item.value)}",
                          extra=" stroke=\"#ffffff\" stroke-width=\"0.5\""))
        if x1 - x0 >= 7.0 * len(item.name) + 6:
            body.append(_text((x0 + x1) / 2, bar_y + bar_h / 2 + 4, item.name, anchor="middle",
                              extra=" fill=\"#ffffff\""))
        cursor += float(item.value)
    body += _marker(x(memory.usable_bytes_per_gpu), bar_y, bar_h,
                    f"usable {format_bytes(memory.usable_bytes_per_gpu)}", dashed=True, above=True)
    body += _marker(x(memory.hbm_bytes_per_gpu), bar_y, bar_h,
                    f"HBM {format_bytes(memory.hbm_bytes_per_gpu)}", dashed=False, above=False)
    body.append(_text(LEFT, bar_y + bar_h + 34, f"total {format_bytes(memory.total_bytes_per_gpu)} per GPU"))
    legend_top = bar_y + bar_h + 58
    body += _memory_legend(items, legend_top)
    rows = -(-len(items) // 3) if items else 0
    return _document(width, legend_top + rows * 20 + 12, title, body)


def _marker(px: float, y: float, h: float, label: str, *, dashed: bool, above: bool) -> list[str]:
    dash = " stroke-dasharray=\"5,3\"" if dashed else ""
    line = (f"<line x1=\"{_f(px)}\" y1=\"{_f(y - 8)}\" x2=\"{_f(px)}\" y2=\"{_f(y + h + 8)}\" "
            f"stroke=\"#222222\" stroke-width=\"1.5\"{dash}/>")
    ty = y - 12 if above else y + h + 20
    return [line, _text(px, ty, label, anchor="end")]


def _memory_legend(items: Sequence[LineItem], top: float) -> list[str]:
    out = []
    col_w = PLOT_W / 3
    for n, item in enumerate(items):
        cx = LEFT + (n % 3) * col_w
        cy = top + (n // 3) * 20
        out.append(_rect(cx, cy - 10, 12, 12, PALETTE[n % len(PALETTE)]))
        out.append(_text(cx + 16, cy, f"{item.name} {format_bytes(item.value)}"))
    return out
