"""Launch ``nproc`` ranks with torch.multiprocessing and torch.distributed (gloo on CPU,
NCCL on GPU), collect each rank's return value, and never hang.

Failure handling: every rank runs under a wrapper that records its exception; the parent
polls the processes and, as soon as one exits with an error, terminates the others and
raises :class:`RankFailure` carrying that rank's number and message. A run that exceeds
``timeout`` seconds in total (e.g. a collective whose peer never arrives) is terminated
the same way and raises :class:`LaunchTimeout`. Collectives also carry the process-group
timeout (``collective_timeout``), so a rank blocked on a dead peer raises by itself.
Every rank also beats (a thread touches a file every :data:`BEAT_S` s): a rank the kernel
shows stopped (SIGSTOP) for :data:`STOPPED_AFTER` s, or whose beats stop for
:data:`SILENT_AFTER` s, is named at once, as the torchrun watchdog (``executor.watchdog``)
names it under torchrun, instead of the peer that times out waiting for it.

All ranks run on this host (``torch.multiprocessing`` with a TCP rendezvous on
127.0.0.1). A multi-node launcher (torchrun's environment rendezvous) is not implemented
yet: the per-rank code would be the same, only the rendezvous differs.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from executor.errors import ExecutorError
from executor.watchdog import DEAD_AFTER

BACKENDS = ("gloo", "nccl")


class LaunchError(ExecutorError, ValueError):
    """Bad launch arguments (world size, backend) detected before any rank starts."""


class RankFailure(ExecutorError, RuntimeError):
    """A rank raised; ``rank`` and ``message`` name it, ``traceback`` has its trace."""

    def __init__(self, rank: int, message: str, tb: str = "") -> None:
        super().__init__(f"rank {rank} failed: {message}")
        self.rank, self.message, self.traceback = rank, message, tb


class LaunchTimeout(ExecutorError, RuntimeError):
    """The ranks did not finish within the launch timeout; all were terminated."""



def _death(code: int | None) -> str:
    """Why a rank process ended with ``code``: a negative code is the signal that killed it;
    SIGKILL (-9) is most often the kernel's out-of-memory killer."""
    if code == -9:
        return "killed by SIGKILL: most often the kernel's out-of-memory killer (see dmesg); a " \
               "longer sequence or larger micro-batch than this machine holds"
    return "killed or crashed"

def free_port() -> int:
    """An unused TCP port on 127.0.0.1 for the rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: Most local ranks one launch starts (one process each on this machine): a plan that
#: needs more is a cluster's, not a laptop's; the limit keeps a typo from forking
#: thousands of processes.
MAX_LOCAL_RANKS = 64


def check_launch(nproc: int, backend: str) -> None:
    """Raise LaunchError for a bad world size (not in 1..:data:`MAX_LOCAL_RANKS`) or backend
    (NCCL needs nproc GPUs)."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise LaunchError(f"nproc must be a positive integer, got {nproc!r}")
    if nproc > MAX_LOCAL_RANKS:
        raise LaunchError(f"nproc {nproc} is above the limit of {MAX_LOCAL_RANKS} local ranks "
                          f"(executor.launch.MAX_LOCAL_RANKS)")
    if backend not in BACKENDS:
        raise LaunchError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    if backend == "nccl":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n < nproc:
            raise LaunchError(f"backend nccl needs {nproc} GPUs, this machine has {n}")


def _write(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(obj))
    os.replace(tmp, path)  # atomic: the parent never reads half a file


def _beat(path: Path) -> None:
    """Touch ``path`` every :data:`BEAT_S` seconds (a daemon thread of each rank): the
    parent names a rank whose beats stop (:func:`_silent_rank`)."""
    while True:
        try:
            path.write_bytes(b"")
            os.utime(path)
        except OSError:
            return
        time.sleep(BEAT_S)


def _worker(rank: int, fn: Callable[..., Any], nproc: int, backend: str, port: int,
            collective_timeout: float, outdir: str, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
    out = Path(outdir)
    threading.Thread(target=_beat, args=(out / f"beat_{rank}",), daemon=True,
                     name="meshplan-beat").start()
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=nproc,
                                timeout=timedelta(seconds=collective_timeout))
        result = fn(rank, nproc, *args)
        dist.barrier()  # every rank's sends have been received before anyone leaves
        _write(out / f"result_{rank}.pkl", result)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, then re-raised
        msg = f"{type(e).__name__}: {e}"
        _write(out / f"error_{rank}.pkl", (time.time(), msg, traceback.format_exc()))
        _exit(1)  # do not wait in destroy_process_group on peers that may be stuck
    # process-group teardown can abort in C++ destructors (gloo threads) after the work is
    # done; the result is written, so leave without running them
    _exit(0)


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _first_error(outdir: Path) -> tuple[int, str, str] | None:
    errs = []
    for f in outdir.glob("error_*.pkl"):
        t, msg, tb = pickle.loads(f.read_bytes())
        errs.append((t, int(f.stem.split("_")[1]), msg, tb))
    if not errs:
        return None
    _, rank, msg, tb = min(errs)
    return rank, msg, tb


