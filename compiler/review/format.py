"""Render ``ArtifactDiff``s: Terraform-like text, a Markdown pull-request comment, or JSON.

Only formatting lives here; every number and verdict was computed by compiler.review.plans.
"""
from __future__ import annotations

import re
from typing import Sequence

from compiler.review.plans import ArtifactDiff, FileChange, InputChange, KeyChange, SummaryChange
from compiler.output import to_json

FORMATS = ("text", "markdown", "json")
_SYMBOL = {"add": "+", "change": "~", "remove": "-", "same": "="}
_VERB = {"add": "added", "change": "changed", "remove": "removed", "same": "unchanged"}


def format_diff(diffs: ArtifactDiff | Sequence[ArtifactDiff], fmt: str = "text", *, unified: bool = False) -> str:
    """Text (Terraform-like), Markdown (a pull-request comment) or JSON (sorted keys)."""
    if isinstance(diffs, ArtifactDiff):
        diffs = [diffs]
    if fmt == "text":
        return format_text(diffs, unified=unified)
    if fmt == "markdown":
        return format_markdown(diffs, unified=unified)
    if fmt == "json":
        return format_json(diffs, unified=unified)
    raise ValueError(f"unknown diff format {fmt!r}; choose from {', '.join(FORMATS)}")


# --------------------------------------------------------------------------- shared


def totals(diffs: Sequence[ArtifactDiff]) -> dict[str, int]:
    out = {"specs": len(diffs), "specs_changed": sum(d.changed for d in diffs),
           "add": 0, "change": 0, "remove": 0, "same": 0}
    for d in diffs:
        for action, n in d.counts().items():
            out[action] += n
    return out


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def summary_line(diffs: Sequence[ArtifactDiff]) -> str:
    t = totals(diffs)
    return (f"{_plural(t['specs_changed'], 'spec')} changed, {_plural(t['change'], 'file')} changed, "
            f"{t['add']} added, {t['remove']} removed.")


def _line_counts(f: FileChange) -> str:
    if f.kind == "plan" and f.action == "change":
        return "see the summary"  # its line counts churn with every estimate field; the summary is the point
    if f.action == "add":
        return f"+{f.lines_added} line{'' if f.lines_added == 1 else 's'}"
    if f.action == "remove":
        return f"-{f.lines_removed} line{'' if f.lines_removed == 1 else 's'}"
    return f"+{f.lines_added} -{f.lines_removed} lines"


def _value(v: str) -> str:
    return v if v != "" else "(flag)"


def _key_text(k: KeyChange) -> str:
    if k.op == "~":
        return f"~ {k.key}: {_value(k.old or '')} -> {_value(k.new or '')}"
    value = k.new if k.op == "+" else k.old
    return f"{k.op} {k.key}" + (f": {value}" if value else "")


def _status_note(d: ArtifactDiff) -> str:
    if d.status == "added":
        return "new: no old version"
    if d.status == "removed":
        return "removed: no new version"
    return ""


# --------------------------------------------------------------------------- text


def format_text(diffs: Sequence[ArtifactDiff], *, unified: bool = False) -> str:
    lines: list[str] = []
    for d in diffs:
        lines += _text_one(d, unified=unified)
    lines.append(f"Diff: {summary_line(diffs)}")
    return "\n".join(lines) + "\n"


def _row_text(row: SummaryChange) -> str:
    if row.old is None or row.new is None:
        return str(row.new if row.old is None else row.old)  # the side that has a plan
    if row.key == "layout":
        return row.change or f"{row.old} -> {row.new}"
    old, _, old_of = row.old.partition(" of ")
    new, _, new_of = row.new.partition(" of ")
    if old_of and old_of == new_of:  # memory: "37.2 GiB -> 24.9 GiB of 76.0 GiB"
        return f"{old} -> {new} of {new_of}" + (f" ({row.change})" if row.change else "")
    return f"{row.old} -> {row.new}" + (f" ({row.change})" if row.change else "")


def input_text(change: InputChange) -> str:
    if change.old is None:
        return f"{change.key}: {change.new} (added)"
    if change.new is None:
        return f"{change.key}: {change.old} (removed)"
    return f"{change.key}: {change.old} -> {change.new}"


def _text_one(d: ArtifactDiff, *, unified: bool) -> list[str]:
    lines = [f"{d.title}: {d.name}"]
    one_sided = d.status in ("added", "removed") or bool(d.old_error or d.new_error)
    rows = [r for r in d.summary if one_sided or r.changed]
    width = max([len(r.label) for r in rows] + [len("spec")])
    lines += [f"  {'spec'.ljust(width)}  {input_text(c)}" for c in d.inputs]  # what changed in the input
    if not d.changed:
        return lines + ["  no changes"]
    if _status_note(d):
        lines.append(f"  {_status_note(d)}")
    for r in rows:
        lines.append(f"  {r.label.ljust(width)}  {_row_text(r)}")
    if d.summary and not one_sided and not d.plan_changed:
        layout = next(r for r in d.summary if r.key == "layout")
        lines.append(f"  plan unchanged: {layout.new}")
    for w in d.warnings:
        lines.append(f"  ! {w}")
    for f in d.files:
        if f.action == "same":
            continue
        counts = "" if f.kind == "plan" and f.key_changes else f" ({_line_counts(f)})"
        lines.append(f"  {_SYMBOL[f.action]} {f.path}{counts}")
        lines += [f"      {_key_text(k)}" for k in f.key_changes]
        if unified and f.unified:
            lines += [f"      {line}" for line in f.unified.rstrip("\n").split("\n")]
    return lines


