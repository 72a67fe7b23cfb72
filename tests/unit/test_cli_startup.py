"""compiler.cli._no_pydantic_plugins: while pydantic's plugins are off, `dtc` stands in for pydantic's plugin loader
so that building the first spec model does not import importlib.metadata. The stand-in must say what the real
loader says then (no plugins), hand every other name to the real module, and step aside when the user's own
PYDANTIC_DISABLE_PLUGINS keeps plugins on. Each case runs in a fresh interpreter: the stand-in lives in
sys.modules."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

PROBE = """
import json, sys
from compiler.cli import _no_pydantic_plugins
_no_pydantic_plugins()
from compiler.spec.load import load_spec
spec = load_spec("specs/70b.yaml").spec
loader = sys.modules["pydantic.plugin._loader"]
out = {"name": spec.name, "metadata_imported": "importlib.metadata" in sys.modules,
       "stand_in": loader.__doc__ is not None and "dtc" in loader.__doc__,
       "plugins": list(loader.get_plugins())}
if len(sys.argv) > 1:  # a name the stand-in does not define comes from the real module
    out["group"] = loader.PYDANTIC_ENTRY_POINT_GROUP
    out["real_now"] = "dtc" not in (sys.modules["pydantic.plugin._loader"].__doc__ or "")
print(json.dumps(out))
"""


def probe(env_value: str | None, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    if env_value is not None:
        env["PYDANTIC_DISABLE_PLUGINS"] = env_value
    got = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=60)
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)


@pytest.mark.parametrize("value", [None, "__all__", "1", "true"])
def test_plugins_off_builds_the_spec_without_importlib_metadata(value: str | None) -> None:
    got = probe(value)
    assert got == {"name": "llama3-70b", "metadata_imported": False, "stand_in": True, "plugins": []}


def test_the_stand_in_hands_other_names_to_the_real_loader() -> None:
    got = probe(None, "other")
    assert got["group"] == "pydantic" and got["real_now"] and got["plugins"] == []


def test_a_user_who_keeps_plugins_on_gets_the_real_loader() -> None:
    got = probe("some_plugin")
    assert not got["stand_in"] and got["name"] == "llama3-70b"


def test_the_real_loader_returns_no_plugins_when_they_are_off() -> None:
    """What the stand-in mimics: should pydantic's loader change its answer, this fails."""
    code = ("import os; os.environ['PYDANTIC_DISABLE_PLUGINS'] = '__all__'\n"
            "from pydantic.plugin._loader import get_plugins; print(list(get_plugins()))")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0 and got.stdout.strip() == "[]", got.stderr
