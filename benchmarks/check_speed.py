"""How long `dtc check` takes over specs/ (the issue's target: under 2 s), as a user runs it.

Usage: python benchmarks/check_speed.py [--repeat N]
Prints wall and CPU seconds per run (CPU is the honest figure on a shared machine). As in
startup_speed.py, the runs have dtc's byte code cached (compileall writes it first, even where
PYTHONDONTWRITEBYTECODE is set), as an installed dtc has.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    subprocess.run([sys.executable, "-m", "compileall", "-q", "compiler"], cwd=REPO, capture_output=True, check=True)
    for i in range(args.repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "compiler", "check"], cwd=REPO, env=ENV, capture_output=True,
                                text=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        last = (result.stdout.strip().splitlines() or [""])[-1]
        print(f"run {i + 1}: exit {result.returncode}, wall {wall:.2f} s, cpu {cpu:.2f} s  ({last})")


if __name__ == "__main__":
    main()
