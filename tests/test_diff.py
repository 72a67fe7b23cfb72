"""`dtc diff` and compiler.review: the semantic summary, per-artifact key changes, the three formats.

- unit tests on hand-made plans and artifacts (no solver, no renderers);
- golden cases in tests/cases/diff/<case>/ (old.yaml, new.yaml -> expected.txt, expected.md),
  regenerated with ``pytest tests/test_diff.py --update-golden``; the Markdown is parsed with
  markdown-it-py and its tables are checked;
- ``dtc diff --base`` on a temporary git repository with real commits, as a real process.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from compiler.artifacts import MANIFEST, ArtifactSet
from compiler.review.format import format_diff
from compiler.review.plans import ArtifactDiff, Side, diff_sides
from compiler.review.files import flatten_json, python_keys, shell_keys
from helpers import REPO, assert_golden, run_cli

CASES = REPO / "tests" / "cases" / "diff"
CASE_NAMES = sorted(p.name for p in CASES.iterdir() if p.is_dir()) if CASES.is_dir() else []
GIB = 2**30


# --------------------------------------------------------------------------- helpers


def _plan(**layout):
    from plan_fixtures import layout_for, plan_for, problem_for

    problem = problem_for()
    return plan_for(problem, layout_for(problem, **layout))


def _with(plan, **estimate):
    """The plan with estimate fields replaced (memory as total_bytes / usable_bytes)."""
    est = plan.estimate
    memory = est.memory
    if "total_bytes" in estimate or "usable_bytes" in estimate:
        memory = dataclasses.replace(
            memory, total_bytes_per_gpu=estimate.pop("total_bytes", memory.total_bytes_per_gpu),
            usable_bytes_per_gpu=estimate.pop("usable_bytes", memory.usable_bytes_per_gpu))
    return dataclasses.replace(plan, estimate=dataclasses.replace(est, memory=memory, **estimate))


def _artifacts(plan, **extra: str) -> ArtifactSet:
    lay = plan.layout
    files = {
        "plan.json": plan.to_json(),
        "ds_config.json": json.dumps({"train_micro_batch_size_per_gpu": lay.micro_batch,
                                      "zero_optimization": {"stage": lay.zero_stage}}, indent=2, sort_keys=True) + "\n",
        "megatron_args.sh": "MEGATRON_ARGS=(\n"
                            f"  --tensor-model-parallel-size {lay.tp}\n"
                            + ("  --use-distributed-optimizer\n" if lay.zero_stage else "") + ")\n",
        "train.sbatch": f"#!/bin/bash\n#SBATCH --partition={plan.slurm.partition or 'gpu'}\n"
                        f"#SBATCH --nodes={lay.num_nodes}\nexport NCCL_IB_TIMEOUT=22\n"
                        f"srun torchrun --nnodes {lay.num_nodes} --nproc-per-node 8 train.py\n",
        "PLAN.md": f"# {plan.name}\n\n{lay.describe()}\n",
    }
    files.update(extra)
    return ArtifactSet(files).with_manifest()


def _diff(old_plan, new_plan, old_files=None, new_files=None) -> ArtifactDiff:
    old = Side("old.yaml", old_plan, old_files or _artifacts(old_plan))
    new = Side("new.yaml", new_plan, new_files or _artifacts(new_plan))
    return diff_sides(old, new, title="spec.yaml")


def md_tables(markdown: str) -> list[list[str]]:
    """Header cells of every table, as markdown-it-py parses them."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    tables, header, in_head = [], [], False
    for i, tok in enumerate(tokens):
        if tok.type == "thead_open":
            header, in_head = [], True
        elif tok.type == "thead_close":
            tables.append(header)
            in_head = False
        elif in_head and tok.type == "th_open":
            header.append(tokens[i + 1].content)
    return tables


# --------------------------------------------------------------------------- parsers


def test_flatten_json_key_paths():
    data = {"zero_optimization": {"stage": 3, "offload": {}}, "betas": [0.9, 0.95], "groups": [{"lr": 1}],
            "a.b": None}
    assert flatten_json(data) == {'["a.b"]': "null", "betas": "[0.9, 0.95]", "groups[0].lr": "1",
                                  "zero_optimization.offload": "{}", "zero_optimization.stage": "3"}


