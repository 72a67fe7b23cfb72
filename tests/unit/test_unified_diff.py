"""review.files.unified_diff: difflib's format in linear time where difflib's matcher is quadratic (a plan.json whose
numbers all moved took `dtc check` minutes), and always an exact edit script."""
from __future__ import annotations

import difflib
import random
import re

import pytest

import compiler.review.files as F

DEFAULT_CELLS = F.MAX_DIFF_CELLS
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def apply(old: list[str], diff: list[str]) -> list[str]:
    """Apply a unified diff strictly (every context and removed line must match: no fuzz)."""
    out, pos, i = [], 0, 2
    while i < len(diff):
        m = HUNK.match(diff[i])
        assert m, diff[i]
        start = int(m.group(1)) - (0 if m.group(2) == "0" else 1)
        out += old[pos:start]
        pos = start
        i += 1
        while i < len(diff) and not diff[i].startswith("@@"):
            tag, line = diff[i][0], diff[i][1:]
            if tag in " -":
                assert old[pos] == line, (pos, old[pos], line)
                pos += 1
            if tag in " +":
                out.append(line)
            i += 1
    return out + old[pos:]


def edits(rng: random.Random) -> tuple[list[str], list[str]]:
    old = [rng.choice("abcde") + "\n" for _ in range(rng.randint(0, 30))]
    new = list(old)
    for _ in range(rng.randint(0, 4)):
        r = rng.random()
        if r < 0.4 and new:
            new[rng.randrange(len(new))] = rng.choice("xyz") + "\n"
        elif r < 0.7:
            new.insert(rng.randint(0, len(new)), rng.choice("xyz") + "\n")
        elif new:
            del new[rng.randrange(len(new))]
    return old, new


@pytest.mark.parametrize("cells", [DEFAULT_CELLS, 40, 4])
def test_every_diff_is_exact(monkeypatch, cells):
    monkeypatch.setattr(F, "MAX_DIFF_CELLS", cells)
    rng = random.Random(7)
    same = 0
    for _ in range(400):
        old, new = edits(rng)
        n = rng.randint(0, 4)
        diff = F.unified_diff(old, new, "a", "b", n=n)
        assert apply(old, diff) == new if diff else old == new
        same += diff == list(difflib.unified_diff(old, new, "a", "b", n=n))
    if cells == DEFAULT_CELLS:  # small files: difflib's own diff
        assert same == 400


def test_a_file_whose_lines_all_changed_is_diffed_at_once():
    old = [f'"x{i}": {i * 1.1},' for i in range(30000)]
    new = [f'"x{i}": {i * 1.2},' for i in range(30000)]
    diff = F.unified_diff(["{"] + old + ["}"], ["{"] + new + ["}"], "a", "b", lineterm="")
    assert diff[2] == "@@ -1,30002 +1,30002 @@"
    assert apply(["{"] + old + ["}"], diff) == ["{"] + new + ["}"]
