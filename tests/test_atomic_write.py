"""Never lose output (issue #8, item 4): writing generated/<name>/ is atomic and refuses hand edits.

The guarantee tested here, precisely:

1. An error at any step of ``write_artifacts`` (every open, write, fsync, chmod, rename and
   directory fsync is made to fail in turn, including a write that stops halfway as on a full
   disk) leaves the previous folder byte-identical if the failure came before the swap, or the
   complete new folder if it came after; it is reported as an ``ArtifactError`` (exit 2, not an
   internal error), and no ``.dtc-tmp-*`` / ``.dtc-old-*`` entry is left when the call returns.
2. A SIGKILL at any moment of a real ``dtc compile`` leaves the folder as the complete old set
   or the complete new set (checked against its MANIFEST.sha256), never a mix. A killed run
   may leave its staging folder behind; the next successful write for that name removes it.
   Where ``renameat2(RENAME_EXCHANGE)`` is unavailable the swap is two renames; a kill between
   them leaves the old set in ``.dtc-old-<name>-<pid>``, and the next write puts it back first.
3. A folder edited by hand (a changed, added or removed file, or changed line endings) or one
   dtc did not write (no manifest) is not overwritten without ``--force``; the error lists
   the files. ``--force`` replaces it with exactly the new set.
"""
from __future__ import annotations

import builtins
import errno
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import compiler.artifacts as artifacts_mod
from compiler.artifacts import MANIFEST, ArtifactSet, write_artifacts
from compiler.errors import ArtifactError
from hardening_report import figure, register
from helpers import REPO

NAME = "atomic"
FIGURES = {"injected": 0, "kills": 0, "kills_mid_write": 0, "old": 0, "new": 0}


@pytest.fixture(scope="module", autouse=True)
def _figures(request: pytest.FixtureRequest):
    register(request.config)
    yield
    figure("atomic", f"atomic write: {FIGURES['injected']} injected failures, {FIGURES['kills']} SIGKILLs "
                     f"({FIGURES['kills_mid_write']} while staging/swapping): {FIGURES['old']} left the old set, "
                     f"{FIGURES['new']} the new set, 0 partial")


def spec_text(partition: str) -> str:
    return (f"name: {NAME}\nmodel: {{preset: llama2-7b}}\n"
            "training: {tokens: 100B, sequence_length: 4096, global_batch: 1024}\n"
            "cluster: {gpu: h100-sxm, num_gpus: 8}\nbudget: {objective: throughput}\n"
            f"slurm: {{partition: {partition}, time_limit: 2h}}\n")


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> tuple[ArtifactSet, ArtifactSet]:
    """Two real artifact sets for the same name that differ (old: partition a, new: partition b)."""
    from compiler.pipeline import compile_loaded
    from compiler.spec.load import load_spec_text

    old = compile_loaded(load_spec_text(spec_text("old-part"), "spec.yaml"))[1]
    new = compile_loaded(load_spec_text(spec_text("new-part"), "spec.yaml"))[1]
    assert old.files != new.files
    return old, new


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def expected_bytes(artifacts: ArtifactSet) -> dict[str, bytes]:
    return {rel: text.encode() for rel, text in artifacts.with_manifest().files.items()}


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith((".dtc-tmp-", ".dtc-old-")))


def manifest_ok(folder: Path) -> bool:
    files = snapshot(folder)
    if MANIFEST not in files:
        return False
    listed = {}
    for line in files[MANIFEST].decode().splitlines():
        digest, _, rel = line.partition("  ")
        listed[rel] = digest
    rest = {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items() if rel != MANIFEST}
    return listed == rest


# --------------------------------------------------------------------------- injected failures

class Boom(OSError):
    def __init__(self) -> None:
        super().__init__(errno.ENOSPC, "No space left on device (injected)")


