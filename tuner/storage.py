"""Study storage and recovery of trials a killed worker left behind.

Storage choice (documented decision): the default is Optuna's ``JournalStorage`` with a
``JournalFileBackend`` — one append-only log ``<study dir>/journal.log``, safe for several
local processes (file lock), no server, and readable by Optuna's own tools:
``optuna trials --storage <study dir>/journal.log --study-name NAME`` and
``optuna-dashboard <study dir>/journal.log``. Any SQLAlchemy URL (``sqlite:///...``,
``postgresql://user@host/db``; the latter needs the ``meshplan[postgres]`` extra,
psycopg 3, SQLAlchemy 2's default PostgreSQL driver) selects Optuna's ``RDBStorage`` with heartbeats, for workers on many machines.

Recovery: every trial records the worker that runs it (host, pid, process start time),
written in the same storage operation that creates the trial (:class:`OwnedTrials`), so
no moment exists at which a RUNNING trial has no owner -- a worker SIGKILLed between
creating a trial and naming itself used to leave an ownerless RUNNING trial that no resume
recovered and that counted as running forever (the flaky 149-of-150 resume). A worker
that takes an enqueued (WAITING) trial writes a claim first and its name after it wins the
trial. When a worker starts it fails the RUNNING trials whose owner (or, before it named
itself, every claimant) is gone -- a dead pid on this host, or (RDB storage) a heartbeat
older than the grace period -- marking them ``interrupted``, and enqueues each one's
parameters once (``retry_of``) so the point is evaluated again: no trial is lost, none that
finished is repeated.
"""

from __future__ import annotations

import datetime
import os
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import StorageError
from tuner.journal import (
    JournalError,
    JournalWriteError,
    OwnerLock,
    RecordJournalBackend,
    TornRecordWarning,
    check_journal_path,
    repair,
    whole_tail,
)
from tuner.workers import proc_start, worker_alive, worker_id, worker_token  # noqa: F401 (re-exported)

WORKER_ATTR = "meshplan_worker"
HEARTBEAT_S = 10
GRACE_S = 60


#: system attr prefix of a worker's claim on an enqueued trial (before it owns it)
CLAIM_PREFIX = "meshplan_claim:"


class OwnedTrials:
    """Storage mixin: a trial this process creates carries :data:`WORKER_ATTR` from its
    creation (one storage operation, no window for a kill), and taking a WAITING trial
    writes a claim before the state change and :data:`WORKER_ATTR` after it.

    Used as ``class X(OwnedTrials, JournalStorage)``; see the module docstring."""

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        """Create a trial; one made for ``study.ask()`` (no template) is RUNNING and owned."""
        if template_trial is None:
            template_trial = FrozenTrial(
                number=-1, state=TrialState.RUNNING, value=None,
                datetime_start=datetime.datetime.now(), datetime_complete=None, params={},
                distributions={}, user_attrs={}, system_attrs={WORKER_ATTR: worker_id()},
                intermediate_values={}, trial_id=-1)
        return super().create_new_trial(study_id, template_trial)  # type: ignore[misc]

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Any = None) -> bool:
        """Set a trial's state; taking a WAITING trial (state RUNNING) claims it first and
        names the owner once the change succeeded."""
        if state != TrialState.RUNNING:
            return super().set_trial_state_values(trial_id, state, values)  # type: ignore[misc]
        me = worker_id()
        self.set_trial_system_attr(trial_id, CLAIM_PREFIX + worker_token(me), me)  # type: ignore[attr-defined]
        ok = super().set_trial_state_values(trial_id, state, values)  # type: ignore[misc]
        if ok:
            self.set_trial_system_attr(trial_id, WORKER_ATTR, me)  # type: ignore[attr-defined]
        return ok


class OwnedJournalStorage(OwnedTrials, JournalStorage):
    """Optuna's JournalStorage with trial ownership (:class:`OwnedTrials`)."""


class OwnedRDBStorage(OwnedTrials, RDBStorage):
    """Optuna's RDBStorage with trial ownership (:class:`OwnedTrials`)."""


def trial_owners(t: FrozenTrial) -> list[dict[str, Any]]:
    """Who runs RUNNING trial ``t``: its :data:`WORKER_ATTR`, else every claimant of an
    enqueued trial taken before the owner named itself; empty for a trial created by a
    client without :class:`OwnedTrials`."""
    w = t.system_attrs.get(WORKER_ATTR)
    if w is not None:
        return [w]
    return [v for k, v in t.system_attrs.items() if k.startswith(CLAIM_PREFIX)]


#: attempts after a lost race creating the schema (workers starting at once)
SCHEMA_RACE_RETRIES = 5


