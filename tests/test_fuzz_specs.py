"""Hostile and broken specs (issue #8, item 1): every spec compiles or fails with a located error.

Three layers, all derandomized so CI is reproducible (benchmarks/fuzz.py runs the same
generators randomized, for as long as you like):

- in process, ``load_spec_bytes`` + ``lower`` on 10,000+ generated specs: the example specs
  and a rich spec with every section, mutated as trees (deleted, duplicated, renamed and
  retyped keys; huge, zero, negative, NaN and infinite numbers; bad units; deep nesting;
  long strings; tags) and as bytes (invalid UTF-8, control characters, truncation, alias
  and merge bombs appended), plus a hand-written corpus of the nastiest cases. A
  ``SpecError`` must carry a summary and a file:line location and render; anything else
  fails. Time per spec is measured on every spec, memory (tracemalloc) on a sample and on
  the whole corpus.
- 200 specs through the real CLI in process (``dtc compile --out``): exit 0 or 2, never a
  traceback or INTERNAL ERROR.
- a few dozen as real subprocesses under RLIMIT_AS = 1 GiB and RLIMIT_CPU = 10 s, with the
  child's own CPU time and peak RSS read from wait4(); and the specs of tests/cases/hostile
  (every input dimension at dtc's caps, issue #16) under the same per-case limits, CPU-s and RSS.

The figures are printed at the end of the run (section "dtc hardening"). For a quick
local run set DTC_FUZZ_SCALE=0.1.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzzing as fz
from hardening_report import figure, register
from helpers import REPO

SCALE = float(os.environ.get("DTC_FUZZ_SCALE", "1"))
N_TREES = max(10, int(6000 * SCALE))  # + N_BYTES + the corpus = 10,000+ specs in process
N_BYTES = max(10, int(4000 * SCALE))
N_CLI = max(5, int(200 * SCALE))
MAX_SECONDS = 3.0  # CPU seconds per spec, in process ("never more than a few seconds")
MAX_TRACED_MB = 200.0  # per spec, Python allocations (tracemalloc)
SUBPROCESS_TIMEOUT_S = 10.0
SUBPROCESS_AS_BYTES = 1 << 30  # RLIMIT_AS for the real processes
MAX_CHILD_RSS_MB = 500.0

BASES = fz.base_specs()
CORPUS = fz.hostile_corpus()
STATS = fz.Stats()
CLI = {"specs": 0, "ok": 0, "user_error": 0, "infeasible": 0, "max_s": 0.0, "max_cpu_s": 0.0}
WALL_HANG_S = 300  # test_cli_compile_sample: a hang, not a slow machine
CPU_BUDGET_S = 60.0  # ... and its CPU seconds per compile
PROC = {"specs": 0, "ok": 0, "user_error": 0, "max_s": 0.0, "max_cpu_s": 0.0, "max_rss_mb": 0.0}
HOSTILE = {"specs": 0, "ok": 0, "user_error": 0, "max_cpu_s": 0.0, "max_cpu_case": "", "max_rss_mb": 0.0,
           "max_rss_case": ""}

FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=True,
                suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module", autouse=True)
def _figures(request: pytest.FixtureRequest):
    register(request.config)
    start = time.perf_counter()
    yield
    figure("fuzz-1", STATS.line("fuzz: load+lower") + f"; {time.perf_counter() - start:.0f} s for this file")
    figure("fuzz-2", f"fuzz: CLI compile (in process): {CLI['specs']} specs, {CLI['ok']} compiled, "
                     f"{CLI['user_error']} exit 2 ({CLI['infeasible']} infeasible), 0 tracebacks, "
                     f"max {CLI['max_s']:.2f} s wall, {CLI['max_cpu_s']:.2f} CPU-s")
    figure("fuzz-3", f"fuzz: subprocess compile (RLIMIT_AS 1 GiB, 10 CPU-s): {PROC['specs']} specs, {PROC['ok']} "
                     f"compiled, {PROC['user_error']} exit 2, max {PROC['max_s']:.2f} s wall, "
                     f"{PROC['max_cpu_s']:.2f} CPU-s, max RSS {PROC['max_rss_mb']:.0f} MB")
    figure("fuzz-4", f"fuzz: hostile dimensions (tests/cases/hostile, limits {fz.CASE_CPU_S:.0f} CPU-s and "
                     f"{fz.CASE_RSS_MB:.0f} MB RSS each): {HOSTILE['specs']} specs, {HOSTILE['ok']} compiled, "
                     f"{HOSTILE['user_error']} exit 2, max {HOSTILE['max_cpu_s']:.2f} CPU-s "
                     f"({HOSTILE['max_cpu_case']}), max RSS {HOSTILE['max_rss_mb']:.0f} MB ({HOSTILE['max_rss_case']})")


# --------------------------------------------------------------------------- in process: load + lower


@pytest.mark.parametrize("label", [label for label, _ in BASES])
def test_starting_points_are_valid(label: str) -> None:
    """Mutations start from valid specs, so that what breaks is the mutation."""
    data = dict(BASES)[label]
    for style in ("block", "flow", "quoted"):
        assert fz.check_spec(fz.emit(fz.to_tree(data), style).encode(), STATS) == "valid", (label, style)


@pytest.mark.parametrize("label", [label for label, _ in CORPUS])
def test_hostile_corpus(label: str) -> None:
    fz.check_spec(dict(CORPUS)[label], STATS, trace_memory=True, max_s=MAX_SECONDS, max_mb=MAX_TRACED_MB)


@pytest.mark.slow
@settings(FUZZ, max_examples=N_TREES)
@given(fz.fuzz_specs(BASES, byte_level=False))
def test_mutated_specs(data: bytes) -> None:
    fz.check_spec(data, STATS, trace_memory=STATS.specs % 97 == 0, max_s=MAX_SECONDS, max_mb=MAX_TRACED_MB)


@pytest.mark.slow
@settings(FUZZ, max_examples=N_BYTES)
@given(fz.fuzz_specs(BASES, byte_level=True))
def test_mutated_bytes(data: bytes) -> None:
    fz.check_spec(data, STATS, trace_memory=STATS.specs % 97 == 0, max_s=MAX_SECONDS, max_mb=MAX_TRACED_MB)


@pytest.mark.slow
def test_fuzz_totals() -> None:
    """The issue's figure: at least 10,000 specs per CI run, 0 failures (runs after the tests above)."""
    if SCALE < 1:
        pytest.skip("DTC_FUZZ_SCALE < 1")
    assert STATS.specs >= 10_000, f"only {STATS.specs} specs fuzzed (run the whole file)"
    assert not STATS.failures
    assert STATS.valid >= 1000 and STATS.rejected >= 1000, STATS.line()


