"""Spec files that are not plain files (issue #16, items 5, 9 and 11): a FIFO, a device, a symbolic
link out of the repository, a file name that is not UTF-8 or longer than a file system allows.
Each is refused with exit 2 and a clear error, quickly, and without printing the linked file."""
from __future__ import annotations

import os
from pathlib import Path

from helpers import REPO, run_dtc

SPEC = (REPO / "specs/7b.yaml").read_bytes()


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "spec.yaml")
    result = run_dtc(["validate", "spec.yaml"], cwd=tmp_path, timeout=60)  # it used to wait for a writer forever
    assert result.returncode == 2, result.stderr
    assert "got a FIFO" in result.stderr and "Traceback" not in result.stderr


def test_link_out_of_the_folder_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "passwd").write_text("root:x:0:0:SECRET-LINE\nname: t\n")
    specs = tmp_path / "repo" / "specs"
    specs.mkdir(parents=True)
    (specs / "evil.yaml").symlink_to(secret / "passwd")
    (specs / "abs.yaml").symlink_to("/etc/passwd")
    for name in ("evil.yaml", "abs.yaml"):
        result = run_dtc(["validate", f"specs/{name}"], cwd=tmp_path / "repo")
        assert result.returncode == 2, result.stderr
        assert "symbolic link to a file outside its folder" in result.stderr
        assert "SECRET-LINE" not in result.stderr and "root:x" not in result.stderr, result.stderr
    result = run_dtc(["check", "--specs-dir", "specs", "--generated", "generated"], cwd=tmp_path / "repo")
    assert result.returncode == 2 and "SECRET-LINE" not in result.stdout + result.stderr


def test_link_inside_the_folder_is_followed(tmp_path: Path) -> None:
    (tmp_path / "real.yaml").write_bytes(SPEC)
    (tmp_path / "alias.yaml").symlink_to("real.yaml")
    result = run_dtc(["validate", "alias.yaml"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_file_name_that_is_not_utf8(tmp_path: Path) -> None:
    name = os.fsdecode(b"bad\xff\x1b[31m.yaml")
    (tmp_path / name).write_bytes(SPEC)
    for command in (["validate", name], ["compile", name, "--out", "out"]):
        result = run_dtc(command, cwd=tmp_path)
        assert result.returncode == 2, (command, result.stderr)
        assert "not valid UTF-8" in result.stderr and "\x1b" not in result.stderr, result.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_path_component_over_255_bytes(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_bytes(SPEC)
    long = "a" * 300
    for command in (["validate", f"{long}.yaml"], ["compile", "spec.yaml", "--out", long],
                    ["compile", "spec.yaml", "--out", f"x/{long}/y"], ["diff", f"{long}.yaml", "spec.yaml"],
                    ["check", "--generated", long, "spec.yaml"], ["smoke", long]):
        result = run_dtc(command, cwd=tmp_path)
        assert result.returncode == 2, (command[0], result.returncode, result.stderr[-2000:])
        assert "Traceback" not in result.stderr and "INTERNAL ERROR" not in result.stderr, result.stderr
        assert "error" in result.stderr.lower()