#: seconds between a rank's beats (:func:`_beat`)
BEAT_S = 0.5
#: a rank whose beats stop this long is named (executor.watchdog's DEAD_AFTER)
SILENT_AFTER = DEAD_AFTER
#: a rank the kernel shows stopped (SIGSTOP, SIGTSTP: state T) this long is named at once
STOPPED_AFTER = 2.0


def _proc_state(pid: int | None) -> str:
    """The kernel's one-letter state of ``pid`` (``/proc/PID/stat``: R, S, D, T, t, Z ...);
    "" where unknown (not Linux, gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _silent_rank(ctx: Any, outdir: Path, since: dict[int, float]) -> tuple[int, str] | None:
    """The first live rank that is stopped by a signal (state T / t for
    :data:`STOPPED_AFTER` s) or whose beats, once started, stopped :data:`SILENT_AFTER` s
    ago, with why; None when every live rank beats. ``since``: rank -> when it was first
    seen stopped."""
    now = time.time()
    for r, p in enumerate(ctx.processes):
        if not p.is_alive():
            continue
        if _proc_state(p.pid) in ("T", "t"):
            first = since.setdefault(r, now)
            if now - first >= STOPPED_AFTER:
                return r, (f"stopped by a signal for {now - first:.0f} s (SIGSTOP or SIGTSTP: "
                           f"process state T; `kill -CONT {p.pid}` resumes it)")
            continue
        since.pop(r, None)
        try:
            last = (outdir / f"beat_{r}").stat().st_mtime
        except OSError:
            continue  # not beating yet (a spawned rank imports torch first: seconds on a busy host)
        if now - last > SILENT_AFTER:
            return r, f"stopped reporting for {now - last:.0f} s (frozen, or its node lost)"
    return None


def _stop(ctx: Any, grace: float = 3.0) -> None:
    for p in ctx.processes:
        if p.is_alive():
            p.terminate()
    deadline = time.time() + grace
    for p in ctx.processes:
        p.join(max(0.0, deadline - time.time()))
        if p.is_alive():
            p.kill()
            p.join(1.0)


def launch(fn: Callable[..., Any], nproc: int, args: tuple = (), backend: str = "gloo",
           timeout: float = 300.0, collective_timeout: float = 60.0) -> list[Any]:
    """Run ``fn(rank, nproc, *args)`` on ``nproc`` spawned ranks; return their results in
    rank order (each must be picklable).

    ``fn`` must be importable (a module-level function). Raises LaunchError before
    starting for a bad nproc/backend, RankFailure when a rank raises (the others are
    terminated), LaunchTimeout after ``timeout`` seconds.
    """
    check_launch(nproc, backend)
    with tempfile.TemporaryDirectory(prefix="meshplan-launch-") as tmp:
        outdir = Path(tmp)
        ctx = mp.start_processes(
            _worker, args=(fn, nproc, backend, free_port(), collective_timeout, tmp, args),
            nprocs=nproc, join=False, start_method="spawn")
        started = time.time()
        deadline = started + timeout
        stopped: dict[int, float] = {}
        try:
            while True:
                err = _first_error(outdir)
                if err is not None:
                    _stop(ctx)
                    raise RankFailure(*err)
                silent = _silent_rank(ctx, outdir, stopped)
                if silent is not None:  # named before its peers time out waiting for it
                    _stop(ctx)
                    raise RankFailure(*silent)
                dead = [r for r, p in enumerate(ctx.processes)
                        if not p.is_alive() and p.exitcode not in (0, None)]
                if dead and _first_error(outdir) is None:
                    _stop(ctx)
                    code = ctx.processes[dead[0]].exitcode
                    raise RankFailure(dead[0], f"exited with code {code} ({_death(code)})")
                if all(not p.is_alive() for p in ctx.processes):
                    break
                if time.time() > deadline:
                    _stop(ctx)
                    raise LaunchTimeout(f"{nproc} ranks did not finish within {timeout:.0f} s; terminated")
                time.sleep(0.05)
        finally:
            _stop(ctx, grace=1.0)
        err = _first_error(outdir)
        if err is not None:
            raise RankFailure(*err)
        results = []
        for r in range(nproc):
            f = outdir / f"result_{r}.pkl"
            if not f.is_file():
                code = ctx.processes[r].exitcode
                raise RankFailure(r, f"exited with code {code} without a result")
            results.append(pickle.loads(f.read_bytes()))
        return results
