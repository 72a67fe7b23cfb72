"""The spec reference in Markdown, generated from the pydantic models (kept in the README)."""
from __future__ import annotations

import typing

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from compiler.spec.models import Spec

START, END = "<!-- spec-reference:start -->", "<!-- spec-reference:end -->"


def _rows(model: type[BaseModel], prefix: str) -> list[tuple[str, type[BaseModel] | None, list[str]]]:
    out = []
    for name, field in model.model_fields.items():
        default = field.default
        if field.default_factory is not None:
            made = field.get_default(call_default_factory=True)
            shown = "optional" if isinstance(made, BaseModel) else f"`{made}`"
        elif default is PydanticUndefined:
            shown = "required"
        elif default is None:
            shown = "-"
        else:
            shown = f"`{default}`"
        sub = None
        for arg in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                sub = arg
        desc = (field.description or "").replace("|", "\\|")
        out.append((f"{prefix}{name}", sub, [f"`{prefix}{name}`", shown, desc]))
    return out


def spec_reference_markdown() -> str:
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    queue: list[tuple[type[BaseModel], str]] = [(Spec, "")]
    while queue:
        model, prefix = queue.pop(0)
        for key, sub, cells in _rows(model, prefix):
            lines.append("| " + " | ".join(cells) + " |")
            if sub is not None:
                queue.append((sub, key + "."))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(spec_reference_markdown(), end="")
