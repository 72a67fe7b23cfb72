"""The README is part of the product: its commands are the ones CI runs, its reference is current."""
from __future__ import annotations


from compiler.spec.reference import END, START, spec_reference_markdown
from helpers import REPO

README = (REPO / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci/run").read_text()
    command = next(line for line in ci.splitlines() if "pytest" in line).strip()
    assert command in README, f"README must show the CI test command: {command}"


def test_readme_has_the_compile_command():
    assert "dtc compile specs/70b.yaml" in README
    assert (REPO / "specs/70b.yaml").exists()


def test_spec_reference_is_current():
    body = README[README.index(START) + len(START):README.index(END)]
    assert body.strip() == spec_reference_markdown().strip(), (
        "README spec reference is stale: regenerate it from compiler/spec/reference.py")


# ------------------------------------------------------------------------------ the worked example
def _worked_example() -> str:
    section = README.split("## A worked example\n", 1)[1]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


def test_worked_example_is_the_spec_file() -> None:
    """Issue #15: the README showed a spec (16M tokens) that was not specs/70b.yaml (2048 sequences)."""
    assert _worked_example() == (REPO / "specs/70b.yaml").read_text()


def test_worked_example_compiles_as_printed(tmp_path) -> None:
    """The README's YAML, compiled as the README says, gives the committed generated/llama3-70b/ and a plan a
    practitioner would not object to (before issue #15: 992 GPUs at TP4 CP8 DP31, micro-batch 9)."""
    import os

    from compiler.problem import lower
    from compiler.solver import solve
    from compiler.spec.load import load_spec
    from helpers import run_cli
    from practitioner import objections

    (tmp_path / "specs").mkdir()
    (tmp_path / "specs/70b.yaml").write_text(_worked_example())
    command = README.split("```console\n$ ", 1)[1].split("\n", 1)[0]
    assert command == "dtc compile specs/70b.yaml"
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        run_cli(command.split()[1:])
        problem = lower(load_spec("specs/70b.yaml"))
    finally:
        os.chdir(old)
    written = tmp_path / "generated/llama3-70b"
    committed = REPO / "generated/llama3-70b"
    assert sorted(p.name for p in written.iterdir()) == sorted(p.name for p in committed.iterdir())
    for p in written.iterdir():
        assert p.read_text() == (committed / p.name).read_text(), p.name
    plan = solve(problem, top_k=0)
    assert plan.layout.global_batch == 2048 and plan.layout.world_size % 8 == 0
    assert objections(problem, plan) == []


STUBS = {
    # sbatch as SLURM 22.05 runs the job (checked on the local SLURM): the output directory must exist
    # (slurmstepd opens it before the script runs, else JobLaunchFailure 0:53), the script runs as a copy in
    # the spool (so $0 is not beside the generated files) in the submit directory with SLURM's variables, and
    # `scontrol show job` names the submitted script as an absolute Command=
    "sbatch": r'''#!/bin/bash
set -u
script="${@: -1}"
job=4242
name="$(sed -n 's/^#SBATCH --job-name=//p' "$script")"
out="$(sed -n 's/^#SBATCH --output=//p' "$script" | sed "s/%x/$name/; s/%j/$job/")"
err="$(sed -n 's/^#SBATCH --error=//p' "$script" | sed "s/%x/$name/; s/%j/$job/")"
nodes="$(sed -n 's/^#SBATCH --nodes=//p' "$script")"
for f in "$out" "$err"; do
  if [[ ! -d "$(dirname "$f")" ]]; then
    echo "slurmstepd: error: couldn't open $f: No such file or directory" >&2; exit 1
  fi
done
echo "Submitted batch job $job"
spool="$(mktemp -d)"
cp "$script" "$spool/slurm_script"
export STUB_COMMAND="$(cd "$(dirname "$script")" && pwd)/$(basename "$script")"
SLURM_SUBMIT_DIR="$PWD" SLURM_JOB_ID=$job SLURM_JOB_NAME="$name" SLURM_JOB_NODELIST="node[001-$nodes]" \
  SLURM_NNODES="$nodes" SLURM_CPUS_PER_TASK=16 bash "$spool/slurm_script" > "$out" 2> "$err"
''',
    "srun": '#!/bin/bash\nprintf "%s\\n" "$@" > "$STUB_LOG/srun.args"\n',
    "scontrol": '#!/bin/bash\nif [[ "$1 $2" == "show hostnames" ]]; then echo node001;\n'
                'elif [[ "$1 $2" == "show job" ]]; then echo "JobId=$3 JobName=x"; echo "   Command=$STUB_COMMAND";\n'
                'else echo "scontrol $*"; fi\n',
}


def test_submit_line_runs_from_the_repo_root(tmp_path) -> None:
    """The README's `sbatch generated/llama3-70b/train.sbatch`, from the repository root, with sbatch, srun and
    scontrol stubbed: the job starts Megatron with the plan's arguments."""
    import os
    import shutil
    import subprocess

    line = README.split("Submit with\n`", 1)[1].split("`", 1)[0]
    assert line == "sbatch generated/llama3-70b/train.sbatch"
    root = tmp_path / "repo"
    shutil.copytree(REPO / "generated/llama3-70b", root / "generated/llama3-70b")
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, text in STUBS.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", STUB_LOG=str(tmp_path))
    r = subprocess.run(["bash", "-c", line], cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    args = (tmp_path / "srun.args").read_text().splitlines()
    # srun runs `bash -c SCRIPT megatron MEGATRON_DIR ARGS...`; SCRIPT checks and runs MEGATRON_DIR/pretrain_gpt.py
    entry = args.index("megatron")
    assert '"$1/pretrain_gpt.py"' in args[entry - 1] and args[entry + 1] == "/opt/Megatron-LM"
    assert "--tensor-model-parallel-size" in args
