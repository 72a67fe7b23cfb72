"""ArtifactSet and the only code that writes generated output to disk.

``write_artifacts`` replaces ``out_dir`` atomically: the new files are written
into a temporary sibling folder, fsynced, and swapped in with one
``renameat2(RENAME_EXCHANGE)`` (two renames where the kernel lacks it), so a
crash at any point leaves either the old folder or the new one, never a mix,
and no temporary folder behind on the next run. Each folder carries
``MANIFEST.sha256``; a folder whose files no longer match it was edited by hand
and is not overwritten without ``force``.

Guarantees, precisely (tests/test_atomic_write.py):

- An exception at any step (a full disk, a permission error, a failing fsync)
  leaves ``out_dir`` byte-identical and removes the staging folder before
  ``write_artifacts`` returns; OS errors are reported as ``ArtifactError`` (exit 2).
  After the swap nothing can fail the call: if deleting the replaced folder fails,
  it stays as a ``.dtc-*`` entry until the next write for that name.
- A kill at any moment leaves ``out_dir`` either the complete old set or the
  complete new set. The staging folder (``.dtc-tmp-<name>-*``) may remain next to
  it; the next ``write_artifacts`` for that name removes it. Where
  ``renameat2(RENAME_EXCHANGE)`` is unsupported (non-Linux, some network file
  systems) the swap is two renames, and a kill between them leaves the old set in
  ``.dtc-old-<name>-<pid>``, which the next write puts back before doing anything.
- ``out_dir`` itself is never a symbolic link: dtc refuses to replace one (and so
  never writes into the folder it points to).
"""
from __future__ import annotations

import ctypes
import errno
import glob
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterator, Mapping

from compiler.errors import ArtifactError, Diagnostic, Location

MANIFEST = "MANIFEST.sha256"
_TMP_PREFIX = ".dtc-tmp-"
_OLD_PREFIX = ".dtc-old-"


@dataclass(frozen=True)
class ArtifactSet:
    """Ordered {relative path: text}; pure data, no disk."""

    files: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for rel in self.files:
            p = PurePosixPath(rel)
            assert not p.is_absolute() and ".." not in p.parts and rel == str(p), f"bad artifact path {rel!r}"

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)

    def __getitem__(self, rel: str) -> str:
        return self.files[rel]

    def __contains__(self, rel: object) -> bool:
        return rel in self.files

    def with_manifest(self) -> "ArtifactSet":
        body = "".join(f"{_sha(text)}  {rel}\n" for rel, text in sorted(self.files.items()) if rel != MANIFEST)
        return ArtifactSet({**{k: v for k, v in self.files.items() if k != MANIFEST}, MANIFEST: body})


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# Files other commands keep inside a generated folder that are not compile output: `dtc smoke`
# writes its report there. They are not compared, not treated as hand edits, and survive a
# recompile (smoke.json names the plan.json hash it was measured against).
EXTRA_FILES = frozenset({"smoke.json"})


def read_artifacts(out_dir: Path) -> ArtifactSet:
    """Every regular file under ``out_dir`` (relative POSIX paths), skipping dtc's temp folders.

    Files are decoded from their exact bytes (no newline translation), so a file whose line
    endings were changed by hand reads as changed.
    """
    files: dict[str, str] = {}
    if not out_dir.is_dir():
        return ArtifactSet({})
    for path in sorted(out_dir.rglob("*")):
        rel = path.relative_to(out_dir).as_posix()
        if (path.is_file() and not rel.startswith((_TMP_PREFIX, _OLD_PREFIX)) and not rel.endswith(".obtained")
                and rel not in EXTRA_FILES):
            files[rel] = path.read_bytes().decode("utf-8", errors="replace")
    return ArtifactSet(files)


def hand_edited_files(out_dir: Path) -> list[str]:
    """Files in a generated folder that differ from its manifest (or all files, if it has none)."""
    current = read_artifacts(out_dir)
    if not current.files:
        return []
    if MANIFEST not in current:
        return sorted(current.files)
    expected: dict[str, str] = {}
    for line in current[MANIFEST].splitlines():
        digest, _, rel = line.partition("  ")
        expected[rel] = digest
    changed = [rel for rel, text in current.files.items() if rel != MANIFEST and expected.get(rel) != _sha(text)]
    changed += [rel for rel in expected if rel not in current]
    return sorted(set(changed))


