"""`dtc --help` reads each command's short help from its source (compiler.cli._short_help_from_source), so
that listing the commands imports none of them: it must say what click itself says of the imported command."""
from __future__ import annotations

import importlib
import warnings

import pytest

from compiler.cli import COMMANDS, _short_help_from_source


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_short_help_from_source_is_clicks(name: str) -> None:
    module, attr = COMMANDS[name]
    cmd = getattr(importlib.import_module(module), attr)
    assert _short_help_from_source(module, attr) == cmd.get_short_help_str(limit=1000)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_short_help_from_source_uses_no_deprecated_click_api(name: str) -> None:
    """Through click's public Command API only: click 8.2+ deprecates click.utils.make_default_short_help and
    Click 9 removes it (mypy saw it as click.utils' module __getattr__, an `object`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _short_help_from_source(*COMMANDS[name])
