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

from compiler.cli import PLUGINS_OFF
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


LOADER_PROBE = """
import os, sys
from pydantic.plugin import _loader
def looked(*args, **kwargs):
    raise SystemExit("looked for plugins")
_loader.entry_points = looked  # the loader looks its plugins up through this name
os.environ["PYDANTIC_DISABLE_PLUGINS"] = sys.argv[1]
print(list(_loader.get_plugins()))
"""


@pytest.mark.parametrize("value", PLUGINS_OFF)
def test_the_real_loader_returns_no_plugins_when_they_are_off(value: str) -> None:
    """What the stand-in mimics, for each value cli.PLUGINS_OFF copies from pydantic: pydantic's own loader returns
    no plugins without looking any up. Should pydantic change its answer or stop taking one of the values, this
    fails (the last test shows the probe sees a lookup)."""
    got = subprocess.run([sys.executable, "-c", LOADER_PROBE, value], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0 and got.stdout.strip() == "[]", got.stderr


def test_the_loader_probe_sees_a_lookup() -> None:
    got = subprocess.run([sys.executable, "-c", LOADER_PROBE, "some_plugin"], capture_output=True, text=True,
                         timeout=60)
    assert got.returncode != 0 and "looked for plugins" in got.stderr