# --------------------------------------------------------------------------- the CLI, in process

_LOCATED = re.compile(r"^(?P<path>[^\n]+?):(?P<line>\d+)(:\d+)?: error(\[\w+\])?: ", re.M)


def _check_cli_output(result, spec: str) -> None:
    out = (result.stdout or "") + (result.stderr or "")
    assert "Traceback" not in out and "INTERNAL ERROR" not in out, out
    assert result.exit_code in (0, 2), (result.exit_code, out, result.exception)
    if result.exit_code == 2:
        assert re.search(r"error(\[\w+\])?:", result.stderr), result.stderr
        if "no layout fits" not in result.stderr:  # infeasible plans: see test_infeasible_error_names_the_spec
            found = _LOCATED.search(result.stderr)
            assert found and found.group("path") == spec, f"not located at {spec}:LINE:\n{result.stderr}"


@pytest.mark.slow
@settings(FUZZ, max_examples=N_CLI)
@given(fz.fuzz_specs(BASES, byte_level=False), st.booleans())
def test_cli_compile_sample(data: bytes, bytes_too: bool) -> None:
    from click.testing import CliRunner

    from compiler.cli import cli

    with tempfile.TemporaryDirectory(prefix="dtc-fuzz-") as tmp:
        spec = os.path.join(tmp, "spec.yaml")
        Path(spec).write_bytes(data)
        start, cpu0 = time.perf_counter(), _cpu_s()
        result = CliRunner().invoke(cli, ["compile", spec, "--out", os.path.join(tmp, "out")])
        elapsed, cpu = time.perf_counter() - start, _cpu_s() - cpu0
        _check_cli_output(result, spec)
        if result.exit_code == 0:  # output stays inside --out
            written = [p for p in Path(tmp).rglob("*") if p.is_file() and p.name != "spec.yaml"]
            assert written and all(Path(tmp, "out") in p.parents for p in written)
    CLI["specs"] += 1
    CLI["ok" if result.exit_code == 0 else "user_error"] += 1
    CLI["infeasible"] += "no layout fits" in (result.stderr or "")
    CLI["max_s"] = max(CLI["max_s"], elapsed)
    CLI["max_cpu_s"] = max(CLI["max_cpu_s"], cpu)
    # the budget is CPU time: a CI worker beside a smoke run's torch processes once took 40 s of wall-clock time for
    # a spec that compiles in 3 s (and not on Hypothesis's rerun); the wall-clock limit only catches a hang. The
    # known slow class (a budget that binds nothing, so every GPU count up to 16,384 with a batch tolerance: the
    # budget-70b base at $0 or $0.01 per GPU-hour, 16-17 CPU-s since the search's group walk resumes, ~40 before)
    # stays inside it; the README's known gap names it
    assert cpu < CPU_BUDGET_S, f"dtc compile took {cpu:.1f} CPU-s on one spec"
    assert elapsed < WALL_HANG_S, f"dtc compile took {elapsed:.1f} s of wall-clock time on one spec"


