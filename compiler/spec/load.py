"""Read a spec file with positions, so every error can point at file:line:column.

This module and ``artifacts.write_artifacts`` are the only places that touch the
disk. YAML is read with ruamel.yaml's round-trip parser (which keeps line and
column of every key and value); duplicate keys, custom tags, alias bombs, deep
nesting and non-UTF-8 bytes are refused with a located error.
"""
from __future__ import annotations

import datetime
import difflib
import functools
import io
import os
import re
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq, CommentedSet, TaggedScalar
from ruamel.yaml.composer import ReusedAnchorWarning
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import (AliasEvent, DocumentStartEvent, MappingEndEvent, MappingStartEvent, ScalarEvent,
                                SequenceEndEvent, SequenceStartEvent)
from ruamel.yaml.parser import RoundTripParser
from ruamel.yaml.reader import ReaderError

from compiler.errors import Diagnostic, Location, SpecError
from compiler.spec.models import Spec

# Guards that keep one spec well under a second and a few MB, whatever it holds (the pure-Python
# YAML scanner costs ~0.1 ms per token and is quadratic in flow-collection depth).
MAX_SPEC_BYTES = 128 * 1024  # a spec is a page of YAML
MAX_SPEC_LINES = 10_000
MAX_EVENTS = 2_000  # YAML parse events (scalars, collection starts/ends, aliases) before construction
MAX_ALIASES = 100  # each alias may copy a whole mapping (merge keys: `<<: [*a, *a, ...]`)
MAX_DIAGNOSTICS = 50
MAX_NODES = 20_000  # alias-bomb guard: nodes after alias expansion
MAX_DEPTH = 32

Path_ = tuple[str | int, ...]
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class SourceMap:
    """Where each key and value of a spec sits in its file (1-based line/column)."""

    path: str
    text: str
    keys: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    values: dict[Path_, tuple[int, int]] = field(default_factory=dict)

    @functools.cached_property
    def _rows(self) -> list[str]:
        rows = _LINE_BREAK.split(self.text)  # YAML's line breaks only (str.splitlines also splits on \x0c, \x85...)
        return rows[:-1] if rows and rows[-1] == "" else rows  # as splitlines: no row after a final break

    def line(self, n: int) -> str | None:
        rows = self._rows
        return rows[n - 1] if 1 <= n <= len(rows) else None

    def locate(self, loc: Path_, *, prefer_key: bool = False) -> Location:
        """The best position for ``loc``: the value, else its key, else the nearest parent."""
        for cut in range(len(loc), -1, -1):
            sub = tuple(loc[:cut])
            order = (self.keys, self.values) if (prefer_key or cut < len(loc)) else (self.values, self.keys)
            for table in order:
                if sub in table:
                    line, col = table[sub]
                    return Location(self.path, line, col, self._token_end(line, col))
        return Location(self.path, 1, 1)

    def _token_end(self, line: int, col: int) -> int:
        row = self.line(line) or ""
        rest = row[col - 1:]
        cut = rest.find(" #")
        if cut >= 0:
            rest = rest[:cut]
        rest = rest.rstrip()
        if rest.endswith(":") and ": " not in rest:
            rest = rest[:-1]
        elif ": " in rest and not rest.startswith(("'", '"')):
            rest = rest.split(": ", 1)[0]
        return col + max(1, len(rest))

    def diagnostic(self, loc: Path_, summary: str, hint: str = "", *, detail: str = "",
                   prefer_key: bool = False, code: str = "") -> Diagnostic:
        where = self.locate(loc, prefer_key=prefer_key)
        return Diagnostic(summary=summary, location=where, hint=hint, detail=detail,
                          source_line=self.line(where.line) if where.line else None, code=code)

    def error(self, loc: Path_, summary: str, hint: str = "", **kw: Any) -> SpecError:
        return SpecError(self.diagnostic(loc, summary, hint, **kw))


@dataclass(frozen=True)
class LoadedSpec:
    """A validated spec and the source map it came from."""

    spec: Spec
    source: SourceMap
    sha256: str


def load_spec(path: str | Path) -> LoadedSpec:
    """Read, parse and validate a spec file. Raises ``SpecError`` (located) on any problem."""
    return load_spec_bytes(read_spec_bytes(path), str(path))


