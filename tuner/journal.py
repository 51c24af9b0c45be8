"""The study journal file: whole records or none, a torn record repaired, write errors in
one line, a lock a dead writer cannot hold.

Optuna's ``JournalFileBackend`` (optuna 5.0.0, ``optuna/storages/journal/_file.py``) appends
each batch of records with one buffered ``write`` and reads the file back line by line. Three
faults follow from that, and this module closes each:

- **A torn record.** A write cut short (a full disk: ``write`` stores what fits and then
  fails; a crash mid-write) leaves a last line without its newline. Optuna's reader skips
  such a last line, but its next append lands on the same line, and that merged line is
  then a JSON error on every later load ("Expecting ',' delimiter", naming no file): the
  study is lost. :class:`RecordJournalBackend` appends under the lock only after the file
  ends in a newline; a torn tail found there (a writer that died mid-record) is cut off,
  after a copy of the file is kept (:func:`backup`). :func:`repair` does the same for a
  journal found torn when it is opened, and for the merged lines an older meshplan left:
  the whole record that follows a torn prefix is kept, so no trial written after it is lost.
- **A failed write.** An append that fails (``ENOSPC``, ``EFBIG`` past a file-size limit,
  ``EACCES``) is undone (the file is cut back to its size before the append) and raised as
  one :class:`JournalWriteError` naming the file; the journal stays as it was.
  :func:`write_failure` finds that error again when Optuna's trial loop has buried it under
  its own follow-up errors (a trial it cannot mark failed ends in ``AssertionError: Should
  not reach.``).
- **A stale lock.** A writer SIGKILLed while it held Optuna's ``.lock`` file made the next
  process wait out the grace period (about 6.7 s with 5 s of grace and Optuna's back-off).
  :class:`OwnerLock` serialises meshplan's writers with ``flock`` on the journal (the kernel
  drops it when its holder dies) and writes its holder's ``host:pid:start`` into the
  ``.lock`` file that Optuna's own tools honour; a ``.lock`` whose holder is a dead process of
  this host is taken over at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._file import BaseJournalFileLock

from tuner.errors import StorageError
from tuner.workers import worker_alive, worker_token

#: how every Optuna journal record starts (``JournalStorage._write_log`` writes ``op_code``
#: first, ``json.dumps`` with ``separators=(",", ":")``)
RECORD_START = b'{"op_code":'
#: bytes read to tell a journal from another file
HEAD_BYTES = 64
#: seconds between looks at a ``.lock`` file held by another process
POLL_S = 0.01


class JournalError(StorageError):
    """A journal file that cannot be used as a study's storage; the message names it."""


class JournalWriteError(JournalError):
    """An append to the journal failed (full disk, file-size limit, permission); the journal
    was left as it was before the append. The message names the file and the OS error."""


class TornRecordWarning(JournalError, UserWarning):
    """A torn record was cut from a journal (a copy of the file was kept); names the file
    and line. A warning (the study goes on), of the tuner's error family as
    ``completion.models.config.ModelConfigWarning`` is of completion's."""


