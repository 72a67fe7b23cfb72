"""compiler/review/folder.py: one comparer of an ArtifactSet with a folder, for `dtc compile` and `dtc check`."""
from __future__ import annotations

import os
from pathlib import Path

from compiler.artifacts import MANIFEST, ArtifactSet, write_artifacts
from compiler.check import SpecCheck, compare
from compiler.review.folder import compare_folder, file_actions


def _expected() -> ArtifactSet:
    return ArtifactSet({"plan.json": "{}\n", "ds_config.json": '{\n  "a": 1\n}\n', "PLAN.md": "# x\n",
                        "train.sbatch": "#!/bin/bash\n"}).with_manifest()


def _folder(tmp_path: Path) -> Path:
    """ds_config.json changed, PLAN.md missing, old.sbatch orphaned, train.sbatch a symbolic link,
    a dangling link nothing expects; plan.json unchanged."""
    out = tmp_path / "x"
    write_artifacts(ArtifactSet({"plan.json": "{}\n", "ds_config.json": '{\n  "a": 2\n}\n', "old.sbatch": "#\n"}),
                    out)
    (tmp_path / "elsewhere").write_text("#!/bin/bash\n")
    os.symlink(tmp_path / "elsewhere", out / "train.sbatch")
    os.symlink(tmp_path / "nowhere", out / "dangling")
    return out


def test_compare_folder_classifies_every_entry(tmp_path: Path):
    c = compare_folder(_expected(), _folder(tmp_path))
    assert c.same == ("plan.json",)
    assert c.added == ("PLAN.md",)
    assert set(c.changed) == {"ds_config.json", "train.sbatch", MANIFEST}  # a link where a file goes: changed
    assert c.removed == ("dangling", "old.sbatch")
    assert c.foreign == {"train.sbatch", "dangling"}
    assert "train.sbatch" not in c.actual  # never followed


def test_compare_folder_agrees_with_dtc_check(tmp_path: Path):
    out = _folder(tmp_path)
    result = SpecCheck(spec="specs/x.yaml")
    compare(_expected(), out, result)
    c = compare_folder(_expected(), out)
    assert result.missing == list(c.added)
    assert result.orphaned == list(c.removed)
    assert set(result.stale) == set(c.changed) - {MANIFEST}  # check leaves out the manifest when others differ


def test_file_actions_is_what_dtc_compile_lists(tmp_path: Path):
    assert file_actions(_expected(), _folder(tmp_path)) == [
        ("+", "PLAN.md"), ("~", "ds_config.json"), ("-", "old.sbatch"), ("=", "plan.json"), ("+", "train.sbatch")]
    assert file_actions(_expected(), tmp_path / "absent") == [
        ("+", "PLAN.md"), ("+", "ds_config.json"), ("+", "plan.json"), ("+", "train.sbatch")]