def read_spec_bytes(path: str | Path) -> bytes:
    """A spec file's bytes, read safely: a regular file (not a FIFO that blocks, a device, a socket),
    at most MAX_SPEC_BYTES, not a symbolic link out of its folder, with a UTF-8 name."""
    p = Path(path)
    shown = str(path)
    if _SURROGATE.search(shown):  # bytes that are not UTF-8 in the file name (surrogate escapes)
        raise SpecError(Diagnostic(summary="the spec's file name is not valid UTF-8",
                                   location=Location(shown), hint="rename the file (its name reaches every artifact)"))
    try:
        _check_link(p, shown)
        # O_NONBLOCK: opening a FIFO must not wait for a writer; O_NOCTTY: nor adopt a terminal
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if stat.S_ISDIR(mode):
                raise SpecError(Diagnostic(summary=f"expected a spec file, got a directory: {shown}",
                                           hint="pass a .yaml file, e.g. specs/70b.yaml"))
            if not stat.S_ISREG(mode):
                kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode)
                        or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
                raise SpecError(Diagnostic(summary=f"expected a spec file, got {kind}: {shown}",
                                           location=Location(shown), hint="save the spec to a file and pass that"))
            size = os.fstat(f.fileno()).st_size
            if size > MAX_SPEC_BYTES:
                raise SpecError(Diagnostic(summary=f"spec file is too large ({size} bytes, at most {MAX_SPEC_BYTES})",
                                           location=Location(shown), hint="a spec is a page of YAML"))
            data = f.read(MAX_SPEC_BYTES + 1)  # bounded, whatever the size said
        if len(data) > MAX_SPEC_BYTES:
            raise SpecError(Diagnostic(summary=f"spec file is too large (more than {MAX_SPEC_BYTES} bytes)",
                                       location=Location(shown), hint="a spec is a page of YAML"))
    except OSError as exc:
        raise SpecError(Diagnostic(summary=f"cannot read spec: {exc.strerror or exc}", location=Location(shown),
                                   hint="check the path")) from None
    return data


def _check_link(p: Path, shown: str) -> None:
    """A spec that is a symbolic link is read only if it points inside its own folder or the working
    folder: a committed ``specs/x.yaml -> /etc/passwd`` would print the file's lines in errors."""
    if not p.is_symlink():
        return
    target = p.resolve()
    for root in (p.parent.resolve(), Path.cwd().resolve()):
        if target == root or root in target.parents:
            return
    raise SpecError(Diagnostic(
        summary=f"the spec is a symbolic link to a file outside its folder: {shown} -> {os.readlink(p)}",
        location=Location(shown), detail="dtc does not follow links out of the repository",
        hint="copy the spec into the repository, or pass the file itself"))


def load_spec_bytes(data: bytes, path: str) -> LoadedSpec:
    import hashlib

    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(Diagnostic(summary=f"spec is too large ({len(data)} bytes, at most {MAX_SPEC_BYTES})",
                                   location=Location(path, 1), hint="a spec is a page of YAML"))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        shown = data.splitlines()[line - 1].decode("utf-8", errors="replace") if data.splitlines() else None
        raise SpecError(Diagnostic(
            summary=f"spec must be UTF-8 text, got byte 0x{data[exc.start]:02x}",
            location=Location(path, line, col, col + 1), hint="save the file as UTF-8",
            source_line=shown)) from None
    return load_spec_text(text, path, sha256=hashlib.sha256(data).hexdigest())


def load_spec_text(text: str, path: str = "<spec>", *, sha256: str | None = None) -> LoadedSpec:
    import hashlib

    if sha256 is None:
        sha256 = hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(Diagnostic(summary=f"spec is too large ({len(text)} characters, at most {MAX_SPEC_BYTES})",
                                   location=Location(path, 1), hint="a spec is a page of YAML"))
    lines = len(_LINE_BREAK.findall(text)) + 1
    if lines > MAX_SPEC_LINES:
        raise SpecError(Diagnostic(summary=f"spec is too long ({lines} lines, at most {MAX_SPEC_LINES})",
                                   location=Location(path, MAX_SPEC_LINES + 1), hint="a spec is a page of YAML"))
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise SpecError(Diagnostic(summary="spec contains a NUL character", location=Location(path, line),
                                   hint="save the file as plain UTF-8 text"))
    source = SourceMap(path=path, text=text)
    _check_flow_depth(text, source)
    raw = _parse_yaml(text, source)
    data = _to_plain(raw, (), source, _Budget(), 0)
    if data is None:
        raise SpecError(source.diagnostic((), "spec is empty", "start from an example in specs/"))
    if not isinstance(data, dict):
        raise SpecError(source.diagnostic((), f"a spec must be a mapping of keys, got {_kind(data)}",
                                          "start from an example in specs/"))
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(validation_diagnostics(exc, data, source)) from None
    return LoadedSpec(spec=spec, source=source, sha256=sha256)


