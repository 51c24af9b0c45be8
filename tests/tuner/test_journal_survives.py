"""The study survives a torn record, a full disk, a refused write, a kill and a stale lock
(issue 43, item 1): no trial lost, none repeated, the study always resumable; bad storage
paths refused before anything is written. The analytic scorer (tests/tuner_analytic.py)
keeps the searches fast."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.tuner.test_tuner_study import Recorder, cfg
from tuner.journal import JournalWriteError, RecordJournalBackend, TornRecordWarning
from tuner.result import TuneResult
from tuner.storage import StorageError, open_storage
from tuner.study import distinct_plans, open_study, optimize

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parents[2]


def _search(d: Path, n: int, **sc):
    c = cfg(sampler="random", **sc)
    study, c = open_study(c, "s", None, d)
    optimize(study, c, Recorder(c), n)
    return study


def _finished(study) -> dict[int, tuple]:
    return {t.number: (t.state.name, t.params, t.values) for t in study.get_trials(deepcopy=False)
            if t.state.is_finished()}


def _check_resumes(d: Path, target: int, **sc) -> None:
    """Resume the study in ``d`` to ``target`` finished trials: every number once, every
    finished trial complete or pruned (none failed but interrupted ones), the target met."""
    study = _search(d, target, **sc)
    trials = study.get_trials(deepcopy=False)
    assert len({t.number for t in trials}) == len(trials)
    fin = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert distinct_plans(study) == target  # distinct plans: a repeat draw is not counted (issue 36)
    assert all(t.user_attrs.get("interrupted") for t in trials if t.state.name == "FAIL")
    # a plan is scored once: the scores of repeats come from the study's cache
    sim = [t.user_attrs["plan_key"] for t in fin if t.state.name == "COMPLETE"
           and not t.user_attrs.get("cached")]
    assert len(sim) == len(set(sim))


def _as_a_worker_that_exits(monkeypatch) -> None:
    """Run the rest of the test (until ``monkeypatch.undo()``) as a worker whose process is
    gone afterwards (a pid that does not exist), as ``meshplan tune`` is once it reported a
    failed write: the trial it left RUNNING is then recovered by the next search."""
    import socket

    import tuner.storage
    import tuner.study
    import tuner.workers

    gone = {"host": socket.gethostname(), "pid": 2**22 + 11, "start": "1"}
    for module in (tuner.workers, tuner.storage, tuner.study):
        monkeypatch.setattr(module, "worker_id", lambda: dict(gone))


def _valid(journal: Path) -> None:
    data = journal.read_bytes()
    assert data.endswith(b"\n")
    assert all(isinstance(json.loads(line), dict) for line in data.splitlines())


def test_a_torn_last_record_is_cut_named_backed_up_and_the_study_resumes(tmp_path):
    """A partial last line (a crash or a full disk mid-write) used to swallow the next
    append ("Expecting ',' delimiter", every later load failing): it is cut, with the file
    and line named and a copy kept, and the study resumes from the records before it."""
    study = _search(tmp_path, 8)
    before = _finished(study)
    journal = tmp_path / "journal.log"
    lines = journal.read_bytes().count(b"\n")
    with journal.open("ab") as f:
        f.write(b'{"op_code":5,"worker_id":"w","trial_id":3,"user_a')
    torn = journal.read_bytes()
    with pytest.warns(TornRecordWarning, match=rf"{journal}: line {lines + 1} is a torn record"):
        study, _ = open_study(cfg(sampler="random"), "s", None, tmp_path)
    assert _finished(study) == before  # nothing lost
    assert (tmp_path / "journal.log.torn-1.bak").read_bytes() == torn
    _valid(journal)
    _check_resumes(tmp_path, 14)


@pytest.mark.parametrize("from_end", [5, 1])
def test_a_merged_line_of_an_older_meshplan_keeps_every_whole_record(tmp_path, from_end):
    """An older meshplan appended onto a torn line: the merged line made every later load
    fail. The whole record after the torn start, and every later line, are kept. As the
    last line (``from_end`` 1) Optuna's reader skipped it in silence (losing its record) and
    failed once the next record followed it (found by the fuzz run)."""
    study = _search(tmp_path, 6)
    journal = tmp_path / "journal.log"
    data = journal.read_bytes().splitlines(keepends=True)
    k = len(data) - from_end
    merged = data[:k] + [b'{"op_code":5,"worker_id":"w","tri' + data[k]] + data[k + 1:]
    journal.write_bytes(b"".join(merged))
    if from_end > 1:
        with pytest.raises(ValueError):  # what Optuna alone makes of it
            optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    with pytest.warns(TornRecordWarning, match=rf"line {k + 1} is a torn record"):
        again, _ = open_study(cfg(sampler="random"), "s", None, tmp_path)
    assert _finished(again) == _finished(study)
    assert journal.read_bytes().startswith(b"".join(data))  # then this worker's own records
    _check_resumes(tmp_path, 10)


@pytest.fixture(scope="module")
def journal_of_a_dead_worker(tmp_path_factory) -> Path:
    """The journal of a 6-trial search run by a process that has exited (so a trial it
    left RUNNING in a cut copy belongs to a dead worker, as after a crash)."""
    d = tmp_path_factory.mktemp("dead")
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from pathlib import Path; "
            f"from tests.tuner.test_journal_survives import _search; _search(Path({str(d)!r}), 6)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return d / "journal.log"


def _reference(tmp: Path, whole: bytes) -> dict[int, tuple]:
    """The finished trials Optuna alone reads from the whole records ``whole``."""
    if not whole:
        return {}
    ref = tmp / "ref.log"
    ref.write_bytes(whole)
    try:
        return _finished(optuna.load_study(study_name="s", storage=optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(ref)))))
    except KeyError:  # cut before the study was created
        return {}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0.0, 1.0))
def test_a_journal_cut_at_any_byte_resumes_without_loss_or_repeat(tmp_path_factory,
                                                                   journal_of_a_dead_worker, cut):
    """A crash can stop a write at any byte: whatever prefix of the journal is left, the
    study opens, keeps every trial whose records are whole, and resumes to its target."""
    d = tmp_path_factory.mktemp("cut")
    data = journal_of_a_dead_worker.read_bytes()
    keep = data[:max(1, int(len(data) * cut))]
    (d / "journal.log").write_bytes(keep)
    expect = _reference(tmp_path_factory.mktemp("ref"), keep[:keep.rfind(b"\n") + 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornRecordWarning)
        study, _ = open_study(cfg(sampler="random"), "s", None, d)
        assert {n: v for n, v in _finished(study).items() if n in expect} == expect
        _check_resumes(d, 9)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EFBIG, errno.EACCES, errno.EDQUOT])
def test_a_failed_write_is_one_error_naming_the_file_and_the_journal_stays_valid(
        tmp_path, monkeypatch, err):
    """A full disk (ENOSPC, or EFBIG past a file-size limit), a quota or a permission error
    in the middle of a record: the part written is taken back, the error is one
    JournalWriteError naming the file (not Optuna's chained OSErrors ending in
    "AssertionError: Should not reach."), and the study resumes."""
    _search(tmp_path, 4)
    journal = tmp_path / "journal.log"
    calls = {"n": 0}
    real = os.write

    def faulty(fd, data):
        calls["n"] += 1
        if calls["n"] >= 6:  # some records in: half a record, then the error
            real(fd, bytes(data[: len(data) // 2]))
            raise OSError(err, os.strerror(err))
        return real(fd, data)

    monkeypatch.setattr(RecordJournalBackend, "write", staticmethod(faulty))
    _as_a_worker_that_exits(monkeypatch)
    c = cfg(sampler="random")
    study, c = open_study(c, "s", None, tmp_path)
    with pytest.raises(JournalWriteError) as e:
        optimize(study, c, Recorder(c), 20)
    msg = str(e.value)
    assert str(journal) in msg and os.strerror(err) in msg and "left as it was" in msg
    assert e.value.__cause__ is None and e.value.__suppress_context__
    _valid(journal)
    monkeypatch.undo()
    _check_resumes(tmp_path, 12)


_FSIZE = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
lim = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (lim, lim))
sys.path.insert(0, {root!r})
from meshplan.cli import main
sys.exit(main(sys.argv[2:]))
"""