def test_shell_keys_megatron_array_flags():
    text = ("#!/bin/bash\n# generated\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\nMEGATRON_ARGS=(\n"
            "  --tensor-model-parallel-size 8   # tp\n  --sequence-parallel\n"
            "  --data-path 0.5 \"$DATA/a\" 0.5 b\n  --lr 3e-4 --min-lr -1\n  --name \"a)b\"\n)\n"
            "MEGATRON_ARGS+=(--use-distributed-optimizer)\n")
    assert shell_keys(text) == {
        "--tensor-model-parallel-size": "8", "--sequence-parallel": "", "--data-path": "0.5 $DATA/a 0.5 b",
        "--lr": "3e-4", "--min-lr": "-1", "--name": "a)b", "--use-distributed-optimizer": "",
        "export CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def test_shell_keys_sbatch_directives_environment_and_launch():
    text = ("#!/bin/bash\n#SBATCH --job-name=x\n#SBATCH --nodes=4\n#SBATCH -p gpu\n#SBATCH --exclusive\n"
            "export NCCL_IB_TIMEOUT=22 A=\"x y\"\nNNODES=4\n"
            "srun --nodes=4 --container-image=img bash -c \"echo hi\"\n"
            "srun torchrun --nnodes \"$NNODES\" --nproc-per-node 8 \\\n"
            "    --rdzv-endpoint=$HOST:29500 \"$DIR/pretrain_gpt.py\" \"${ARGS[@]}\" --save /ckpt 2>&1 | tee log\n")
    assert shell_keys(text) == {
        "#SBATCH --job-name": "x", "#SBATCH --nodes": "4", "#SBATCH -p": "gpu", "#SBATCH --exclusive": "",
        "export NCCL_IB_TIMEOUT": "22", "export A": "x y", "NNODES": "4",
        "srun --nodes": "4", "srun --container-image": "img",
        "torchrun --nnodes": "$NNODES", "torchrun --nproc-per-node": "8", "torchrun --rdzv-endpoint": "$HOST:29500",
        "pretrain_gpt.py --save": "/ckpt"}


def test_python_keys_module_constants():
    text = "import os\nTP = 8\nMODEL = {'layers': 32, 'dims': [1, 2]}\nx: int = 3\nY = os.getcwd()\n"
    assert python_keys(text) == {"TP": "8", "MODEL.layers": "32", "MODEL.dims": "[1, 2]", "x": "3"}
    assert python_keys("def (:\n") is None


# --------------------------------------------------------------------------- diff_sides


def test_identical_sides_are_the_same():
    plan = _plan(dp_shard=8, zero_stage=2)
    d = _diff(plan, plan)
    assert d.status == "same" and not d.changed and d.warnings == ()
    assert {f.action for f in d.files} == {"same"}
    assert MANIFEST not in {f.path for f in d.files}
    assert "no changes" in format_diff(d)


def test_layout_change_summary_and_key_changes():
    old, new = _plan(tp=8, zero_stage=0), _plan(tp=4, dp_shard=2, zero_stage=3)
    d = _diff(old, new)
    assert d.status == "changed"
    assert [(k.key, k.old, k.new) for k in d.layout_changes] == [
        ("tp", "8", "4"), ("dp", "1", "2"), ("zero", "0", "3"), ("grad_accum", "64", "32")]
    layout = next(r for r in d.summary if r.key == "layout")
    assert layout.change == "tp 8 -> 4, dp 1 -> 2, zero 0 -> 3, grad_accum 64 -> 32"
    files = {f.path: f for f in d.files}
    assert [(k.key, k.old, k.new) for k in files["ds_config.json"].key_changes] == [
        ("zero_optimization.stage", "0", "3")]
    assert [(k.op, k.key) for k in files["megatron_args.sh"].key_changes] == [
        ("~", "--tensor-model-parallel-size"), ("+", "--use-distributed-optimizer")]
    assert files["plan.json"].action == "change" and files["plan.json"].key_changes == ()  # summarised above
    assert files["PLAN.md"].kind == "text" and files["PLAN.md"].lines_added == 1
    text = format_diff(d)
    assert "  layout" in text and "tp 8 -> 4, dp 1 -> 2, zero 0 -> 3" in text
    assert "      ~ zero_optimization.stage: 0 -> 3" in text
    assert "      + --use-distributed-optimizer" in text
    assert text.endswith("Diff: 1 spec changed, 4 files changed, 0 added, 0 removed.\n")


def test_plan_json_lists_setting_changes_only():
    old = _plan(dp_shard=8, zero_stage=2)
    new = dataclasses.replace(old, slurm=old.slurm.model_copy(update={"partition": "batch"}))
    d = _diff(old, new)
    assert not d.plan_changed
    plan_json = next(f for f in d.files if f.path == "plan.json")
    assert [(k.key, k.old, k.new) for k in plan_json.key_changes] == [("slurm.partition", "null", '"batch"')]
    sbatch = next(f for f in d.files if f.path == "train.sbatch")
    assert [(k.key, k.old, k.new) for k in sbatch.key_changes] == [("#SBATCH --partition", "gpu", "batch")]
    text = format_diff(d)
    assert "  plan unchanged: tp=1 pp=1 dp=8 zero=2" in text
    markdown = format_diff(d, "markdown")
    assert "Plan unchanged" in markdown and ["", "old", "new", "change"] not in md_tables(markdown)


@pytest.mark.parametrize("old_est, new_est, expected", [
    ({"total_bytes": 60 * GIB, "usable_bytes": 76 * GIB}, {"total_bytes": 74 * GIB, "usable_bytes": 76 * GIB},
     "memory is now within 3% of usable HBM (74.0 of 76.0 GiB per GPU)"),
    ({"cost_usd": 1.0e6}, {"cost_usd": 1.25e6}, "cost up 25% ($1.00M -> $1.25M)"),
    ({"time_to_train_s": 10 * 86400.0}, {"time_to_train_s": 13 * 86400.0}, "time to train up 30% (10.0 d -> 13.0 d)"),
    ({"mfu": 0.5}, {"mfu": 0.44}, "MFU down 12% relative (50.0% -> 44.0%)"),
])
def test_warnings(old_est, new_est, expected):
    plan = _plan(dp_shard=8, zero_stage=2)
    old, new = _with(plan, **old_est), _with(plan, **new_est)
    d = diff_sides(Side("a", old, _artifacts(old)), Side("b", new, _artifacts(new)))
    assert expected in d.warnings


@pytest.mark.parametrize("old_est, new_est", [
    ({"total_bytes": 74 * GIB, "usable_bytes": 76 * GIB}, {"total_bytes": 74.5 * GIB, "usable_bytes": 76 * GIB}),
    ({"cost_usd": 1.0e6}, {"cost_usd": 1.19e6}),
    ({"mfu": 0.5}, {"mfu": 0.46}),
])
def test_no_warning_below_thresholds(old_est, new_est):
    plan = _plan(dp_shard=8, zero_stage=2)
    old, new = _with(plan, **old_est), _with(plan, **new_est)
    d = diff_sides(Side("a", old, _artifacts(old)), Side("b", new, _artifacts(new, **{"x.txt": "x\n"})))
    assert d.changed and d.warnings == ()


def test_plan_json_change_explained_when_nothing_else_changed():
    """A comment-only spec edit changes only plan.json's provenance: say so rather than nothing."""
    old = _plan(dp_shard=8, zero_stage=2)
    new = dataclasses.replace(old, provenance=dataclasses.replace(old.provenance, spec_sha256="beef"))
    d = _diff(old, new)
    (plan_json,) = [f for f in d.files if f.action != "same"]
    assert [(k.key, k.new) for k in plan_json.key_changes] == [("provenance.spec_sha256", '"beef"')]


def test_budget_warning_and_input_only_change():
    plan = _with(_plan(dp_shard=8, zero_stage=2), cost_usd=96_000.0)
    old = dataclasses.replace(plan, budget=dataclasses.replace(plan.budget, max_cost_usd=200_000.0))
    new = dataclasses.replace(plan, budget=dataclasses.replace(plan.budget, max_cost_usd=100_000.0))
    d = _diff(old, new)
    assert d.warnings == ("cost is now within 5% of the budget ($96.00K of $100.00K)",)
    assert not d.plan_changed  # only an input row changed
    text = format_diff(d)
    assert "  budget  max $200.00K, fastest -> max $100.00K, fastest (-50.0%)\n  plan unchanged: tp=1" in text
    markdown = format_diff(d, "markdown")
    assert md_tables(markdown)[0] == ["", "old", "new", "change"] and "Plan unchanged: `tp=1" in markdown


def test_target_dropped_and_global_batch_warnings():
    old = _plan(dp_shard=8, zero_stage=2)
    new = dataclasses.replace(old, targets=tuple(t for t in old.targets if t != "fsdp"),
                              training=dataclasses.replace(old.training, global_batch=32))
    old_files = _artifacts(old, **{"fsdp_config.py": "TP = 1\n"})
    d = diff_sides(Side("a", old, old_files), Side("b", new, _artifacts(new)))
    assert "target fsdp dropped: fsdp_config.py no longer generated" in d.warnings
    assert any(w.startswith("global batch 64 -> 32 sequences") for w in d.warnings)
    assert ("fsdp_config.py", "remove") in [(f.path, f.action) for f in d.files]


def test_added_removed_and_infeasible_sides():
    plan = _plan(dp_shard=8, zero_stage=2)
    added = diff_sides(Side("a"), Side("b", plan, _artifacts(plan)))
    assert added.status == "added" and all(f.action == "add" for f in added.files)
    assert "new: no old version" in format_diff(added)
    removed = diff_sides(Side("a", plan, _artifacts(plan)), Side("b"))
    assert removed.status == "removed" and all(f.action == "remove" for f in removed.files)
    broken = diff_sides(Side("a", plan, _artifacts(plan)), Side("b", error="infeasible: no layout fits"))
    assert broken.status == "changed" and broken.files == ()
    assert broken.warnings[0] == "the new version does not compile: infeasible: no layout fits"
    fixed = diff_sides(Side("a", error="infeasible: no layout fits"), Side("b", plan, _artifacts(plan)))
    assert "the old version did not compile: infeasible: no layout fits" in fixed.warnings
    text = format_diff(fixed)
    assert "  layout         tp=1 pp=1 dp=8" in text


def test_unified_diff_on_request():
    old, new = _plan(tp=8, zero_stage=0), _plan(tp=4, dp_shard=2, zero_stage=3)
    d = _diff(old, new)
    assert "@@" not in format_diff(d)
    text = format_diff(d, unified=True)
    assert "      --- a/ds_config.json" in text and '      +    "stage": 3' in text
    markdown = format_diff(d, "markdown", unified=True)
    assert "```diff\n--- a/ds_config.json" in markdown


def test_json_format_is_data():
    old, new = _plan(tp=8, zero_stage=0), _plan(tp=4, dp_shard=2, zero_stage=3)
    data = json.loads(format_diff([_diff(old, new), _diff(old, old)], "json"))
    assert data["summary"] == {"specs": 2, "specs_changed": 1, "files_added": 0, "files_changed": 4,
                               "files_removed": 0, "files_unchanged": 6}
    first = data["diffs"][0]
    assert first["status"] == "changed" and first["title"] == "spec.yaml"
    assert {"key": "tp", "old": "8", "new": "4", "op": "~"} in first["layout_changes"]
    memory = next(r for r in first["summary"] if r["key"] == "memory")
    assert memory["old_value"][0] == old.estimate.memory.total_bytes_per_gpu
    assert "unified" not in first["files"][0]
    assert "unified" in json.loads(format_diff(_diff(old, new), "json", unified=True))["diffs"][0]["files"][0]


def test_markdown_tables_and_details():
    old, new = _plan(tp=8, zero_stage=0), _plan(tp=4, dp_shard=2, zero_stage=3)
    markdown = format_diff(_diff(old, new), "markdown")
    tables = md_tables(markdown)
    assert tables[0] == ["", "old", "new", "change"]
    assert tables[1:] == [["key", "old", "new"]] * 2  # ds_config.json, megatron_args.sh
    assert markdown.count("<details><summary>") == 2
    assert "- `PLAN.md` changed (+1 -1 lines)" in markdown
    assert "<code>ds_config.json</code> changed (1 key changed, +1 -1 lines)" in markdown
    assert markdown.rstrip().endswith("**Diff:** 1 spec changed, 4 files changed, 0 added, 0 removed.")


def test_markdown_escapes_cells():
    from compiler.review.format import md_code, md_escape

    assert md_code("a|b") == "`a\\|b`"
    assert md_code("x`y") == "``x`y``"
    assert md_escape("micro_batch <b>|") == "micro\\_batch \\<b>\\|"


# --------------------------------------------------------------------------- golden cases


def _case_diff(case: Path, fmt: str) -> tuple[int, str]:
    os.chdir(case)
    try:
        result = run_cli(["diff", "old.yaml", "new.yaml", "--format", fmt], exit_code=None)
    finally:
        os.chdir(REPO)
    assert result.exit_code in (0, 1), f"{case.name}: exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    return result.exit_code, result.stdout


@pytest.mark.parametrize("case", CASE_NAMES)
def test_golden_case(case: str, update_golden: bool):
    folder = CASES / case
    code, text = _case_diff(folder, "text")
    assert code == (0 if case == "no_change" else 1), text
    code_md, markdown = _case_diff(folder, "markdown")
    assert code_md == code
    tables = md_tables(markdown)
    if case == "no_change":
        assert tables == [] and "No changes." in markdown
    elif case == "slurm_partition":
        assert "Plan unchanged" in markdown and tables and all(t == ["key", "old", "new"] for t in tables)
    else:
        assert tables[0] == ["", "old", "new", "change"]
        assert all(t == ["key", "old", "new"] for t in tables[1:])
    regen = f"pytest tests/test_diff.py --update-golden -k {case}"
    failures = []
    for actual, name in ((text, "expected.txt"), (markdown, "expected.md")):
        try:  # both goldens are compared (and, with --update-golden, written) before failing
            assert_golden(actual, folder / name, update=update_golden, regen=regen)
        except pytest.fail.Exception as exc:
            failures.append(str(exc))
    if failures:
        pytest.fail("\n".join(failures))


def test_golden_cases_are_all_there():
    expected = {"model_size", "gpu_type", "budget_cut", "pinned_tp", "slurm_partition", "no_change"}
    assert expected <= set(CASE_NAMES)
    for case in CASE_NAMES:
        names = {p.name for p in (CASES / case).iterdir() if not p.name.endswith(".obtained")}
        assert names == {"old.yaml", "new.yaml", "expected.txt", "expected.md"}, f"{case}: unexpected files {names}"


def test_golden_expectations():
    """What each case is about, checked on the data (not only the bytes)."""
    from compiler.review.sides import path_side

    def diff(case: str) -> ArtifactDiff:
        folder = CASES / case
        return diff_sides(path_side(str(folder / "old.yaml"), strict=False, compile_as=str(folder / "new.yaml")),
                          path_side(str(folder / "new.yaml"), strict=True))

    size = diff("model_size")
    assert next(r for r in size.summary if r.key == "model").changed
    gpu = diff("gpu_type")
    assert next(r for r in gpu.summary if r.key == "gpus").changed
    budget = diff("budget_cut")
    assert next(r for r in budget.summary if r.key == "budget").changed
    assert next(r for r in budget.summary if r.key == "cost").changed
    tp = diff("pinned_tp")
    assert [k.key for k in tp.layout_changes][:1] == ["tp"]
    slurm = diff("slurm_partition")
    assert slurm.changed and not slurm.plan_changed and not slurm.layout_changes
    assert any(k.key.endswith("partition") for f in slurm.files for k in f.key_changes if f.kind == "sbatch")
    assert not diff("no_change").changed


# --------------------------------------------------------------------------- the command


def test_usage_and_bad_input_exit_2(tmp_path: Path):
    assert run_cli(["diff"], exit_code=2).exit_code == 2
    assert "give OLD NEW" in run_cli(["diff", "only-one.yaml"], exit_code=2).output
    result = run_cli(["diff", str(tmp_path / "nope.yaml"), str(tmp_path / "nope2.yaml")], exit_code=2)
    assert "no such spec or folder" in result.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {preset: llama3-8b}\n")
    good = CASES / "pinned_tp" / "old.yaml"
    result = run_cli(["diff", str(good), str(bad)], exit_code=2)
    assert "missing required key" in result.stderr
    # an invalid OLD side is shown, not an error: the spec language may have changed since
    result = run_cli(["diff", str(bad), str(good)], exit_code=1)
    assert "the old version did not compile: invalid spec: missing required key" in result.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "empty folder" in run_cli(["diff", str(empty), str(empty)], exit_code=2).stderr


def test_diff_generated_folders_and_spec_against_folder(tmp_path: Path):
    spec = CASES / "pinned_tp" / "old.yaml"
    run_cli(["compile", str(spec), "--out", str(tmp_path / "a")])
    run_cli(["compile", str(CASES / "pinned_tp" / "new.yaml"), "--out", str(tmp_path / "b")])
    (name,) = [p.name for p in (tmp_path / "a").iterdir()]
    result = run_cli(["diff", str(tmp_path / "a" / name), str(tmp_path / "b" / name)], exit_code=1)
    assert "  layout" in result.stdout and "tp 2 -> 4" in result.stdout
    same = run_cli(["diff", str(tmp_path / "a" / name), str(spec)], exit_code=0)
    assert "no changes" in same.stdout
    (tmp_path / "a" / name / "plan.json").unlink()
    result = run_cli(["diff", str(tmp_path / "a" / name), str(tmp_path / "b" / name)], exit_code=1)
    assert "has no plan.json: comparing files only" in result.stdout


# --------------------------------------------------------------------------- --base on a real git repository


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _dtc(repo: Path, *args: str) -> subprocess.CompletedProcess:
    """`dtc ARGS` in ``repo``, in-process (what --base reads from a real git repository is the subject here;
    tests/test_terminal_safety.py and others run dtc as a process)."""
    old = os.getcwd()
    os.chdir(repo)
    try:
        result = run_cli(list(args), exit_code=None)
    finally:
        os.chdir(old)
    return subprocess.CompletedProcess(["dtc", *args], result.exit_code, result.stdout, result.stderr)


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "specs").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "dtc@example.com")
    _git(repo, "config", "user.name", "dtc test")
    _git(repo, "config", "commit.gpgsign", "false")
    (repo / "specs" / "run.yaml").write_bytes((CASES / "pinned_tp" / "old.yaml").read_bytes())
    (repo / "specs" / "other.yaml").write_bytes((CASES / "slurm_partition" / "old.yaml").read_bytes())
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "first")
    (repo / "specs" / "run.yaml").write_bytes((CASES / "pinned_tp" / "new.yaml").read_bytes())
    _git(repo, "commit", "-q", "-am", "pin tp 4")
    return repo


