"""A wheel install works on its own: templates and catalogs ship inside it, and it writes the
same bytes as the editable install (no dependence on the checkout)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from helpers import REPO

pytestmark = pytest.mark.slow  # builds a wheel and installs it into a fresh virtual environment


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    dist = root / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(REPO)], check=True, timeout=300)
    wheels = list(dist.glob("dtc-*.whl"))
    assert len(wheels) == 1, wheels
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    subprocess.run([str(env_dir / "bin/python"), "-m", "pip", "install", "-q", str(wheels[0])], check=True,
                   timeout=600)
    return env_dir


def test_wheel_contains_templates_and_data(wheel_venv: Path) -> None:
    out = subprocess.run([str(wheel_venv / "bin/python"), "-c",
                          "import importlib.resources as r; root = r.files('compiler'); "
                          "print(sorted(p.name for p in (root / 'templates').iterdir())); "
                          "print(sorted(p.name for p in (root / 'data').iterdir())); "
                          "from compiler.targets import registry; "
                          "print({t.name: sorted(p.name for p in (root / 'targets' / t.name / t.templates).iterdir()) "
                          "for t in registry.targets() if t.templates})"],
                         capture_output=True, text=True, cwd="/", check=True)
    assert "gpus.yaml" in out.stdout and "models.yaml" in out.stdout
    assert "bridge_perf_recipes.csv" in out.stdout  # dtc calibrate reads Megatron-Bridge runs with it
    assert "report" in out.stdout
    assert "torchrun.sbatch.j2" in out.stdout and "megatron_args.sh.j2" in out.stdout


def test_wheel_dtc_compiles_byte_identically(wheel_venv: Path, tmp_path: Path) -> None:
    """Every example spec, compiled by the wheel and by the checkout (different hash seeds)."""
    (tmp_path / "specs").mkdir()
    specs = sorted(p.name for p in (REPO / "specs").glob("*.yaml"))
    for name in specs:
        shutil.copy(REPO / "specs" / name, tmp_path / "specs" / name)
    args = ["compile", *[f"specs/{name}" for name in specs], "-o"]
    wheel_out, editable_out = tmp_path / "wheel", tmp_path / "editable"
    r = subprocess.run([str(wheel_venv / "bin/dtc"), *args, str(wheel_out)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600,
                       env={"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "1"})
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "compiler", *args, str(editable_out)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "2"})
    assert r.returncode == 0, r.stderr
    assert len([p for p in wheel_out.iterdir() if p.is_dir()]) == len(specs)
    files = sorted(p.relative_to(wheel_out) for p in wheel_out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(editable_out) for p in editable_out.rglob("*") if p.is_file())
    for rel in files:
        assert (wheel_out / rel).read_bytes() == (editable_out / rel).read_bytes(), rel
    assert (wheel_venv / "bin/dtc").exists()
    assert subprocess.run([str(wheel_venv / "bin/dtc"), "--help"], capture_output=True).returncode == 0
