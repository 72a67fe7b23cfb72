"""`dtc check`: generated/ against the specs, recompiled in memory; exit codes as diff(1)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from compiler.artifacts import MANIFEST, ArtifactSet, write_artifacts
from compiler.check import SpecCheck, compare, summary_line
from helpers import REPO, run_cli

CASE = REPO / "tests" / "cases" / "diff" / "pinned_tp" / "old.yaml"
OTHER = REPO / "tests" / "cases" / "diff" / "slurm_partition" / "old.yaml"


# --------------------------------------------------------------------------- compare(), no solver


def _expected() -> ArtifactSet:
    return ArtifactSet({"plan.json": "{}\n", "ds_config.json": '{\n  "a": 1\n}\n', "PLAN.md": "# x\n"}).with_manifest()


def test_compare_up_to_date(tmp_path: Path):
    write_artifacts(_expected(), tmp_path / "x")
    result = SpecCheck(spec="specs/x.yaml")
    compare(_expected(), tmp_path / "x", result)
    assert result.status == "ok" and not result.needs_force


def test_compare_stale_missing_orphaned(tmp_path: Path):
    out = tmp_path / "x"
    write_artifacts(ArtifactSet({"plan.json": "{}\n", "ds_config.json": '{\n  "a": 2\n}\n', "old.sbatch": "#\n"}), out)
    result = SpecCheck(spec="specs/x.yaml")
    compare(_expected(), out, result)
    assert result.status == "stale"
    assert result.stale == ["ds_config.json"]  # the manifest follows from the others and is not listed
    assert result.missing == ["PLAN.md"] and result.orphaned == ["old.sbatch"]
    assert '-  "a": 2' in result.diffs["ds_config.json"] and '+  "a": 1' in result.diffs["ds_config.json"]
    assert not result.needs_force  # the folder matches its own manifest: dtc compile may replace it


def test_compare_hand_edit_needs_force(tmp_path: Path):
    out = tmp_path / "x"
    write_artifacts(_expected(), out)
    (out / "ds_config.json").write_text("{}\n")
    result = SpecCheck(spec="specs/x.yaml")
    compare(_expected(), out, result)
    assert result.stale == ["ds_config.json"] and result.needs_force
    assert summary_line([result], [], Path("generated")) == (
        "Check: 1 spec, 0 up to date, 1 stale (1 file). Run: dtc compile --force specs/x.yaml")


def test_compare_only_manifest(tmp_path: Path):
    out = tmp_path / "x"
    write_artifacts(_expected(), out)
    (out / MANIFEST).write_text("")
    result = SpecCheck(spec="specs/x.yaml")
    compare(_expected(), out, result)
    assert result.stale == [MANIFEST]


def test_summary_line_variants():
    ok, stale, failed = SpecCheck("specs/a.yaml"), SpecCheck("specs/b.yaml", missing=["x", "y"]), SpecCheck(
        "specs/c.yaml", errors=["boom"])
    assert summary_line([ok], [], Path("generated")) == "Check: 1 spec, 1 up to date."
    assert summary_line([ok, stale, failed], ["generated/old/"], Path("out")) == (
        "Check: 3 specs, 1 up to date, 1 stale (2 files), 1 failed, 1 orphaned folder. "
        "Run: dtc compile --out out specs/b.yaml; rm -r -- generated/old/")


HOSTILE_NAMES = ["specs/a;touch pwned;.yaml", "specs/$(touch pwned).yaml", "specs/`touch pwned`.yaml",
                 "specs/a b.yaml", "specs/'q'.yaml", "specs/-rf.yaml", "specs/new\nline.yaml", "specs/~.yaml",
                 "specs/a&&touch pwned.yaml", "specs/\x1b[31mred.yaml"]


def test_run_line_is_shell_quoted(tmp_path: Path):
    """Issue #16 item 6: `Run: dtc compile specs/a;touch pwned;.yaml; rm -r generated/x ~/` ran commands
    when pasted. Pasted into bash (dtc and rm stubbed to print their arguments), the line now passes
    every name as one argument and runs nothing else."""
    import subprocess

    stale = [SpecCheck(name, missing=["x"]) for name in HOSTILE_NAMES]
    orphans = ["generated/x;touch pwned/", "generated/y ~/", "generated/$(touch pwned)/"]
    line = summary_line(stale, orphans, Path("out dir;touch pwned"))
    run = line.split(" Run: ", 1)[1]
    assert "\x1b" not in run and "\n" not in run
    stubs = ("dtc() { printf 'dtc'; printf ' <%s>' \"$@\"; echo; }\n"
             "rm() { printf 'rm'; printf ' <%s>' \"$@\"; echo; }\n")
    result = subprocess.run(["bash", "-c", stubs + run], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "pwned").exists()
    from compiler.errors import printable

    dtc_line, rm_line = result.stdout.splitlines()
    assert dtc_line == "dtc <compile> <--out> <out dir;touch pwned> " + " ".join(f"<{printable(n)}>" for n in HOSTILE_NAMES)
    assert rm_line == "rm <-r> <--> " + " ".join(f"<{o}>" for o in orphans)


# --------------------------------------------------------------------------- the command


def _write_specs(root: Path) -> Path:
    """specs/ with two small specs."""
    (root / "specs").mkdir()
    shutil.copy(CASE, root / "specs" / "a.yaml")
    shutil.copy(OTHER, root / "specs" / "b.yaml")
    text = (root / "specs" / "b.yaml").read_text()
    (root / "specs" / "b.yaml").write_text(text.replace("name: diff-case", "name: diff-case-b"))
    return root


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two specs compiled into generated/ by `dtc compile`, once for the module: each test copies it."""
    root = _write_specs(tmp_path_factory.mktemp("compiled"))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        run_cli(["compile", "specs/a.yaml", "specs/b.yaml"])
    return root / "generated"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """specs/ with two small specs; ``_compile_all`` adds what `dtc compile` wrote for them."""
    _write_specs(tmp_path)
    return tmp_path


