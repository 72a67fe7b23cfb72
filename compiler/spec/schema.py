"""The spec's JSON Schema (`dtc schema`; committed as schemas/spec.schema.json), from the pydantic models."""
from __future__ import annotations

import typing
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic and the spec models load when the schema is made, not when this module is imported
    from pydantic import BaseModel

SCHEMA_ID = "https://dtc.dev/schemas/spec.schema.json"


def _models(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every pydantic model reachable from ``root``, by class name (= its $defs key)."""
    from pydantic import BaseModel

    found: dict[str, type[BaseModel]] = {}
    queue = [root]
    while queue:
        model = queue.pop()
        if model.__name__ in found:
            continue
        found[model.__name__] = model
        for field in model.model_fields.values():
            stack = [field.annotation]
            while stack:
                arg = stack.pop()
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    queue.append(arg)
                stack.extend(typing.get_args(arg))
    return found


def spec_json_schema() -> dict:
    """Spec.model_json_schema(), plus the field descriptions pydantic drops beside a bare $ref."""
    from compiler.spec.models import Spec

    schema = Spec.model_json_schema()
    models = _models(Spec)
    for name, definition in [("Spec", schema), *schema.get("$defs", {}).items()]:
        model = models.get(name)
        if model is None:
            continue
        for field_name, prop in definition.get("properties", {}).items():
            field = model.model_fields.get(field_name)
            if field is not None and field.description and "description" not in prop:
                prop["description"] = field.description
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}
