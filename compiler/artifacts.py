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
  it; the next ``write_artifacts`` for that name removes it. That holds for a kill while
  a run deletes a folder too (its staging folder, the replaced folder, an earlier run's
  leftover): the staging mark goes into every folder dtc deletes first and out last. Where
  ``renameat2(RENAME_EXCHANGE)`` is unsupported (non-Linux, some network file
  systems) the swap is two renames, and a kill between them leaves the old set in
  ``.dtc-old-<name>-<pid>``, which the next write puts back before doing anything.
- One writer at a time (issue #16): a writer holds an exclusive ``flock`` on the
  parent folder from its first look at leftovers to its last removal, so a second
  ``dtc compile`` of the same spec waits (at most LOCK_WAIT_S) instead of deleting the
  first one's live staging folder; each run ends with a complete folder. On a file
  system without locks nothing is cleaned up (leftovers stay; the swap is still atomic).
- Only what is provably dtc's is deleted (issue #16): a leftover ``.dtc-tmp-*`` /
  ``.dtc-old-*`` entry is removed only if it is a real folder that is empty, carries
  the staging mark (STAGING_MARK, written first into every staging folder and removed
  just before the swap), or is a complete generated folder (its files match its
  manifest). A file, a symbolic link or a folder of someone else's with such a name is
  left alone; inside ``out_dir`` every entry counts (``.dtc-*`` names, ``*.obtained``,
  symbolic links, dangling or not, FIFOs), so a folder holding one is "edited by hand".
- ``out_dir`` itself is never a symbolic link: dtc refuses to replace one (and so
  never writes into the folder it points to), and no symbolic link inside it is
  followed when it is read (``read_artifacts``, ``foreign_entries``).
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import hashlib
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterator, Mapping

from compiler.errors import ArtifactError, Diagnostic, Location

MANIFEST = "MANIFEST.sha256"
_TMP_PREFIX = ".dtc-tmp-"
_OLD_PREFIX = ".dtc-old-"
STAGING_MARK = ".dtc-staging"  # in a staging folder while it fills: the proof that dtc made it
LOCK_WAIT_S = 120.0  # how long a second writer into the same folder waits for the first


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


def _entries(out_dir: Path) -> list[tuple[str, str]]:
    """(relative POSIX path, kind) of everything under ``out_dir``, never following a symbolic link:
    kind is "file" (regular), "link" (a symbolic link, dangling or not) or "other" (FIFO, socket,
    device). Folders are walked, not listed."""
    found: list[tuple[str, str]] = []
    for dirpath, dirnames, filenames in os.walk(out_dir, followlinks=False):
        base = Path(dirpath)
        for name in sorted(dirnames + filenames):
            path = base / name
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode):
                continue
            kind = "file" if stat.S_ISREG(mode) else "link" if stat.S_ISLNK(mode) else "other"
            found.append((path.relative_to(out_dir).as_posix(), kind))
    return sorted(found)


