"""Who a study worker is: host, pid and process start time, as one token, and whether it
still lives (``tuner.storage`` names trial owners with it, ``tuner.journal`` the holder of
a journal's lock)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any


def proc_start(pid: int) -> str | None:
    """The start time (clock ticks since boot) of ``pid`` from /proc, None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def worker_id() -> dict[str, Any]:
    """This process: host name, pid and process start time."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": proc_start(pid)}


def worker_token(w: dict[str, Any] | None = None) -> str:
    """A worker's identity as one string ``host:pid:start`` (default: this process)."""
    w = worker_id() if w is None else w
    return f"{w.get('host')}:{w.get('pid')}:{w.get('start')}"


def worker_alive(w: dict[str, Any]) -> bool | None:
    """True/False for a worker on this host; None when it ran on another host."""
    if w.get("host") != socket.gethostname():
        return None
    pid = int(w.get("pid", -1))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    start = proc_start(pid)
    return start is None or w.get("start") is None or start == w.get("start")
