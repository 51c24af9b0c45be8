"""Run a plan's ranks under torchrun (one process per rank, any number of nodes).

torchrun (``torch.distributed.run``) starts the processes and sets the ``env://``
rendezvous variables ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` (the host and port of global rank 0's node). :func:`init_from_env` reads
them and joins the default process group (gloo on CPUs, NCCL with one GPU per local rank);
:func:`start_watchdog` starts :class:`executor.watchdog.Watchdog` on a ``TCPStore`` that
rank 0 hosts on a free port of ``MASTER_ADDR`` (the port is broadcast over the process
group), so a dead or hung rank is named across nodes; :func:`run_rank` runs this rank's
row of the schedule (``executor.run``'s per-rank code, the same as the local launcher's)
and gathers every rank's result on rank 0, which builds the same
:class:`~executor.run.Measurement` as ``executor.run_plan``.

The caller (``meshplan.executor.run``, the torchrun entry point) builds the schedule and
the prediction on rank 0 and shares them with :func:`share` (the executor never imports
the simulator).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from executor.launch import BACKENDS, LaunchError
from executor.run import STEP_TIMEOUT, gathered_measurement, rank_main
from executor.watchdog import Watchdog

#: the variables torchrun sets for the env:// rendezvous
ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class RankEnv:
    """This process's place in the run (from torchrun's environment)."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    backend: str


def read_env(environ: Any = None) -> dict[str, str]:
    """The :data:`ENV_VARS` of ``environ`` (default ``os.environ``). Raises LaunchError
    naming the missing or non-integer ones (the process was not started by torchrun)."""
    env = os.environ if environ is None else environ
    missing = [k for k in ENV_VARS if not env.get(k)]
    if missing:
        raise LaunchError(f"environment variable(s) {missing} not set: start this under torchrun "
                          f"(torchrun --nnodes N --nproc-per-node G -m meshplan.executor.run PLAN.json)")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        if not env[k].isdigit():
            raise LaunchError(f"environment variable {k} must be a non-negative integer, got {env[k]!r}")
    return {k: env[k] for k in ENV_VARS}


def default_backend() -> str:
    """nccl when this process sees a GPU, else gloo."""
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "gloo"


def init_from_env(backend: str | None = None, timeout: float = STEP_TIMEOUT) -> RankEnv:
    """Join the default process group with the ``env://`` rendezvous (``timeout``: seconds
    a collective may wait). ``backend`` None: :func:`default_backend`. Raises LaunchError
    for a missing variable, an unknown backend or NCCL without a GPU for LOCAL_RANK."""
    env = read_env()
    backend = backend or default_backend()
    if backend not in BACKENDS:
        raise LaunchError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    local = int(env["LOCAL_RANK"])
    if backend == "nccl":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if local >= n:
            raise LaunchError(f"backend nccl: LOCAL_RANK {local} needs GPU {local}, this node has {n}")
        torch.cuda.set_device(local)
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout))
    return RankEnv(int(env["RANK"]), int(env["WORLD_SIZE"]), local, env["MASTER_ADDR"],
                   int(env["MASTER_PORT"]), backend)


def share(obj: Any, env: RankEnv) -> Any:
    """Rank 0's ``obj`` on every rank (``broadcast_object_list``)."""
    box = [obj if env.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def start_watchdog(env: RankEnv, on_verdict: Any, interval: float, dead_after: float,
                   hang_after: float, progress_dir: str | None = None) -> Watchdog:
    """A started :class:`Watchdog` on a TCPStore hosted by rank 0 on a free port of
    ``MASTER_ADDR`` (rank 0 binds port 0 and broadcasts the port it got); arguments as
    the Watchdog's."""
    store = None
    if env.rank == 0:
        store = dist.TCPStore(env.master_addr, 0, env.world_size, is_master=True,
                              timeout=timedelta(seconds=dead_after), wait_for_workers=False)
    port = share(store.port if store is not None else None, env)
    if store is None:
        store = dist.TCPStore(env.master_addr, port, env.world_size, is_master=False,
                              timeout=timedelta(seconds=dead_after))
    dog = Watchdog(store, env.rank, env.world_size, on_verdict, interval, dead_after, hang_after,
                   progress_dir)
    return dog.start()


def run_rank(env: RankEnv, plan: Any, rows: Any, steps: int, warmup: int = 0, seed: int = 0,
             params: bool = False, adam_epsilon: float | None = None,
             watchdog: Watchdog | None = None, profile_dir: str | None = None) -> Any:
    """Run this rank's part of ``plan`` (``rows``: the schedule's per-stage actions, see
    ``executor.run.plan_rows``) for ``warmup + steps`` steps; every rank's result is
    gathered on rank 0, which returns the :class:`~executor.run.Measurement` (others return
    None). ``watchdog`` gets the progress; ``profile_dir``: each rank also records a
    trace of a few extra (unreported) steps there (``executor.profile``). Raises what the
    per-rank code raises."""
    progress = watchdog.progress if watchdog is not None else None
    res = rank_main(env.rank, env.world_size, plan, steps, warmup, seed, False, params,
                     adam_epsilon, rows, progress, profile_dir)
    if watchdog is not None:
        watchdog.state = "gathering"
    gathered: list[Any] | None = [None] * env.world_size if env.rank == 0 else None
    dist.gather_object(res, gathered, dst=0)
    if env.rank != 0:
        return None
    return gathered_measurement(gathered, env.world_size, env.backend, steps, params)
