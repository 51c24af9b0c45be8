"""A fast slice of the issue-43 fuzz run (benchmarks/fuzz_entry_points.py): two generated
inputs of every hostile kind (tests/_hostile.py), each refused in one line naming the fault,
with no traceback and no file it must not touch changed."""

from __future__ import annotations

import random

import pytest

from tests._entry_points import run_cli
from tests._hostile import KINDS, check


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("seed", [1, 2])
def test_hostile_inputs_are_refused_in_one_line(tmp_path, monkeypatch, kind, seed):
    monkeypatch.chdir(tmp_path)
    case = KINDS[kind](random.Random(f"{kind}{seed}"), tmp_path)
    before = {p: p.read_bytes() for p in case.untouched}
    rc, out, err = run_cli(case.argv)
    assert check(case, rc, out, err, before) is None, (case, rc, err[-1500:])