def test_base_against_commits(git_repo: Path):
    changed = _dtc(git_repo, "diff", "--base", "HEAD~1", "specs/run.yaml")
    assert changed.returncode == 1, changed.stderr
    assert changed.stdout.startswith("specs/run.yaml (HEAD~1 -> working tree): ")
    assert "tp 2 -> 4" in changed.stdout
    assert "Diff: 1 spec changed" in changed.stdout
    same = _dtc(git_repo, "diff", "--base", "HEAD", "specs/run.yaml")
    assert same.returncode == 0, same.stderr + same.stdout
    assert "no changes" in same.stdout
    # no spec named: every spec under specs/ changed since the base (other.yaml did not change)
    auto = _dtc(git_repo, "diff", "--base", "HEAD~1", "--format", "markdown")
    assert auto.returncode == 1, auto.stderr
    assert auto.stdout.startswith("### specs/run.yaml (HEAD~1 -> working tree): ")
    assert "other.yaml" not in auto.stdout
    assert md_tables(auto.stdout)[0] == ["", "old", "new", "change"]
    nothing = _dtc(git_repo, "diff", "--base", "HEAD")
    assert nothing.returncode == 0 and nothing.stdout == "Diff: 0 specs changed, 0 files changed, 0 added, 0 removed.\n"