# --------------------------------------------------------------------------- Markdown

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<|])")


def md_escape(text: str) -> str:
    return _MD_SPECIAL.sub(r"\\\1", text).replace("\n", " ")


def md_code(text: str) -> str:
    """An inline code span that is safe in a table cell."""
    if text == "":
        return ""
    ticks = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (ticks + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text.replace('|', chr(92) + '|').replace(chr(10), ' ')}{pad}{fence}"


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`{3,}", text)), default=2)
    return "`" * (longest + 1)


def format_markdown(diffs: Sequence[ArtifactDiff], *, unified: bool = False) -> str:
    parts: list[str] = [] if diffs else ["No changed specs to compare."]
    for d in diffs:
        parts.append(_md_one(d, unified=unified))
    parts.append(f"**Diff:** {summary_line(diffs)}")
    return "\n\n".join(p.strip("\n") for p in parts) + "\n"


def _md_one(d: ArtifactDiff, *, unified: bool) -> str:
    out = [f"### {md_escape(d.title)}: {md_escape(d.name)}"]
    if d.inputs:
        out.append("**Spec:** " + "; ".join(
            f"{md_code(c.key)} " + (f"{md_code(c.new or '')} (added)" if c.old is None else
                                    f"{md_code(c.old)} (removed)" if c.new is None else
                                    f"{md_code(c.old)} → {md_code(c.new)}") for c in d.inputs))
    if not d.changed:
        out.append("No changes.")
        return "\n\n".join(out)
    if _status_note(d):
        out.append(f"_{md_escape(_status_note(d))}_")
    one_sided = d.status != "changed" or bool(d.old_error or d.new_error)
    rows = [r for r in d.summary if one_sided or d.plan_changed or r.changed]
    if rows:
        table = ["| | old | new | change |", "| --- | --- | --- | --- |"]
        for r in rows:
            show = md_code if r.key == "layout" else md_escape
            cells = [md_escape(r.label), show(r.old) if r.old is not None else "-",
                     show(r.new) if r.new is not None else "-", md_escape(r.change)]
            if r.changed and r.old is not None and r.new is not None:
                cells[0] = f"**{cells[0]}**"
            table.append("| " + " | ".join(cells) + " |")
        out.append("\n".join(table))
    if d.summary and not one_sided and not d.plan_changed:
        layout = next(r for r in d.summary if r.key == "layout")
        out.append(f"Plan unchanged: {md_code(layout.new or '')}")
    if d.warnings:
        out.append("\n".join(f"- ⚠️ {md_escape(w)}" for w in d.warnings))
    changed = [f for f in d.files if f.action != "same"]
    if changed:
        c = d.counts()
        out.append(f"**Files:** {c['change']} changed, {c['add']} added, {c['remove']} removed")
    bullets: list[str] = []
    for f in changed:
        block = _md_file(f, unified=unified)
        if block is None:
            bullets.append(f"- {md_code(f.path)} {_VERB[f.action]} ({_line_counts(f)})")
        else:
            if bullets:
                out.append("\n".join(bullets))
                bullets = []
            out.append(block)
    if bullets:
        out.append("\n".join(bullets))
    return "\n\n".join(out)


def _md_file(f: FileChange, *, unified: bool) -> str | None:
    body: list[str] = []
    if f.key_changes:
        rows = ["| key | old | new |", "| --- | --- | --- |"]
        for k in f.key_changes:
            rows.append(f"| {md_code(k.key)} | {_md_value(k.old)} | {_md_value(k.new)} |")
        body.append("\n".join(rows))
    if unified and f.unified:
        fence = _fence(f.unified)
        body.append(f"{fence}diff\n{f.unified.rstrip(chr(10))}\n{fence}")
    if not body:
        return None
    n = len(f.key_changes)
    what = [f"{_plural(n, 'key')} changed"] if n else []
    counts = [] if f.kind == "plan" and n else [_line_counts(f)]
    summary = f"<code>{_html(f.path)}</code> {_VERB[f.action]} ({', '.join(what + counts)})"
    return "\n\n".join([f"<details><summary>{summary}</summary>", *body, "</details>"])


def _md_value(v: str | None) -> str:
    if v is None:
        return "_absent_"
    if v == "":
        return "_flag_"
    return md_code(v)


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# --------------------------------------------------------------------------- JSON


def format_json(diffs: Sequence[ArtifactDiff], *, unified: bool = False) -> str:
    t = totals(diffs)
    return to_json({
        "diffs": [d.to_dict(unified=unified) for d in diffs],
        "summary": {"specs": t["specs"], "specs_changed": t["specs_changed"], "files_added": t["add"],
                    "files_changed": t["change"], "files_removed": t["remove"], "files_unchanged": t["same"]},
    })
