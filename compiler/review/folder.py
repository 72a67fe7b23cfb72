"""An ``ArtifactSet`` against a generated folder on disk: which files would be added, changed, removed.

``compare_folder`` is the one comparer: `dtc compile` lists its result as ``+ ~ - =`` (``file_actions``)
and `dtc check` reports it as missing, stale and orphaned files. Nothing is followed or written: the
folder is read with ``read_artifacts`` (regular files only) and ``foreign_entries`` (symbolic links,
FIFOs and the like, never read). A foreign entry where a file is expected counts as changed; one that
nothing expects counts as removed.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from compiler.artifacts import MANIFEST, ArtifactSet, foreign_entries, read_artifacts


@dataclass(frozen=True)
class FolderComparison:
    actual: ArtifactSet  # the regular files on disk
    foreign: frozenset[str]  # entries on disk that are not regular files
    added: tuple[str, ...]  # expected, absent on disk (in the expected order)
    changed: tuple[str, ...]  # expected, different on disk or not a regular file there (in the expected order)
    removed: tuple[str, ...]  # on disk, not expected (sorted)
    same: tuple[str, ...]  # expected and identical on disk (in the expected order)


def compare_folder(expected: ArtifactSet, out_dir: Path) -> FolderComparison:
    """``expected`` (the manifest included when it has one) against what ``out_dir`` holds."""
    actual = read_artifacts(out_dir)  # never follows a symbolic link (a committed PLAN.md -> ../../.git/config)
    foreign = frozenset(foreign_entries(out_dir))
    added, changed, same = [], [], []
    for rel, text in expected.files.items():
        if rel in foreign or (rel in actual and actual[rel] != text):
            changed.append(rel)
        elif rel not in actual:
            added.append(rel)
        else:
            same.append(rel)
    removed = sorted({rel for rel in actual.files if rel not in expected} | {rel for rel in foreign if rel not in expected})
    return FolderComparison(actual=actual, foreign=foreign, added=tuple(added), changed=tuple(changed),
                            removed=tuple(removed), same=tuple(same))


def file_actions(new: ArtifactSet, out_dir: Path) -> list[tuple[str, str]]:
    """[(symbol, path)] by path: + add, ~ change, - remove, = same (manifest excluded). What `dtc compile`
    lists: the regular files it would write or delete (a foreign entry where a file goes: +)."""
    c = compare_folder(new, out_dir)
    symbol = {rel: "+" for rel in c.added}
    symbol.update({rel: "+" if rel in c.foreign else "~" for rel in c.changed})
    symbol.update({rel: "=" for rel in c.same})
    symbol.update({rel: "-" for rel in c.removed if rel not in c.foreign})
    return [(symbol[rel], rel) for rel in sorted(symbol) if rel != MANIFEST]