def _compile_all(project: Path, monkeypatch: pytest.MonkeyPatch, compiled: Path) -> dict[str, Path]:
    """generated/ as `dtc compile specs/a.yaml specs/b.yaml` writes it (a copy of the module's one compile)."""
    monkeypatch.chdir(project)
    shutil.copytree(compiled, project / "generated", symlinks=True)
    folders = sorted(p for p in (project / "generated").iterdir())
    assert len(folders) == 2
    return {"a": folders[0], "b": folders[1]}


def test_check_up_to_date(project: Path, monkeypatch: pytest.MonkeyPatch, compiled: Path):
    _compile_all(project, monkeypatch, compiled)
    result = run_cli(["check"], exit_code=0)
    assert result.stdout == "Check: 2 specs, 2 up to date.\n"
    assert run_cli(["check", "specs/a.yaml"], exit_code=0).stdout == "Check: 1 spec, 1 up to date.\n"


def test_check_edited_file_is_stale(project: Path, monkeypatch: pytest.MonkeyPatch, compiled: Path):
    folders = _compile_all(project, monkeypatch, compiled)
    plan_md = folders["a"] / "PLAN.md"
    plan_md.write_text(plan_md.read_text() + "an edit\n")
    result = run_cli(["check"], exit_code=1)
    # by default: what is stale, where the details are, and the command that fixes it; nothing else
    assert result.stdout == (f"specs/a.yaml -> generated/{folders['a'].name}/: stale: PLAN.md changed\n"
                             "Details: dtc check --diff specs/a.yaml\n"
                             "Check: 2 specs, 1 up to date, 1 stale (1 file). Run: dtc compile --force specs/a.yaml\n")
    result = run_cli(["check", "--diff"], exit_code=1)
    assert f"specs/a.yaml -> generated/{folders['a'].name}/: stale" in result.stdout
    assert "  ~ PLAN.md" in result.stdout and "      -an edit" in result.stdout
    assert "Details:" not in result.stdout
    assert result.stdout.endswith("Check: 2 specs, 1 up to date, 1 stale (1 file). "
                                  "Run: dtc compile --force specs/a.yaml\n")


