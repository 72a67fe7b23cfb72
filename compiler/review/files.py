"""One artifact, old -> new: a ``FileChange`` with the keys that changed, line counts, a unified diff.

Artifacts are read as flat {key: value} maps, so that a diff can say which setting changed:

- JSON (ds_config.json): dotted key paths, ``zero_optimization.stage`` -> ``3``;
- shell (megatron_args.sh) and sbatch scripts: the flags of every bash array
  (``MEGATRON_ARGS=(--tensor-model-parallel-size 8 --sequence-parallel ...)``),
  ``#SBATCH`` directives, ``export NAME=value`` and plain assignments, and the
  options of launch lines (srun, torchrun, deepspeed, ``*.py``) keyed by program;
- Python (fsdp_config.py): module-level constants that are literals.

Values are display strings; a bare flag has the value "". Parsing is forgiving:
whatever does not parse yields None (the diff then shows line counts only).
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import json
import re
import shlex
from dataclasses import dataclass
from typing import Any, Literal, Sequence

from compiler.artifacts import MANIFEST, ArtifactSet

# plan.json sections listed key by key under plan.json; the layout and the estimate are
# the semantic summary instead, and provenance/search/alternatives are derived noise.
PLAN_SETTING_SECTIONS = ("name", "description", "targets", "training", "budget", "slurm")
PLAN_DERIVED_SECTIONS = ("layout", "estimate", "alternatives")


@dataclass(frozen=True)
class KeyChange:
    """One key of an artifact: ``old``/``new`` are display strings, None when absent ("" is a bare flag)."""

    key: str
    old: str | None
    new: str | None

    @property
    def op(self) -> str:
        return "+" if self.old is None else "-" if self.new is None else "~"


@dataclass(frozen=True)
class FileChange:
    path: str
    action: str  # add, change, remove, same
    kind: str  # plan, json, shell, sbatch, python, text
    key_changes: tuple[KeyChange, ...] = ()
    lines_added: int = 0
    lines_removed: int = 0
    unified: str = ""


# difflib's matcher is quadratic in the lines that differ: a 1.3 MB plan.json whose numbers all moved (a cost-model
# change) took minutes. Past this many (old x new) differing lines they are replaced as a whole instead (still an
# exact unified diff that patch applies, not a minimal one).
MAX_DIFF_CELLS = 4_000_000
_Opcode = tuple[Literal["replace", "delete", "insert", "equal"], int, int, int, int]


def unified_diff(old: Sequence[str], new: Sequence[str], fromfile: str, tofile: str, *, n: int = 3,
                 lineterm: str = "\n") -> list[str]:
    """difflib.unified_diff's format, in time linear in the lines outside the changed middle: for a big file the
    common first and last lines are set aside before difflib matches the rest; a middle too big for it
    (MAX_DIFF_CELLS) is replaced as a whole. The edit script is always exact, so every hunk's context is the
    file's. Files small enough for difflib get difflib's own diff."""
    if len(old) * len(new) <= MAX_DIFF_CELLS:
        return list(difflib.unified_diff(old, new, fromfile, tofile, n=n, lineterm=lineterm))
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[len(old) - 1 - tail] == new[len(new) - 1 - tail]:
        tail += 1
    a_end, b_end = len(old) - tail, len(new) - tail
    if head == a_end and head == b_end:
        return []
    middle: list[_Opcode]
    if (a_end - head) * (b_end - head) <= MAX_DIFF_CELLS:
        middle = [(tag, i1 + head, i2 + head, j1 + head, j2 + head) for tag, i1, i2, j1, j2 in
                  difflib.SequenceMatcher(None, old[head:a_end], new[head:b_end]).get_opcodes()]
    else:
        whole: Literal["replace", "delete", "insert"] = \
            "replace" if a_end > head and b_end > head else "delete" if a_end > head else "insert"
        middle = [(whole, head, a_end, head, b_end)]
    before: list[_Opcode] = [("equal", 0, head, 0, head)] if head else []
    after: list[_Opcode] = [("equal", a_end, len(old), b_end, len(new))] if tail else []
    codes = before + middle + after
    out = [f"--- {fromfile}{lineterm}", f"+++ {tofile}{lineterm}"]
    for group in _GivenOpcodes(codes).get_grouped_opcodes(n):
        first, last = group[0], group[-1]
        out.append(f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@{lineterm}")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [" " + line for line in old[i1:i2]]
                continue
            out += ["-" + line for line in old[i1:i2]] + ["+" + line for line in new[j1:j2]]
    return out


class _GivenOpcodes(difflib.SequenceMatcher):
    """A matcher whose edit script is given: difflib's own get_grouped_opcodes cuts it into hunks."""

    def __init__(self, codes: list[_Opcode]):
        super().__init__(None, (), ())
        self._codes = codes

    def get_opcodes(self) -> list[_Opcode]:
        return list(self._codes)  # get_grouped_opcodes edits the list it gets


def _range(start: int, stop: int) -> str:
    """difflib's unified range: 'first,length' (1-based), 'first' for one line, 'before,0' for none."""
    length = stop - start
    if length == 1:
        return f"{start + 1}"
    return f"{start if length == 0 else start + 1},{length}"


