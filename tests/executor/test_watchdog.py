"""executor.watchdog: the verdicts (a rank that raised, died or hangs is the one named) from
beats in a real torch.distributed store driven by a fake clock, the stack inspection that
tells waiting from computing, and a running watchdog naming a silent peer in bounded time."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch.distributed as dist

from executor.collectives import wait_work
from executor.watchdog import Watchdog, main_thread_location


def _beat(store, rank, beat, step=0, action=0, state="running", where="x.py:1 f"):
    store.set(f"meshplan/watchdog/beat/{rank}", json.dumps(
        {"beat": beat, "step": step, "action": action, "state": state, "where": where}))


def _dog(store, world=3, **kw):
    kw.setdefault("dead_after", 5.0)
    kw.setdefault("hang_after", 20.0)
    return Watchdog(store, 0, world, lambda m: None, interval=1.0, **kw)


def test_a_silent_rank_is_named_dead_after_dead_after_seconds():
    store = dist.HashStore()
    dog = _dog(store)
    for r in range(3):
        _beat(store, r, 1)
    assert dog.check(100.0) is None
    for t in (101.0, 103.0, 105.5):  # ranks 0 and 1 keep beating, rank 2 is silent
        _beat(store, 0, int(t))
        _beat(store, 1, int(t), action=int(t))
        verdict = dog.check(t)
    assert verdict.startswith("rank 2 stopped reporting for 6 s")
    assert "last progress: rank 2: step 0 action 0 (x.py:1 f)" in verdict


def test_two_silent_ranks_are_both_named():
    store = dist.HashStore()
    dog = _dog(store, world=4)
    for r in range(4):
        _beat(store, r, 1)
    dog.check(0.0)
    _beat(store, 1, 2)
    assert dog.check(6.0).startswith("ranks [2, 3] stopped reporting")


def test_a_rank_that_raised_is_named_with_its_message():
    store = dist.HashStore()
    dog = _dog(store)
    for r in range(3):
        _beat(store, r, 1)
    Watchdog(store, 1, 3, lambda m: None).fail("ValueError: boom")
    assert dog.check(0.0) == "rank 1 failed: ValueError: boom"


def test_the_hung_rank_is_named_not_the_ones_waiting_for_it():
    store = dist.HashStore()
    dog = _dog(store)
    t = 0.0
    while t <= 21.0:  # everyone beats, nobody progresses; rank 1 computes, 0 and 2 wait
        _beat(store, 0, int(t) + 1, step=3, action=5, where="waiting in wait_work")
        _beat(store, 1, int(t) + 1, step=3, action=4, where="model.py:12 forward")
        _beat(store, 2, int(t) + 1, step=3, action=5, where="waiting in all_reduce")
        verdict = dog.check(t)
        if t < 20.0:
            assert verdict is None, t
        t += 1.0
    assert verdict == ("rank 1 hangs at step 3 action 4 in model.py:12 forward "
                       "(no progress for 21 s; ranks [0, 2] wait for it)")


def test_progress_anywhere_is_not_a_hang_and_every_rank_waiting_is_reported_as_such():
    store = dist.HashStore()
    dog = _dog(store, world=2)
    for t in range(30):
        _beat(store, 0, t + 1, action=t)  # rank 0 progresses
        _beat(store, 1, t + 1, where="waiting in wait_work")
        assert dog.check(float(t)) is None
    store2 = dist.HashStore()
    dog2 = _dog(store2, world=2)
    for t in range(22):
        _beat(store2, 0, t + 1, where="waiting in broadcast")
        _beat(store2, 1, t + 1, where="waiting in wait_work")
        verdict = dog2.check(float(t))
    assert verdict.startswith("no progress for 21 s, every rank waits in a collective: rank 0 "
                              "waiting in broadcast")


def test_bad_times_are_refused():
    with pytest.raises(ValueError, match="interval < dead_after"):
        Watchdog(dist.HashStore(), 0, 2, lambda m: None, interval=5.0, dead_after=2.0)


class _Work:
    def __init__(self, release):
        self.release = release

    def wait(self):
        self.release.wait(10)


def _computes(release):
    while not release.is_set():
        time.sleep(0.01)


def test_main_thread_location_tells_waiting_from_computing():
    release = threading.Event()
    waiter = threading.Thread(target=wait_work, args=(_Work(release),))
    worker = threading.Thread(target=_computes, args=(release,))
    waiter.start()
    worker.start()
    time.sleep(0.2)
    try:
        assert main_thread_location(waiter.ident) == "waiting in wait_work"
        where = main_thread_location(worker.ident)
        assert where.startswith("test_watchdog.py:") and where.endswith(" _computes")
    finally:
        release.set()
        waiter.join()
        worker.join()


def test_a_running_watchdog_names_a_peer_that_stopped_beating():
    """Rank 1 beats once and dies; rank 0's thread (0.2 s beats, dead after 1 s) names it
    within dead_after + 2 beats."""
    store, verdicts = dist.HashStore(), []
    got = threading.Event()
    _beat(store, 1, 1)
    dog = Watchdog(store, 0, 2, lambda m: (verdicts.append(m), got.set()), interval=0.2,
                   dead_after=1.0, hang_after=30.0)
    t0 = time.monotonic()
    dog.start()
    assert got.wait(5.0), "no verdict"
    assert time.monotonic() - t0 < 1.0 + 3 * 0.2 + 0.5
    assert verdicts[0].startswith("rank 1 stopped reporting")
    dog.stop()


def test_progress_files_hold_each_beat(tmp_path):
    store = dist.HashStore()
    dog = Watchdog(store, 0, 1, lambda m: None, progress_dir=str(tmp_path))
    dog.progress(2, 7)
    dog.start()  # the first beat is published at once
    doc = json.loads((tmp_path / "rank0.json").read_text())
    dog.stop()
    assert (doc["rank"], doc["step"], doc["action"], doc["state"]) == (0, 2, 7, "running")
    assert json.loads((tmp_path / "rank0.json").read_text())["state"] == "done"
