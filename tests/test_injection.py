"""No injection (issue #8, item 2): every spec value that reaches a script is rejected or inert.

A corpus of attacks (``$()``, backticks, ``;``, ``&&``, pipes, redirections, newlines,
``#SBATCH`` smuggling, quotes, leading dashes, globs, path traversal, odd Unicode) is placed in
every spec field that reaches a generated file, and in the spec's own file name. Each attempt
must either

- be rejected by ``dtc compile`` with exit 2 and an error located at the spec line that names
  the field, or
- compile, and then be inert: every sbatch script (and the megatron_args.sh it sources) runs
  under bash in a sandbox whose srun, torchrun, python, deepspeed, scontrol and module are
  stubs, without creating the canary file the attack would create; ShellCheck (-S style) has
  no finding; the #SBATCH directives are exactly those of the clean spec; the generated
  Python and JSON have the same structure as the clean spec's (the value only ever lands
  inside a string literal); nothing is written outside ``--out``; and the value arrives at
  the stubbed launcher byte for byte (an environment value in the environment, a path as one
  argument).

The figures ("injection: N attacks tried, M rejected, K rendered inert, 0 executed") are
printed at the end of the run.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import fuzzing as fz
from hardening_report import figure, register

CANARY = "CANARY"

# {canary} is replaced by the absolute path of the canary file of each attempt.
ATTACKS: dict[str, str] = {
    "dollar-paren": "$(touch {canary})",
    "backticks": "`touch {canary}`",
    "semicolon": "x; touch {canary}",
    "and": "x && touch {canary}",
    "pipe": "x | touch {canary}",
    "redirect": "x > {canary}",
    "newline": "x\ntouch {canary}",
    "cr-newline": "x\r\ntouch {canary}",
    "sbatch-smuggle": "x\n#SBATCH --account=evil",
    "single-quote-break": "x'; touch {canary}; '",
    "double-quote-break": "x\"; touch {canary}; \"",
    "both-quotes": "'\"; touch {canary}; \"'",
    "escaped-quote": "x\\'; touch {canary}; #",
    "ifs": "${{IFS}}touch${{IFS}}{canary}",
    "brace-expansion": "{{x,$(touch {canary})}}",
    "process-subst": "<(touch {canary})",
    "arith": "$((`touch {canary}`))",
    # bash evaluates an integer variable's assigned value as arithmetic, and an array subscript
    # inside it runs $(...) even from a single-quoted string
    "array-subscript": "a[$(touch {canary})]",
    "param-default": "${{x:-$(touch {canary})}}",
    "ansi-c": "$'\\x24(touch {canary})'",
    "glob": "*",
    "tilde": "~root",
    "leading-dash": "-x",
    "double-dash-help": "--help",
    "option-smuggle": "--export=ALL,LD_PRELOAD={canary}",
    "traversal": "../../etc",
    "absolute-etc": "/etc/passwd",
    "nul": "x\x00touch {canary}",
    "line-separator": "x\u2028touch {canary}",
    "nel": "x\x85touch {canary}",
    "vertical-tab": "x\x0btouch {canary}",
    "escape-seq": "x\x1b]0;owned\x07",
    "fullwidth-semicolon": "x\uff1btouch {canary}",
    "percent": "%x%j%u",
    "python-break": "x'''; import os; os.system('touch {canary}'); '''",
    "python-fstring": "{{__import__('os').system('touch {canary}')}}",
    "json-break": "x\", \"injected\": \"1",
    "markdown": "x\n# Heading\n<script>touch {canary}</script>",
    "long": "a" * 5000,
    "empty": "",
}

# field label -> (how to place a value in the clean spec; is the field free text?)
FIELDS = [
    "name", "description", "slurm.job_name", "slurm.partition", "slurm.account", "slurm.qos",
    "slurm.container_image", "slurm.container_mounts", "slurm.modules", "slurm.environment.name",
    "slurm.environment.value", "slurm.workdir", "slurm.megatron_dir", "data.datasets.path", "slurm.train_script",
    "slurm.output_dir", "cluster.gpu.name", "spec file name",
]
# The field name that a rejection must mention (the spec key at the reported line).
MENTION = {"slurm.environment.name": "slurm.environment", "slurm.environment.value": "slurm.environment",
           "data.datasets.path": "data.datasets[0].path"}
# Variables the rendered scripts set or read that a spec may still override: tuning knobs.
TUNING_KNOBS = {"OMP_NUM_THREADS", "PYTHONPATH", "CHECKPOINT_DIR", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "CUDA_DEVICE_MAX_CONNECTIONS",
                "NCCL_", "NVTE_", "TORCH_", "PYTORCH_"}

CLEAN: dict[str, Any] = {
    "name": "inject",
    "model": {"preset": "llama2-7b"},
    "training": {"tokens": "100B", "sequence_length": 4096, "global_batch": 1024},
    "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
    "budget": {"objective": "throughput"},
    "targets": ["deepspeed", "fsdp", "megatron", "slurm"],
    "data": {"tokenizer": "tokenizer", "datasets": [{"path": "data/corpus_text_document"}]},
    "slurm": {"partition": "gpu", "account": "ml", "qos": "normal", "time_limit": "2h",
              "container_image": "nvcr.io/nvidia/pytorch:24.05-py3", "container_mounts": ["/data:/data"],
              "modules": ["cuda/12.4"], "environment": {"NCCL_DEBUG": "WARN"}, "job_name": "inject",
              "output_dir": "logs", "workdir": "run",
              "megatron_dir": "megatron-lm", "train_script": "train.py"},
}

FIGURES = {"tried": 0, "rejected": 0, "inert": 0, "executed": 0}


@pytest.fixture(scope="module", autouse=True)
def _figures(request: pytest.FixtureRequest):
    register(request.config)
    yield
    known = FIGURES["tried"] - FIGURES["rejected"] - FIGURES["inert"] - FIGURES["executed"]
    figure("injection", f"injection: {FIGURES['tried']} attacks tried, {FIGURES['rejected']} rejected, "
                        f"{FIGURES['inert']} rendered inert, {FIGURES['executed']} executed"
                        + (f" ({known} inert but with a known ShellCheck note, xfail)" if known else ""))


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is not installed: run .ci/install-system-deps.sh", pytrace=False)
    return path


# --------------------------------------------------------------------------- building the attempt


def place(field: str, value: str, spec: dict[str, Any]) -> str:
    """Put ``value`` into ``field`` of ``spec`` (a deep copy); returns the spec file name to use."""
    slurm = spec["slurm"]
    if field == "name":
        spec["name"] = value
    elif field == "description":
        spec["description"] = value
    elif field == "cluster.gpu.name":
        spec["cluster"]["gpu"] = {**fz.CUSTOM_GPU, "name": value}
    elif field == "slurm.container_mounts":
        slurm["container_mounts"] = ["/data:/data", value]
    elif field == "slurm.modules":
        slurm["modules"] = ["cuda/12.4", value]
    elif field == "slurm.environment.name":
        slurm["environment"] = {"NCCL_DEBUG": "WARN", value: "1"}
    elif field == "slurm.environment.value":
        slurm["environment"] = {"NCCL_DEBUG": "WARN", "INJECT_ME": value}
    elif field == "data.datasets.path":
        spec["data"]["datasets"] = [{"path": value}]
    elif field == "spec file name":
        return value
    else:
        slurm[field.split(".", 1)[1]] = value
    return "spec.yaml"


@dataclass
class Attempt:
    field: str
    attack: str
    root: Path  # everything of this attempt lives under here
    value: str
    spec_file: Path
    out: Path
    canary: Path


MEGATRON_CHECKOUT = CLEAN["slurm"]["megatron_dir"]


def make_attempt(tmp: Path, field: str, attack: str) -> Attempt:
    import copy

    root = tmp / "attempt"
    (root / "work" / "run").mkdir(parents=True)
    (root / "work" / "run" / MEGATRON_CHECKOUT).mkdir()  # the clean spec's megatron_dir, as on a cluster
    (root / "work" / "run" / MEGATRON_CHECKOUT / "pretrain_gpt.py").write_text("")
    (root / "canary").mkdir()
    canary = root / "canary" / CANARY
    value = ATTACKS[attack].format(canary=canary)
    spec = copy.deepcopy(CLEAN)
    file_name = place(field, value, spec)
    if field == "spec file name":
        file_name = (value.replace("/", "_").replace("\x00", "_") or "empty") + ".yaml"
    spec_file = root / "work" / file_name
    spec_file.write_bytes(fz.emit(fz.to_tree(spec), "quoted").encode("utf-8", errors="surrogatepass"))
    return Attempt(field, attack, root, value, spec_file, root / "work" / "out", canary)


def compile_attempt(a: Attempt):
    from click.testing import CliRunner

    from compiler.cli import cli

    cwd = os.getcwd()
    os.chdir(a.spec_file.parent)  # the spec is passed by its bare file name, as users do
    try:
        return CliRunner().invoke(cli, ["compile", "--out", "out", "--", a.spec_file.name])
    finally:
        os.chdir(cwd)


# --------------------------------------------------------------------------- the sandbox

STUB = r"""#!/bin/bash
# dtc injection sandbox: records its argv and environment, then does nothing (or runs the step).
me="$(basename "$0")"
{ printf '%s\0' "$me" "$@"; printf '\036'; } >> "$DTC_STUB_LOG"
env -0 > "$DTC_STUB_DIR/env.$me"
case "$me" in
  scontrol) [[ "${1:-}" == show && "${2:-}" == hostnames ]] && echo node1 ;;
  srun)
    while [[ $# -gt 0 && "$1" == -* ]]; do shift; done
    [[ $# -gt 0 ]] && exec "$@" ;;
esac
exit 0
"""
STUBS = ["srun", "torchrun", "python", "python3", "deepspeed", "scontrol", "module", "sbatch", "nvidia-smi",
         "mpirun", "ssh", "pdsh"]


def sandbox(a: Attempt) -> dict[str, str]:
    bin_dir = a.root / "bin"
    bin_dir.mkdir()
    for name in STUBS:
        (bin_dir / name).write_text(STUB)
        (bin_dir / name).chmod(0o755)
    (a.root / "home").mkdir()
    (a.root / "stubs").mkdir()
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(a.root / "home"), "LANG": "C.UTF-8",
        "DTC_STUB_LOG": str(a.root / "stubs" / "log"), "DTC_STUB_DIR": str(a.root / "stubs"),
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "SLURM_CPUS_PER_TASK": "4",
        "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1", "DTC_NPROC_PER_NODE": "1",
    }


def run_script(script: Path, env: dict[str, str], cwd: Path, artifacts: Path) -> subprocess.CompletedProcess:
    env = {**env, "DTC_ARTIFACT_DIR": str(artifacts), "SLURM_SUBMIT_DIR": str(artifacts)}
    proc = subprocess.Popen(["bash", str(script)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{script.name} ran past 30 s in the sandbox")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def stub_calls(a: Attempt) -> list[list[str]]:
    log = a.root / "stubs" / "log"
    if not log.exists():
        return []
    records = log.read_bytes().split(b"\x1e")
    return [[x.decode("utf-8", "surrogateescape") for x in r.split(b"\0")[:-1]] for r in records if r]


def stub_env(a: Attempt, name: str) -> dict[str, str]:
    path = a.root / "stubs" / f"env.{name}"
    if not path.exists():
        return {}
    pairs = [p.decode("utf-8", "surrogateescape") for p in path.read_bytes().split(b"\0") if p]
    return dict(p.split("=", 1) for p in pairs if "=" in p)


# --------------------------------------------------------------------------- structure of the artifacts

_DIRECTIVE = re.compile(r"^#SBATCH\s+(--?[A-Za-z-]+)")


def sbatch_directives(text: str) -> list[str]:
    """The directive options sbatch reads: #SBATCH lines before the first command (as sbatch parses)."""
    found = []
    for line in text.splitlines()[1:]:
        if line.startswith("#SBATCH"):
            m = _DIRECTIVE.match(line)
            found.append(m.group(1) if m else line)
        elif line.strip() and not line.startswith("#"):
            break
    return found


def python_shape(text: str) -> str:
    """The AST with every string constant blanked: equal shapes = the value stayed inside literals."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
        if isinstance(node, ast.JoinedStr):
            node.values = []
    return ast.dump(tree, include_attributes=False)


def json_shape(value: Any, key: str = "") -> Any:
    """Keys and types, with lists collapsed to the set of their item shapes and the environment's
    names (data, not structure) folded: equal shapes = the value stayed inside a JSON string."""
    if isinstance(value, dict):
        if key == "environment":
            return {"*": sorted({json.dumps(json_shape(v)) for v in value.values()})}
        return {k: json_shape(v, k) for k, v in value.items() if k not in ("name", "description", "spec_path")}
    if isinstance(value, list):
        return sorted({json.dumps(json_shape(v)) for v in value})
    return type(value).__name__


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The clean spec's artifacts and sandbox run: what every accepted attack is compared with."""
    tmp = tmp_path_factory.mktemp("clean")
    a = make_attempt(tmp, "slurm.partition", "empty")
    a.spec_file.write_text(fz.emit(fz.to_tree(CLEAN), "quoted"))
    result = compile_attempt(a)
    assert result.exit_code == 0, result.stderr
    folder = a.out / "inject"
    files = {p.name: p.read_text() for p in folder.iterdir() if p.is_file()}
    env = sandbox(a)
    for script in sorted(folder.glob("*.sbatch")):
        run = run_script(script, env, a.root / "work", folder)
        assert run.returncode == 0, (script.name, run.stderr.decode())
    launched = [call[0] for call in stub_calls(a)]
    assert launched.count("srun") == 4 and "torchrun" in launched and "python" in launched, launched
    return {"files": files, "directives": {n: sbatch_directives(t) for n, t in files.items() if n.endswith(".sbatch")},
            "python": {n: python_shape(t) for n, t in files.items() if n.endswith(".py")},
            "json": {n: json_shape(json.loads(t)) for n, t in files.items() if n.endswith(".json")}}


# --------------------------------------------------------------------------- the test

# Known findings, reported to the owners of the files involved; strict, so a fix shows up here.
KNOWN: dict[tuple[str, str], str] = {}
CASES = [pytest.param(f, k, id=f"{f}-{k}",
                      marks=[pytest.mark.xfail(strict=True, reason=KNOWN[f, k])] if (f, k) in KNOWN else [])
         for f in FIELDS for k in ATTACKS
         # a file name cannot hold NUL or exceed the file system's name length: no such case exists
         if not (f == "spec file name" and ("\x00" in ATTACKS[k] or len(ATTACKS[k]) > 200))]


@pytest.mark.slow  # each case runs bash -n, shellcheck and the sandboxed launcher
@pytest.mark.parametrize(("field", "attack"), CASES)
def test_attack_is_rejected_or_inert(field: str, attack: str, tmp_path: Path, clean: dict[str, Any]) -> None:
    a = make_attempt(tmp_path, field, attack)
    FIGURES["tried"] += 1
    result = compile_attempt(a)
    output = (result.stdout or "") + (result.stderr or "")
    assert "Traceback" not in output and "INTERNAL ERROR" not in output, output
    assert result.exit_code in (0, 2), (result.exit_code, output, result.exception)
    assert not a.canary.exists(), f"{attack} in {field} executed while compiling"
    if result.exit_code == 2:
        check_rejection(a, result.stderr)
        FIGURES["rejected"] += 1
        return
    check_inert(a, clean)
    FIGURES["inert"] += 1


def check_rejection(a: Attempt, stderr: str) -> None:
    first = stderr.splitlines()[0] if stderr else ""
    m = re.match(r"^(?P<path>.+?):(?P<line>\d+):(?P<col>\d+): error(\[\w+\])?: (?P<summary>.*)$", first)
    assert m, f"rejection of {a.attack} in {a.field} is not located:\n{stderr}"
    assert m.group("path") == a.spec_file.name, first
    mention = MENTION.get(a.field, a.field)
    if a.field == "spec file name":
        return
    if a.field in ("slurm.environment.name",):
        assert "slurm.environment" in stderr or "invalid YAML" in stderr, stderr
        return
    assert mention in stderr or "invalid YAML" in stderr or "spec" in m.group("summary"), (
        f"rejection of {a.attack} in {a.field} does not name the field:\n{stderr}")
    line = a.spec_file.read_text(encoding="utf-8", errors="replace").splitlines()[int(m.group("line")) - 1]
    leaf = mention.rsplit(".", 1)[-1]
    assert leaf in line or a.field in ("slurm.environment.value", "slurm.container_mounts", "slurm.modules") \
        or a.field == "slurm.environment.name", f"error line {line!r} is not the {leaf} line:\n{stderr}"


def check_inert(a: Attempt, clean: dict[str, Any]) -> None:
    written = [p for p in a.root.rglob("*") if p.is_file()]
    checkout = a.root / "work" / "run" / MEGATRON_CHECKOUT
    outside = [p for p in written if a.out not in p.parents and p != a.spec_file and checkout not in p.parents]
    assert not outside, f"written outside --out: {outside}"
    folders = [p for p in a.out.iterdir()]
    assert len(folders) == 1 and folders[0].is_dir() and not folders[0].is_symlink(), folders
    folder = folders[0]
    files = {p.name: p.read_text(encoding="utf-8") for p in folder.iterdir() if p.is_file()}
    assert set(files) == set(clean["files"]), sorted(set(files) ^ set(clean["files"]))
    for name, text in files.items():
        if name.endswith(".sbatch"):
            assert sbatch_directives(text) == clean["directives"][name], (name, sbatch_directives(text))
            assert sum(line.startswith("#SBATCH") for line in text.splitlines()) == len(clean["directives"][name])
        if name.endswith(".py"):
            assert python_shape(text) == clean["python"][name], f"{a.attack} in {a.field} changed {name}'s code"
        if name.endswith(".json"):
            assert json_shape(json.loads(text)) == clean["json"][name], name
    scripts = sorted(p for p in folder.iterdir() if p.suffix in (".sbatch", ".sh"))
    for script in scripts:
        subprocess.run(["bash", "-n", str(script)], check=True, capture_output=True)
    check = subprocess.run([_require("shellcheck"), "-S", "style", *map(str, scripts)], capture_output=True,
                           text=True)
    assert check.returncode == 0, f"shellcheck on {a.attack} in {a.field}:\n{check.stdout}"
    env = sandbox(a)
    workdir_missing = a.field == "slurm.workdir" and not (a.root / "work" / a.value).is_dir()
    # the Megatron scripts check MEGATRON_DIR/pretrain_gpt.py (the literal value) before starting Python
    megatron_missing = a.field == "slurm.megatron_dir" and not (a.root / "work" / "run" / a.value).is_dir()
    for script in sorted(folder.glob("*.sbatch")):
        run = run_script(script, env, a.root / "work", folder)
        if a.canary.exists():
            FIGURES["executed"] += 1
            pytest.fail(f"{a.attack} in {a.field} EXECUTED when {script.name} ran")
        if workdir_missing:  # `cd -- VALUE` failed on the literal value, as it should
            assert run.returncode != 0 and b"cd: " in run.stderr, (script.name, run.stderr)
        elif megatron_missing and "pretrain_gpt.py" in script.read_text():
            assert run.returncode == 2 and b"pretrain_gpt.py not found" in run.stderr, (script.name, run.stderr)
        else:
            assert run.returncode == 0, (script.name, run.stderr.decode(errors="replace"))
    assert not any(p.name.startswith(CANARY) for p in a.root.rglob("*")), "a canary appeared"
    if a.field == "spec file name":
        check_pasted_header(a, folder)
    if not workdir_missing:
        check_delivered(a)


def check_pasted_header(a: Attempt, folder: Path) -> None:
    """Issue #16 item 6: the "run: dtc compile SPEC" in each generated file's header, pasted into bash
    (dtc stubbed to print its arguments), names the spec file as one argument and runs nothing else."""
    from compiler.errors import printable

    stub = "dtc() { printf '%s\\0' \"$@\"; }\n"
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        header = next((line for line in path.read_text(encoding="utf-8").splitlines()
                       if line.startswith("# Generated by dtc from ")), None)
        if header is None:
            continue
        command = header.split(" -- do not edit; run: ", 1)[1]
        run = subprocess.run(["bash", "-c", stub + command], cwd=a.root / "work", capture_output=True, timeout=30)
        assert not a.canary.exists(), f"pasting {path.name}'s header ran {a.attack}"
        assert run.stdout.split(b"\0")[:-1] == [b"compile", printable(a.spec_file.name).encode()], (path.name, run)


def check_delivered(a: Attempt) -> None:
    """The value reached the launcher byte for byte: inert, not mangled."""
    calls = stub_calls(a)
    assert [c[0] for c in calls].count("srun") == 4, [c[0] for c in calls]
    if a.field == "slurm.environment.value":
        for launcher in ("torchrun", "python"):
            assert stub_env(a, launcher).get("INJECT_ME") == a.value, launcher
    elif a.field in ("data.datasets.path", "slurm.train_script"):
        args = [arg for call in calls for arg in call]
        assert a.value in args, f"{a.field} {a.value!r} did not arrive as one argument"


def test_spec_environment_cannot_shadow_what_the_scripts_use(clean: dict[str, Any]) -> None:
    """Every variable the scripts set or read is reserved in the spec, or is a tuning knob."""
    from compiler.spec.models import RESERVED_ENV_NAMES

    used: set[str] = set()
    for name, text in clean["files"].items():
        if name.endswith((".sbatch", ".sh")):
            code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
            used |= set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", code))
            used |= set(re.findall(r"(?:^|[\s;{])(?:export\s+|local\s+)?([A-Za-z_][A-Za-z0-9_]*)(?:\+)?=", code, re.M))
    shell_specials = {"PWD", "RANDOM", "LINENO"}
    loose = sorted(n for n in used - shell_specials if n not in RESERVED_ENV_NAMES
                   and not n.startswith(("SLURM_", "DTC_", "BASH_"))
                   and not any(n == k or (k.endswith("_") and n.startswith(k)) for k in TUNING_KNOBS))
    assert not loose, f"the scripts use {loose}: add them to RESERVED_ENV_NAMES (or to TUNING_KNOBS here)"


def test_out_folder_symlink_is_not_followed(tmp_path: Path) -> None:
    """generated/<name> as a symlink to a folder elsewhere: dtc must not write through it."""
    from click.testing import CliRunner

    from compiler.cli import cli

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "inject").symlink_to(elsewhere, target_is_directory=True)
    spec = tmp_path / "spec.yaml"
    spec.write_text(fz.emit(fz.to_tree(CLEAN), "quoted"))
    for extra in ([], ["--force"]):
        result = CliRunner().invoke(cli, ["compile", str(spec), "--out", str(out), *extra])
        assert "Traceback" not in result.output and result.exit_code in (0, 2), (result.output, result.exception)
        assert sorted(p.name for p in elsewhere.iterdir()) == ["precious.txt"], "wrote through the symlink"
        assert (elsewhere / "precious.txt").read_text() == "keep me\n"
        assert result.exit_code == 2, "replaced the symlink instead of refusing"
        assert "is a symbolic link; refusing to replace it" in result.stderr, result.stderr
        assert sorted(p.name for p in out.iterdir()) == ["inject"] and (out / "inject").is_symlink()


def test_out_parent_symlink_writes_inside_its_target(tmp_path: Path) -> None:
    """--out itself may be a symlink (a user's choice); the spec name still cannot leave it."""
    from helpers import run_cli

    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    spec = tmp_path / "spec.yaml"
    spec.write_text(fz.emit(fz.to_tree(CLEAN), "quoted"))
    run_cli(["compile", str(spec), "--out", str(tmp_path / "link")])
    assert sorted(p.name for p in real.iterdir()) == ["inject"]


def _bash_variable_names() -> set[str]:
    """Every variable bash treats specially: the spec's list plus what a clean bash defines itself."""
    from compiler.spec.models import BASH_VARIABLE_NAMES

    listed = subprocess.run(["env", "-i", "bash", "--norc", "--noprofile", "-c", "compgen -v"],
                            capture_output=True, text=True, check=True).stdout.split()
    return set(BASH_VARIABLE_NAMES) | set(listed)


def test_every_bash_variable_the_clean_shell_defines_is_reserved() -> None:
    from compiler.spec.models import env_name_problem

    loose = sorted(n for n in _bash_variable_names() if env_name_problem(n) is None)
    assert not loose, f"bash defines {loose} but slurm.environment accepts them"


@pytest.mark.parametrize("name", ["OPTIND", "RANDOM", "SRANDOM", "HISTCMD", "LINENO", "SECONDS", "COLUMNS",
                                  "LINES", "UID", "EUID", "PPID", "BASHPID", "EPOCHSECONDS", "OPTERR",
                                  "HISTSIZE", "SHLVL", "auto_resume", "bash_env"])
def test_bash_variable_as_environment_name_is_rejected(name: str, tmp_path: Path) -> None:
    """Issue #16.1: `OPTIND: 'a[$(touch pwned)]'` ran `touch` when the sbatch script ran."""
    a = make_attempt(tmp_path, "slurm.environment.value", "array-subscript")
    spec = copy_clean()
    spec["slurm"]["environment"] = {"NCCL_DEBUG": "WARN", name: a.value}
    a.spec_file.write_text(fz.emit(fz.to_tree(spec), "quoted"))
    result = compile_attempt(a)
    assert result.exit_code == 2, (name, result.output)
    assert "slurm.environment" in result.stderr and "bash" in result.stderr, result.stderr
    assert not a.canary.exists()


def test_renderer_refuses_a_bash_variable_in_a_hand_made_plan() -> None:
    """The renderer applies the same rule to a plan.json that never went through the spec."""
    import dataclasses

    from compiler.errors import RenderError
    from compiler.targets.slurm.render import slurm_context
    from plan_fixtures import layout_for, plan_for, problem_for

    problem = problem_for()
    plan = plan_for(problem, layout_for(problem, dp_shard=8, zero_stage=3), real_estimate=False)
    bad = dataclasses.replace(plan, slurm=plan.slurm.model_copy(update={"environment": {"OPTIND": "a[$(touch x)]"}}))
    with pytest.raises(RenderError, match="bash"):
        slurm_context(bad)


def copy_clean() -> dict[str, Any]:
    import copy

    return copy.deepcopy(CLEAN)


# --------------------------------------------------------------------------- DTC_BENCH_STEPS (dtc sweep)
# train_megatron.sbatch reads the iteration count of a benchmark run from the environment at run time (set by
# dtc sweep's task files, or by hand): every attack, and every value that is not a plain positive number, must stop
# the script with exit 2 before anything runs; "" is the override unset.
BENCH_NOT_NUMBERS = {"zero": "0", "negative": "-1", "leading-zero": "007", "exponent": "1e3", "hex": "0x10",
                     "plus": "+5", "space-before": " 6", "space-after": "6 ", "newline-after": "6\n",
                     "too-many-digits": "12345678", "arabic-digits": "\u0663", "float": "2.5"}
BENCH_VALUES = {**{k: v for k, v in ATTACKS.items() if "\x00" not in v}, **BENCH_NOT_NUMBERS}


@pytest.fixture(scope="module")
def bench_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The clean spec (real data, so --data-path is in the list) compiled once."""
    tmp = tmp_path_factory.mktemp("bench")
    a = make_attempt(tmp, "name", "empty")
    a.spec_file.write_text(fz.emit(fz.to_tree(CLEAN), "quoted"))
    result = compile_attempt(a)
    assert result.exit_code == 0, result.stderr
    return a.out / "inject"


def _bench_run(tmp_path: Path, folder: Path, value: str | None) -> tuple[Attempt, subprocess.CompletedProcess]:
    a = make_attempt(tmp_path, "name", "empty")
    env = sandbox(a)
    if value is not None:
        env["DTC_BENCH_STEPS"] = value.replace("{canary}", str(a.canary))
    return a, run_script(folder / "train_megatron.sbatch", env, a.root / "work", folder)


@pytest.mark.slow  # runs the generated launcher under bash in the sandbox
@pytest.mark.parametrize("name", sorted(BENCH_VALUES))
def test_bench_steps_is_checked_before_use(name: str, tmp_path: Path, bench_folder: Path) -> None:
    a, run = _bench_run(tmp_path, bench_folder, BENCH_VALUES[name])
    FIGURES["tried"] += 1
    assert not a.canary.exists(), f"DTC_BENCH_STEPS={BENCH_VALUES[name]!r} ran {name}"
    if BENCH_VALUES[name] == "":
        assert run.returncode == 0, run.stderr.decode()  # unset: the plan's own run
        FIGURES["inert"] += 1
        return
    assert run.returncode == 2, (name, run.returncode, run.stderr.decode())
    assert b"DTC_BENCH_STEPS must be a whole number of iterations" in run.stderr
    launched = [c[0] for c in stub_calls(a)]
    assert "srun" not in launched and "python" not in launched, f"the launcher ran with a bad DTC_BENCH_STEPS: {launched}"
    FIGURES["rejected"] += 1


@pytest.mark.slow  # runs the generated launcher under bash in the sandbox
def test_bench_steps_overrides_reach_megatron(tmp_path: Path, bench_folder: Path) -> None:
    """A valid count: pretrain_gpt.py gets the artifact's arguments without the checkpoint and data paths, then
    --train-iters N and the benchmark flags (compiler/targets/megatron/render.py: the one list)."""
    from compiler.targets.megatron.render import BENCH_APPEND_FLAGS, BENCH_DROP_FLAGS
    from compiler.targets.megatron.smoke import split_flags

    plain_a, plain = _bench_run(tmp_path / "plain", bench_folder, None)
    bench_a, bench = _bench_run(tmp_path / "bench", bench_folder, "12")
    assert plain.returncode == 0 and bench.returncode == 0, bench.stderr.decode()

    def megatron_argv(a: Attempt) -> list[str]:
        (call,) = [c for c in stub_calls(a) if c[0] == "python"]
        assert call[1].endswith("/pretrain_gpt.py"), call
        return call[2:]

    before, after = megatron_argv(plain_a), megatron_argv(bench_a)
    assert {"--save", "--load", "--data-path"} <= set(before)
    kept = [(f, v) for f, v in split_flags(before) if f not in BENCH_DROP_FLAGS]
    tail = [("--train-iters", ["12"])] + [(f[0], list(f[1:])) for f in BENCH_APPEND_FLAGS]
    assert split_flags(after) == kept + tail
    # and Megatron's own parser and validate_args accept them at the plan's world size (one validator process)
    import sys

    from compiler.plan import Plan

    plan = Plan.from_json((bench_folder / "plan.json").read_text())
    conn = stub_env(bench_a, "python").get("CUDA_DEVICE_MAX_CONNECTIONS")
    batch = tmp_path / "batch.jsonl"
    batch.write_text(json.dumps({"name": "bench", "flags": after, "world_size": plan.layout.world_size,
                                  "env": {"CUDA_DEVICE_MAX_CONNECTIONS": conn}}) + "\n")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "tools" / "validators" / "megatron_check.py"), "--batch",
                           str(batch)], capture_output=True, text=True, timeout=300, cwd=root)
    (result,) = map(json.loads, proc.stdout.splitlines())
    assert result["ok"] and proc.returncode == 0, (result["errors"], proc.stderr[-2000:])
    assert result["derived"]["data_parallel_size"] == plan.layout.dp