TUNE = ["tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
        "--global-batch-size", "32", "--seq-len", "4096", "--layers", "4", "--no-progress",
        "--study", "k"]


@pytest.mark.slow
def test_tune_on_a_full_disk_says_one_line_and_resumes(tmp_path):
    """``meshplan tune`` under a file-size limit (a disk that fills up): one ``error:`` line
    naming the journal, no traceback, the journal valid, and the same command resumes to
    its target without a repeat."""
    out = tmp_path / "run"
    args = [*TUNE, "--output", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    args += ["--sampler", "tpe"]  # trials drawn one by one (the default search may prove at once)
    r = subprocess.run([sys.executable, "-m", "meshplan", *args, "--trials", "3"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    size = (out / "journal.log").stat().st_size
    r = subprocess.run([sys.executable, "-c", _FSIZE.format(root=str(ROOT)), str(size + 4000),
                        *args, "--trials", "12"], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "Should not reach" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and str(out / "journal.log") in errors[0], r.stderr
    _valid(out / "journal.log")
    r = subprocess.run([sys.executable, "-m", "meshplan", *args, "--trials", "12"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    st_ = open_storage(str(out / "journal.log"), None)
    trials = optuna.load_study(study_name="k", storage=st_).get_trials(deepcopy=False)
    study = optuna.load_study(study_name="k", storage=st_)
    assert distinct_plans(study) == 12  # distinct plans (issue 36); repeats served from the cache
    assert len({t.number for t in trials}) == len(trials)
    import pandas as pd

    # one row per trial drawn (an interrupted trial's retry stands for it)
    assert len(pd.read_csv(out / "history.csv")) == sum(t.state.name in ("COMPLETE", "PRUNED") for t in trials)


@pytest.mark.parametrize("path", ["/dev/full", "/dev/zero", "/dev/null"])
def test_a_device_is_refused_as_storage(path):
    """``--storage /dev/full`` grew memory by 650 MB/s until the kernel killed the process."""
    if not os.path.exists(path):
        pytest.skip(f"{path} missing")
    with pytest.raises(StorageError, match="not a regular file"):
        open_storage(path, None)


def test_a_fifo_a_directory_and_a_foreign_file_are_refused_untouched(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(StorageError, match="not a regular file"):
        open_storage(str(fifo), None)
    with pytest.raises(StorageError, match="is a directory"):
        open_storage(str(tmp_path), None)
    other = tmp_path / "notes.txt"
    other.write_text("my notes\n")
    with pytest.raises(StorageError, match="is not an Optuna journal"):
        open_storage(str(other), None)
    assert other.read_text() == "my notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "pipe"]  # no lock left
    (tmp_path / "new.log").unlink(missing_ok=True)
    assert open_storage(str(tmp_path / "new.log"), None) is not None  # a new file is fine
    with pytest.raises(StorageError, match="is empty"):
        open_storage("", None)


def test_a_lock_left_by_a_killed_writer_is_taken_at_once(tmp_path):
    """A writer SIGKILLed while holding the journal's lock made the next run wait ~6.7 s for
    Optuna's stale-lock grace: a lock whose holder is a dead process of this host is taken
    over at once; one naming no holder (an Optuna tool's) still gets the grace period."""
    _search(tmp_path, 2)
    journal = tmp_path / "journal.log"
    dead = subprocess.run([sys.executable, "-c", "import os, socket; print(socket.gethostname(), "
                           "os.getpid())"], capture_output=True, text=True).stdout.split()
    Path(f"{journal}.lock").write_text(f"{dead[0]}:{dead[1]}:None")
    t0 = time.monotonic()
    _search(tmp_path, 4)
    assert time.monotonic() - t0 < 3.0
    assert not Path(f"{journal}.lock").exists()


def test_history_has_one_row_per_plan_after_an_interrupted_trial(tmp_path):
    """A trial a kill interrupted (FAIL, retried once) added a second row for its plan:
    81 rows for 80 trials. Its retry's row is the plan's row."""
    c = cfg(sampler="random")
    study, c = open_study(c, "s", None, tmp_path)
    optimize(study, c, Recorder(c), 5)
    # a trial left RUNNING by a worker that is gone (a pid that does not exist)
    tid = study._storage.create_new_trial(study._study_id)
    import socket

    from tuner.storage import WORKER_ATTR

    study._storage.set_trial_system_attr(tid, WORKER_ATTR, {"host": socket.gethostname(),
                                                            "pid": 2**22 + 7, "start": "1"})
    optimize(study, c, Recorder(c), 8)
    res = TuneResult(study, 64)
    states = [t.state.name for t in study.get_trials(deepcopy=False)]
    assert states.count("FAIL") == 1 and len(states) == 9
    df = res.to_dataframe()
    assert len(df) == 8 and "FAIL" not in set(df.state)


_SEARCH = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from tests.tuner.test_journal_survives import _search
_search(Path(sys.argv[1]), int(sys.argv[2]), sleep_s=0.01)
"""


@pytest.mark.slow
def test_repeated_sigkills_lose_no_trial_and_repeat_none(tmp_path):
    """A search SIGKILLed six times at random moments (inside a trial, between records, in
    the middle of a journal write) keeps every trial finished before each kill as it was,
    resumes each time, and ends with its target met, every trial number once and no plan
    scored twice."""
    import random
    import signal

    rng = random.Random(43)
    code = _SEARCH.format(root=str(ROOT))
    target = 150
    kept: dict[int, tuple] = {}
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(target)],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0 + rng.random() * 1.5)  # past the imports, into the search
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate()
        assert proc.returncode in (-9, 0), err[-2000:]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TornRecordWarning)
            st_ = open_storage(None, tmp_path)
        try:
            now = _finished(optuna.load_study(study_name="s", storage=st_))
        except KeyError:  # killed before it created the study
            now = {}
        assert {n: now[n] for n in kept} == kept  # nothing finished was lost or changed
        kept = now
    _check_resumes(tmp_path, target, sleep_s=0.01)
