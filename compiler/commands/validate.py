"""`dtc validate SPEC...`: parse, validate and lower each spec; report every error."""
from __future__ import annotations

import click

from compiler.errors import DtcError, ExitCode
from compiler.output import to_json
from compiler import units


@click.command("validate")
@click.argument("specs", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def validate_command(specs: tuple[str, ...], as_json: bool) -> None:
    """Check that each SPEC is valid (syntax, types, units, model and GPU names, pins).

    Prints one line per valid spec; every error of every invalid spec is reported,
    with file:line:column. Exit 0 if all are valid, 2 otherwise.
    """
    from compiler.problem import lower  # here, not at import: `dtc --help` lists this command without them
    from compiler.spec.load import load_spec

    results, failed = [], 0
    for path in specs:
        try:
            problem = lower(load_spec(path))
        except DtcError as exc:
            failed += 1
            if not as_json:
                click.echo(exc.render(), err=True)
            results.append({"spec": path, "valid": False, "errors": [d.render() for d in exc.diagnostics]})
            continue
        summary = (f"{problem.model_name}, {units.format_count(problem.num_params)} params, "
                   f"{units.format_count(problem.tokens)} tokens, "
                   f"{'/'.join(o.name for o in problem.gpu_options)}")
        results.append({"spec": path, "valid": True, "name": problem.name, "model": problem.model_name,
                        "num_params": problem.num_params, "tokens": problem.tokens,
                        "gpus": [o.name for o in problem.gpu_options]})
        if not as_json:
            click.echo(f"ok  {path}: {problem.name} ({summary})")
    if as_json:
        click.echo(to_json({"results": results}), nl=False)
    else:
        click.echo(f"Validate: {len(specs) - failed} valid, {failed} invalid.")
    if failed:
        raise SystemExit(int(ExitCode.USER_ERROR))
