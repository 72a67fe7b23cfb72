"""`dtc diff`: what a config change does, for review (the semantic summary, then each artifact).

    dtc diff OLD NEW                      two specs, two generated folders, or one of each
    dtc diff --base REV [SPEC...]         specs as of git REV -> the working tree
                                          (no SPEC: every spec under specs/ changed since REV,
                                          and every generated/ folder that changed without
                                          its spec, e.g. after a cost-model change)

Both versions of a spec are compiled in memory with this dtc, so the diff shows what
the spec change does; a generated folder is read as it is (its plan from plan.json).
"""
from __future__ import annotations

from pathlib import Path

import click

from compiler.errors import ExitCode, printable
from compiler.review.format import format_diff
from compiler.review.plans import diff_sides
from compiler.review.sides import base_diff, path_side


# --------------------------------------------------------------------------- the command


@click.command("diff")
@click.argument("paths", nargs=-1, type=click.Path(path_type=str))
@click.option("--base", "base", metavar="REV", default=None,
              help="Compare each SPEC as of git revision REV with the working tree (no SPEC: all specs "
                   "under specs/ changed since REV).")
@click.option("--format", "fmt", type=click.Choice(["text", "markdown", "json"]), default="text",
              show_default=True, help="markdown: a pull-request comment; json: for tools.")
@click.option("--unified", is_flag=True, help="Also show the unified diff of every changed file.")
def diff_command(paths: tuple[str, ...], base: str | None, fmt: str, unified: bool) -> None:
    """Show what a config change does: layout, memory, speed and cost, then each artifact.

    \b
      dtc diff OLD NEW                  two specs, two generated folders, or one of each
      dtc diff --base origin/main specs/70b.yaml
      dtc diff --base origin/main       every spec under specs/ changed since origin/main
                                        (and generated/ folders changed without their spec)

    Exit 0 no differences, 1 differences, 2 bad input (unreadable or invalid new spec,
    unknown revision). A spec that is infeasible on one side is shown, not an error.
    """
    if base is not None:
        diffs = base_diff(base, paths)
    elif len(paths) == 2:
        new = path_side(paths[1], strict=True)
        same_file = Path(paths[0]).is_file() and Path(paths[1]).is_file()
        old = path_side(paths[0], strict=False, compile_as=paths[1] if same_file else None)
        diffs = [diff_sides(old, new, title=f"{printable(paths[0])} -> {printable(paths[1])}")]
    else:
        raise click.UsageError("give OLD NEW (two specs or generated folders), or --base REV [SPEC...]")
    click.echo(format_diff(diffs, fmt, unified=unified), nl=False)
    if any(d.changed for d in diffs):
        raise SystemExit(int(ExitCode.DIFFERENCES))