def load_spec_data(data: dict[str, Any], path: str = "<data>") -> LoadedSpec:
    """A spec given as data (the mapping its YAML would parse to), validated exactly like a file; a
    SpecError names the field (there is no line to point at). What code that builds a Problem uses
    instead of writing YAML (compiler.problem.problem_from_data)."""
    import hashlib
    import json

    source = SourceMap(path=path, text="")
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(validation_diagnostics(exc, data, source)) from None
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, default=str)
    return LoadedSpec(spec=spec, source=source, sha256=hashlib.sha256(text.encode("utf-8")).hexdigest())


# --------------------------------------------------------------------------- YAML


class _Limit(Exception):
    """Raised from inside the YAML parser when a spec nests too deeply or holds too much."""

    def __init__(self, summary: str, hint: str, mark: Any, *, whole_token: bool = False):
        super().__init__(summary)
        self.summary, self.hint, self.mark, self.whole_token = summary, hint, mark, whole_token


class _GuardedParser(RoundTripParser):
    """ruamel's round-trip parser, refusing what the constructor should never see.

    The composer recurses once per nesting level and the scanner is quadratic in flow
    depth, so depth is cut here, before either gets far; events and aliases are counted
    so that a spec of many tiny values (or of merge keys copying one mapping again and
    again) cannot take seconds. Tags and non-scalar keys are refused here too: ruamel's
    constructors for ``!!set 1`` or a mapping used as a key fail with TypeError and
    AttributeError, not with a YAML error.
    """

    def __init__(self, loader: Any) -> None:
        super().__init__(loader)
        self.dtc_events = 0
        self.dtc_aliases = 0
        self.dtc_documents: list[Any] = []
        self.dtc_stack: list[list[int]] = []  # per open collection: [is_mapping, children so far]
        self.dtc_open_anchors: list[str | None] = []  # per open collection: its anchor

    def get_event(self) -> Any:
        event = super().get_event()
        self.dtc_events += 1
        if self.dtc_events > MAX_EVENTS:
            raise _Limit(f"spec holds too many values (more than {MAX_EVENTS} YAML nodes)",
                         "a spec is a page of YAML", event.start_mark)
        if isinstance(event, AliasEvent):  # counted before _node: an alias is a node too
            self.dtc_aliases += 1
            if self.dtc_aliases > MAX_ALIASES:
                raise _Limit(f"spec uses more than {MAX_ALIASES} aliases (an alias bomb?)",
                             "write the values out instead of referring to anchors", event.start_mark,
                             whole_token=True)
            if event.anchor in self.dtc_open_anchors:  # `a: &a {<<: *a}`: ruamel's merge crashes on it
                raise _Limit(f"alias *{event.anchor} refers to the mapping or list that defines it (a value "
                             "cannot contain itself)", "refer to a finished anchor, or write the values out",
                             event.start_mark, whole_token=True)
        if isinstance(event, (ScalarEvent, AliasEvent, MappingStartEvent, SequenceStartEvent)):
            self._node(event)
        elif isinstance(event, (MappingEndEvent, SequenceEndEvent)):
            if self.dtc_stack:
                self.dtc_stack.pop()
                self.dtc_open_anchors.pop()
        elif isinstance(event, DocumentStartEvent):
            self.dtc_documents.append(event.start_mark)
        return event

    def _node(self, event: Any) -> None:
        tag = getattr(event, "tag", None)
        tag = getattr(tag, "value", tag)  # ruamel >= 0.18 may wrap tags in a Tag object
        if tag:
            shown = str(tag).replace("tag:yaml.org,2002:", "!!")
            raise _Limit(f"YAML tags are not allowed, got {shown}", "remove the tag; write the plain value",
                         event.start_mark, whole_token=True)
        parent = self.dtc_stack[-1] if self.dtc_stack else None
        if parent is not None:
            if parent[0] and parent[1] % 2 == 0 and not isinstance(event, ScalarEvent):
                what = "an alias" if isinstance(event, AliasEvent) else (
                    "a mapping" if isinstance(event, MappingStartEvent) else "a list")
                raise _Limit(f"keys must be strings, got {what}", "quote the key", event.start_mark)
            parent[1] += 1
        if isinstance(event, (MappingStartEvent, SequenceStartEvent)):
            if len(self.dtc_stack) >= MAX_DEPTH:
                raise _Limit(f"spec nests deeper than {MAX_DEPTH} levels", "flatten the structure", event.start_mark)
            self.dtc_stack.append([int(isinstance(event, MappingStartEvent)), 0])
            self.dtc_open_anchors.append(getattr(event, "anchor", None))


