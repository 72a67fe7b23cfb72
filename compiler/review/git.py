"""Files and folders as of a git revision, for `dtc diff --base REV` (git run as a subprocess, never a shell).

Names are read with -z (git quotes unusual names in its line output, never in -z output) and kept as
bytes where git takes them, so that a name with non-UTF-8 bytes still reaches its file.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from compiler.artifacts import ArtifactSet
from compiler.check import SPEC_SUFFIXES
from compiler.errors import DtcError, printable


def _git(root: Path, *args: str | bytes) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=60)
    except FileNotFoundError:
        raise DtcError("git is not installed; --base needs git") from None


def repo_root(near: Path) -> Path:
    start = near if near.is_dir() else near.parent
    while not start.exists() and start != start.parent:
        start = start.parent
    result = _git(start, "rev-parse", "--show-toplevel")
    if result.returncode != 0:
        raise DtcError(f"{near} is not inside a git repository; --base needs one",
                       hint="run dtc diff --base from a git checkout, or compare two files: dtc diff OLD NEW")
    return Path(result.stdout.decode().strip()).resolve()


def verify_rev(root: Path, rev: str) -> None:
    if rev.startswith("-") or _git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").returncode != 0:
        raise DtcError(f"unknown git revision {rev!r} in {root}",
                       hint="check the name; in CI fetch the history first (actions/checkout with fetch-depth: 0)")


def git_show(root: Path, rev: str, rel: str) -> bytes | None:
    """The file ``rel`` (relative to the top) as of ``rev``; None if it did not exist there. A symbolic
    link is its blob (the link's text), never the file it points to."""
    result = _git(root, "cat-file", "blob", os.fsencode(f"{rev}:{rel}"))
    return result.stdout if result.returncode == 0 else None


def changed_paths(root: Path, rev: str, rel: str, *, strict: bool) -> set[str]:
    """Paths under ``rel`` changed, added or deleted since ``rev`` (tracked or untracked), read with -z:
    git quotes names with non-ASCII bytes, quotes or newlines in its line output ("0 specs changed"
    while one had), never in -z output. Bytes that are not UTF-8 become surrogate escapes (os.fsdecode),
    so the name still reaches the file on disk."""
    names: set[str] = set()
    for args in (("diff", "--name-only", "-z", "--no-renames", rev, "--", rel),
                 ("ls-files", "-z", "--others", "--exclude-standard", "--", rel)):
        result = _git(root, *args)
        if result.returncode != 0:
            if strict:
                raise DtcError(f"git {args[0]} failed: {printable(result.stderr.decode(errors='replace').strip())}")
            continue
        names.update(os.fsdecode(name) for name in result.stdout.split(b"\0") if name)
    return names


def changed_specs(root: Path, rev: str, specs_dir: Path) -> list[Path]:
    """Specs under ``specs_dir`` changed, added or deleted since ``rev`` (tracked or untracked)."""
    rel = os.path.relpath(specs_dir.resolve(), root)
    names = {n for n in changed_paths(root, rev, rel, strict=True) if n.endswith(SPEC_SUFFIXES)}
    return [root / name for name in sorted(names)]


def git_folder(root: Path, rev: str, rel: str) -> ArtifactSet:
    """Every file under the folder ``rel`` as of ``rev`` (relative paths), read in one git call."""
    listing = _git(root, "ls-tree", "-r", "-z", "--name-only", rev, "--", f"{rel}/")
    names = [os.fsdecode(n) for n in listing.stdout.split(b"\0") if n] if listing.returncode == 0 else []
    files: dict[str, str] = {}
    lines = [n for n in names if "\n" not in n]  # cat-file --batch reads one name a line
    if lines:
        batch = subprocess.run(["git", "-C", str(root), "cat-file", "--batch"], capture_output=True, timeout=60,
                               input=b"".join(os.fsencode(f"{rev}:{n}") + b"\n" for n in lines))
        data, pos = batch.stdout, 0
        for name in lines:
            end = data.index(b"\n", pos)
            header = data[pos:end].split()
            pos = end + 1
            if len(header) == 3 and header[1] == b"blob":
                size = int(header[2])
                files[name[len(rel) + 1:]] = data[pos:pos + size].decode("utf-8", errors="replace")
                pos += size + 1
    for name in names:
        if "\n" in name:
            blob = git_show(root, rev, name)
            if blob is not None:
                files[name[len(rel) + 1:]] = blob.decode("utf-8", errors="replace")
    return ArtifactSet(files)
