"""Fixtures of the cost-model tests (the builders live in cm_helpers.py)."""
from __future__ import annotations

import pytest

from cm_helpers import make_layout, make_problem


@pytest.fixture
def problem_factory():
    return make_problem


@pytest.fixture
def layout_factory():
    return make_layout
