#!/usr/bin/env python3
"""The long fuzz run of issue #8, item 1: N randomized hostile specs, as long as you like.

The same generators as tests/test_fuzz_specs.py (tests/fuzzing.py), but randomized: each
run draws new specs (pass --seed to repeat one). Every spec goes through load + lower in
process; with --compile, every spec that validates is also solved and rendered
(``compile_loaded``), which is much slower. A spec must pass, or fail with a located
``SpecError`` (or an ``InfeasibleError`` when compiling); anything else is a failure, printed
with the spec that caused it (also saved to --save-failures, if given).

    python benchmarks/fuzz.py 100000                 # ~15 min on one core
    python benchmarks/fuzz.py 2000 --compile --seed 7
    python benchmarks/fuzz.py --hostile              # tests/cases/hostile as real processes: CPU-s, RSS
    python benchmarks/fuzz.py --race 100             # 100 pairs of concurrent `dtc compile` into one folder

``--hostile`` compiles every spec of tests/cases/hostile (input dimensions at dtc's caps, issue
#16) as a real process under the same limits as the tests (RLIMIT_CPU, RLIMIT_AS) and prints
each one's own CPU seconds and peak RSS (from wait4).

Exit status 1 when any failure was found, 0 otherwise.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import fuzzing as fz  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import seed as hypothesis_seed  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def compile_check(data: bytes, counts: dict[str, int], failures: list[str]) -> None:
    from compiler.errors import DtcError, InfeasibleError, SpecError
    from compiler.pipeline import compile_loaded
    from compiler.spec.load import load_spec_bytes

    try:
        loaded = load_spec_bytes(data, fz.SPEC_PATH)
    except SpecError:
        return
    start = time.perf_counter()
    try:
        compile_loaded(loaded)
        counts["compiled"] += 1
    except InfeasibleError:
        counts["infeasible"] += 1
    except SpecError as exc:
        counts["rejected_late"] += 1
        fz.check_diagnostics(exc, fz.SPEC_PATH)
    except DtcError as exc:
        failures.append(f"{type(exc).__name__} (exit {int(exc.exit_code)}):\n{exc.render()}\nspec: {data!r}")
    except Exception as exc:  # noqa: BLE001 - what we hunt
        failures.append("".join(traceback.format_exception(exc)) + f"\nspec: {data!r}")
    counts["max_compile_ms"] = max(counts["max_compile_ms"], int((time.perf_counter() - start) * 1000))


def hostile() -> int:
    """Every tests/cases/hostile spec as a real, limited process; 1 if one broke a limit."""
    import tempfile

    bad = 0
    print(f"{'case':32} {'exit':>5} {'CPU-s':>7} {'RSS MB':>7}  (limits {fz.CASE_CPU_S:.0f} CPU-s, "
          f"{fz.CASE_RSS_MB:.0f} MB)")
    for spec in fz.hostile_cases():
        with tempfile.TemporaryDirectory(prefix="dtc-hostile-") as tmp:
            got = fz.run_limited([sys.executable, "-m", "compiler", "compile", str(spec), "--out", "out"], Path(tmp))
        over = got.code not in (0, 2) or got.cpu_s >= fz.CASE_CPU_S or got.rss_mb >= fz.CASE_RSS_MB
        bad += over
        shown = got.code if got.code is not None else f"sig{got.signal}"
        print(f"{spec.stem:32} {shown!s:>5} {got.cpu_s:7.2f} {got.rss_mb:7.0f}{'  OVER' if over else ''}")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", type=int, nargs="?", default=0, help="specs to generate")
    parser.add_argument("--hostile", action="store_true", help="run tests/cases/hostile as limited processes")
    parser.add_argument("--race", type=int, default=0, metavar="PAIRS",
                        help="start PAIRS pairs of concurrent `dtc compile` of one spec into one folder")
    parser.add_argument("--seed", type=int, default=None, help="repeat a run (default: a random seed)")
    parser.add_argument("--compile", action="store_true", help="also solve and render every valid spec")
    parser.add_argument("--bytes-share", type=float, default=0.4, help="share of byte-level mutations")
    parser.add_argument("--save-failures", type=Path, default=None, help="write failing specs into this folder")
    args = parser.parse_args()
    if args.hostile:
        return hostile()
    if args.race:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="dtc-race-") as tmp:
            got = fz.race_pairs(Path(tmp), args.race, seed=args.seed or 0)
        print(got.line())
        for problem in got.problems[:20]:
            print(f"\n--- {problem}")
        return 1 if got.problems else 0
    if args.n < 1:
        parser.error("give a number of specs to generate, or --hostile")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    bases = fz.base_specs()
    stats = fz.Stats()
    counts = {"compiled": 0, "infeasible": 0, "rejected_late": 0, "max_compile_ms": 0}
    failures: list[str] = []
    start = time.perf_counter()

    @hypothesis_seed(seed)
    @settings(max_examples=args.n, database=None, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(st.floats(0, 1).flatmap(lambda u: fz.fuzz_specs(bases, byte_level=u < args.bytes_share)))
    def run(data: bytes) -> None:
        try:
            fz.check_spec(data, stats, trace_memory=stats.specs % 100 == 0)
        except fz.FuzzFailure as exc:
            failures.append(str(exc))
            return
        if args.compile:
            compile_check(data, counts, failures)
        if stats.specs % 1000 == 0:
            print(f"  {stats.specs} specs, {len(failures)} failures, {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)

    run()
    elapsed = time.perf_counter() - start
    print(stats.line(f"fuzz (seed {seed})") + f", {elapsed:.0f} s")
    if args.compile:
        print(f"compile: {counts['compiled']} compiled, {counts['infeasible']} infeasible, "
              f"{counts['rejected_late']} rejected after load, max {counts['max_compile_ms']} ms")
    for i, failure in enumerate(failures[:20]):
        print(f"\n--- failure {i + 1}\n{failure}")
        if args.save_failures:
            args.save_failures.mkdir(parents=True, exist_ok=True)
            (args.save_failures / f"failure-{i + 1}.txt").write_text(failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
