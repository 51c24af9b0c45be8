"""Name the rank that died or hangs in a multi-node run (torchrun), within bounded time.

Every rank runs a :class:`Watchdog` thread that, every ``interval`` seconds, publishes a
heartbeat to a key-value store all ranks reach (a ``torch.distributed.TCPStore`` hosted by
rank 0, so it works across nodes without a shared file system) and reads everyone else's:

- a *beat counter* (incremented by the thread: the process is alive) and the rank's
  *progress* (step and action index, set by the executor before each action), and *where*
  its main thread is: ``waiting in <torch.distributed function>`` when the innermost
  frames are inside ``torch/distributed``, else the innermost frame of its own code
  (``sys._current_frames``, CPython);
- ``error``: the message of an exception the rank raised.

Verdicts, checked on every beat (each watcher uses its own clock: beats are counters, so
node clocks need not agree):

- a rank published an error -> ``rank r failed: <message>``;
- a rank's beat counter has not changed for ``dead_after`` s -> it died or its node was
  lost (``rank r stopped reporting for N s (process died, killed or node lost); last
  progress ...``);
- no rank's progress has changed for ``hang_after`` s while all beat -> the ranks that are
  *not* waiting in torch.distributed hang (``rank r hangs: no progress for N s at step s
  action a, in file:line function; ranks [...] wait for it``); when every rank waits, all
  are named as waiting in their collectives;
- the store itself is unreachable -> rank 0, which hosts it, died.

On a verdict the watcher calls ``on_verdict(message)`` (the torchrun entry prints it and
ends the process: a collective blocked on a dead peer cannot be interrupted).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from executor.errors import ExecutorError

#: seconds between beats
INTERVAL = 1.0
#: a rank whose beats stop this long is dead
DEAD_AFTER = 15.0
#: no rank progressing this long (all alive) is a hang
HANG_AFTER = 120.0
_PREFIX = "meshplan/watchdog"


@dataclass
class _Seen:
    beat: int = -1
    progress: tuple = ()
    beat_at: float | None = None  # this watcher's clock when the beat / progress last changed
    progress_at: float | None = None


#: functions of the executor that only wait for peers (``executor.collectives.wait_work``)
WAIT_FUNCTIONS = ("wait_work",)


def main_thread_location(thread_id: int) -> str:
    """Where thread ``thread_id`` is: ``waiting in <fn>`` when its innermost frames are in
    ``torch/distributed`` or in one of :data:`WAIT_FUNCTIONS`, else ``<file>:<line>
    <function>`` of its innermost frame."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return "gone"
    f = frame
    for _ in range(4):  # a collective's own frames, or a wait() called from ours
        if f is None:
            break
        path = f.f_code.co_filename.replace(os.sep, "/")
        if "/torch/distributed/" in path or f.f_code.co_name in WAIT_FUNCTIONS:
            return f"waiting in {f.f_code.co_name}"
        f = f.f_back
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} {frame.f_code.co_name}"