def test_base_sees_uncommitted_added_and_deleted_specs(git_repo: Path):
    (git_repo / "specs" / "new.yaml").write_bytes((CASES / "gpu_type" / "old.yaml").read_bytes())  # untracked
    (git_repo / "specs" / "other.yaml").unlink()
    result = _dtc(git_repo, "diff", "--base", "HEAD", "--format", "json")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    status = {d["title"].split(" ")[0]: d["status"] for d in data["diffs"]}
    assert status == {"specs/new.yaml": "added", "specs/other.yaml": "removed"}


def test_base_bad_input_exits_2(git_repo: Path, tmp_path: Path):
    bad_rev = _dtc(git_repo, "diff", "--base", "no-such-rev", "specs/run.yaml")
    assert bad_rev.returncode == 2 and "unknown git revision 'no-such-rev'" in bad_rev.stderr
    missing = _dtc(git_repo, "diff", "--base", "HEAD", "specs/nope.yaml")
    assert missing.returncode == 2 and "no such spec" in missing.stderr
    outside = tmp_path / "plain"
    (outside / "specs").mkdir(parents=True)
    (outside / "specs" / "run.yaml").write_bytes((CASES / "pinned_tp" / "old.yaml").read_bytes())
    not_git = _dtc(outside, "diff", "--base", "HEAD", "specs/run.yaml")
    assert not_git.returncode == 2 and "not inside a git repository" in not_git.stderr
    assert "Traceback" not in bad_rev.stderr + missing.stderr + not_git.stderr


