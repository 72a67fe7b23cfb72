"""User-facing errors and exit codes.

A ``DtcError`` carries one or more ``Diagnostic``s (summary, location, detail,
hint), rendered in the compiler style::

    specs/70b.yaml:14:22: error: tensor_parallel must divide num_attention_heads (64), got 48
       |
    14 |   tensor_parallel: 48
       |                    ^^
      hint: use one of 1, 2, 4, 8

``assert`` is used only for internal invariants; anything else the user can
cause raises a ``DtcError`` subclass. A bug (any other exception) is reported by compiler/cli.py as
INTERNAL ERROR with exit code 3 (``ExitCode.INTERNAL_ERROR``).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class ExitCode(enum.IntEnum):
    """Exit codes of every dtc command (as diff(1): 1 means differences)."""

    OK = 0
    DIFFERENCES = 1
    USER_ERROR = 2
    INTERNAL_ERROR = 3


EXIT_CODES_HELP = (
    "Exit codes: 0 ok / no differences; 1 differences found (check, diff, "
    "compile --check); 2 user error (invalid spec, infeasible, bad usage); "
    "3 internal error (a bug: please report)."
)


def printable(text: object, *, keep_newlines: bool = False) -> str:
    """``text`` safe to show on a terminal or in generated Markdown: every character a terminal or a
    viewer would act on instead of showing is escaped, visibly: C0 and C1 controls (ESC starts colour,
    cursor and OSC 52 clipboard sequences; CR overwrites the line; BEL, NUL), DEL, bidirectional
    overrides and isolates (U+202E), zero-width and other format characters, line and paragraph
    separators, and lone surrogates (a file name that is not UTF-8). The one function every echo of
    user text goes through (issue #16): Diagnostic.render, and the CLI's stdout/stderr while a
    command runs. ``\n``, ``\r``, ``\t`` and other C0 controls become ``\\n``, ``\\r``, ``\\t``,
    ``\\x1b``; everything else ``\\u202e`` (JSON's own escape, so JSON output stays JSON; astral
    characters as a surrogate pair). ``keep_newlines``: text of several lines keeps its line breaks."""
    text = str(text)
    if text.isprintable():
        return text
    out = []
    for ch in text:
        code = ord(ch)
        if ch.isprintable() or (keep_newlines and ch == "\n"):
            out.append(ch)
        elif ch in _C0_NAMES:
            out.append(_C0_NAMES[ch])
        elif code < 0x20:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
    return "".join(out)


_C0_NAMES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shell_command(*words: str) -> str:
    """A command for a person to paste, every word shell-quoted (``shlex.quote``), shown printable:
    check's "Run:" line, the provenance header of every generated file, hints (issue #16: a spec
    named ``a;touch pwned;.yaml`` made "Run: dtc compile specs/a;touch pwned;.yaml")."""
    import shlex

    return " ".join(shlex.quote(printable(word)) for word in words)


@dataclass(frozen=True)
class Location:
    """A place in a source file; line and column are 1-based."""

    path: str
    line: int | None = None
    column: int | None = None
    end_column: int | None = None

    def __str__(self) -> str:
        path = printable(self.path)
        if self.line is None:
            return path
        if self.column is None:
            return f"{path}:{self.line}"
        return f"{path}:{self.line}:{self.column}"


@dataclass(frozen=True)
class Diagnostic:
    summary: str
    location: Location | None = None
    detail: str = ""
    hint: str = ""
    severity: str = "error"
    source_line: str | None = None
    code: str = ""  # a layout rule's reason code (compiler.rules), shown as error[code]

    def render(self) -> str:
        head = f"{self.location}: " if self.location else ""
        kind = f"{self.severity}[{self.code}]" if self.code else self.severity
        lines = [f"{head}{kind}: {printable(self.summary)}"]
        loc = self.location
        if loc is not None and loc.line is not None and self.source_line is not None:
            gutter = str(loc.line)
            pad = " " * len(gutter)
            text, column, width = _window(self.source_line.rstrip(), loc.column, loc.end_column)
            lines.append(f"{pad} |")
            lines.append(f"{gutter} | {text}")
            if column is not None:
                lines.append(f"{pad} | {' ' * (column - 1)}{'^' * width}")
        for extra in self.detail.rstrip("\n").split("\n") if self.detail else ():
            lines.append(f"  {printable(extra)}" if extra else "")
        if self.hint:
            lines.append(f"  hint: {printable(self.hint)}")
        return "\n".join(lines)


_SHOWN_LINE = 120  # longest source excerpt under a diagnostic; longer lines are cut around the column


def _window(text: str, column: int | None, end_column: int | None) -> tuple[str, int | None, int]:
    """(excerpt, column in it, caret width): a long source line cut to the part around ``column``."""
    text = "".join(ch if ch.isprintable() or ch == "\t" else "?" for ch in text)
    width = max(1, (end_column or (column or 0) + 1) - (column or 0)) if column is not None else 1
    if len(text) <= _SHOWN_LINE:
        return text, column, width
    start = 0 if column is None else max(0, column - 1 - _SHOWN_LINE // 3)
    excerpt = text[start:start + _SHOWN_LINE]
    prefix = "..." if start else ""
    suffix = "..." if start + _SHOWN_LINE < len(text) else ""
    if column is None:
        return prefix + excerpt + suffix, None, width
    column = column - start + len(prefix)
    width = max(1, min(width, len(prefix) + len(excerpt) - column + 1))
    return prefix + excerpt + suffix, column, width


class DtcError(Exception):
    """Base of every user-facing error; exits with ``exit_code``."""

    exit_code = ExitCode.USER_ERROR

    def __init__(self, diagnostics: list[Diagnostic] | Diagnostic | str, *, hint: str = ""):
        if isinstance(diagnostics, str):
            diagnostics = [Diagnostic(summary=diagnostics, hint=hint)]
        elif isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics: list[Diagnostic] = list(diagnostics)
        super().__init__(self.render())

    def render(self) -> str:
        body = "\n\n".join(d.render() for d in self.diagnostics)
        n = len(self.diagnostics)
        if n > 1:
            body += f"\n\n{n} errors"
        return body


class SpecError(DtcError):
    """A spec that does not parse, validate or make sense."""


class InfeasibleError(DtcError):
    """No layout satisfies the spec; carries the search summary."""

    def __init__(self, diagnostics, *, summary: object = None, closest: object = None):
        self.summary = summary
        self.closest = closest
        super().__init__(diagnostics)


class RenderError(DtcError):
    """A renderer could not produce an artifact (usually a dtc bug)."""

    exit_code = ExitCode.INTERNAL_ERROR


class ArtifactError(DtcError):
    """Output folders that dtc refuses to touch (hand-edited, outside --out)."""


class SmokeError(DtcError):
    """A smoke run that could not be set up."""