def _cpu_s() -> float:
    """CPU seconds of this thread, as fuzzing.check_spec counts them: CliRunner runs dtc compile in it, and compile
    starts no process or thread."""
    return time.thread_time()


def test_infeasible_error_names_the_spec(tmp_path: Path) -> None:
    spec = tmp_path / "tiny.yaml"
    spec.write_text("name: t\nmodel: {preset: llama3-70b}\ntraining: {tokens: 1T, sequence_length: 4096, "
                    "global_batch: 512}\ncluster: {gpu: a100-40gb, num_gpus: 1}\n")
    from helpers import run_cli

    result = run_cli(["compile", str(spec), "--out", str(tmp_path / "out")], exit_code=2)
    assert "no layout fits" in result.stderr
    assert str(spec) in result.stderr


# --------------------------------------------------------------------------- real processes, with limits


def run_limited(args: list[str], cwd: Path, *, timeout: float = SUBPROCESS_TIMEOUT_S,
                address_space: int = SUBPROCESS_AS_BYTES) -> fz.Limited:
    """The child under RLIMIT_CPU = ``timeout`` CPU-seconds and RLIMIT_AS (see fuzzing.run_limited)."""
    return fz.run_limited(args, cwd, cpu_s=timeout, wall_s=max(timeout, fz.CASE_WALL_S), address_space=address_space)


SUBPROCESS_LABELS = [
    "alias-bomb", "merge-many", "merge-chain", "deep-flow-list", "deep-block", "5000-digit-int", "too-large",
    "long-line", "many-values", "many-errors", "many-anchors", "tag-python", "tag-set-scalar", "unhashable-key",
    "lone-surrogate", "nul", "utf16", "latin1", "escape-seq", "two-docs", "huge-int", "1e400", "shape-max",
    "prime-heads", "moe-max", "params-100T", "1gib-gpu", "1pib-gpu", "slow-gpu", "fast-gpu", "free-gpu-cheapest",
    "one-gpu", "tiny-budget", "env-newline", "hex-octal",
]