def file_changes(old: ArtifactSet, new: ArtifactSet, context: int):
    """A FileChange per artifact of either side (new order, then removed files), the manifest skipped."""
    order = list(new.files) + [p for p in old.files if p not in new.files]
    for path in order:
        if path == MANIFEST:
            continue
        yield compare_file(path, old.files.get(path), new.files.get(path), context=context)


def compare_file(path: str, old: str | None, new: str | None, *, context: int = 3) -> FileChange:
    """One artifact, old text -> new text (None: absent on that side)."""
    kind = file_kind(path, new if new is not None else old or "")
    if old == new:
        return FileChange(path, "same", kind)
    action = "add" if old is None else "remove" if new is None else "change"
    old_lines = (old or "").splitlines(keepends=True)
    new_lines = (new or "").splitlines(keepends=True)
    diff = unified_diff(old_lines, new_lines, f"a/{path}" if old is not None else "/dev/null",
                        f"b/{path}" if new is not None else "/dev/null", n=context)
    added = sum(1 for line in diff[2:] if line.startswith("+"))
    removed = sum(1 for line in diff[2:] if line.startswith("-"))
    unified = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in diff)
    keys: tuple[KeyChange, ...] = ()
    if old is not None and new is not None:  # action == "change"
        try:
            if kind == "plan":
                keys = key_changes(_plan_settings(old), _plan_settings(new))
            else:
                keys = key_changes(parse_keys(kind, old), parse_keys(kind, new))
        except (RecursionError, MemoryError):  # a file nested beyond parsing (hand-made): lines only
            keys = ()
    return FileChange(path, action, kind, keys, added, removed, unified)


def explain_plan_json(f: FileChange, old: ArtifactSet, new: ArtifactSet) -> FileChange:
    """plan.json changed but no setting and no summary row did: list what did (e.g. the spec's hash)."""
    if f.kind != "plan" or f.action != "change" or f.key_changes:
        return f
    try:
        keys = key_changes(_plan_settings(old[f.path], exclude=PLAN_DERIVED_SECTIONS),
                           _plan_settings(new[f.path], exclude=PLAN_DERIVED_SECTIONS))
    except (RecursionError, MemoryError):
        return f
    return dataclasses.replace(f, key_changes=keys)


def key_changes(old: dict[str, str] | None, new: dict[str, str] | None) -> tuple[KeyChange, ...]:
    """Changed, added and removed keys, in the order of the new file (removed keys last)."""
    if old is None or new is None:
        return ()
    out = [KeyChange(k, old.get(k), v) for k, v in new.items() if old.get(k) != v]
    out += [KeyChange(k, v, None) for k, v in old.items() if k not in new]
    return tuple(out)


def _plan_settings(text: str, *, exclude: Sequence[str] = ()) -> dict[str, str] | None:
    """plan.json flattened: the setting sections, or (with ``exclude``) everything else but those."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    wanted = [k for k in data if k not in exclude] if exclude else [k for k in PLAN_SETTING_SECTIONS if k in data]
    return flatten_json({k: data[k] for k in wanted})


# --------------------------------------------------------------------------- parsing artifacts into keys

LAUNCHERS = frozenset({"srun", "torchrun", "deepspeed", "python", "python3", "accelerate", "mpirun"})

_ARRAY_START = re.compile(r"(?m)^[ \t]*(?:(?:declare|local)\s+-a\s+)?([A-Za-z_][A-Za-z0-9_]*)\+?=\(")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NUMBER = re.compile(r"-\.?\d")


def file_kind(path: str, text: str = "") -> str:
    name = path.rsplit("/", 1)[-1]
    if name == "plan.json":
        return "plan"
    if name.endswith(".json"):
        return "json"
    if name.endswith(".sbatch"):
        return "sbatch"
    if name.endswith(".sh") or text.startswith(("#!/bin/bash", "#!/usr/bin/env bash", "#!/bin/sh")):
        return "shell"
    if name.endswith(".py"):
        return "python"
    return "text"


def parse_keys(kind: str, text: str | None) -> dict[str, str] | None:
    if text is None:
        return None
    if kind == "json":
        try:
            return flatten_json(json.loads(text))
        except (ValueError, RecursionError):
            return None
    if kind in ("shell", "sbatch"):
        return shell_keys(text)
    if kind == "python":
        return python_keys(text)
    return None


# --------------------------------------------------------------------------- JSON


def _show_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _join(prefix: str, key: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_-]+", key):
        return f"{prefix}.{key}" if prefix else key
    return f"{prefix}[{json.dumps(key, ensure_ascii=False)}]"


def flatten_json(data: Any, prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}, "c": [1, 2], "d": [{"e": 1}]} -> {"a.b": "1", "c": "[1, 2]", "d[0].e": "1"}."""
    out: dict[str, str] = {}
    if isinstance(data, dict) and data:
        for key in sorted(data):
            out.update(flatten_json(data[key], _join(prefix, str(key))))
    elif isinstance(data, list) and any(isinstance(v, (dict, list)) for v in data):
        for i, value in enumerate(data):
            out.update(flatten_json(value, f"{prefix}[{i}]"))
    else:
        out[prefix or "."] = _show_json(data)
    return out


