"""`dtc schema`: the spec's JSON Schema (committed as schemas/spec.schema.json)."""
from __future__ import annotations

import click

from compiler.output import to_json


@click.command("schema")
def schema_command() -> None:
    """Print the spec's JSON Schema (for editor completion and validation)."""
    from compiler.spec.schema import spec_json_schema

    click.echo(to_json(spec_json_schema()), nl=False)
