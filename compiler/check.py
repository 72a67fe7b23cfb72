"""Is generated/ what the specs compile to? (`dtc check`; nothing is written)

Every spec is compiled in memory and compared byte for byte, manifest included, with
generated/<name>/: stale files (differ), missing files (would be added) and orphaned
files (on disk, not produced). Without named specs every spec in the specs folder is
checked and generated/ folders that no spec names are reported as orphaned too.
``check`` returns a ``CheckReport``; the command only prints it.
"""
from __future__ import annotations

import json
import multiprocessing
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from compiler.artifacts import MANIFEST, ArtifactSet, hand_edited_files, read_regular_file
from compiler.errors import DtcError, ExitCode, shell_command
from compiler.review.files import unified_diff
from compiler.review.folder import compare_folder

SPEC_SUFFIXES = (".yaml", ".yml")  # what a spec file's name ends with (find_specs; dtc diff --base's changed_specs)
MAX_WORKERS = 16


@dataclass
class SpecCheck:
    spec: str
    name: str | None = None
    out: str | None = None
    stale: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    orphaned: list[str] = field(default_factory=list)
    diffs: dict[str, list[str]] = field(default_factory=dict)
    folder_missing: bool = False
    needs_force: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.errors:
            return "failed"
        return "stale" if self.stale or self.missing or self.orphaned else "ok"

    @property
    def num_files(self) -> int:
        return len(self.stale) + len(self.missing) + len(self.orphaned)

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "name": self.name, "out": self.out, "status": self.status,
                "stale": self.stale, "missing": self.missing, "orphaned": self.orphaned,
                "folder_missing": self.folder_missing, "needs_force": self.needs_force, "errors": self.errors}


@dataclass
class CheckReport:
    """Every spec's check, the generated/ folders no spec names, and the one-line summary."""

    results: list[SpecCheck]
    orphans: list[str]
    summary: str

    def counts(self) -> dict[str, int]:
        counts = {status: sum(r.status == status for r in self.results) for status in ("ok", "stale", "failed")}
        return {**counts, "specs": len(self.results), "orphaned_folders": len(self.orphans)}

    @property
    def exit_code(self) -> int:
        """diff(1)'s convention: 0 up to date, 1 out of date, 2 a bad or infeasible spec."""
        if any(r.status == "failed" for r in self.results):
            return int(ExitCode.USER_ERROR)
        if self.orphans or any(r.status == "stale" for r in self.results):
            return int(ExitCode.DIFFERENCES)
        return int(ExitCode.OK)


def compare(expected: ArtifactSet, out_dir: Path, result: SpecCheck) -> None:
    """Fill ``result`` with what differs between ``expected`` (with manifest) and ``out_dir``: review.folder's
    comparison (changed -> stale, added -> missing, removed -> orphaned) with a diff of each stale file, the
    manifest left out when other files differ (it follows from them)."""
    c = compare_folder(expected, out_dir)  # never follows a symbolic link (a committed PLAN.md -> ../../.git/config)
    result.folder_missing = not out_dir.is_dir()
    result.stale, result.missing, result.orphaned = list(c.changed), list(c.added), list(c.removed)
    for rel in c.changed:
        if rel in c.foreign:
            result.diffs[rel] = [f"{out_dir / rel}: a symbolic link or other non-regular file; not followed or read"]
        else:
            result.diffs[rel] = unified_diff(c.actual[rel].splitlines(), expected[rel].splitlines(), f"{out_dir / rel}",
                                             f"{result.spec} (compiled)", lineterm="")
    if MANIFEST in result.stale and (len(result.stale) > 1 or result.missing or result.orphaned):
        result.stale.remove(MANIFEST)
        result.diffs.pop(MANIFEST, None)
    result.needs_force = bool(c.actual.files or c.foreign) and bool(hand_edited_files(out_dir))


def check_spec(path: str, generated: Path) -> SpecCheck:
    from compiler.pipeline import compile_loaded
    from compiler.spec.load import load_spec

    result = SpecCheck(spec=path)
    try:
        loaded = load_spec(path)
        result.name = loaded.spec.name
        plan, artifacts = compile_loaded(loaded)
    except DtcError as exc:
        if exc.exit_code != ExitCode.USER_ERROR:
            raise
        result.errors = [d.render() for d in exc.diagnostics]
        return result
    out_dir = generated / plan.name
    result.name, result.out = plan.name, f"{out_dir}/"
    compare(artifacts.with_manifest(), out_dir, result)
    return result


def _preload() -> None:
    """Import the pipeline and read the built-in data (catalog, efficiency tables, templates' environment)
    once, in this process, so that forked workers share them instead of each paying ~0.3 s of CPU again."""
    from compiler.catalog import load_catalog
    from compiler.costmodel.efficiency import load_efficiency
    from compiler.pipeline import compile_loaded  # noqa: F401 - imports the problem, plan and render modules
    from compiler.render import invariants, report  # noqa: F401 - imported by render() on its first call
    from compiler.render.environment import environment
    from compiler.solver import solve  # noqa: F401
    from compiler.targets import registry

    load_catalog()
    load_efficiency()
    environment()
    registry.targets()