_FLOW_CHARS = re.compile(r"[\[\]{}\"'#\n]")


def _check_flow_depth(text: str, source: SourceMap) -> None:
    """Refuse `[[[[...` beyond MAX_DEPTH before the scanner, which is quadratic in flow depth, sees it.

    A cheap over-approximation of YAML: brackets inside quotes and comments are skipped, and
    any other bracket counts, so it can only ever stop a spec that also nests too deeply or
    holds dozens of unbalanced brackets in a plain string.
    """
    depth, quote, comment = 0, "", False
    for m in _FLOW_CHARS.finditer(text):
        ch, at = m.group(), m.start()
        if comment:
            comment = ch != "\n"
        elif quote:
            quote = "" if ch == quote else quote
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise _located(source, _offset_location(source, at), f"spec nests deeper than {MAX_DEPTH} levels",
                               "flatten the structure")
        elif ch in "]}":
            depth = max(0, depth - 1)
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (at == 0 or text[at - 1] in " \t\n"):
            comment = True


def _mark_location(source: SourceMap, mark: Any) -> Location:
    if mark is None:
        return Location(source.path, 1)
    return Location(source.path, mark.line + 1, mark.column + 1)


def _offset_location(source: SourceMap, offset: int) -> Location:
    offset = max(0, min(offset, len(source.text)))
    breaks = list(_LINE_BREAK.finditer(source.text, 0, offset))
    line = len(breaks) + 1
    col = offset - (breaks[-1].end() if breaks else 0) + 1
    return Location(source.path, line, col, col + 1)


def _located(source: SourceMap, loc: Location, summary: str, hint: str) -> SpecError:
    return SpecError(Diagnostic(summary=summary, location=loc, hint=hint,
                                source_line=source.line(loc.line) if loc.line else None))