def test_check_missing_and_orphaned_files(project: Path, monkeypatch: pytest.MonkeyPatch, compiled: Path):
    folders = _compile_all(project, monkeypatch, compiled)
    (folders["a"] / "PLAN.md").unlink()
    (folders["b"] / "notes.txt").write_text("stray\n")
    result = run_cli(["check"], exit_code=1)
    assert ": stale: PLAN.md missing\n" in result.stdout
    assert ": stale: notes.txt orphaned (not produced by the spec)\n" in result.stdout
    result = run_cli(["check", "--diff"], exit_code=1)
    assert "  + PLAN.md (missing)" in result.stdout
    assert "  - notes.txt (orphaned: not produced by the spec)" in result.stdout
    assert "2 stale (2 files)" in result.stdout
    data = json.loads(run_cli(["check", "--json"], exit_code=1).stdout)
    assert [s["status"] for s in data["specs"]] == ["stale", "stale"]
    assert data["specs"][0]["missing"] == ["PLAN.md"] and data["specs"][1]["orphaned"] == ["notes.txt"]


def test_check_orphaned_and_missing_folders(project: Path, monkeypatch: pytest.MonkeyPatch, compiled: Path):
    folders = _compile_all(project, monkeypatch, compiled)
    (project / "generated" / "old-run").mkdir()
    (project / "generated" / "old-run" / "plan.json").write_text("{}\n")
    result = run_cli(["check"], exit_code=1)
    assert "generated/old-run/: orphaned folder (no spec in specs/ is named old-run)" in result.stdout
    assert result.stdout.endswith("Check: 2 specs, 2 up to date, 1 orphaned folder. Run: rm -r -- generated/old-run/\n")
    # naming specs checks only those: the stray folder is not reported
    assert run_cli(["check", "specs/a.yaml"], exit_code=0)
    shutil.rmtree(folders["b"])
    result = run_cli(["check", "specs/b.yaml"], exit_code=1)
    assert f"specs/b.yaml -> generated/{folders['b'].name}/: missing (" in result.stdout