def open_storage(url: str | None, study_dir: Path | None) -> BaseStorage | None:
    """Resolve ``--storage``: None -> a journal file in ``study_dir`` (created with its
    parents: the caller named it; None when study_dir is None too: in-memory); a path or
    ``journal:PATH`` -> that journal file, in a directory that must exist (nothing is
    created beside a path the caller gave); a SQLAlchemy URL -> RDBStorage with heartbeats.

    A journal path must be a regular file that holds an Optuna journal, or a new file in an
    existing directory (:func:`tuner.journal.check_journal_path`: ``/dev/full``, a FIFO, a
    directory or another file are refused before anything is written); a torn record in it
    is cut out, a copy of the file kept (:func:`tuner.journal.repair`).

    Raises StorageError naming the URL when it is empty, its directory is missing, it is not
    a journal file, its driver is missing or it is malformed."""
    if url is None:
        if study_dir is None:
            return None
        study_dir.mkdir(parents=True, exist_ok=True)
        return _journal(study_dir / "journal.log", f"journal {str(study_dir / 'journal.log')!r}")
    if url.startswith("journal:"):
        url = url[len("journal:"):]
    if "://" not in url:
        parent = Path(url).parent
        if not url.strip():
            raise StorageError("storage '' is empty; give a journal file path or a database URL")
        if not parent.is_dir():
            raise StorageError(f"storage {url!r}: directory {str(parent)!r} does not exist")
        return _journal(Path(url), f"storage {url!r}")
    url = rdb_url(url)
    for attempt in range(SCHEMA_RACE_RETRIES + 1):
        try:
            with warnings.catch_warnings():  # heartbeats are marked experimental by Optuna
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return OwnedRDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
                                       engine_kwargs={"pool_pre_ping": True})
        except ImportError:
            raise StorageError(f"storage {url!r}: its database driver is not installed; "
                               f"install meshplan[postgres] (psycopg 3) for PostgreSQL") from None
        except Exception as e:  # sqlalchemy's ArgumentError / OperationalError / IntegrityError
            # Workers that start together race to create Optuna's tables; the loser gets
            # an IntegrityError ("duplicate key ... pg_type") and simply tries again.
            if type(e).__name__ in ("IntegrityError", "ProgrammingError") and attempt < SCHEMA_RACE_RETRIES:
                time.sleep(0.2 * (attempt + 1))
                continue
            first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
            raise StorageError(f"storage {url!r}: {type(e).__name__}: {first}") from None
    raise AssertionError("unreachable")  # pragma: no cover


#: seconds before a journal ``.lock`` file that names no live meshplan holder (one an
#: Optuna tool left) is taken over; a dead meshplan holder's is taken at once
#: (:class:`tuner.journal.OwnerLock`); a live writer holds it for milliseconds (Optuna's
#: default is 30 s)
LOCK_GRACE_S = 5


def _journal(path: Path, label: str) -> JournalStorage:
    """Optuna's journal storage on the file ``path`` with whole-record appends and torn-record
    repair (:mod:`tuner.journal`), a lock a dead writer does not hold, and trial ownership
    (:class:`OwnedJournalStorage`). Refuses a path that is not a regular file or not a
    journal (:func:`tuner.journal.check_journal_path`, naming ``label``) before writing."""
    check_journal_path(path, label)
    lock = OwnerLock(str(path), LOCK_GRACE_S)
    try:
        backend = RecordJournalBackend(str(path), lock)  # creates an empty file if missing
    except OSError as e:
        raise JournalError(f"{label}: cannot create {str(path)!r}: {e.strerror or e}") from None
    if not _whole_tail(path):
        try:
            repair(path, lock)
        except JournalWriteError as e:  # Optuna reads the records before it; appends retry
            warnings.warn(str(e), TornRecordWarning, stacklevel=2)
    try:
        return OwnedJournalStorage(backend)
    except ValueError:  # a line that is not a record: cut it (a copy kept), then read again
        if not repair(path, lock):
            raise
        return OwnedJournalStorage(RecordJournalBackend(str(path), lock))


def _whole_tail(path: Path) -> bool:
    """:func:`tuner.journal.whole_tail` of the file at ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return whole_tail(fd)
    finally:
        os.close(fd)


#: URL schemes of PostgreSQL without a driver named (``postgres://`` is Heroku's spelling,
#: which SQLAlchemy >= 1.4 rejects)
_PG_SCHEMES = ("postgresql://", "postgres://")


def rdb_url(url: str) -> str:
    """A PostgreSQL URL without a driver (``postgresql://`` or ``postgres://``) with the driver
    named: ``postgresql+psycopg://`` (psycopg 3, the ``meshplan[postgres]`` extra, and
    SQLAlchemy 2.1's default; SQLAlchemy 2.0 would pick psycopg2 for a bare
    ``postgresql://``), or ``postgresql+psycopg2://`` when only psycopg2 is installed. Other
    URLs (a driver named, ``sqlite://``) are returned as they are."""
    import importlib.util

    for scheme in _PG_SCHEMES:
        if url.startswith(scheme):
            only_v2 = (importlib.util.find_spec("psycopg") is None
                       and importlib.util.find_spec("psycopg2") is not None)
            return f"postgresql+{'psycopg2' if only_v2 else 'psycopg'}://" + url[len(scheme):]
    return url


#: Seconds after which a RUNNING trial that names no owner (created by a client without
#: :class:`OwnedTrials`, e.g. a journal of an earlier meshplan) counts as orphaned.
ORPHAN_GRACE_S = 60.0


def recover_interrupted(study: optuna.Study) -> list[int]:
    """Fail trials whose worker is gone (or, naming no owner, that started more than
    :data:`ORPHAN_GRACE_S` ago) and enqueue their parameters once; returns the numbers of
    the trials re-enqueued."""
    storage = study._storage
    if getattr(storage, "heartbeat_interval", None):
        optuna.storages.fail_stale_trials(study)
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get("retry_of") for t in trials}
    out = []
    for t in trials:
        if t.state == TrialState.RUNNING:
            owners = trial_owners(t)
            if not owners:  # written by a client without OwnedTrials (an older meshplan)
                start = t.datetime_start
                if start is None or (datetime.datetime.now() - start).total_seconds() < ORPHAN_GRACE_S:
                    continue
            elif any(worker_alive(w) is not False for w in owners):
                continue
            try:
                storage.set_trial_user_attr(t._trial_id, "interrupted", True)
                storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
        elif not (t.state == TrialState.FAIL and t.number not in retried):
            continue
        if t.number in retried:
            continue
        study.enqueue_trial(t.params, user_attrs={"retry_of": t.number},
                            skip_if_exists=False)
        retried.add(t.number)
        out.append(t.number)
    return out