class _HalfWriter:
    """A file whose write stops halfway, as on a full disk."""

    def __init__(self, f: Any) -> None:
        self._f = f

    def write(self, text: str) -> int:
        self._f.write(text[: len(text) // 2])
        self._f.flush()
        raise Boom()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __enter__(self) -> "_HalfWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._f.close()


def _targets() -> list[tuple[str, Any, str]]:
    """(label, object, attribute) of every operation write_artifacts performs."""
    return [("open", artifacts_mod, "open"), ("write", artifacts_mod, "open"), ("fsync", os, "fsync"),
            ("chmod", os, "chmod"), ("rename", os, "rename"), ("remove-mark", os, "remove"),
            ("mkdtemp", artifacts_mod.tempfile, "mkdtemp"), ("exchange", artifacts_mod, "_rename_exchange")]


def _original(obj: Any, attr: str) -> Callable:
    return builtins.open if (obj is artifacts_mod and attr == "open") else getattr(obj, attr)


def count_calls(monkeypatch: pytest.MonkeyPatch, fn: Callable[[], None]) -> dict[str, int]:
    counts: dict[str, int] = {}
    with monkeypatch.context() as m:
        for label, obj, attr in _targets():
            if label == "write":
                continue
            real = _original(obj, attr)

            def counting(*a: Any, _real: Callable = real, _label: str = label, **k: Any) -> Any:
                counts[_label] = counts.get(_label, 0) + 1
                return _real(*a, **k)

            m.setattr(obj, attr, counting, raising=False)
        fn()
    counts["write"] = counts.get("open", 0)
    return counts


def fail_at(m: pytest.MonkeyPatch, label: str, obj: Any, attr: str, k: int) -> None:
    real = _original(obj, attr)
    seen = [0]

    def failing(*a: Any, **kw: Any) -> Any:
        seen[0] += 1
        if seen[0] != k:
            return real(*a, **kw)
        if label == "write":
            return _HalfWriter(real(*a, **kw))
        raise Boom()

    m.setattr(obj, attr, failing, raising=False)


@pytest.mark.slow  # hundreds of injected failures, each a full fsync'd write
@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_failure_at_every_step_leaves_old_or_new(exchange: bool, sets, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = sets
    out = tmp_path / NAME
    if not exchange:
        monkeypatch.setattr(artifacts_mod, "_rename_exchange", lambda a, b: False)
    write_artifacts(old, out)
    old_bytes, new_bytes = snapshot(out), expected_bytes(new)
    assert old_bytes == expected_bytes(old)

    counts = count_calls(monkeypatch, lambda: write_artifacts(new, out))
    write_artifacts(old, out)
    # opens: every file, the manifest, the staging mark and the mark put into the replaced folder before it is
    # deleted (after an exchange, or the second of two renames)
    assert counts.get("open", 0) == len(new.files) + 3 and counts.get("fsync", 0) >= len(new.files) + 1, counts
    tried = 0
    for label, obj, attr in _targets():
        for k in range(1, counts.get(label, 0) + 1):
            with monkeypatch.context() as m:
                fail_at(m, label, obj, attr, k)
                try:
                    write_artifacts(new, out)
                    failed = False
                except ArtifactError as exc:
                    failed = True
                    assert "No space left on device" in exc.render() and "left as it was" in exc.render()
            tried += 1
            FIGURES["injected"] += 1
            state = snapshot(out)
            assert state in (old_bytes, new_bytes), f"{label} #{k}: a mix of old and new"
            if failed:
                assert state == old_bytes, f"{label} #{k} failed but the folder changed"
            assert leftovers(tmp_path) == [], f"{label} #{k} left {leftovers(tmp_path)}"
            write_artifacts(old, out, force=True)  # reset for the next step
            assert snapshot(out) == old_bytes and leftovers(tmp_path) == []
    assert tried >= 40, counts


def test_undeletable_old_folder_is_removed_by_the_next_write(sets, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The one leftover a returning call may leave: the replaced folder, when deleting it fails."""
    old, new = sets
    out = tmp_path / NAME
    write_artifacts(old, out)
    with monkeypatch.context() as m:
        m.setattr(artifacts_mod.shutil, "rmtree", lambda *a, **k: None)  # rmtree(ignore_errors) that failed
        write_artifacts(new, out)
    assert snapshot(out) == expected_bytes(new)
    assert len(leftovers(tmp_path)) == 1
    write_artifacts(new, out)
    assert leftovers(tmp_path) == []


def test_kill_between_the_two_renames_is_repaired(sets, tmp_path: Path) -> None:
    """The state a SIGKILL between the fallback's two renames leaves: no folder, the old one aside."""
    old, new = sets
    out = tmp_path / NAME
    write_artifacts(old, out)
    old_bytes = snapshot(out)
    staged = tmp_path / f".dtc-tmp-{NAME}-abc123"
    shutil.copytree(out, staged)
    (staged / "plan.json").write_text("half")  # a staging folder the kill interrupted (still marked)
    (staged / artifacts_mod.STAGING_MARK).write_text("")
    os.rename(out, tmp_path / f".dtc-old-{NAME}-4242")
    write_artifacts(new, out)  # not --force: the restored folder matches its manifest
    assert snapshot(out) == expected_bytes(new)
    assert leftovers(tmp_path) == []
    # and with a hand-edited old folder, the repair happens and the refusal still protects it
    write_artifacts(old, out, force=True)
    (out / "PLAN.md").write_text("my notes\n")
    edited = snapshot(out)
    os.rename(out, tmp_path / f".dtc-old-{NAME}-4243")
    with pytest.raises(ArtifactError, match="edited by hand"):
        write_artifacts(new, out)
    assert snapshot(out) == edited and leftovers(tmp_path) == []
    assert old_bytes != edited


class _Killed(BaseException):
    """A SIGKILL stand-in: not an OSError, so nothing on the way swallows it (rmtree's ignore_errors included)."""


@pytest.mark.parametrize("marked", [True, False], ids=["staging", "complete-set"])
def test_a_kill_while_deleting_a_leftover_leaves_it_recognisable(marked: bool, sets, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the SIGKILL test under load: a run killed while it deleted an earlier run's staging folder left
    part of it without its staging mark and without a whole manifest, so no later run would delete it. The mark
    now goes in first and out last for every folder dtc deletes: stopped after any number of unlinks, what is
    left is still provably dtc's, and the next write removes it."""
    old, new = sets
    out = tmp_path / NAME
    write_artifacts(old, out)
    n_files = len(snapshot(out))
    real_unlink = os.unlink
    for k in range(1, n_files + 2):
        staged = tmp_path / f".dtc-tmp-{NAME}-k{k}"
        shutil.copytree(out, staged)  # a killed run's staging folder: full, marked or just unmarked
        if marked:
            (staged / artifacts_mod.STAGING_MARK).write_text("")
        calls = {"n": 0}

        def unlink(path, *a, **kw):
            calls["n"] += 1
            if calls["n"] == k:
                raise _Killed()
            return real_unlink(path, *a, **kw)

        with monkeypatch.context() as m:
            m.setattr(os, "unlink", unlink)
            with pytest.raises(_Killed):
                write_artifacts(new, out, force=True)
        if staged.exists():
            assert artifacts_mod.is_dtc_leftover(staged), f"stopped at unlink {k}: {sorted(snapshot(staged))}"
        write_artifacts(old, out, force=True)
        assert leftovers(tmp_path) == [], f"stopped at unlink {k}"
        assert snapshot(out) == expected_bytes(old)


def test_leftovers_of_other_specs_are_not_touched(sets, tmp_path: Path) -> None:
    old, _ = sets
    other = tmp_path / f".dtc-tmp-{NAME}-7b-xyz"  # staging of a spec named "atomic-7b"
    other.mkdir()
    write_artifacts(old, tmp_path / NAME)
    assert other.exists()


def test_os_errors_exit_2_through_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from helpers import run_cli

    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text("p"))
    out = tmp_path / "out"
    run_cli(["compile", str(spec), "--out", str(out)])
    before = snapshot(out / NAME)
    spec.write_text(spec_text("q"))
    real = os.fsync
    calls = [0]

    def fsync(fd: int) -> None:
        calls[0] += 1
        if calls[0] == 3:
            raise Boom()
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    result = run_cli(["compile", str(spec), "--out", str(out)], exit_code=2)
    assert "cannot write" in result.stderr and "INTERNAL ERROR" not in result.stderr, result.stderr
    assert snapshot(out / NAME) == before and leftovers(out) == []


# --------------------------------------------------------------------------- real kills


def _compile_proc(spec: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "compiler", "compile", spec.name, "--out", str(out)],
                            cwd=spec.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)


@pytest.mark.slow  # launches writers and kills them
def test_sigkill_at_random_moments(tmp_path: Path) -> None:
    """Kill real `dtc compile` runs: at random delays, and the moment a staging folder appears."""
    rng = random.Random(8)
    spec = tmp_path / "spec.yaml"
    out = tmp_path / "out"
    spec.write_text(spec_text("p0"))
    assert _compile_proc(spec, out).wait(timeout=60) == 0
    sets = {"p0": snapshot(out / NAME)}
    spec.write_text(spec_text("p1"))
    start = time.perf_counter()
    assert _compile_proc(spec, out).wait(timeout=60) == 0
    run_time = time.perf_counter() - start
    sets["p1"] = snapshot(out / NAME)
    assert sets["p0"] != sets["p1"]
    current = "p1"
    for i in range(24):
        target = "p0" if current == "p1" else "p1"
        spec.write_text(spec_text(target))
        proc = _compile_proc(spec, out)
        mid_write = i % 2 == 0
        if mid_write:  # wait for the staging folder, then kill within a few hundred microseconds
            deadline = time.perf_counter() + 60
            while proc.poll() is None and time.perf_counter() < deadline:
                if any(n.startswith(".dtc-tmp-") for n in os.listdir(out)):
                    time.sleep(rng.uniform(0, 0.002))
                    break
        else:
            time.sleep(rng.uniform(0, run_time * 1.1))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            FIGURES["kills"] += 1
            FIGURES["kills_mid_write"] += mid_write
        proc.wait(timeout=60)
        state = snapshot(out / NAME)
        assert state in (sets["p0"], sets["p1"]), f"kill #{i} left a partial folder: {sorted(state)}"
        assert manifest_ok(out / NAME)
        current = "p0" if state == sets["p0"] else "p1"
        FIGURES["old" if current != target else "new"] += 1
    # the next run cleans up whatever the kills left
    spec.write_text(spec_text("p1"))
    assert _compile_proc(spec, out).wait(timeout=60) == 0
    assert snapshot(out / NAME) == sets["p1"] and leftovers(out) == []


# --------------------------------------------------------------------------- hand edits


@pytest.fixture
def compiled(tmp_path: Path) -> tuple[Path, Path]:
    from helpers import run_cli

    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text("p"))
    run_cli(["compile", str(spec), "--out", str(tmp_path / "out")])
    return spec, tmp_path / "out" / NAME


EDITS: dict[str, Callable[[Path], str]] = {
    "changed": lambda d: (d / "train.sbatch").write_text((d / "train.sbatch").read_text() + "echo mine\n")
    and "train.sbatch",
    "removed": lambda d: (d / "ds_config.json").unlink() or "ds_config.json",
    "added": lambda d: (d / "notes.txt").write_text("mine\n") and "notes.txt",
    "crlf": lambda d: (d / "megatron_args.sh").write_bytes((d / "megatron_args.sh").read_bytes().replace(b"\n", b"\r\n"))
    and "megatron_args.sh",
    "truncated": lambda d: (d / "plan.json").write_text("") or "plan.json",
    "manifest-removed": lambda d: (d / MANIFEST).unlink() or "plan.json",
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_hand_edits_are_refused_and_named(edit: str, compiled: tuple[Path, Path]) -> None:
    from helpers import run_cli

    spec, folder = compiled
    named = EDITS[edit](folder)
    edited = snapshot(folder)
    spec.write_text(spec_text("q"))
    result = run_cli(["compile", str(spec), "--out", str(folder.parent)], exit_code=2)
    assert "edited by hand" in result.stderr and f"  {named}" in result.stderr, result.stderr
    assert "--force" in result.stderr
    assert snapshot(folder) == edited
    run_cli(["compile", str(spec), "--out", str(folder.parent), "--force"])
    state = snapshot(folder)
    assert "notes.txt" not in state and manifest_ok(folder)
    assert b"--partition=q" in state["train.sbatch"]
    assert leftovers(folder.parent) == []


def test_foreign_folder_is_refused(tmp_path: Path) -> None:
    from helpers import run_cli

    folder = tmp_path / "out" / NAME
    folder.mkdir(parents=True)
    (folder / "thesis.tex").write_text("years of work\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text("p"))
    result = run_cli(["compile", str(spec), "--out", str(tmp_path / "out")], exit_code=2)
    assert "thesis.tex" in result.stderr
    assert (folder / "thesis.tex").read_text() == "years of work\n"
    (folder / "thesis.tex").unlink()  # an empty folder is fine
    run_cli(["compile", str(spec), "--out", str(tmp_path / "out")])


def test_output_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    from helpers import run_cli

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / NAME).write_text("a file\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text("p"))
    result = run_cli(["compile", str(spec), "--out", str(tmp_path / "out"), "--force"], exit_code=2)
    assert "not a folder" in result.stderr
    assert (tmp_path / "out" / NAME).read_text() == "a file\n"


def test_two_specs_with_one_name_in_one_run_are_refused(tmp_path: Path) -> None:
    from helpers import run_cli

    (tmp_path / "a.yaml").write_text(spec_text("pa"))
    (tmp_path / "b.yaml").write_text(spec_text("pb"))
    result = run_cli(["compile", str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml"), "--out", str(tmp_path / "out")],
                     exit_code=None)
    assert result.exit_code == 2 and NAME in result.stderr, (result.exit_code, result.stderr)


# --------------------------------------------------------------------------- issue #16: one writer, only dtc's own


def test_names_like_dtc_leftovers_are_never_deleted_unless_provably_dtc(sets, tmp_path: Path) -> None:
    """Hand-made entries named like dtc's staging/old folders survive a write; provably dtc's go."""
    old, new = sets
    out = tmp_path / NAME
    write_artifacts(old, out)
    mine = tmp_path / f".dtc-tmp-{NAME}-abcd1234"  # a folder of someone else's
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    old_mine = tmp_path / f".dtc-old-{NAME}-4242"
    old_mine.mkdir()
    (old_mine / "thesis.tex").write_text("years of work\n")
    a_file = tmp_path / f".dtc-tmp-{NAME}-file1"
    a_file.write_text("a file\n")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("keep\n")
    link = tmp_path / f".dtc-old-{NAME}-link1"
    link.symlink_to(target)
    dangling = tmp_path / f".dtc-tmp-{NAME}-dangle1"
    dangling.symlink_to(tmp_path / "nowhere")
    # and what dtc's own runs leave: an empty staging folder, a marked one, a complete replaced folder
    empty = tmp_path / f".dtc-tmp-{NAME}-empty111"
    empty.mkdir()
    marked = tmp_path / f".dtc-tmp-{NAME}-marked11"
    marked.mkdir()
    (marked / artifacts_mod.STAGING_MARK).write_text("")
    (marked / "plan.json").write_text("half")
    complete = tmp_path / f".dtc-tmp-{NAME}-complete"
    shutil.copytree(out, complete)
    write_artifacts(new, out)
    assert snapshot(out) == expected_bytes(new)
    assert (mine / "notes.txt").read_text() == "mine\n" and (old_mine / "thesis.tex").exists()
    assert a_file.read_text() == "a file\n" and link.is_symlink() and (target / "keep.txt").exists()
    assert dangling.is_symlink()
    assert not empty.exists() and not marked.exists() and not complete.exists()


HAND_ADDED: dict[str, Callable[[Path], None]] = {
    "dtc-tmp-file": lambda d: (d / ".dtc-tmp-x-abc").write_text("mine\n"),
    "dtc-old-folder": lambda d: ((d / ".dtc-old-x-1").mkdir(), (d / ".dtc-old-x-1" / "a").write_text("mine\n")),
    "obtained": lambda d: (d / "plan.json.obtained").write_text("mine\n"),
    "dangling-link": lambda d: (d / "link").symlink_to(d / "nowhere"),
    "link-to-file": lambda d: (d / "passwd").symlink_to("/etc/passwd"),
    "fifo": lambda d: os.mkfifo(d / "pipe"),
}


@pytest.mark.parametrize("entry", sorted(HAND_ADDED))
def test_hand_added_entries_in_the_output_folder_are_not_deleted_silently(entry: str, sets, tmp_path: Path) -> None:
    """Inside OUT/<name>/ every entry counts: dtc-like names, *.obtained, links and FIFOs make it
    a hand-edited folder (exit 2, named) instead of disappearing with the next write."""
    old, new = sets
    out = tmp_path / NAME
    write_artifacts(old, out)
    HAND_ADDED[entry](out)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(ArtifactError, match="edited by hand") as err:
        write_artifacts(new, out)
    added = sorted(set(before) - {rel.split("/")[0] for rel in expected_bytes(old)})  # dtc_runtime/ is a folder
    assert added and all(f"  {name}" in err.value.render() for name in added), err.value.render()
    assert sorted(p.name for p in out.iterdir()) == before
    write_artifacts(new, out, force=True)  # --force replaces the folder with exactly the new set
    assert snapshot(out) == expected_bytes(new) and not any(p.is_symlink() for p in out.iterdir())


_HOLD_LOCK = ("import fcntl, os, sys, time\n"
              "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"
              "fcntl.flock(fd, fcntl.LOCK_EX)\n"
              "print('locked', flush=True)\n"
              "time.sleep(float(sys.argv[2]))\n")


@pytest.mark.slow  # launches a second process
def test_a_second_writer_waits_for_the_first(sets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While another process writes into the folder (holds the lock), a write waits; it never cleans
    up that process's staging folder, and gives up with a clean error after LOCK_WAIT_S."""
    old, new = sets
    out = tmp_path / NAME
    write_artifacts(old, out)
    live = tmp_path / f".dtc-tmp-{NAME}-live1234"  # the other writer's staging folder, half written
    live.mkdir()
    (live / artifacts_mod.STAGING_MARK).write_text("")
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(tmp_path), "30"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        monkeypatch.setattr(artifacts_mod, "LOCK_WAIT_S", 0.3)
        with pytest.raises(ArtifactError, match="another dtc is writing"):
            write_artifacts(new, out)
        assert live.exists() and snapshot(out) == expected_bytes(old)
    finally:
        holder.kill()
        holder.wait()
    start = time.perf_counter()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(tmp_path), "0.5"], stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "locked"
    monkeypatch.setattr(artifacts_mod, "LOCK_WAIT_S", 60.0)
    write_artifacts(new, out)  # waits for the holder, then writes (and cleans the dead run's staging)
    holder.wait()
    assert time.perf_counter() - start >= 0.4
    assert snapshot(out) == expected_bytes(new) and leftovers(tmp_path) == []