class Watchdog:
    """Heartbeat, progress and failure verdicts of one rank (see the module docstring).

    Args:
        store: a ``torch.distributed.Store`` every rank reaches (``set``, ``get``, ``check``).
        rank, world_size: this rank and the ranks watched.
        on_verdict: called once, from the watchdog thread, with the verdict message.
        interval, dead_after, hang_after: seconds (beat period; silence that means dead;
            no progress anywhere that means a hang). ``dead_after`` and ``hang_after`` must
            exceed ``interval``.
        progress_dir: when given, each beat is also written to ``progress_dir/rank<R>.json``
            (the beat's fields plus ``rank``, ``pid`` and ``time``): a per-rank progress
            file to watch a run from outside (on a shared file system, across nodes).
    Raises:
        ValueError: for non-positive or inconsistent times.
    """

    def __init__(self, store: Any, rank: int, world_size: int, on_verdict: Callable[[str], None],
                 interval: float = INTERVAL, dead_after: float = DEAD_AFTER,
                 hang_after: float = HANG_AFTER, progress_dir: str | None = None) -> None:
        if not 0 < interval < min(dead_after, hang_after):
            raise ExecutorError(f"watchdog times must satisfy 0 < interval < dead_after, hang_after; "
                             f"got interval={interval}, dead_after={dead_after}, hang_after={hang_after}")
        self.store, self.rank, self.world = store, rank, world_size
        self.on_verdict = on_verdict
        self.interval, self.dead_after, self.hang_after = interval, dead_after, hang_after
        self.step, self.action, self.state = -1, -1, "starting"
        self._beat = 0
        self._seen = [_Seen() for _ in range(world_size)]
        self._stop = threading.Event()
        self._main = threading.main_thread().ident
        self._thread = threading.Thread(target=self._loop, name="meshplan-watchdog", daemon=True)
        self.verdict: str | None = None
        self.progress_dir = progress_dir

    # -- called by the rank ------------------------------------------------------------------
    def start(self) -> Watchdog:
        """Publish the first beat and start the thread; returns self."""
        self._publish()
        self._thread.start()
        return self

    def progress(self, step: int, action: int) -> None:
        """The rank is about to run ``action`` (index in its row) of ``step``."""
        self.step, self.action, self.state = step, action, "running"

    def fail(self, message: str) -> None:
        """Publish this rank's own error (others name it as the failed rank)."""
        self.store.set(f"{_PREFIX}/error/{self.rank}", message)

    def stop(self, state: str = "done") -> None:
        """Mark the rank ``state`` (progress no longer expected) and stop the thread."""
        self.state = state
        try:
            self._publish()
        except Exception:  # noqa: BLE001 - the store may be gone at teardown
            pass
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(2 * self.interval)

    # -- the thread -----------------------------------------------------------------------
    def _publish(self) -> None:
        self._beat += 1
        where = self.state if self.state != "running" else main_thread_location(self._main)
        beat = {"beat": self._beat, "step": self.step, "action": self.action, "state": self.state,
                "where": where}
        self.store.set(f"{_PREFIX}/beat/{self.rank}", json.dumps(beat))
        if self.progress_dir is not None:
            path = os.path.join(self.progress_dir, f"rank{self.rank}.json")
            with open(path + ".tmp", "w") as f:
                json.dump({**beat, "rank": self.rank, "pid": os.getpid(), "time": time.time()}, f)
            os.replace(path + ".tmp", path)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._publish()
                verdict = self.check(time.monotonic())
            except Exception as e:  # noqa: BLE001 - the store is rank 0's: it is gone
                verdict = (f"rank 0 is unreachable (its heartbeat store failed: "
                           f"{type(e).__name__}: {' '.join(str(e).split())[:200]}); rank 0 "
                           f"died, was killed or its node was lost")
            if verdict is not None and not self._stop.is_set():
                self.verdict = verdict
                self._stop.set()
                self.on_verdict(verdict)
                return

    def _read(self) -> list[dict | None]:
        out = []
        for r in range(self.world):
            key = f"{_PREFIX}/beat/{r}"
            out.append(json.loads(self.store.get(key)) if self.store.check([key]) else None)
        return out

    def check(self, now: float) -> str | None:
        """One round of verdicts at time ``now`` (this rank's monotonic clock); None when all
        is well. Public so that tests can drive it with a fake store and clock."""
        for r in range(self.world):
            key = f"{_PREFIX}/error/{r}"
            if r != self.rank and self.store.check([key]):
                return f"rank {r} failed: {self.store.get(key).decode()}"
        beats = self._read()
        for r, b in enumerate(beats):
            s = self._seen[r]
            if s.beat_at is None:
                s.beat_at = s.progress_at = now
            if b is None:
                continue
            if b["beat"] != s.beat:
                s.beat, s.beat_at = b["beat"], now
            prog = (b["step"], b["action"], b["state"])
            if prog != s.progress:
                s.progress, s.progress_at = prog, now
        dead = [r for r, b in enumerate(beats) if r != self.rank
                and now - self._seen[r].beat_at > self.dead_after
                and (b is None or b["state"] != "done")]
        if dead:
            last = "; ".join(
                f"rank {r}: " + ("none" if beats[r] is None else
                                 f"step {beats[r]['step']} action {beats[r]['action']} ({beats[r]['where']})")
                for r in dead)
            who = f"rank {dead[0]}" if len(dead) == 1 else f"ranks {dead}"
            return (f"{who} stopped reporting for {now - max(self._seen[r].beat_at for r in dead):.0f} s "
                    f"(process died, was killed or its node was lost); last progress: {last}")
        active = [(r, b) for r, b in enumerate(beats) if b is not None and b["state"] == "running"]
        if active and all(now - self._seen[r].progress_at > self.hang_after for r, _ in active):
            stuck = now - max(self._seen[r].progress_at for r, _ in active)
            waiting = [r for r, b in active if b["where"].startswith("waiting in")]
            hung = [(r, b) for r, b in active if r not in waiting]
            if hung:
                desc = "; ".join(f"rank {r} hangs at step {b['step']} action {b['action']} in "
                                 f"{b['where']}" for r, b in hung)
                return (f"{desc} (no progress for {stuck:.0f} s"
                        + (f"; ranks {waiting} wait for it)" if waiting else ")"))
            desc = ", ".join(f"rank {r} {b['where']} at step {b['step']} action {b['action']}"
                             for r, b in active)
            return f"no progress for {stuck:.0f} s, every rank waits in a collective: {desc}"
        return None
