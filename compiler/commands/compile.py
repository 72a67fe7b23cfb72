"""`dtc compile SPEC...`: solve each spec and write generated/<name>/ atomically.

With --check nothing is written: exit 1 if any output would change (as black --check).
"""
from __future__ import annotations

from pathlib import Path

import click

from compiler.artifacts import write_artifacts
from compiler.errors import DtcError, ExitCode
from compiler.output import to_json
from compiler.review.folder import file_actions
from compiler import units


def plan_lines(plan) -> list[str]:
    from compiler import uncertainty  # here, not at import: `dtc --help` lists this command

    est, lay = plan.estimate, plan.layout
    return [
        f"  plan   {lay.describe()}",
        f"         {plan.cluster.num_gpus} x {plan.cluster.gpu} ({plan.cluster.num_nodes} node{'s' if plan.cluster.num_nodes != 1 else ''})",
        f"  memory {units.format_bytes(est.memory.total_bytes_per_gpu)} / "
        f"{units.format_bytes(est.memory.usable_bytes_per_gpu)} usable per GPU     "
        f"step {units.format_seconds(est.step_time_s)}     MFU {est.mfu * 100:.1f}%",
        f"  train  {uncertainty.time_to_train_text(est)}, {est.gpu_hours:,.0f} GPU-hours, "
        f"{units.format_money(est.cost_usd)}",
    ] + ([f"  band   {uncertainty.band_source(est)}"] if est.band is not None else [])


def _parse_targets(value: str | None) -> tuple[str, ...] | None:
    if not value:
        return None
    from compiler.spec.models import ALL_TARGETS  # here, not at import: `dtc --help` lists this command

    names = tuple(t.strip() for t in value.split(",") if t.strip())
    bad = [t for t in names if t not in ALL_TARGETS]
    if bad:
        raise click.BadParameter(f"unknown target {bad[0]!r}; choose from {', '.join(ALL_TARGETS)}")
    return names


@click.command("compile")
@click.argument("specs", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=str))
@click.option("--out", "-o", "out", default="generated", show_default=True, type=click.Path(file_okay=False),
              help="Parent folder; each spec is written to OUT/<name>/.")
@click.option("--target", "target", default=None, help="Comma-separated subset of the spec's targets.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if any generated file would change.")
@click.option("--force", is_flag=True, help="Overwrite a generated folder even if it was edited by hand.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def compile_command(specs: tuple[str, ...], out: str, target: str | None, check: bool, force: bool,
                    as_json: bool) -> None:
    """Solve each SPEC and write its artifacts to OUT/<name>/ (atomically).

    Writes plan.json, PLAN.md and the target files (ds_config.json, fsdp_config.py,
    megatron_args.sh, *.sbatch). A folder edited by hand is not overwritten without
    --force. Exit 0 ok; with --check, 1 if anything would change; 2 on a bad or
    infeasible spec.
    """
    from compiler.pipeline import compile_loaded  # here, not at import: `dtc --help` lists this command
    from compiler.spec.load import load_spec

    targets = _parse_targets(target)
    counts = {"+": 0, "~": 0, "-": 0, "=": 0}
    results, failures = [], 0
    written: dict[str, str] = {}  # spec name -> the spec that wrote it in this run
    for path in specs:
        try:
            loaded = load_spec(path)
            name = loaded.spec.name
            if name in written:
                raise loaded.source.error(("name",), f"name is already used by {written[name]} in this run, got '{name}'",
                                          "each spec writes OUT/<name>/; give the specs different names")
            plan, artifacts = compile_loaded(loaded, targets=targets)
            written[name] = path
            out_dir = Path(out) / plan.name
            actions = file_actions(artifacts, out_dir)
            if not check:
                write_artifacts(artifacts, out_dir, force=force)
        except DtcError as exc:
            failures += 1
            click.echo(exc.render(), err=True)
            results.append({"spec": path, "ok": False, "errors": [d.render() for d in exc.diagnostics]})
            continue
        for symbol, _ in actions:
            counts[symbol] += 1
        results.append({"spec": path, "ok": True, "out": str(out_dir), "layout": plan.layout.to_dict(),
                        "files": {rel: symbol for symbol, rel in actions}})
        if not as_json:
            click.echo(f"{path} -> {out_dir}/")
            for line in plan_lines(plan):
                click.echo(line)
            for symbol, rel in actions:
                if symbol != "=" or not check:
                    click.echo(f"  {symbol} {rel}")
    changed = counts["+"] + counts["~"] + counts["-"]
    verb = "Check" if check else "Compile"
    summary = (f"{verb}: {counts['+']} to add, {counts['~']} to change, {counts['-']} to remove, "
               f"{counts['=']} unchanged" + (f"; {failures} spec(s) failed" if failures else "") + ".")
    if as_json:
        click.echo(to_json({"results": results, "summary": {"add": counts["+"], "change": counts["~"],
                                                            "remove": counts["-"], "unchanged": counts["="],
                                                            "failed": failures}}), nl=False)
    else:
        click.echo(summary)
    if failures:
        raise SystemExit(int(ExitCode.USER_ERROR))
    if check and changed:
        raise SystemExit(int(ExitCode.DIFFERENCES))
