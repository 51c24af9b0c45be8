"""Test helper run under torchrun (``-m tests._torchrun_hang PLAN.json ...``): the torchrun
entry point with rank ``HANG_RANK`` (env, default 1) stuck in a sleep before its second step,
so ``executor.watchdog`` must name it as the rank that hangs."""

from __future__ import annotations

import os
import sys
import time

from executor.rank_exec import RankExecutor
from meshplan.executor.run import main

_run_step = RankExecutor.run_step
_steps = {"n": 0}


def stuck_forever() -> None:
    """Sleep in a loop (not in torch.distributed): a hung rank."""
    while True:
        time.sleep(0.1)


def run_step(self, actions):
    """RankExecutor.run_step, except that rank HANG_RANK never starts its second step."""
    _steps["n"] += 1
    if _steps["n"] == 2 and os.environ["RANK"] == os.environ.get("HANG_RANK", "1"):
        stuck_forever()
    return _run_step(self, actions)


RankExecutor.run_step = run_step

if __name__ == "__main__":
    sys.exit(main())
