"""`dtc schema`: the spec's JSON Schema (committed as schemas/spec.schema.json)."""
from __future__ import annotations

import click

from compiler.report import to_json
from compiler.spec.models import Spec

SCHEMA_ID = "https://dtc.dev/schemas/spec.schema.json"


def spec_json_schema() -> dict:
    schema = Spec.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}


@click.command("schema")
def schema_command() -> None:
    """Print the spec's JSON Schema (for editor completion and validation)."""
    click.echo(to_json(spec_json_schema()), nl=False)
