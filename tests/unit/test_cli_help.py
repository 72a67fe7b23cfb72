"""`dtc --help` reads each command's short help from its source (compiler.cli._short_help_from_source), so
that listing the commands imports none of them: it must say what click itself says of the imported command."""
from __future__ import annotations

import importlib

import pytest

from compiler.cli import COMMANDS, _short_help_from_source


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_short_help_from_source_is_clicks(name: str) -> None:
    module, attr = COMMANDS[name]
    cmd = getattr(importlib.import_module(module), attr)
    assert _short_help_from_source(module, attr) == cmd.get_short_help_str(limit=1000)
