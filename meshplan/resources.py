"""Host resources a command may take: processes (ranks, workers) bounded by the cores this
process may run on, so that an oversubscribed request is refused with its reason instead
of running for minutes (``calibrate --quick --nproc 64`` on 2 cores gave no answer in
120 s; ``tune --workers 256`` took 110 s for 3 trials)."""

from __future__ import annotations

import os

from meshplan.errors import MeshplanError

#: processes always allowed, whatever the core count (the commands' defaults: 2 ranks)
MIN_PROCESSES = 2


class ResourceError(MeshplanError):
    """A request for more processes than this host can run; names the option and the limit."""


def host_cores() -> int:
    """CPU cores this process may run on (its affinity mask; the CPU count where there is
    none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def process_limit() -> int:
    """The most processes a command starts on this host: its cores, at least
    :data:`MIN_PROCESSES`."""
    return max(MIN_PROCESSES, host_cores())


def check_processes(flag: str, n: int, what: str, why: str) -> None:
    """Refuse ``n`` processes (``what``: what each one is; ``why``: what oversubscribing
    would cost) beyond :func:`process_limit`: ResourceError naming ``flag``, ``n`` and the
    core count."""
    limit = process_limit()
    if n > limit:
        cores = host_cores()
        raise ResourceError(f"{flag} {n}: this host has {cores} core(s); {n} {what} would run "
                            f"{n / cores:.0f} to a core ({why}): give at most {limit}")