def _parse_yaml(text: str, source: SourceMap) -> Any:
    yaml = YAML(typ="rt", pure=True)
    yaml.allow_duplicate_keys = False
    yaml.Parser = _GuardedParser
    try:
        with warnings.catch_warnings():
            # YAML lets an anchor be redefined (the later one wins); ruamel warns on stderr.
            warnings.simplefilter("ignore", ReusedAnchorWarning)
            docs = list(yaml.load_all(io.StringIO(text)))
    except _Limit as exc:
        loc = _mark_location(source, exc.mark)
        if exc.whole_token and loc.line is not None and loc.column is not None:
            loc = Location(loc.path, loc.line, loc.column, source._token_end(loc.line, loc.column))
        raise _located(source, loc, exc.summary, exc.hint) from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = (exc.problem or exc.context or "invalid YAML").strip()
        hint = "check indentation, colons and quotes on this line"
        if "duplicate key" in str(exc):
            found = re.search(r'duplicate key "([^"]*)"', str(exc))
            problem = f"duplicate key '{found.group(1) if found else '?'}'"
            hint = "each key may appear once in a mapping; remove one of them"
            mark = exc.problem_mark or mark
        if mark is not None and exc.context_mark is not None and source.line(mark.line + 1) is None:
            mark = exc.context_mark  # the problem is at end of file: point at where the construct began
            problem = f"{(exc.context or '').strip()}: {problem}".strip(": ")
        raise _located(source, _mark_location(source, mark), f"invalid YAML: {problem}", hint) from None
    except ReaderError as exc:
        char = exc.character if isinstance(exc.character, int) else 0
        what = f"character U+{char:04X}" if char else "character"
        raise _located(source, _offset_location(source, exc.position or 0),
                       f"invalid YAML: {what} is not allowed in YAML ({exc.reason})",
                       "remove control characters; write them as escapes in a double-quoted string") from None
    except YAMLError as exc:
        raise _located(source, _mark_location(source, getattr(exc, "problem_mark", None)),
                       f"invalid YAML: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                       "check the file's syntax") from None
    except (ValueError, OverflowError):
        # ruamel converts scalars with int()/float(): a 5000-digit number exceeds Python's limit.
        found = re.search(r"[-+]?[0-9][0-9_]{99,}", text)
        loc = _offset_location(source, found.start()) if found else Location(source.path, 1)
        raise _located(source, loc, "invalid YAML: a number is too long to read",
                       "write large numbers with a unit, e.g. 15T") from None
    except RecursionError:
        raise _located(source, Location(source.path, 1), "invalid YAML: nested too deeply",
                       f"a spec nests at most {MAX_DEPTH} levels") from None
    if len(docs) > 1:
        marks = getattr(yaml.parser, "dtc_documents", [])
        loc = _mark_location(source, marks[1]) if len(marks) > 1 else Location(source.path, 1)
        raise _located(source, loc, f"a spec file holds one YAML document, got {len(docs)}",
                       "remove the '---' separators")
    return docs[0] if docs else None


_SURROGATE = re.compile("[\ud800-\udfff]")


class _Budget:
    def __init__(self) -> None:
        self.nodes = 0


def _kind(value: Any) -> str:
    from collections.abc import Mapping

    for kind, word in ((bool, "a boolean"), (Mapping, "a mapping"), (list, "a list"), (tuple, "a list"),
                       (str, "a string"), (int, "a number"), (float, "a number"), (type(None), "null")):
        if isinstance(value, kind):
            return word
    return type(value).__name__


def _tag_of(node: Any) -> str | None:
    tag = getattr(node, "tag", None)
    value = getattr(tag, "value", tag)
    return value if isinstance(value, str) and value else None


def _to_plain(node: Any, path: Path_, source: SourceMap, budget: _Budget, depth: int) -> Any:
    """ruamel round-trip nodes -> plain dict/list/scalars, recording positions."""
    budget.nodes += 1
    if budget.nodes > MAX_NODES:
        raise source.error(path, f"spec expands to more than {MAX_NODES} values (an alias bomb?)",
                           "do not nest aliases of aliases")
    if depth > MAX_DEPTH:
        raise source.error(path, f"spec nests deeper than {MAX_DEPTH} levels", "flatten the structure")
    tag = _tag_of(node)
    if isinstance(node, TaggedScalar) or tag:
        shown = (tag or "!").replace("tag:yaml.org,2002:", "!!")
        raise source.error(path, f"YAML tags are not allowed, got {shown}", "remove the tag; write the plain value")
    if isinstance(node, CommentedMap):
        out: dict[str, Any] = {}
        for key in node:
            if not isinstance(key, str) or isinstance(key, bool):
                pos = _pos(node, key, "key")
                if pos:
                    source.keys[path + (str(key),)] = pos
                shown = f" {_show(key)}" if isinstance(key, (bool, int, float)) else ""
                raise source.error(path + (str(key),), f"keys must be strings, got {_kind(key)}{shown}",
                                   "quote the key", prefer_key=True)
            key_s = str(key)
            if _SURROGATE.search(key_s):
                raise source.error(path, "key is not valid Unicode (a lone surrogate escape such as \\ud800)",
                                   "write the character itself")
            kpos, vpos = _pos(node, key, "key"), _pos(node, key, "value")
            if kpos:
                source.keys[path + (key_s,)] = kpos
            if vpos:
                source.values[path + (key_s,)] = vpos
            elif kpos:
                source.values.setdefault(path + (key_s,), kpos)
            out[key_s] = _to_plain(node[key], path + (key_s,), source, budget, depth + 1)
        return out
    if isinstance(node, CommentedSeq):
        items = []
        for i, item in enumerate(node):
            try:
                line, col = node.lc.item(i)
                source.values[path + (i,)] = (line + 1, col + 1)
            except (KeyError, IndexError, TypeError, AttributeError):
                pass
            items.append(_to_plain(item, path + (i,), source, budget, depth + 1))
        return items
    if isinstance(node, bool):
        return bool(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        text = str(node)
        if _SURROGATE.search(text):  # "\ud800" in a double-quoted scalar: not writable as UTF-8
            raise source.error(path, "string is not valid Unicode (a lone surrogate escape such as \\ud800)",
                               "write the character itself, or a \\U escape of a real code point")
        return text
    if isinstance(node, (datetime.date, datetime.datetime)):
        return node.isoformat()
    if node is None:
        return None
    if isinstance(node, (set, frozenset, CommentedSet)):
        raise source.error(path, "YAML sets are not allowed", "use a list")
    raise source.error(path, f"unsupported YAML value of type {type(node).__name__}", "write a plain value")


def _pos(node: CommentedMap, key: Any, which: str) -> tuple[int, int] | None:
    try:
        line, col = node.lc.key(key) if which == "key" else node.lc.value(key)
        return line + 1, col + 1
    except (KeyError, TypeError, AttributeError):
        return None


# --------------------------------------------------------------------------- pydantic -> diagnostics

_TYPE_WORDS = {
    "int_type": "a whole number", "int_parsing": "a whole number", "int_from_float": "a whole number",
    "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
    "bool_parsing": "true or false", "string_type": "a string", "list_type": "a list",
    "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
}


def _model_at(loc: Path_) -> type[BaseModel] | None:
    """The pydantic model class that owns the mapping at ``loc`` (None past lists/dicts)."""
    model: type[BaseModel] | None = Spec
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        model = _submodel(model.model_fields[part].annotation)
    return model


def _submodel(annotation: Any) -> type[BaseModel] | None:
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _submodel(arg)
        if found is not None:
            return found
    return None


def _normalise(loc: tuple, data: Any) -> Path_:
    """Drop pydantic's union-member tags from ``loc``, keeping only real data keys/indices."""
    out: list[str | int] = []
    cur = data
    for part in loc:
        if isinstance(cur, dict) and isinstance(part, str) and (part in cur or _is_field(out, part)):
            out.append(part)
            cur = cur.get(part)
        elif isinstance(cur, list) and isinstance(part, int):
            out.append(part)
            cur = cur[part] if 0 <= part < len(cur) else None
        elif isinstance(cur, dict) and isinstance(part, str) and "[" not in part and part[:1].islower() and part not in (
                "str", "int", "float", "bool", "list", "dict", "function-after", "function-before") \
                and not part.startswith("constrained-"):
            out.append(part)
            cur = None
    return tuple(out)


def _is_field(prefix: list, name: str) -> bool:
    model = _model_at(tuple(prefix))
    return model is not None and name in model.model_fields


def _dotted(loc: Path_) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "spec"


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else (
        "true" if value is True else "false" if value is False else "null" if value is None else
        "a mapping" if isinstance(value, dict) else "a list" if isinstance(value, list) else str(value))
    return text if len(text) <= 80 else text[:77] + "..."


def validation_diagnostics(exc: ValidationError, data: dict, source: SourceMap) -> list[Diagnostic]:
    grouped: dict[Path_, list[Mapping[str, Any]]] = {}
    for detail in exc.errors(include_url=False):
        grouped.setdefault(_normalise(detail["loc"], data), []).append(detail)
    diags: list[Diagnostic] = []
    seen: set[tuple[Path_, str]] = set()
    parents = {other[:cut] for other in grouped for cut in range(len(other))}
    for loc, errs in grouped.items():
        if all(e["type"] in _TYPE_WORDS for e in errs) and loc in parents:
            continue  # a union member (e.g. a custom GPU mapping) matched and reported deeper errors
        specific = [e for e in errs if e["type"] not in _TYPE_WORDS] or errs
        if len(specific) < len(errs) and all(e["type"] in _TYPE_WORDS for e in errs):
            specific = errs
        if all(e["type"] in _TYPE_WORDS for e in specific) and len(specific) > 1:
            words = sorted({_TYPE_WORDS[e["type"]] for e in specific})
            specific = [dict(specific[0], type="dtc_union", ctx={"words": words})]
        for err in specific:
            diag = _diagnostic_for(err, loc, source)
            key = (loc, diag.summary)
            if key not in seen:
                seen.add(key)
                diags.append(diag)
    diags.sort(key=lambda d: (d.location.line or 0, d.location.column or 0) if d.location else (0, 0))
    if len(diags) > MAX_DIAGNOSTICS:
        rest = len(diags) - MAX_DIAGNOSTICS + 1
        diags = diags[:MAX_DIAGNOSTICS - 1] + [Diagnostic(
            summary=f"... and {rest} more errors", location=diags[MAX_DIAGNOSTICS - 1].location,
            hint="fix the errors above first")]
    return diags


def _diagnostic_for(err: Mapping[str, Any], loc: Path_, source: SourceMap) -> Diagnostic:
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    name = _dotted(loc)
    if kind == "extra_forbidden":
        parent = loc[:-1]
        model = _model_at(parent)
        valid = sorted(model.model_fields) if model else []
        guess = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.6)
        hint = f"did you mean '{guess[0]}'?" if guess else f"valid keys here: {', '.join(valid)}"
        where = f"in {_dotted(parent)}" if parent else "at the top level"
        return source.diagnostic(loc, f"unknown key '{loc[-1]}' {where}", hint, prefer_key=True)
    if kind == "missing":
        parent = loc[:-1]
        model = _model_at(parent)
        desc = ""
        if model is not None and loc[-1] in model.model_fields:
            desc = model.model_fields[str(loc[-1])].description or ""
        where = f"in {_dotted(parent)}" if parent else "at the top level"
        return source.diagnostic(parent, f"missing required key '{loc[-1]}' {where}",
                                 f"add {loc[-1]}: ... ({desc.rstrip('.')})" if desc else f"add {loc[-1]}",
                                 prefer_key=True)
    if kind == "dtc_rule":
        field_loc = loc + (ctx["field"],) if ctx.get("field") and (not loc or loc[-1] != ctx["field"]) else loc
        if ctx.get("key") is not None:  # a rule about one entry of a mapping: point at that entry
            field_loc = field_loc + (str(ctx["key"]),)
        return source.diagnostic(field_loc, f"{_dotted(field_loc)}: {err['msg']}, got {_show(ctx.get('value'))}",
                                 ctx.get("hint", ""), prefer_key=bool(ctx.get("at_key")))
    if kind == "dtc_unit":
        return source.diagnostic(loc, f"{name} must be {ctx['kind']}, got {_show(value)}", f"write {ctx['expected']}")
    if kind == "dtc_int":
        return source.diagnostic(loc, f"{name} must be a whole number, got {_show(value)}", "write e.g. 8")
    if kind == "dtc_union":
        return source.diagnostic(loc, f"{name} must be {' or '.join(ctx['words'])}, got {_show(value)}",
                                 _field_hint(loc))
    if kind == "literal_error":
        expected = ctx.get("expected", "")
        choices = [c.strip(" '") for c in expected.replace(" or ", ", ").split(",") if c.strip()]
        guess = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.5)
        hint = f"did you mean '{guess[0]}'?" if guess else f"choose one of: {', '.join(choices)}"
        return source.diagnostic(loc, f"{name} must be one of {', '.join(choices)}, got {_show(value)}", hint)
    if kind == "string_pattern_mismatch":
        if isinstance(value, str) and value.startswith("-"):
            return source.diagnostic(loc, f"{name} must not start with '-', got {_show(value)}",
                                     "a value starting with '-' would be read as a command-line option")
        if isinstance(value, str) and value.startswith("~"):
            return source.diagnostic(loc, f"{name} must not start with '~', got {_show(value)}",
                                     "values are quoted in the scripts, so '~' is not expanded: write the full path")
        if isinstance(value, str) and not value:
            return source.diagnostic(loc, f"{name} must not be empty", _field_hint(loc) or "remove the key")
        return source.diagnostic(loc, f"{name} has characters that are not allowed, got {_show(value)}",
                                 "use letters, digits, '.', '_' and '-' (paths may also use '/'); no spaces, "
                                 "quotes, '$', ';', or newlines")
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        bound = next(iter(ctx.values()), "")
        words = {"greater_than_equal": "at least", "greater_than": "greater than",
                 "less_than_equal": "at most", "less_than": "less than"}[kind]
        return source.diagnostic(loc, f"{name} must be {words} {bound}, got {_show(value)}", _field_hint(loc))
    if kind in _TYPE_WORDS:
        return source.diagnostic(loc, f"{name} must be {_TYPE_WORDS[kind]}, got {_show(value)}", _field_hint(loc))
    if kind in ("too_short", "too_long", "string_too_long", "string_too_short"):
        return source.diagnostic(loc, f"{name}: {err['msg'].lower()}, got {_show(value)}", _field_hint(loc))
    return source.diagnostic(loc, f"{name}: {err['msg']}, got {_show(value)}", _field_hint(loc))


def _field_hint(loc: Path_) -> str:
    model = _model_at(loc[:-1]) if loc else None
    if model is not None and isinstance(loc[-1], str) and loc[-1] in model.model_fields:
        desc = model.model_fields[loc[-1]].description or ""
        return f"{loc[-1]}: {desc}" if desc else ""
    return ""