def check_journal_path(path: Path, label: str) -> None:
    """Refuse, before anything is written, a journal path that is not a regular file (a
    device such as ``/dev/full`` or ``/dev/zero``, a FIFO, a directory) or an existing file
    that is not an Optuna journal (non-empty and not starting with :data:`RECORD_START`).
    A path that does not exist passes (it is created in its folder, which the caller
    checked). Raises :class:`JournalError` naming ``label`` (the option as typed)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise JournalError(f"{label}: cannot read {str(path)!r}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise JournalError(f"{label} is a directory; give a journal file path")
    if not stat.S_ISREG(st.st_mode):
        raise JournalError(f"{label}: {str(path)!r} is not a regular file (a device, FIFO or "
                           f"socket); give a journal file path or a database URL")
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError as e:
        raise JournalError(f"{label}: cannot read {str(path)!r}: {e.strerror or e}") from None
    torn_first = b"\n" not in head and RECORD_START.startswith(head)  # cut inside record 1
    if head and not (head.startswith(RECORD_START) or torn_first):
        raise JournalError(f"{label}: {str(path)!r} exists and is not an Optuna journal (it does "
                           f"not start with an Optuna record); give a new file or a journal")


def backup(path: Path) -> Path:
    """Copy ``path`` to the first free ``<path>.torn-N.bak`` (N = 1, 2, ...); returns it.
    Raises OSError when the copy cannot be written."""
    n = 1
    while (dst := path.with_name(f"{path.name}.torn-{n}.bak")).exists():
        n += 1
    shutil.copyfile(path, dst)
    return dst


def _whole_suffix(line: bytes) -> bytes | None:
    """The whole record at the end of a merged line (``<torn prefix><record>\\n``): the
    longest suffix from a :data:`RECORD_START` that parses as a JSON object; None if none."""
    pos = line.find(RECORD_START, 1)
    while pos != -1:
        try:
            if isinstance(json.loads(line[pos:]), dict):
                return line[pos:]
        except ValueError:
            pass
        pos = line.find(RECORD_START, pos + 1)
    return None


def _scan(data: bytes) -> tuple[int, bytes, int] | None:
    """The first torn line of a journal's bytes: (1-based line number, the bytes to keep in
    place of it and everything after, the offset where it starts); None when every line is a
    whole record. A torn last line is dropped; a merged line keeps its whole record and
    every line after it; any other bad line drops itself and what follows (the records
    before it are kept)."""
    pos, number = 0, 0
    while pos < len(data):
        number += 1
        end = data.find(b"\n", pos)
        if end == -1:  # a torn last record
            return number, b"", pos
        line = data[pos:end + 1]
        try:
            ok = isinstance(json.loads(line), dict)
        except ValueError:
            ok = False
        if not ok:
            rest = _whole_suffix(line)
            return number, (rest + data[end + 1:]) if rest is not None else b"", pos
        pos = end + 1
    return None


def repair(path: Path, lock: BaseJournalFileLock) -> bool:
    """Cut every torn record out of the journal at ``path`` under ``lock`` (see
    :func:`_scan`), keeping a copy of the torn file first (:func:`backup`) and warning once
    per torn line with :class:`TornRecordWarning` (file, line, what was kept, the backup).
    Returns True when the file changed. Raises :class:`JournalWriteError` naming the file
    when the copy or the rewrite cannot be written (the journal is then left as it was)."""
    lock.acquire()
    try:
        data = original = path.read_bytes()
        changed, saved = False, None
        while (torn := _scan(data)) is not None:
            number, rest, start = torn
            if saved is None:
                try:
                    saved = backup(path)
                except OSError as e:
                    raise JournalWriteError(
                        f"journal {str(path)!r}: line {number} is a torn record and no copy of "
                        f"the file could be written before repairing it ({e.strerror or e}); "
                        f"free space and run again") from None
            kept = "the whole record after its torn start and every later line" if rest \
                else f"the {number - 1} records before it"
            warnings.warn(f"journal {path}: line {number} is a torn record (a write cut short "
                          f"by a crash or a full disk): kept {kept}; the torn file is saved "
                          f"as {saved}", TornRecordWarning, stacklevel=2)
            data = data[:start] + rest
            changed = True
        if changed:
            _rewrite(path, data, original)
        return changed
    finally:
        lock.release()


def _rewrite(path: Path, data: bytes, original: bytes) -> None:
    """Replace the file's bytes ``original`` by ``data``: cut in place when ``data`` is a
    prefix of it (a torn tail: the file keeps its inode, so the lock other writers hold on
    it stays theirs), else a temporary file renamed over it (whole or not at all). Raises
    JournalWriteError naming the file."""
    if original.startswith(data):
        try:
            with open(path, "r+b") as f:
                f.truncate(len(data))
                os.fsync(f.fileno())
            return
        except OSError as e:
            raise JournalWriteError(f"journal {str(path)!r}: cannot cut its torn tail: "
                                    f"{e.strerror or e}") from None
    tmp = path.with_name(f".{path.name}.repair")
    try:
        tmp.write_bytes(data)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise JournalWriteError(f"journal {str(path)!r}: cannot rewrite it after a torn record: "
                                f"{e.strerror or e}") from None


#: bytes read back from a journal's end to find its last line (a record is a few KiB)
TAIL_BYTES = 1 << 20


def whole_tail(fd: int) -> bool:
    """True when the journal open at ``fd`` is empty or ends with a whole record: a newline
    after a line that parses as a JSON object. A torn last record has no newline; a record
    an older meshplan appended onto a torn one has one but does not parse (Optuna's reader
    skips such a last line in silence, and fails on it once another record follows). A
    last line longer than :data:`TAIL_BYTES` counts as whole."""
    size = os.fstat(fd).st_size
    if size == 0:
        return True
    tail = os.pread(fd, min(size, TAIL_BYTES), max(0, size - TAIL_BYTES))
    if not tail.endswith(b"\n"):
        return False
    start = tail.rfind(b"\n", 0, len(tail) - 1)
    if start < 0 and size > TAIL_BYTES:
        return True
    try:
        return isinstance(json.loads(tail[start + 1:]), dict)
    except ValueError:
        return False


def _write_all(fd: int, data: bytes, write: Callable[[int, bytes], int]) -> None:
    """``write`` until all of ``data`` is written (a short write continues where it ended)."""
    view = memoryview(data)
    while view:
        n = write(fd, view)
        view = view[n:]


class RecordJournalBackend(JournalFileBackend):
    """Optuna's journal file backend whose appends are whole records or nothing.

    ``append_logs`` runs under ``lock``: it cuts a torn tail a dead writer left
    (:func:`whole_tail`; a copy of the file kept, :class:`TornRecordWarning`), writes the records, fsyncs, and on any
    OSError cuts the file back to its size before the append and raises
    :class:`JournalWriteError` naming the file (the first such error is kept in
    :attr:`failure`). Reads are Optuna's."""

    #: the OS write call (a test injects faults here)
    write: Callable[[int, bytes], int] = staticmethod(os.write)

    def __init__(self, file_path: str, lock_obj: BaseJournalFileLock) -> None:
        super().__init__(file_path, lock_obj)
        self.failure: JournalWriteError | None = None

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        """Append ``logs`` as one record per line (see the class docstring)."""
        data = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode()
        path = Path(self._file_path)
        try:
            self._lock.acquire()
        except OSError as e:
            raise self._failed(f"cannot take its lock {e.filename or ''}: {e.strerror or e}") from None
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
        except OSError as e:
            self._lock.release()
            raise self._failed(f"cannot open it for writing: {e.strerror or e}") from None
        try:
            size = os.fstat(fd).st_size
            if not whole_tail(fd):  # a writer died mid-record (or an older meshplan merged one)
                os.close(fd)
                fd = -1
                repair(path, _Held())
                fd = os.open(path, os.O_RDWR | os.O_APPEND)
                size = os.fstat(fd).st_size
            try:
                _write_all(fd, data, type(self).write)
                os.fsync(fd)
            except OSError as e:
                os.ftruncate(fd, size)
                raise self._failed(f"cannot append a record: {e.strerror or e} (errno "
                                   f"{e.errno}); the journal is left as it was") from None
        finally:
            if fd >= 0:
                os.close(fd)
            self._lock.release()

    def _failed(self, what: str) -> JournalWriteError:
        """A JournalWriteError naming the file, remembered in :attr:`failure`."""
        err = JournalWriteError(f"journal {self._file_path!r}: {what}")
        self.failure = self.failure or err
        return err