# --------------------------------------------------------------------------- Python


def python_keys(text: str) -> dict[str, str] | None:
    """Module-level literal constants: ``TP = 8`` -> {"TP": "8"}; dicts are flattened (``MODEL.num_layers``)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, value = node.target.id, node.value
        else:
            continue
        try:
            literal = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        out.update(_flatten_py(literal, name))
    return out


def _flatten_py(value: Any, prefix: str) -> dict[str, str]:
    if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(_flatten_py(item, f"{prefix}.{key}"))
        return out
    return {prefix: repr(value)}


# --------------------------------------------------------------------------- shell


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return text.split("#", 1)[0].split()


def _array_end(text: str, start: int) -> int:
    """Index of the ')' closing a bash array whose body starts at ``start`` (quotes, $( ), comments)."""
    depth, i, quote, n = 0, start, "", len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c == "\\":
            i += 2
            continue
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == start or text[i - 1] in " \t\n("):
            nl = text.find("\n", i)
            i = n if nl < 0 else nl
            continue
        elif c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                return i
            depth -= 1
        i += 1
    return n


def _flag_pairs(tokens: list[str], *, multi: bool = True, stop: bool = False) -> list[tuple[str, str]]:
    """['--tp', '8', '--sp', '--x', 'a', 'b'] -> [('--tp', '8'), ('--sp', ''), ('--x', 'a b')].

    With ``multi`` (bash arrays of Megatron flags) a flag takes every value up to the next
    flag (``--data-path 0.5 a 0.5 b``); on launch lines it takes at most one, and a
    ``--flag=value`` none, so that positional arguments are not read as values. With
    ``stop`` the first positional argument ends the options (``srun --nodes=4 bash -c ...``).
    """
    pairs: list[tuple[str, str]] = []
    open_ = False
    for tok in tokens:
        if tok.startswith("-") and not _NUMBER.match(tok) and len(tok) > 1:
            name, eq, value = tok.partition("=")
            pairs.append((name, value if eq else ""))
            open_ = not eq
        elif pairs and open_:
            name, value = pairs[-1]
            pairs[-1] = (name, f"{value} {tok}" if value else tok)
            open_ = multi
        elif stop:
            break
    return pairs


def _add(out: dict[str, str], key: str, value: str) -> None:
    out[key] = f"{out[key]}, {value}" if key in out else value


def shell_keys(text: str) -> dict[str, str]:
    """Directives, variables, array flags and launch options of a bash script."""
    out: dict[str, str] = {}
    rest: list[str] = []
    pos = 0
    for m in _ARRAY_START.finditer(text):
        if m.start() < pos:
            continue
        end = _array_end(text, m.end())
        rest.append(text[pos:m.start()])
        for flag, value in _flag_pairs(_split(text[m.end():end])):
            _add(out, flag, value)
        pos = end + 1
    rest.append(text[pos:])
    body = "".join(rest)
    for line in body.splitlines():
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            tokens = _split(stripped[len("#SBATCH"):])
            if tokens:
                name, eq, value = tokens[0].partition("=")
                _add(out, f"#SBATCH {name}", value if eq else " ".join(tokens[1:]))
    seen: dict[str, int] = {}
    for line in _logical_lines(body):
        _statement_keys(_split(line), out, seen)
    return out


def _logical_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#") and not current:
            continue
        if raw.endswith("\\"):
            current += raw[:-1] + " "
            continue
        lines.append(current + raw)
        current = ""
    if current:
        lines.append(current)
    return lines


def _is_assignment(tok: str) -> bool:
    name, eq, _ = tok.partition("=")
    return bool(eq) and bool(_NAME.match(name))


def _statement_keys(tokens: list[str], out: dict[str, str], seen: dict[str, int]) -> None:
    if not tokens:
        return
    if tokens[0] == "export":
        for tok in tokens[1:]:
            if _is_assignment(tok):
                name, _, value = tok.partition("=")
                _add(out, f"export {name}", value)
        return
    if all(_is_assignment(t) for t in tokens):
        for tok in tokens:
            name, _, value = tok.partition("=")
            _add(out, name, value)
        return
    prog: str | None = None
    args: list[str] = []

    def flush() -> None:
        if prog is not None:
            for flag, value in _flag_pairs(args, multi=False, stop=prog.split("#")[0] in LAUNCHERS):
                _add(out, f"{prog} {flag}", value)

    for tok in tokens:
        base = tok.rsplit("/", 1)[-1]
        if base in LAUNCHERS or (base.endswith(".py") and not tok.startswith("-")):
            flush()
            seen[base] = seen.get(base, 0) + 1
            prog, args = (base if seen[base] == 1 else f"{base}#{seen[base]}"), []
        elif tok in ("|", "&&", "||", ";") or tok.startswith((">", "2>", "&>")):
            flush()
            prog, args = None, []
        elif prog is not None:
            args.append(tok)
    flush()
