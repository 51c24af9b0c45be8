"""Speed of the pipeline schedule builders + SimPy engine (targets from issue 6)."""

from __future__ import annotations

from benchmarks.harness import BenchResult, measure
from simulator import build_schedule, simulate_pipeline

TIMES = {"F": 1e-3, "B": 1e-3, "W": 1e-3}


def _run(name: str, p: int, m: int, v: int) -> None:
    simulate_pipeline(build_schedule(name, p, m, v), TIMES, 1e-5)


def run() -> list[BenchResult]:
    """1F1B p=64 m=512 and ZBVPP p=32 m=256, schedule build + simulation, target 1 s each."""
    return [
        measure("1F1B p=64 m=512 (65536 actions)", lambda: _run("1F1B", 64, 512, 1), 1.0),
        measure("ZBVPP p=32 m=256 (49152 actions)", lambda: _run("ZBVPP", 32, 256, 2), 1.0),
    ]