def test_base_shows_generated_folders_changed_without_their_spec(git_repo: Path):
    """A compiler change rewrites generated/ with no spec edit: --base compares the folders themselves."""
    compiled = _dtc(git_repo, "compile", "specs/other.yaml")
    assert compiled.returncode == 0, compiled.stderr
    _git(git_repo, "add", "-A")
    _git(git_repo, "commit", "-q", "-m", "generated")
    (folder,) = (git_repo / "generated").iterdir()
    sbatch = folder / "train.sbatch"
    sbatch.write_text(sbatch.read_text().replace("#SBATCH --partition=gpu", "#SBATCH --partition=other"))
    result = _dtc(git_repo, "diff", "--base", "HEAD")
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith(f"generated/{folder.name}/ (HEAD -> working tree): {folder.name}\n")
    assert "  plan unchanged: " in result.stdout
    assert "      ~ #SBATCH --partition: gpu -> other" in result.stdout
    # a spec change that explains its folder is shown once, as the spec
    spec = git_repo / "specs" / "other.yaml"
    spec.write_text(spec.read_text().replace("partition: gpu", "partition: other"))
    result = _dtc(git_repo, "diff", "--base", "HEAD")
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("specs/other.yaml (HEAD -> working tree)") and "generated/" not in result.stdout