class _Held(BaseJournalFileLock):
    """A lock already held by the caller (repair from inside an append)."""

    def acquire(self) -> bool:
        """Nothing to take: the caller holds the lock."""
        return True

    def release(self) -> None:
        """Nothing to give back."""


def _holder_dead(text: str) -> bool:
    """True when ``text`` (a ``.lock`` file's ``host:pid:start``) names a process of this
    host that is gone; False for another host, a live process, or no token (an Optuna
    tool's lock: its grace period applies)."""
    host, _, rest = text.partition(":")
    pid, _, start = rest.partition(":")
    if not host or not pid.isdigit():
        return False
    return worker_alive({"host": host, "pid": int(pid), "start": start or None}) is False


class OwnerLock(BaseJournalFileLock):
    """The journal's write lock: ``flock`` on the journal file (meshplan's writers; the
    kernel releases it when the holder dies), then Optuna's ``.lock`` file (what Optuna's
    own tools take: ``JournalFileOpenLock`` / ``JournalFileSymlinkLock`` create it
    exclusively), created whole with the holder's ``host:pid:start``. A ``.lock`` whose
    holder is a dead process of this host is removed at once; any other is removed once
    unchanged for ``grace_period`` seconds (Optuna's rule). Only the ``flock`` holder
    removes a ``.lock``, so two meshplan waiters never both take it."""

    def __init__(self, filepath: str, grace_period: float) -> None:
        self._target = filepath
        self._lock_file = filepath + ".lock"
        self.grace_period = grace_period
        self._fd = -1

    def acquire(self) -> bool:
        """Take the ``flock``, then the ``.lock`` file. Raises OSError when either cannot be
        taken (a folder this user cannot write)."""
        fd = os.open(self._target, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._take_lock_file()
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def _take_lock_file(self) -> None:
        tmp = f"{self._lock_file}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(worker_token())
        try:
            mtime, since = None, time.monotonic()
            while True:
                try:
                    os.link(tmp, self._lock_file)  # created with its token, or not at all
                    return
                except FileExistsError:
                    pass
                try:
                    st = os.stat(self._lock_file)
                    holder = Path(self._lock_file).read_text(errors="replace")
                except FileNotFoundError:
                    continue
                if st.st_mtime != mtime:
                    mtime, since = st.st_mtime, time.monotonic()
                if _holder_dead(holder) or time.monotonic() - since > self.grace_period:
                    Path(self._lock_file).unlink(missing_ok=True)
                    continue
                time.sleep(POLL_S)
        finally:
            os.unlink(tmp)

    def release(self) -> None:
        """Remove the ``.lock`` file and drop the ``flock``."""
        try:
            os.unlink(self._lock_file)
        except FileNotFoundError:
            pass
        finally:
            if self._fd >= 0:
                fd, self._fd = self._fd, -1
                os.close(fd)


def write_failure(storage: Any) -> JournalWriteError | None:
    """The first :class:`JournalWriteError` the journal backend of ``storage`` raised, or
    None (also for a storage that is not a journal)."""
    backend = getattr(storage, "_backend", None)
    return getattr(backend, "failure", None)


__all__ = ["JournalError", "JournalWriteError", "OwnerLock", "RecordJournalBackend",
           "TornRecordWarning", "backup", "check_journal_path", "repair", "write_failure"]
