"""`dtc check [SPEC...]`: is generated/ what the specs compile to? (nothing is written)

Every spec is compiled in memory and compared byte for byte, manifest included, with
generated/<name>/: stale files (differ), missing files (would be added) and orphaned
files (on disk, not produced). Without SPEC arguments every spec in --specs-dir is
checked and generated/ folders that no spec names are reported as orphaned too.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path

import click

from compiler.artifacts import MANIFEST, ArtifactSet, foreign_entries, hand_edited_files, read_artifacts
from compiler.errors import DtcError, ExitCode, printable, shell_command
from compiler.report import to_json

SPEC_SUFFIXES = (".yaml", ".yml")
DIFF_LINES = 20  # unified-diff lines shown per stale file
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

    def to_dict(self) -> dict:
        return {"spec": self.spec, "name": self.name, "out": self.out, "status": self.status,
                "stale": self.stale, "missing": self.missing, "orphaned": self.orphaned,
                "folder_missing": self.folder_missing, "needs_force": self.needs_force, "errors": self.errors}


def compare(expected: ArtifactSet, out_dir: Path, result: SpecCheck) -> None:
    """Fill ``result`` with what differs between ``expected`` (with manifest) and ``out_dir``."""
    actual = read_artifacts(out_dir)  # never follows a symbolic link (a committed PLAN.md -> ../../.git/config)
    foreign = set(foreign_entries(out_dir))
    result.folder_missing = not out_dir.is_dir()
    for rel, text in expected.files.items():
        if rel in foreign:
            result.stale.append(rel)
            result.diffs[rel] = [f"{out_dir / rel}: a symbolic link or other non-regular file; not followed or read"]
        elif rel not in actual:
            result.missing.append(rel)
        elif actual[rel] != text:
            result.stale.append(rel)
            result.diffs[rel] = list(difflib.unified_diff(
                actual[rel].splitlines(), text.splitlines(), f"{out_dir / rel}", f"{result.spec} (compiled)",
                lineterm=""))
    result.orphaned = sorted({rel for rel in actual.files if rel not in expected}
                             | {rel for rel in foreign if rel not in expected})
    if MANIFEST in result.stale and (len(result.stale) > 1 or result.missing or result.orphaned):
        result.stale.remove(MANIFEST)  # it follows from the others
        result.diffs.pop(MANIFEST, None)
    result.needs_force = bool(actual.files or foreign) and bool(hand_edited_files(out_dir))


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


def check_specs(paths: list[str], generated: Path) -> list[SpecCheck]:
    """check_spec over ``paths``, in parallel processes when there are several (the solver dominates)."""
    workers = min(len(paths), os.cpu_count() or 1, MAX_WORKERS)
    if workers <= 1:
        return [check_spec(path, generated) for path in paths]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(check_spec, paths, [generated] * len(paths)))


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


def _duplicates(results: list[SpecCheck]) -> None:
    seen: dict[str, str] = {}
    for r in results:
        if r.name is None or r.errors:
            continue
        if r.name in seen:
            r.errors.append(f"{r.spec}: error: spec name {r.name!r} is also used by {seen[r.name]}; "
                            f"both would write {r.out}\n  hint: give each spec its own name")
        else:
            seen[r.name] = r.spec


# --------------------------------------------------------------------------- output


def _names(files: list[str], limit: int = 6) -> str:
    shown = ", ".join(printable(f) for f in files[:limit])
    return shown if len(files) <= limit else f"{shown}, ... ({len(files)} in all)"


def _short_lines(r: SpecCheck) -> list[str]:
    """One line per spec that is not up to date: which files, and how (the default output)."""
    if r.status == "ok":
        return []
    spec, out = printable(r.spec), printable(r.out or "")
    if r.status == "failed":
        return [f"{spec}: failed", *r.errors]
    if r.folder_missing:
        return [f"{spec} -> {out}: missing ({len(r.missing)} files would be written)"]
    what = [f"{_names(r.stale)} changed" if r.stale else "", f"{_names(r.missing)} missing" if r.missing else "",
            f"{_names(r.orphaned)} orphaned (not produced by the spec)" if r.orphaned else ""]
    return [f"{spec} -> {out}: stale: " + "; ".join(w for w in what if w)]


def _spec_lines(r: SpecCheck) -> list[str]:
    """The details (--diff): every file, with a short unified diff of each changed one."""
    if r.status == "ok":
        return []
    spec, out = printable(r.spec), printable(r.out or "")
    if r.status == "failed":
        return [f"{spec}: failed", *r.errors]
    if r.folder_missing:
        return [f"{spec} -> {out}: missing ({len(r.missing)} files would be written)"]
    lines = [f"{spec} -> {out}: stale"]
    for rel in r.stale:
        lines.append(f"  ~ {printable(rel)}")
        diff = r.diffs.get(rel, [])
        lines += [f"      {line}" for line in diff[:DIFF_LINES]]
        if len(diff) > DIFF_LINES:
            lines.append(f"      ... {len(diff) - DIFF_LINES} more lines "
                         f"({shell_command('dtc', 'diff', r.out or '', r.spec)})")
    lines += [f"  + {printable(rel)} (missing)" for rel in r.missing]
    lines += [f"  - {printable(rel)} (orphaned: not produced by the spec)" for rel in r.orphaned]
    return lines


def _out_args(generated: Path, flag: str = "--generated") -> list[str]:
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
        fixes.append(shell_command("dtc", "compile", *force, *_out_args(generated, "--out"), *(r.spec for r in stale)))
    if orphans:
        fixes.append(shell_command("rm", "-r", "--", *orphans))
    if fixes:
        line += " Run: " + "; ".join(fixes)
    return line


@click.command("check")
@click.argument("specs", nargs=-1, type=click.Path(dir_okay=False, path_type=str))
@click.option("--specs-dir", "specs_dir", default="specs", show_default=True, type=click.Path(file_okay=False),
              help="Where the specs are (used when no SPEC is given).")
@click.option("--generated", "generated", default="generated", show_default=True, type=click.Path(file_okay=False),
              help="The committed output folder; each spec is compared with GENERATED/<name>/.")
@click.option("--diff", "show_diff", is_flag=True,
              help="Show every stale file with the first lines of its unified diff.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def check_command(specs: tuple[str, ...], specs_dir: str, generated: str, show_diff: bool, as_json: bool) -> None:
    """Check that GENERATED/ is what the specs compile to (nothing is written).

    Recompiles every spec in --specs-dir (or each SPEC) in memory and names, per spec, the
    stale, missing and orphaned files, then the command that fixes them; --diff adds a short
    diff of each. Exit 0 up to date; 1 out of date; 2 on a bad or infeasible spec.
    """
    out_root = Path(generated)
    paths = list(specs) or find_specs(Path(specs_dir))
    results = check_specs(paths, out_root)
    _duplicates(results)
    orphans: list[str] = []
    if not specs:
        names = {r.name for r in results if r.name} | {Path(r.spec).stem for r in results if r.name is None}
        orphans = orphaned_folders(out_root, names)
    line = summary_line(results, orphans, out_root)
    if as_json:
        counts = {status: sum(r.status == status for r in results) for status in ("ok", "stale", "failed")}
        click.echo(to_json({"specs": [r.to_dict() for r in results], "orphaned_folders": orphans,
                            "counts": {**counts, "specs": len(results), "orphaned_folders": len(orphans)},
                            "summary": line}), nl=False)
    else:
        for r in results:
            for text in (_spec_lines(r) if show_diff else _short_lines(r)):
                click.echo(text, err=r.status == "failed")
        for folder in orphans:
            click.echo(f"{printable(folder)}: orphaned folder (no spec in {printable(specs_dir)}/ is named "
                       f"{printable(Path(folder).name)})")
        stale = [r for r in results if r.status == "stale" and not r.folder_missing]
        if stale and not show_diff:
            click.echo("Details: " + shell_command("dtc", "check", "--diff", *_out_args(out_root),
                                                   *(r.spec for r in stale)))
        click.echo(line)
    if any(r.status == "failed" for r in results):
        raise SystemExit(int(ExitCode.USER_ERROR))
    if orphans or any(r.status == "stale" for r in results):
        raise SystemExit(int(ExitCode.DIFFERENCES))