def read_regular_file(path: Path) -> bytes | None:
    """A regular file's bytes, opened without following a symbolic link (None if it is not one now)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        return f.read()


def read_artifacts(out_dir: Path) -> ArtifactSet:
    """Every regular file under ``out_dir`` (relative POSIX paths), except EXTRA_FILES.

    Files are decoded from their exact bytes (no newline translation), so a file whose line
    endings were changed by hand reads as changed. A symbolic link is never followed (its
    target could be anything, e.g. ../../.git/config): links, FIFOs and the like are listed by
    ``foreign_entries`` instead.
    """
    files: dict[str, str] = {}
    if out_dir.is_symlink() or not out_dir.is_dir():
        return ArtifactSet({})
    for rel, kind in _entries(out_dir):
        if kind == "file" and rel not in EXTRA_FILES:
            data = read_regular_file(out_dir / rel)
            if data is not None:
                files[rel] = data.decode("utf-8", errors="replace")
    return ArtifactSet(files)


def foreign_entries(out_dir: Path) -> list[str]:
    """Entries of a generated folder that are not regular files (symbolic links, dangling or not,
    FIFOs, sockets, devices): dtc never writes one, never follows or reads one."""
    if out_dir.is_symlink() or not out_dir.is_dir():
        return []
    return [rel for rel, kind in _entries(out_dir) if kind != "file"]


def hand_edited_files(out_dir: Path) -> list[str]:
    """Files in a generated folder that differ from its manifest (or all files, if it has none),
    with every entry that is not a regular file."""
    current = read_artifacts(out_dir)
    foreign = foreign_entries(out_dir)
    if not current.files:
        return foreign
    if MANIFEST not in current:
        return sorted(set(current.files) | set(foreign))
    expected: dict[str, str] = {}
    for line in current[MANIFEST].splitlines():
        digest, _, rel = line.partition("  ")
        expected[rel] = digest
    changed = [rel for rel, text in current.files.items() if rel != MANIFEST and expected.get(rel) != _sha(text)]
    changed += [rel for rel in expected if rel not in current]
    return sorted(set(changed) | set(foreign))


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


def write_text_atomically(path: Path, text: str) -> None:
    """One file (a cluster profile, a sweep's PLAN.md): written beside ``path`` and renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write(artifacts: ArtifactSet, out_dir: Path, *, force: bool) -> None:
    parent = out_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    with _writer_lock(parent) as locked:
        if locked:
            _clean_leftovers(parent, out_dir.name)
        _write_locked(artifacts, out_dir, force=force)


def _write_locked(artifacts: ArtifactSet, out_dir: Path, *, force: bool) -> None:
    parent = out_dir.parent
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
        with open(staged / STAGING_MARK, "w", encoding="utf-8") as f:  # first: the folder is provably dtc's
            f.write("a staging folder of dtc compile; safe to delete\n")
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
        os.remove(staged / STAGING_MARK)  # from here on the folder is a complete set (its manifest proves it)
        os.chmod(staged, 0o755)
        _fsync_dir(staged, strict=True)
        _swap_in(staged, out_dir)
        _fsync_dir(parent, strict=False)  # the swap is done: the new folder is in place either way
    finally:
        _discard(staged)


@contextlib.contextmanager
def _writer_lock(parent: Path):
    """An exclusive flock on ``parent`` while this process writes into it (yields False where the
    file system has no locks). A second writer waits up to LOCK_WAIT_S, then gives up with exit 2."""
    import fcntl

    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield False
        return
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        locked = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ArtifactError(Diagnostic(
                        summary=f"another dtc is writing into {parent}; gave up after {LOCK_WAIT_S:.0f} s",
                        location=Location(str(parent)),
                        hint="wait for the other dtc compile to finish, then run this one again")) from None
                time.sleep(0.02)
            except OSError:  # no locks on this file system: write without one, clean nothing up
                break
        yield locked
    finally:
        os.close(fd)  # releases the lock


def _swap_in(staged: Path, out_dir: Path) -> None:
    if not out_dir.exists():
        os.rename(staged, out_dir)
        return
    if _rename_exchange(staged, out_dir):
        _discard(staged)  # staged now holds the old folder
        return
    old = out_dir.parent / f"{_OLD_PREFIX}{out_dir.name}-{os.getpid()}"
    os.rename(out_dir, old)
    try:
        os.rename(staged, out_dir)
    except BaseException:
        os.rename(old, out_dir)  # put the old folder back before reporting the failure
        raise
    _discard(old)


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


def is_dtc_leftover(path: Path) -> bool:
    """Provably dtc's own: a real folder that is empty, carries the staging mark, or is a complete
    generated folder (every file matches its manifest, nothing else in it). Anything else with a
    ``.dtc-*`` name (a file, a symbolic link, a folder of someone else's) is left alone."""
    if path.is_symlink() or not path.is_dir():
        return False
    entries = _entries(path)
    if not entries:
        return True
    if (STAGING_MARK, "file") in entries:
        return True
    return (MANIFEST, "file") in entries and not hand_edited_files(path)


def _clean_leftovers(parent: Path, name: str) -> None:
    """Undo what a killed earlier run left next to ``name``: put back an old folder, drop staging.

    Called only under the writer lock, so no live run's staging folder can be among them."""
    target = parent / name
    if not target.exists() and not target.is_symlink():
        olds = [p for p in _leftovers(parent, _OLD_PREFIX, name) if p.is_dir() and not p.is_symlink()]
        if olds:  # killed between the two renames of the fallback swap: the old folder is complete
            os.rename(olds[-1], target)
    for prefix in (_TMP_PREFIX, _OLD_PREFIX):
        for path in _leftovers(parent, prefix, name):
            if is_dtc_leftover(path):
                _discard(path)  # a kill while deleting it leaves it still provably dtc's


def _discard(path: Path) -> None:
    """Delete a folder of dtc's (the replaced folder, a staging folder, an earlier run's leftover) so that a kill at
    any moment leaves a leftover the next write recognises: the staging mark goes in first and out last (a folder
    half-deleted without it, its manifest gone first, would look like someone else's and stay for good). A symbolic
    link or a file swapped into its place is unlinked, never followed."""
    if path.is_symlink() or not path.is_dir():
        _remove(path)
        return
    try:
        with open(path / STAGING_MARK, "w", encoding="utf-8") as f:
            f.write("dtc: a folder of dtc's, being deleted\n")
    except OSError:
        _remove(path)
        return
    for child in list(path.iterdir()):
        if child.name != STAGING_MARK:
            _remove(child)
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
