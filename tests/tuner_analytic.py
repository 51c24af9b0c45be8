"""A small analytic scorer for the study-mechanics tests only (resume, workers, caching,
constraints): step time and memory are closed-form functions of the candidate, so the
tests run without the cost model. Never used for the Done-when searches."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from tuner.space import Candidate
from tuner.study import Score

GIB = 2**30


def analytic_time_memory(c: Candidate, gb: int) -> tuple[float, int]:
    """time = m*(1 + 0.1*pp + 0.05*tp) / mbs-ish; memory = 100 GiB / (tp*pp) / (1+zero) *mbs."""
    m = gb // (c.dp * c.micro_batch_size)
    t = (m * c.micro_batch_size) * (1.0 + 0.05 * c.tp) / c.tp + 0.2 * (c.pp - 1)
    t *= {"none": 1.0, "selective": 1.05, "full": 1.33}[c.recompute]
    mem = 100 * GIB / (c.tp * c.pp) / (1 + c.zero) * c.micro_batch_size
    mem /= {"none": 1.0, "selective": 1.5, "full": 4.0}[c.recompute]
    return t, int(mem)


def make_analytic(config: Mapping[str, Any]):
    """Scorer factory: ``config`` has global_batch_size, memory_limit_gib, sleep_s and an
    optional ``calls_file`` where each scored plan appends one line (counts simulations
    across processes)."""
    gb = int(config["global_batch_size"])
    cap = int(config.get("memory_limit_gib", 80) * GIB)
    sleep = float(config.get("sleep_s", 0.0))
    calls = config.get("calls_file")

    def score(c: Candidate) -> Score:
        if sleep:
            time.sleep(sleep)
        if calls:
            with open(calls, "a") as f:
                f.write(f"{os.getpid()} {c.key()}\n")
        t, mem = analytic_time_memory(c, gb)
        return Score(t, mem, cap, {"tokens_per_s": gb / t, "mfu": 0.5, "bubble_ratio": 0.0})

    return score
