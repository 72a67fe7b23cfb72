"""`dtc check [SPEC...]`: is generated/ what the specs compile to? (nothing is written)

The work is compiler.check's (compile in memory, compare with generated/<name>/); this
command prints its report: one line per spec that is not up to date (or, with --diff,
every file with the first lines of its diff), orphaned folders, the summary; or --json.
"""
from __future__ import annotations

from pathlib import Path

import click

from compiler.check import CheckReport, SpecCheck, check, out_args
from compiler.errors import printable, shell_command
from compiler.output import to_json

DIFF_LINES = 20  # unified-diff lines shown per stale file


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


def _print(report: CheckReport, specs_dir: str, generated: Path, show_diff: bool) -> None:
    for r in report.results:
        for text in (_spec_lines(r) if show_diff else _short_lines(r)):
            click.echo(text, err=r.status == "failed")
    for folder in report.orphans:
        click.echo(f"{printable(folder)}: orphaned folder (no spec in {printable(specs_dir)}/ is named "
                   f"{printable(Path(folder).name)})")
    stale = [r for r in report.results if r.status == "stale" and not r.folder_missing]
    if stale and not show_diff:
        click.echo("Details: " + shell_command("dtc", "check", "--diff", *out_args(generated), *(r.spec for r in stale)))
    click.echo(report.summary)


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
    report = check(specs, Path(specs_dir), out_root)
    if as_json:
        click.echo(to_json({"specs": [r.to_dict() for r in report.results], "orphaned_folders": report.orphans,
                            "counts": report.counts(), "summary": report.summary}), nl=False)
    else:
        _print(report, specs_dir, out_root, show_diff)
    if report.exit_code:
        raise SystemExit(report.exit_code)