QUOTED_NAMES = ["spéc.yaml", 'quo"te.yaml', "new\nline.yaml", "back\\slash.yaml", "tab\there.yaml", "ünïcode-é.yml"]


def test_base_sees_specs_whose_names_git_quotes(git_repo: Path):
    """Issue #16 item 7: git quotes names with non-ASCII bytes, quotes, backslashes, tabs or newlines in
    its line output ("specs/sp\\303\\251c.yaml"), so --base read "0 specs changed" while they had.
    Paths are read with -z now: committed-then-changed and untracked specs alike."""
    old = (CASES / "pinned_tp" / "old.yaml").read_bytes()
    new = (CASES / "pinned_tp" / "new.yaml").read_bytes()
    committed, untracked = QUOTED_NAMES[:3], QUOTED_NAMES[3:]
    for name in committed:
        (git_repo / "specs" / name).write_bytes(old)
    _git(git_repo, "add", "-A")
    _git(git_repo, "commit", "-q", "-m", "odd names")
    for name in committed:
        (git_repo / "specs" / name).write_bytes(new)
    for name in untracked:
        (git_repo / "specs" / name).write_bytes(new)
    result = _dtc(git_repo, "diff", "--base", "HEAD", "--format", "json")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    titles = [d["title"] for d in data["diffs"]]
    assert len(titles) == len(QUOTED_NAMES), titles
    from compiler.errors import printable

    for name in committed:  # titles are shown printable: one line, no control characters
        assert any(t.startswith(f"specs/{printable(name)} (HEAD -> working tree)") for t in titles), (name, titles)
    text = _dtc(git_repo, "diff", "--base", "HEAD")
    assert f"Diff: {len(QUOTED_NAMES)} specs changed" in text.stdout, text.stdout[-500:]
    assert "specs/new\\nline.yaml" in text.stdout  # shown escaped, one line