def test_check_other_folders(project: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(project)
    (project / "cfg").mkdir()
    shutil.move(str(project / "specs" / "a.yaml"), project / "cfg" / "a.yaml")
    run_cli(["compile", "cfg/a.yaml", "--out", "out"])
    assert run_cli(["check", "--specs-dir", "cfg", "--generated", "out"], exit_code=0)
    result = run_cli(["check", "--specs-dir", "cfg"], exit_code=1)
    assert "Run: dtc compile cfg/a.yaml" in result.stdout


def test_check_bad_input_exits_2(project: Path, monkeypatch: pytest.MonkeyPatch, compiled: Path):
    _compile_all(project, monkeypatch, compiled)
    (project / "specs" / "c.yaml").write_text("name: broken\nmodel: {preset: llama3-8b}\n")
    result = run_cli(["check"], exit_code=2)
    assert "specs/c.yaml: failed" in result.stderr and "missing required key" in result.stderr
    assert "1 failed" in result.stdout
    assert run_cli(["check", "specs/nope.yaml"], exit_code=2)
    assert "no specs folder" in run_cli(["check", "--specs-dir", "nowhere"], exit_code=2).stderr
    (project / "specs" / "c.yaml").write_text((project / "specs" / "a.yaml").read_text())
    assert "is also used by specs/a.yaml" in run_cli(["check"], exit_code=2).stderr


# --------------------------------------------------------------------------- CI integration files


def test_ci_workflow_and_pre_commit_hook():
    import re
    import subprocess

    from ruamel.yaml import YAML

    yaml = YAML(typ="safe")
    workflow = yaml.load((REPO / ".github" / "workflows" / "dtc.yml").read_text())
    assert set(workflow["on"]["pull_request"]["paths"]) >= {"specs/**", "generated/**", "compiler/**"}
    assert workflow["permissions"]["pull-requests"] == "write"
    steps = workflow["jobs"]["review"]["steps"]
    checkout = next(s for s in steps if s.get("uses", "").startswith("actions/checkout"))
    assert checkout["with"]["fetch-depth"] == 0  # dtc diff --base reads the base branch with git
    runs = [s["run"] for s in steps if "run" in s]
    script = "\n".join(runs)
    assert "pip install -e ." in script and "dtc check" in script
    assert 'dtc diff --base "origin/$BASE_REF" --format markdown > diff.md || [ $? -eq 1 ]' in script
    for run in runs:  # every step is valid bash once the ${{ }} expressions are filled in
        body = re.sub(r"\$\{\{[^}]*\}\}", "0", run)
        subprocess.run(["bash", "-n", "-c", body], check=True)
    hooks = yaml.load((REPO / ".pre-commit-hooks.yaml").read_text())
    (hook,) = hooks
    assert hook["id"] == "dtc-check" and hook["entry"] == "dtc check" and hook["language"] == "python"
    assert hook["pass_filenames"] is False and hook["files"] == "^(specs|generated)/"
    doc = (REPO / "docs" / "review.md").read_text()
    for needle in ("dtc check", "dtc diff --base", ".github/workflows/dtc.yml", "id: dtc-check", "--format markdown"):
        assert needle in doc, needle


def test_links_in_generated_are_not_followed(project: Path, monkeypatch: pytest.MonkeyPatch, compiled: Path) -> None:
    """Issue #16 item 5: a committed generated/X/PLAN.md -> ../../.git/config made `dtc check` and
    `dtc diff --unified` print the checkout's credentials. A link is reported, never read."""
    folders = _compile_all(project, monkeypatch, compiled)
    git = project / ".git"
    git.mkdir()
    (git / "config").write_text("[http]\n\textraheader = AUTHORIZATION: basic SECRET-TOKEN\n")
    folder = next(iter(folders.values()))
    (folder / "PLAN.md").unlink()
    (folder / "PLAN.md").symlink_to("../../.git/config")
    (folder / "notes.md").symlink_to("../../.git/config")
    result = run_cli(["check"], exit_code=1)
    assert "SECRET-TOKEN" not in result.stdout + result.stderr
    result = run_cli(["check", "--diff"], exit_code=1)
    assert "SECRET-TOKEN" not in result.stdout + result.stderr
    assert "PLAN.md: a symbolic link or other non-regular file; not followed or read" in result.stdout
    assert "- notes.md (orphaned" in result.stdout
    for args in (["diff", "--unified", str(folder), "specs/a.yaml"], ["diff", "--unified", "specs/a.yaml", str(folder)],
                 ["diff", "--format", "markdown", "--unified", str(folder), "specs/a.yaml"]):
        result = run_cli(args, exit_code=None)
        assert result.exit_code in (1, 2) and "SECRET-TOKEN" not in result.stdout + result.stderr, args
    result = run_cli(["compile", "specs/a.yaml", "specs/b.yaml"], exit_code=2)  # a hand-edited folder
    assert "SECRET-TOKEN" not in result.stdout + result.stderr and "notes.md" in result.stderr


def test_expected_work_orders_by_the_committed_search(tmp_path: Path) -> None:
    """The workers take the specs longest first, as far as the committed plan.json of each spec (found by the
    spec path it records) says; a link there is not read (the order is all it decides: 0, the spec's own place)."""
    from compiler.check import _expected_work

    spec = str(CASE)
    assert _expected_work([spec], tmp_path) == [0]  # nothing committed
    folder = tmp_path / "diff-case"
    folder.mkdir()
    plan = {"provenance": {"spec_path": spec}, "search": {"num_considered": 1234}}
    (tmp_path / "elsewhere.json").write_text(json.dumps(plan))
    (folder / "plan.json").symlink_to(tmp_path / "elsewhere.json")
    assert _expected_work([spec], tmp_path) == [0]
    (folder / "plan.json").unlink()
    (folder / "plan.json").write_text(json.dumps(plan))
    other = tmp_path / "other"
    other.mkdir()
    (other / "plan.json").write_text(json.dumps({"provenance": {"spec_path": "specs/other.yaml"},
                                                 "search": {"num_considered": 7}}))
    assert _expected_work([spec, "specs/other.yaml", str(tmp_path / "missing.yaml")], tmp_path) == [1234, 7, 0]
    assert _expected_work([os.path.relpath(spec)], tmp_path) == [1234]  # the same file however it is written
    (folder / "plan.json").write_text("not json")
    assert _expected_work([spec], tmp_path) == [0]
    (folder / "plan.json").write_text('{"search": {"num_considered": 1234}}')  # no spec path recorded
    assert _expected_work([spec], tmp_path) == [0]
