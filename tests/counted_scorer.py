"""Scorer factories for the shared exhaustive tests (issue 18 item 5): they count every
score in a file that all processes append to, so a test can see that no plan was scored
twice across workers.

``make_counted``: the real cost model (``meshplan.tuning.make_scorer``) and its bound.
``make_analytic_bounded``: ``tests.tuner_analytic``'s closed-form scorer with a closed-form
bound (half its time and half its memory: a valid lower bound by construction), and an
optional per-score sleep so that a test can kill a worker mid-search."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from tests.tuner_analytic import GIB, analytic_time_memory
from tuner.exhaustive import Bound
from tuner.study import Score

#: keys of a scorer config this module reads (the rest goes to the wrapped scorer)
OWN = ("calls_file", "sleep_s", "memory_limit_gib", "rendezvous")
#: environment variable with a per-score sleep (s) that overrides the config's sleep_s
SLEEP_ENV = "MESHPLAN_TEST_SCORE_SLEEP_S"
#: longest wait (s) of the rendezvous for a second process
RENDEZVOUS_S = 120.0


def _log(calls: str | None, c: Any) -> None:
    if calls:
        with open(calls, "a") as f:
            f.write(f"{os.getpid()} {c.key()}\n")


def make_counted(config: Mapping[str, Any]):
    """``make_scorer(config)`` that appends ``PID KEY`` to ``config['calls_file']`` per score."""
    from meshplan.tuning import make_scorer

    base = make_scorer({k: v for k, v in config.items() if k not in OWN})
    calls = config.get("calls_file")

    def score(c):
        _log(calls, c)
        return base(c)

    score.bound = base.bound
    return score


def _rendezvous(calls: str) -> None:
    """Wait until another process has scored a plan (a line of another pid in ``calls``)."""
    me, end = str(os.getpid()), time.monotonic() + RENDEZVOUS_S
    while time.monotonic() < end:
        with open(calls) as f:
            if any(ln.split(" ", 1)[0] != me for ln in f if ln.strip()):
                return
        time.sleep(0.05)


def make_analytic_bounded(config: Mapping[str, Any]):
    """The analytic scorer with ``bound(c) = (t / 2, mem / 2, cap)``; ``sleep_s`` per score;
    with ``rendezvous`` (and a ``calls_file``) each process's first score waits until
    another process has scored one, so that a test sees two workers overlap."""
    gb = int(config["global_batch_size"])
    cap = int(config.get("memory_limit_gib", 80) * GIB)
    # the environment's SLEEP_ENV, when set, overrides sleep_s: a test slows one process
    # down without changing the study's stored config (a resume must match it)
    sleep = float(os.environ.get(SLEEP_ENV, config.get("sleep_s", 0.0)))
    calls = config.get("calls_file")
    meet = [bool(config.get("rendezvous")) and calls is not None]

    def score(c):
        if sleep:
            time.sleep(sleep)
        _log(calls, c)
        if meet[0]:
            meet[0] = False
            _rendezvous(calls)
        t, mem = analytic_time_memory(c, gb)
        return Score(t, mem, cap, {"tokens_per_s": gb / t})

    def bound(c):
        t, mem = analytic_time_memory(c, gb)
        return Bound(t / 2, mem // 2, cap)

    score.bound = bound
    return score
