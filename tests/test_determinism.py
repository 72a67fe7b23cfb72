"""Determinism (issue #8, item 3): the same spec gives byte-identical output, wherever it runs.

- in process: compiling twice, and rendering from ``Plan.from_json(plan.to_json())``;
- in subprocesses that differ in PYTHONHASHSEED (0, 1, random), working directory (the spec
  copied under two different absolute paths), HOME, USER/LOGNAME, TZ, locale, umask and, where
  ``unshare --uts`` works, the host name;
- no absolute path of the machine (/work, /tmp, /root, /home, the checkout, the cwd), no user
  or host name and nothing that looks like a timestamp in any generated file.

The editable-vs-wheel comparison is in tests/test_packaging.py (every example spec).
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hardening_report import figure, register
from helpers import REPO

SPECS = sorted(p.name for p in (REPO / "specs").glob("*.yaml"))
FIGURES = {"specs": 0, "runs": 0, "files": 0}
FORBIDDEN = [
    (re.compile(r"/(work|tmp|root|home|Users|private/var)/"), "an absolute path of the machine"),
    (re.compile(r"\b(19|20)\d\d-[01]\d-[0-3]\d([T ][0-2]\d:[0-5]\d)?"), "a date"),
]
NOW = int(time.time())


@pytest.fixture(scope="module", autouse=True)
def _figures(request: pytest.FixtureRequest):
    register(request.config)
    yield
    figure("determinism", f"determinism: {FIGURES['specs']} specs x {FIGURES['runs']} environments, "
                          f"{FIGURES['files']} files byte-identical, no machine paths, names or timestamps")


def compile_in_process(spec: Path) -> dict[str, str]:
    from compiler.pipeline import compile_spec

    return dict(compile_spec(spec)[1].with_manifest().files)


ROUND_TRIP_KNOWN: dict[str, str] = {}


@pytest.mark.parametrize("spec", [pytest.param(s, marks=[pytest.mark.xfail(strict=True, reason=ROUND_TRIP_KNOWN[s])]
                                               if s in ROUND_TRIP_KNOWN else []) for s in SPECS])
def test_compile_twice_and_round_trip(spec: str) -> None:
    from compiler.pipeline import compile_spec
    from compiler.plan import Plan
    from compiler.render.all_targets import render

    path = Path("specs") / spec
    plan, artifacts = compile_spec(path)  # the first compile's plan is the one round-tripped (no third solve)
    first, second = dict(artifacts.with_manifest().files), compile_in_process(path)
    assert first == second
    again = Plan.from_json(plan.to_json())
    assert again.to_json() == plan.to_json()
    assert dict(render(again, targets=plan.targets).with_manifest().files) == first


ENVIRONMENTS = [
    {"PYTHONHASHSEED": "0", "HOME": "/home/alice", "USER": "alice", "LOGNAME": "alice", "TZ": "UTC",
     "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "umask": 0o022, "host": None, "cwd": "a"},
    {"PYTHONHASHSEED": "1", "HOME": "/home/bob-dtc-determinism", "USER": "bobdtcdet", "LOGNAME": "bobdtcdet",
     "TZ": "Asia/Kolkata", "LANG": "C", "LC_ALL": "C", "umask": 0o077, "host": "dtc-other-host",
     "cwd": "deeper/and/different path"},
    {"PYTHONHASHSEED": "random", "HOME": "/nonexistent", "USER": "carol", "LOGNAME": "carol",
     "TZ": "America/St_Johns", "LANG": "POSIX", "LC_ALL": "POSIX", "umask": 0o002, "host": None, "cwd": "c"},
]


def _can_unshare() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    r = subprocess.run([unshare, "--uts", "true"], capture_output=True)
    return r.returncode == 0


def run_in(env_spec: dict, root: Path) -> dict[str, bytes]:
    cwd = root / env_spec["cwd"]
    (cwd / "specs").mkdir(parents=True)
    for spec in SPECS:
        shutil.copy(REPO / "specs" / spec, cwd / "specs" / spec)
    env = {k: v for k, v in env_spec.items() if k.isupper()}
    env.update(PATH=os.environ["PATH"], PYTHONPATH=str(REPO))
    args = [sys.executable, "-m", "compiler", "compile", *[f"specs/{s}" for s in SPECS], "--out", "generated"]
    if env_spec["host"] and _can_unshare():
        script = f"hostname {env_spec['host']} && exec \"$@\""
        args = ["unshare", "--uts", "sh", "-c", script, "sh", *args]
    umask = env_spec["umask"]
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
                       preexec_fn=lambda: os.umask(umask))
    assert r.returncode == 0, r.stderr
    out = cwd / "generated"
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, bytes]]:
    root = tmp_path_factory.mktemp("determinism")
    results = [run_in(e, root / f"env{i}") for i, e in enumerate(ENVIRONMENTS)]
    FIGURES["specs"], FIGURES["runs"] = len(SPECS), len(results)
    return results


@pytest.mark.slow  # compiles in subprocesses under other environments
def test_identical_bytes_across_environments(runs: list[dict[str, bytes]]) -> None:
    first = runs[0]
    assert len({name.split("/")[0] for name in first}) == len(SPECS)
    for other in runs[1:]:
        assert sorted(other) == sorted(first)
        different = [name for name in first if first[name] != other[name]]
        assert not different, f"differ between environments: {different}"
    FIGURES["files"] = len(first)


@pytest.mark.slow  # compares with subprocess compiles
def test_in_process_equals_subprocess(runs: list[dict[str, bytes]]) -> None:
    from compiler.spec.load import load_spec

    for spec in SPECS:
        name = load_spec(REPO / "specs" / spec).spec.name
        files = compile_in_process(Path("specs") / spec)
        for rel, text in files.items():
            assert runs[0][f"{name}/{rel}"] == text.encode(), f"{name}/{rel}"


@pytest.mark.slow  # reads the cross-environment subprocess compiles
def test_nothing_of_the_machine_leaks(runs: list[dict[str, bytes]]) -> None:
    words = {"alice", "bobdtcdet", "carol", "dtc-other-host", "bob-dtc-determinism", "different path",
             socket.gethostname(), str(REPO), os.getcwd()}
    words = {w for w in words if w and len(w) > 3}
    for name, data in runs[0].items():
        text = data.decode("utf-8")
        for word in words:
            assert word not in text, f"{name} contains {word!r}"
        for pattern, what in FORBIDDEN:
            found = pattern.search(text)
            assert not found, f"{name} contains {what}: {found.group(0)!r}"
        for number in re.findall(r"\b1\d{9}\b", text):  # a Unix time within a day of this run
            assert abs(int(number) - NOW) > 86400, f"{name} contains a timestamp of this run: {number}"
    for name, data in runs[1].items():
        assert b"bobdtcdet" not in data and b"dtc-other-host" not in data, name


@pytest.mark.slow  # reads the cross-environment subprocess compiles
def test_generated_text_is_plain(runs: list[dict[str, bytes]]) -> None:
    """LF line endings, exactly one trailing newline, valid UTF-8, no tabs or control characters."""
    for name, data in runs[0].items():
        text = data.decode("utf-8")
        assert "\r" not in text, name
        assert text.endswith("\n") and not text.endswith("\n\n"), name
        bad = [ch for ch in text if ord(ch) < 32 and ch not in "\n\t"]
        assert not bad, f"{name} has control characters {bad[:3]!r}"


def test_absolute_spec_paths_leave_no_trace(tmp_path: Path) -> None:
    """`dtc compile /abs/path/spec.yaml` from two different places writes the same bytes."""
    outs = []
    for where in ("one/place", "another/deeper/place"):
        folder = tmp_path / where
        folder.mkdir(parents=True)
        shutil.copy(REPO / "specs" / "7b.yaml", folder / "7b.yaml")
        r = subprocess.run([sys.executable, "-m", "compiler", "compile", str(folder / "7b.yaml"), "--out",
                            str(folder / "out")], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
        assert r.returncode == 0, r.stderr
        out = folder / "out"
        outs.append({p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()})
    assert outs[0] == outs[1]
    for name, data in outs[0].items():
        assert str(tmp_path).encode() not in data, name
