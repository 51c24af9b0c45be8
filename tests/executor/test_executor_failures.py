"""Launch failure handling: a raising rank ends the run with its message, a hung run ends
at the launch timeout, bad world sizes are refused before any rank starts."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from executor.launch import LaunchError, LaunchTimeout, RankFailure, launch


def _rank1_raises(rank: int, nproc: int) -> int:
    if rank == 1:
        raise ValueError("boom from rank 1")
    t = torch.ones(3)
    dist.all_reduce(t)  # rank 0 waits here for a peer that never comes
    return rank


def _rank0_hangs(rank: int, nproc: int) -> int:
    if rank == 0:
        time.sleep(120)
    return rank


def _rank1_sigkilled(rank: int, nproc: int) -> int:
    import os
    import signal

    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer ends a rank
    time.sleep(30)
    return rank


def _ok(rank: int, nproc: int) -> int:
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return int(t.item())


@pytest.mark.distributed
def test_raising_rank_ends_run_with_its_message_within_timeout():
    t0 = time.monotonic()
    with pytest.raises(RankFailure, match="rank 1 failed: ValueError: boom from rank 1") as ei:
        launch(_rank1_raises, 2, timeout=60, collective_timeout=60)
    assert time.monotonic() - t0 < 30
    assert ei.value.rank == 1 and "boom from rank 1" in ei.value.traceback


@pytest.mark.distributed
def test_a_sigkilled_rank_is_named_as_a_likely_oom_kill():
    """A hunt: validate of a plan too big for the host ended "exited with code -9 (killed or
    crashed)"; SIGKILL is named, with the out-of-memory killer as its usual sender."""
    with pytest.raises(RankFailure, match="rank 1 failed: exited with code -9 .*out-of-memory killer"):
        launch(_rank1_sigkilled, 2, timeout=60, collective_timeout=60)


@pytest.mark.distributed
def test_hung_rank_is_terminated_at_the_launch_timeout():
    t0 = time.monotonic()
    with pytest.raises(LaunchTimeout, match="did not finish within 6 s"):
        launch(_rank0_hangs, 2, timeout=6)
    assert time.monotonic() - t0 < 20


@pytest.mark.parametrize("nproc, backend, msg", [
    (0, "gloo", "nproc must be a positive integer"),
    (2, "mpi", "backend must be one of"),
])
def test_bad_launch_refused_before_start(nproc, backend, msg):
    with pytest.raises(LaunchError, match=msg):
        launch(_ok, nproc, backend=backend)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_nccl_without_gpus_refused():
    with pytest.raises(LaunchError, match="backend nccl needs 2 GPUs"):
        launch(_ok, 2, backend="nccl")