def write_artifacts(artifacts: ArtifactSet, out_dir: Path, *, force: bool = False) -> None:
    """Atomically replace ``out_dir`` with ``artifacts`` (plus a manifest)."""
    out_dir = Path(out_dir)
    if out_dir.name in ("", ".", ".."):
        raise ArtifactError(Diagnostic(summary=f"not a folder name to write: {str(out_dir)!r}",
                                       location=Location(str(out_dir)), hint="write into a named folder"))
    try:
        _write(artifacts, out_dir, force=force)
    except OSError as exc:
        where = exc.filename if isinstance(exc.filename, str) else str(out_dir)
        raise ArtifactError(Diagnostic(
            summary=f"cannot write {out_dir}: {exc.strerror or exc}",
            location=Location(str(out_dir)), detail=f"at {where}" if where != str(out_dir) else "",
            hint=f"check free space and permissions; {out_dir} was left as it was")) from None


def _write(artifacts: ArtifactSet, out_dir: Path, *, force: bool) -> None:
    parent = out_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    _clean_leftovers(parent, out_dir.name)
    if out_dir.is_symlink():
        raise ArtifactError(Diagnostic(
            summary=f"{out_dir} is a symbolic link; refusing to replace it",
            location=Location(str(out_dir)),
            detail=f"it points to {os.readlink(out_dir)}; dtc writes only real folders inside --out",
            hint="remove the link, or pass the folder it points to (its parent) as --out"))
    if out_dir.exists() and not out_dir.is_dir():
        raise ArtifactError(Diagnostic(summary=f"output path exists and is not a folder: {out_dir}",
                                       location=Location(str(out_dir)), hint="choose another --out"))
    if out_dir.exists() and not force:
        edited = hand_edited_files(out_dir)
        if edited:
            raise ArtifactError(Diagnostic(
                summary=f"{out_dir} was edited by hand; refusing to overwrite it",
                location=Location(str(out_dir)),
                detail="changed or unknown files:\n" + "\n".join(f"  {rel}" for rel in edited),
                hint="move your edits into the spec, or pass --force to overwrite"))
    staged = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{out_dir.name}-", dir=parent))
    try:
        for rel, text in artifacts.with_manifest().files.items():
            target = staged / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            if rel.endswith((".sh", ".sbatch", ".py")):
                os.chmod(target, 0o755)
        for rel in sorted(EXTRA_FILES):
            kept = out_dir / rel
            if kept.is_file() and not kept.is_symlink() and rel not in artifacts.files:
                shutil.copy2(kept, staged / rel)
        os.chmod(staged, 0o755)
        _fsync_dir(staged, strict=True)
        _swap_in(staged, out_dir)
        _fsync_dir(parent, strict=False)  # the swap is done: the new folder is in place either way
    finally:
        _remove(staged)


def _swap_in(staged: Path, out_dir: Path) -> None:
    if not out_dir.exists():
        os.rename(staged, out_dir)
        return
    if _rename_exchange(staged, out_dir):
        _remove(staged)  # staged now holds the old folder
        return
    old = out_dir.parent / f"{_OLD_PREFIX}{out_dir.name}-{os.getpid()}"
    os.rename(out_dir, old)
    try:
        os.rename(staged, out_dir)
    except BaseException:
        os.rename(old, out_dir)  # put the old folder back before reporting the failure
        raise
    _remove(old)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _rename_exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths with renameat2(2); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _leftovers(parent: Path, prefix: str, name: str) -> list[Path]:
    """``prefix + name + '-' + suffix`` entries, where the suffix is dtc's (no '-': not another spec's)."""
    found = []
    for path in parent.glob(f"{glob.escape(prefix + name)}-*"):
        suffix = path.name[len(prefix) + len(name) + 1:]
        if suffix and "-" not in suffix:
            found.append(path)
    return sorted(found)


def _clean_leftovers(parent: Path, name: str) -> None:
    """Undo what a killed earlier run left next to ``name``: put back an old folder, drop staging."""
    target = parent / name
    if not target.exists() and not target.is_symlink():
        olds = _leftovers(parent, _OLD_PREFIX, name)
        if olds:  # killed between the two renames of the fallback swap: the old folder is complete
            os.rename(olds[-1], target)
    for prefix in (_TMP_PREFIX, _OLD_PREFIX):
        for path in _leftovers(parent, prefix, name):
            _remove(path)


def _remove(path: Path) -> None:
    """Delete a staging/old folder, or a symlink that was swapped into its place (never following it)."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink(missing_ok=True)
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)


def _fsync_dir(path: Path, *, strict: bool) -> None:
    """fsync a directory (its entries); where directories cannot be opened, skip it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        if strict:
            raise
    finally:
        os.close(fd)
