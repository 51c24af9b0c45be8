"""The claim protocol of ``tuner.study._Objective._claim`` under interleavings that a
two-process race hits only rarely, driven here step by step on one in-memory study.

A *peer* is a RUNNING trial of another live worker (a ``sleep`` child process stands in for
it) with the same ``plan_key``. The case that lost the old wall-clock rule: this worker
(lower trial number) sees a peer that drew the same plan after it but looked before this
worker's key was written, so the peer saw nobody and scores. This worker must wait for the
peer's decision rather than score too.
"""

from __future__ import annotations

import subprocess
import threading
import time

import optuna
import pytest

from tests.tuner.test_tuner_study import cfg
from tuner import study as S
from tuner.result import record_attrs
from tuner.storage import WORKER_ATTR, worker_id
from tuner.workers import proc_start

KEY = '{"plan": "same"}'
REC = {"time_s": 1.25, "memory_bytes": 3 * 2**30, "memory_limit_bytes": 80 * 2**30,
       "metrics": {"mfu": 0.4}}


@pytest.fixture
def peer_owner():
    proc = subprocess.Popen(["sleep", "60"])
    import socket

    yield proc, {"host": socket.gethostname(), "pid": proc.pid, "start": proc_start(proc.pid)}
    proc.kill()
    proc.wait()


@pytest.fixture(autouse=True)
def fast_poll(monkeypatch):
    monkeypatch.setattr(S, "PEER_POLL_S", 0.005)


def _setup(peer_first: bool, owner: dict):
    """A study with this worker's trial and a peer's trial (numbers in the order asked)."""
    study = optuna.create_study()
    trials = [study.ask(), study.ask()]
    mine, peer = (trials[1], trials[0]) if peer_first else (trials[0], trials[1])
    study._storage.set_trial_system_attr(mine._trial_id, WORKER_ATTR, worker_id())
    study._storage.set_trial_system_attr(peer._trial_id, WORKER_ATTR, owner)
    mine.set_user_attr("plan_key", KEY)
    peer.set_user_attr("plan_key", KEY)
    return study, mine, peer


def _start_claim(study, mine):
    obj = S._Objective(study, cfg(), scorer=lambda c: pytest.fail("no scorer call here"))
    out: dict = {}
    th = threading.Thread(target=lambda: out.setdefault("rec", obj._claim(mine, KEY)))
    th.start()
    return th, out


def _finish_peer(study, peer):
    for k, v in record_attrs(REC).items():
        peer.set_user_attr(k, v)
    study.tell(peer, REC["time_s"])


def test_lower_number_waits_for_an_undecided_higher_peer_that_then_scores(peer_owner):
    study, mine, peer = _setup(peer_first=False, owner=peer_owner[1])
    assert mine.number < peer.number
    th, out = _start_claim(study, mine)
    time.sleep(0.2)
    assert th.is_alive(), "scored beside a peer that had not decided"
    peer.set_user_attr(S.CLAIM_ATTR, "scoring")
    time.sleep(0.1)
    assert th.is_alive()
    assert study.trials[mine.number].user_attrs[S.CLAIM_ATTR] == "waiting"
    _finish_peer(study, peer)
    th.join(5)
    assert not th.is_alive()
    assert out["rec"]["time_s"] == REC["time_s"]
    assert out["rec"]["memory_bytes"] == REC["memory_bytes"]


def test_lower_number_scores_once_the_higher_peer_waits(peer_owner):
    study, mine, peer = _setup(peer_first=False, owner=peer_owner[1])
    th, out = _start_claim(study, mine)
    time.sleep(0.1)
    assert th.is_alive()
    peer.set_user_attr(S.CLAIM_ATTR, "waiting")
    th.join(5)
    assert not th.is_alive() and out["rec"] is None  # None: this worker scores
    assert study.trials[mine.number].user_attrs[S.CLAIM_ATTR] == "scoring"


def test_higher_number_waits_for_a_lower_peer_and_scores_when_it_dies(peer_owner):
    proc, owner = peer_owner
    study, mine, peer = _setup(peer_first=True, owner=owner)
    assert peer.number < mine.number
    th, out = _start_claim(study, mine)
    time.sleep(0.2)
    assert th.is_alive()
    assert study.trials[mine.number].user_attrs[S.CLAIM_ATTR] == "waiting"
    proc.kill()
    proc.wait()
    th.join(5)
    assert not th.is_alive() and out["rec"] is None
    # it retracted its "waiting" (a peer may have read it) before it decided to score
    assert study.trials[mine.number].user_attrs[S.CLAIM_ATTR] == "deciding"


def test_a_peer_that_finished_is_read_from_the_history(peer_owner):
    study, mine, peer = _setup(peer_first=False, owner=peer_owner[1])
    _finish_peer(study, peer)
    obj = S._Objective(study, cfg(), scorer=lambda c: pytest.fail("no scorer call here"))
    assert obj._claim(mine, KEY)["time_s"] == REC["time_s"]
    assert S.CLAIM_ATTR not in study.trials[mine.number].user_attrs  # nothing to decide


def test_alone_it_scores_without_publishing_a_decision():
    study = optuna.create_study()
    mine = study.ask()
    study._storage.set_trial_system_attr(mine._trial_id, WORKER_ATTR, worker_id())
    mine.set_user_attr("plan_key", KEY)
    obj = S._Objective(study, cfg(), scorer=lambda c: pytest.fail("no scorer call here"))
    assert obj._claim(mine, KEY) is None
    assert S.CLAIM_ATTR not in study.trials[mine.number].user_attrs


def test_optunas_warnings_about_an_interrupted_trial_are_dropped():
    """Found by a bad-input hunt: Ctrl-C during tune printed Optuna's traceback of the
    trial it stopped (2 of 4 runs); the CLI's one ``interrupted:`` line is what remains.
    Other failed trials keep their warnings."""
    import logging
    import sys

    f = S._InterruptedTrialFilter()

    def rec(msg, exc=None):
        info = None
        if exc is not None:
            try:
                raise exc
            except BaseException:
                info = sys.exc_info()
        return logging.LogRecord("optuna.study._optimize", logging.WARNING, __file__, 1, msg, None, info)

    assert not f.filter(rec("Trial 25 failed with parameters: {} because of the following error: "
                            "KeyboardInterrupt().", KeyboardInterrupt()))
    assert not f.filter(rec("Trial 25 failed with value None."))
    assert f.filter(rec("Trial 26 failed with parameters: {} because of the following error: "
                        "ZeroDivisionError().", ZeroDivisionError()))
    assert f.filter(rec("Trial 26 failed with value None."))