@pytest.mark.slow
@pytest.mark.parametrize("label", SUBPROCESS_LABELS)
def test_real_process_with_limits(label: str, tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_bytes(dict(CORPUS)[label])
    got = run_limited([sys.executable, "-m", "compiler", "compile", "spec.yaml", "--out", "out"], tmp_path)
    code, err, rss = got.code, got.stderr, got.rss_mb
    PROC["specs"] += 1
    PROC["max_s"] = max(PROC["max_s"], got.wall_s)
    PROC["max_cpu_s"] = max(PROC["max_cpu_s"], got.cpu_s)
    PROC["max_rss_mb"] = max(PROC["max_rss_mb"], rss)
    assert code is not None, f"dtc compile ran past {SUBPROCESS_TIMEOUT_S} CPU-s on {label} (signal {got.signal})"
    assert code in (0, 2), f"exit {code} on {label}:\n{err}"
    assert "Traceback" not in err and "INTERNAL ERROR" not in err and "MemoryError" not in err, err
    assert rss < MAX_CHILD_RSS_MB, f"{label}: peak RSS {rss:.0f} MB"
    PROC["ok" if code == 0 else "user_error"] += 1
    if code == 2 and "no layout fits" not in err:
        assert err.startswith("spec.yaml:"), err


@pytest.mark.slow
@pytest.mark.parametrize("case", [p.stem for p in fz.hostile_cases()])
def test_hostile_dimensions_within_limits(case: str, tmp_path: Path) -> None:
    """Issue #16 item 2: specs at dtc's caps (a 10M-sequence batch on 8 GPUs, 1,024 layers, the
    deepest pipeline, a batch tolerance over 16,384 GPUs) compile as real processes within
    CASE_CPU_S CPU-seconds and CASE_RSS_MB of RSS each, measured from the child's own usage."""
    spec = fz.HOSTILE_CASES / f"{case}.yaml"
    got = fz.run_limited([sys.executable, "-m", "compiler", "compile", str(spec), "--out", "out"], tmp_path)
    HOSTILE["specs"] += 1
    if got.cpu_s > HOSTILE["max_cpu_s"]:
        HOSTILE["max_cpu_s"], HOSTILE["max_cpu_case"] = got.cpu_s, case
    if got.rss_mb > HOSTILE["max_rss_mb"]:
        HOSTILE["max_rss_mb"], HOSTILE["max_rss_case"] = got.rss_mb, case
    assert got.code is not None, f"{case}: ended by signal {got.signal} after {got.cpu_s:.1f} CPU-s\n{got.stderr}"
    assert got.code in (0, 2), f"exit {got.code} on {case}:\n{got.stderr}"
    assert "Traceback" not in got.stderr and "INTERNAL ERROR" not in got.stderr, got.stderr
    assert got.cpu_s < fz.CASE_CPU_S, f"{case}: {got.cpu_s:.1f} CPU-s"
    assert got.rss_mb < fz.CASE_RSS_MB, f"{case}: peak RSS {got.rss_mb:.0f} MB"
    HOSTILE["ok" if got.code == 0 else "user_error"] += 1


RACE_PAIRS = max(4, int(24 * SCALE))


@pytest.mark.slow
def test_concurrent_compiles_of_one_spec(tmp_path: Path) -> None:
    """Issue #16 item 3: two real `dtc compile --out OUT` of one spec at once (the same spec or two
    versions, a new folder or over an existing one), many times: each run exits 0 or 2 with a clean
    error, and the folder always ends as one complete set with no staging folder left. (Before,
    one run's clean-up could delete the other's live staging folder: a folder missing plan.json,
    both exiting 0.) benchmarks/fuzz.py --race N runs as many pairs as you like."""
    got = fz.race_pairs(tmp_path, RACE_PAIRS)
    figure("fuzz-5", "fuzz: " + got.line())
    assert not got.problems, "\n".join(got.problems)
    assert got.complete == got.pairs == RACE_PAIRS


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/dev/zero", "/dev/urandom", "/dev/null", ".", "no/such/spec.yaml"])
def test_special_paths(path: str, tmp_path: Path) -> None:
    """Devices that never end, a folder, a missing file: exit 2, quickly, without reading forever."""
    got = run_limited([sys.executable, "-m", "compiler", "validate", path], tmp_path)
    code, err = got.code, got.stderr
    assert code == 2, (path, code, err)
    assert "Traceback" not in err and "INTERNAL ERROR" not in err, err
    assert err.startswith(f"{path}") or re.search(r"error(\[\w+\])?:", err.lower()), err


SLOW = {
    "budget-70b-cheapest": ("budget:\n  max_cost: $5M\n  objective: fastest\n", "budget:\n  max_cost: $5M\n"
                            "  objective: cheapest\n"),
}


FEW_CPU_SECONDS = 5.0  # "a few seconds" of CPU for one valid spec


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="reported: the solver takes 6-14 s of CPU by the machine and its load (12-20 s "
                                       "before the fastest_lb/groups_lb refinements, 38 s before this wave) on "
                                       "specs/budget-70b.yaml with objective: cheapest and max_gpus: 4096 "
                                       "(benchmarks/solver_speed.py; the search runs twice, once for the thin-regime "
                                       "alternative), beyond 'a few seconds'")
@pytest.mark.parametrize("case", sorted(SLOW))
def test_valid_specs_compile_within_seconds(case: str, tmp_path: Path) -> None:
    old, new = SLOW[case]
    # specs/budget-70b.yaml as it was when this was found (the example now caps max_gpus at 2048)
    text = (REPO / "specs/budget-70b.yaml").read_text().replace("max_gpus: 2048", "max_gpus: 4096")
    assert old in text and "max_gpus: 4096" in text
    (tmp_path / "spec.yaml").write_text(text.replace(old, new))
    got = run_limited([sys.executable, "-m", "compiler", "compile", "spec.yaml", "--out", "out"], tmp_path,
                      timeout=FEW_CPU_SECONDS)
    assert got.code == 0, f"{case}: exit {got.code} after {got.cpu_s:.1f} CPU-s\n{got.stderr}"