def _expected_work(paths: Sequence[str], generated: Path) -> list[int]:
    """How long each spec's search was when its committed plan was written (plan.json's search.num_considered),
    0 when unknown: it orders the specs for the workers, nothing else. The plans are found by the spec path they
    record (provenance.spec_path), so no spec is loaded here: this runs before the workers start."""
    known: dict[str, int] = {}
    if generated.is_dir():
        for folder in sorted(generated.iterdir()):
            try:
                data = json.loads(read_regular_file(folder / "plan.json") or b"{}")
                known[os.path.abspath(data["provenance"]["spec_path"])] = int(data["search"]["num_considered"])
            except (DtcError, OSError, ValueError, KeyError, TypeError):
                continue
    return [known.get(os.path.abspath(path), 0) for path in paths]


def check_specs(paths: Sequence[str], generated: Path) -> list[SpecCheck]:
    """check_spec over ``paths`` (results in their order), in parallel processes when there are several.

    The solver dominates and one spec may take several times all the others (budget-70b: about half
    of specs/), so the workers (one per CPU, forked after ``_preload``) take the specs longest first,
    as far as the committed plans tell: the longest then runs from the start, beside the others,
    instead of last."""
    workers = min(len(paths), os.cpu_count() or 1, MAX_WORKERS)
    if workers <= 1:
        return [check_spec(path, generated) for path in paths]
    from concurrent.futures import ProcessPoolExecutor

    work = _expected_work(paths, generated)
    order = sorted(range(len(paths)), key=lambda i: -work[i])
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    if context.get_start_method() == "fork":
        _preload()
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {i: pool.submit(check_spec, paths[i], generated) for i in order}
        return [futures[i].result() for i in range(len(paths))]


def find_specs(specs_dir: Path) -> list[str]:
    if not specs_dir.is_dir():
        raise DtcError(f"no specs folder {specs_dir}/", hint="pass --specs-dir, or name the specs to check")
    found = sorted(str(p) for p in specs_dir.iterdir() if p.is_file() and p.suffix in SPEC_SUFFIXES)
    if not found:
        raise DtcError(f"no specs (*.yaml) in {specs_dir}/", hint="pass --specs-dir, or name the specs to check")
    return found


def orphaned_folders(generated: Path, names: set[str]) -> list[str]:
    if not generated.is_dir():
        return []
    return sorted(f"{p}/" for p in generated.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and p.name not in names)


def mark_duplicates(results: list[SpecCheck]) -> None:
    """A spec whose name an earlier spec already uses fails: both would write the same folder."""
    seen: dict[str, str] = {}
    for r in results:
        if r.name is None or r.errors:
            continue
        if r.name in seen:
            r.errors.append(f"{r.spec}: error: spec name {r.name!r} is also used by {seen[r.name]}; "
                            f"both would write {r.out}\n  hint: give each spec its own name")
        else:
            seen[r.name] = r.spec


def out_args(generated: Path, flag: str = "--generated") -> list[str]:
    """The option that names ``generated`` in a command to paste (none for the default folder)."""
    return [] if generated == Path("generated") else [flag, str(generated)]


def summary_line(results: list[SpecCheck], orphans: list[str], generated: Path) -> str:
    n = len(results)
    ok = sum(r.status == "ok" for r in results)
    stale = [r for r in results if r.status == "stale"]
    failed = sum(r.status == "failed" for r in results)
    parts = [f"{n} spec{'' if n == 1 else 's'}", f"{ok} up to date"]
    if stale:
        files = sum(r.num_files for r in stale)
        parts.append(f"{len(stale)} stale ({files} file{'' if files == 1 else 's'})")
    if failed:
        parts.append(f"{failed} failed")
    if orphans:
        parts.append(f"{len(orphans)} orphaned folder{'' if len(orphans) == 1 else 's'}")
    line = "Check: " + ", ".join(parts) + "."
    fixes = []
    if stale:  # commands a person pastes: every name shell-quoted (a spec named 'a;touch x;.yaml')
        force = ["--force"] if any(r.needs_force for r in stale) else []
        fixes.append(shell_command("dtc", "compile", *force, *out_args(generated, "--out"), *(r.spec for r in stale)))
    if orphans:
        fixes.append(shell_command("rm", "-r", "--", *orphans))
    if fixes:
        line += " Run: " + "; ".join(fixes)
    return line


def check(specs: Sequence[str], specs_dir: Path, generated: Path) -> CheckReport:
    """Check ``specs`` (or, when none is named, every spec in ``specs_dir`` and the folders of ``generated``
    that none of them names) against ``generated``."""
    paths = list(specs) or find_specs(specs_dir)
    results = check_specs(paths, generated)
    mark_duplicates(results)
    orphans: list[str] = []
    if not specs:
        names = {r.name for r in results if r.name} | {Path(r.spec).stem for r in results if r.name is None}
        orphans = orphaned_folders(generated, names)
    return CheckReport(results=results, orphans=orphans, summary=summary_line(results, orphans, generated))
