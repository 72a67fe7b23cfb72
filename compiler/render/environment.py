"""The one Jinja2 environment: StrictUndefined, templates shipped inside the package.

Template names are "<folder>/<file>": the shared folders under compiler/templates (``common``,
``report``) and each registered target's own templates (compiler/targets/<name>/templates, named
"<name>/...").
"""
from __future__ import annotations

import functools
import json
import shlex
from importlib import resources
from typing import Any

import jinja2

from compiler.units import format_bytes, format_count, format_seconds

TEMPLATE_PACKAGE = "compiler"
TEMPLATE_DIR = "templates"


def to_json(value: Any) -> str:
    """dtc's JSON: sorted keys, 2-space indent, no HTML escaping (unlike jinja's tojson)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def shell_quote(value: Any) -> str:
    """Quote for POSIX sh; every spec value that reaches a script goes through this."""
    return shlex.quote(str(value))


def py_repr(value: Any) -> str:
    """A Python literal (for generated .py files)."""
    return repr(value)


@functools.cache
def environment() -> jinja2.Environment:
    from compiler.targets import registry

    root = resources.files(TEMPLATE_PACKAGE) / TEMPLATE_DIR
    folders = {p.name: jinja2.FileSystemLoader(str(p)) for p in root.iterdir() if p.is_dir()}
    for target in registry.targets():
        if target.templates:
            folder = resources.files(f"compiler.targets.{target.name}") / target.templates
            folders[target.name] = jinja2.FileSystemLoader(str(folder))
    env = jinja2.Environment(
        loader=jinja2.PrefixLoader(folders),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters.update(to_json=to_json, shell_quote=shell_quote, py_repr=py_repr, format_bytes=format_bytes,
                       format_count=format_count, format_seconds=format_seconds)
    return env


def render_template(name: str, **context: Any) -> str:
    text = environment().get_template(name).render(**context)
    return text if text.endswith("\n") else text + "\n"
