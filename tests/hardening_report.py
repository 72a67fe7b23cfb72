"""The figures of the hardening tests (fuzz, injection, determinism, atomic writes), printed at the end.

Each test module calls ``figure(key, line)``; a tiny plugin, registered once by the first
module that uses it, prints every line in a "dtc hardening" section of the terminal summary
(and each line is also printed when it is recorded, for ``pytest -s``).
"""
from __future__ import annotations

import pytest

_LINES: dict[str, str] = {}
_NAME = "dtc-hardening-figures"


class _Figures:
    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter) -> None:  # noqa: ANN001 - pytest's reporter
        if _LINES:
            terminalreporter.section("dtc hardening")
            for key in sorted(_LINES):
                terminalreporter.write_line(_LINES[key])


def register(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin(_NAME):
        config.pluginmanager.register(_Figures(), _NAME)


def figure(key: str, line: str) -> None:
    _LINES[key] = line
    print(line)
