"""Speed of the pipeline schedule builders + SimPy engine (targets from issue 18).

Each schedule is built cold (the build and play memos cleared before every run). The
1F1B figure is also given as a ratio to a bare SimPy loop with the same events, measured in
the same run (:func:`bare_loop`): one process per rank, one Timeout per action and one
Event per input a rank waits for, no bookkeeping."""

from __future__ import annotations

import simpy

from benchmarks.harness import BenchResult, cpu_time_it, measure, time_it
from simulator import build_schedule, simulate_pipeline
from simulator.pipeline_sim import clear_play_cache
from simulator.schedules.base import clear_schedule_cache

TIMES = {"F": 1e-3, "B": 1e-3, "W": 1e-3}


def _run(name: str, p: int, m: int, v: int, **opts) -> None:
    clear_schedule_cache()
    clear_play_cache()
    simulate_pipeline(build_schedule(name, p, m, v, **opts), TIMES, 1e-5)


def bare_loop(p: int, actions_per_rank: int, waits: int) -> None:
    """The events of a play without its bookkeeping: ``p`` processes yielding one Timeout
    per action; ``waits`` of them first wait on an Event another process triggers."""
    env = simpy.Environment()
    events = [env.event() for _ in range(waits)]

    def proc(r: int):
        for j in range(actions_per_rank):
            k = r * actions_per_rank + j
            if k < waits and r > 0:
                yield events[k]
            if k + actions_per_rank < waits:
                events[k + actions_per_rank].succeed()
            yield env.timeout(1000)

    for r in range(p):
        env.process(proc(r))
    env.run()


def _waits(name: str, p: int, m: int, v: int) -> int:
    """How many times the engine's ranks wait for an input in this play (counted by
    replaying with a counting Event factory)."""
    orig = simpy.Environment
    count = [0]

    class Counting(orig):
        def event(self):
            count[0] += 1
            return super().event()

    simpy.Environment = Counting
    try:
        _run(name, p, m, v)
    finally:
        simpy.Environment = orig
    return count[0]


def run() -> list[BenchResult]:
    """1F1B p=64 m=512 (target 0.5 s, and <= 4x the bare loop), ZB automatic p=32 m=256
    with its stage times (target 0.2 s), ZBVPP p=32 m=256 (recorded, no target). The
    1F1B and ZB rows also give their CPU seconds (:func:`cpu_time_it`), which a shared
    machine's load moves much less than the wall clock."""
    waits = _waits("1F1B", 64, 512, 1)
    bare = time_it(lambda: bare_loop(64, 2 * 512, waits))
    one = measure("1F1B p=64 m=512 (65536 actions) build + simulate", lambda: _run("1F1B", 64, 512, 1), 0.5)
    cpu_one, cpu_bare = cpu_time_it(lambda: _run("1F1B", 64, 512, 1)), cpu_time_it(lambda: bare_loop(64, 1024, waits))
    one.extra = (f"{one.seconds / bare:.2f}x a bare SimPy loop with the same events ({bare:.3f} s, {waits} waits; "
                 f"target <= 4x); CPU {cpu_one:.3f} s = {cpu_one / cpu_bare:.2f}x the bare loop's {cpu_bare:.3f} s")

    def zb_run() -> None:
        _run("ZB", 32, 256, 1, stage_times=TIMES, comm_time=1e-5)

    zb = measure("ZB auto p=32 m=256 (24576 actions) build + simulate", zb_run, 0.2)
    zb.extra = f"CPU {cpu_time_it(zb_run):.3f} s"
    zbv = measure("ZBVPP p=32 m=256 (49152 actions) build + simulate",
                  lambda: _run("ZBVPP", 32, 256, 2, stage_times={"F": 1e-3, "B": 1.2e-3, "W": 0.8e-3},
                               comm_time=1e-5), None)
    return [one, zb, zbv]
