"""Collective timings for calibration: runs on every rank under ``executor.launch``.

For each group size n in 2..nproc (ranks 0..n-1) and each kind, rank 0 times
``iters * reps`` calls per buffer size S (the nccl-tests buffer, see
``clusters.collectives``), each after the same short compute on every rank (as in a
step), and keeps their mean (what a step accumulates); ``send_recv`` is a one-way transfer
from rank 0 to rank 1 (``batch_isend_irecv`` as the executor's pipeline p2p) timed by
the receiver. Every operation is the executor's own (:mod:`executor.collectives`). Returns ``{"kind/n": [(S, seconds), ...]}`` on
rank 0, None elsewhere.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from executor.collectives import Groups, all_gather, all_reduce, all_to_all, p2p, reduce_scatter


def _busy() -> None:
    """Compute between two collectives, as in a training step (a few hundred us)."""
    _BUSY[0] @ _BUSY[1]


_BUSY = (torch.randn(512, 256), torch.randn(256, 256))


def _bench(fn, iters: int, reps: int, group) -> float:
    """Mean seconds of ``fn`` when each call follows the same compute on every rank, as
    the executor's collectives follow kernels: arriving from compute costs a wake-up
    and the peers' skew, which back-to-back loops hide (on a loaded 2-core host a
    256 KB all_reduce took 0.6 ms back-to-back and 1.5-2.2 ms after compute)."""
    fn()
    dist.barrier(group=group)
    times = []
    for _ in range(iters * reps):
        _busy()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.fmean(times)


def _ops(n: int, pg, rank: int, s: int):
    """kind -> zero-argument callable moving an S-byte (nccl-tests) buffer."""
    numel = max(n, (s // 4) // n * n)
    x = torch.ones(numel)
    block = torch.ones(numel // n)
    return {
        "all_reduce": lambda: all_reduce(x, pg, n),
        "reduce_scatter": lambda: reduce_scatter(x, 0, rank, n, pg),
        "all_gather": lambda: all_gather(block, 0, n, pg, numel),
        "all_to_all": lambda: all_to_all(x.reshape(1, -1), 0, 1, rank, n, pg, n),
    }, numel * 4


def _one_way(rank: int, s: int):
    """Rank 0 sends S bytes to rank 1 (batched p2p, as the executor's pipeline does)."""
    buf = torch.ones(max(1, s // 4))

    def run():
        for w in p2p([("send" if rank == 0 else "recv", buf, 1 - rank)]):
            w.wait()

    return run, buf.numel() * 4


def collective_worker(rank: int, nproc: int, sizes: list[int], iters: int, reps: int):
    """Per-rank body (see module docstring)."""
    groups = Groups([tuple(range(n)) for n in range(2, nproc + 1)], timeout=120)
    points: dict[str, list[tuple[float, float]]] = {}
    for n in range(2, nproc + 1):
        members = tuple(range(n))
        pg = groups.get(members)
        if rank < n:
            for s in sizes:
                ops, nbytes = _ops(n, pg, rank, s)
                for kind, fn in ops.items():
                    t = _bench(fn, iters, reps, pg)
                    points.setdefault(f"{kind}/{n}", []).append((float(nbytes), t))
        dist.barrier()
    pair = groups.get((0, 1))
    for s in sizes:
        if rank < 2:
            fn, nbytes = _one_way(rank, s)
            t = _bench(fn, iters, reps, pair)
            if rank == 1:  # the receiver's time: what a pipeline stage waits
                points.setdefault("send_recv/2", []).append((float(nbytes), t))
        dist.barrier()
    if nproc > 1:  # rank 1 measured send_recv: hand it to rank 0
        box = [points.get("send_recv/2")]
        dist.broadcast_object_list(box, src=1)
        points["send_recv/2"] = box[0]
    return points if rank == 0 else None


def link_estimates(kind: str, n: int, alpha: float, beta: float) -> tuple[float, float]:
    """(step latency a, bandwidth B) implied by a fit ``t = alpha + beta S`` of ``kind`` on
    ``n`` ranks under the single-node model of ``clusters.collectives`` (ring all_reduce:
    alpha = 2(n-1) a, beta = 2(n-1)/(n B); ring reduce_scatter / all_gather and all_to_all:
    alpha = (n-1) a, beta = (n-1)/(n B); send_recv: alpha = a, beta = 1/B)."""
    if kind == "send_recv":
        steps, share = 1.0, 1.0
    elif kind == "all_reduce":
        steps, share = 2.0 * (n - 1), 2.0 * (n - 1) / n
    else:
        steps, share = float(n - 1), (n - 1) / n
    bw = share / beta if beta > 0 else float("inf")
    return max(alpha, 0.0) / steps, bw
