"""Benchmark harness. Each benchmark is timed next to a fixed reference workload measured
in the same run, so results are recorded as absolute seconds and as a ratio to the
reference (robust to a faster or slower machine). Targets are checked here, never in tests."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class BenchResult:
    name: str
    seconds: float
    reference_seconds: float
    target_seconds: float | None
    extra: str = ""

    @property
    def ratio(self) -> float:
        return self.seconds / self.reference_seconds

    @property
    def ok(self) -> bool:
        return self.target_seconds is None or self.seconds <= self.target_seconds


def reference_workload() -> None:
    """A fixed CPU workload: a 512x512 float64 matmul 20 times plus a 1e6-step Python loop."""
    a = np.random.default_rng(0).standard_normal((512, 512))
    for _ in range(20):
        a = a @ a
        a /= np.abs(a).max()
    s = 0
    for i in range(1_000_000):
        s += i


def time_it(fn: Callable[[], object], repeat: int = 3) -> float:
    """Median wall-clock seconds of ``repeat`` calls of ``fn``."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cpu_time_it(fn: Callable[[], object], repeat: int = 5) -> float:
    """Fewest CPU seconds (``time.process_time``: this process only, so other jobs on a
    shared machine inflate it far less than the wall clock) of ``repeat`` calls of ``fn``."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def measure(name: str, fn: Callable[[], object], target_seconds: float | None, repeat: int = 3, extra: str = "") -> BenchResult:
    ref = time_it(reference_workload, repeat=3)
    sec = time_it(fn, repeat=repeat)
    return BenchResult(name, sec, ref, target_seconds, extra)
