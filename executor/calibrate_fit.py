"""Fits that turn calibration timings into the cluster spec's constants.

Model the constants feed (``simulator.roofline``, ``clusters.collectives``): an executed
kernel costs ``o`` (``kernel_overhead_s``) plus

- GEMM of F FLOPs: ``(F + F_half) / P`` (``P`` = ``peak_flops[fp32]`` with ``gemm`` = 1,
  ``F_half`` = ``gemm_half_flops``);
- attention, executed FLOPs F: ``F / (P a)`` (``a`` = ``efficiency.attention``);
- memory-bound, bytes M (operands + results): ``M / (B_copy m)`` (``B_copy`` =
  ``memory_bandwidth``, ``m`` = ``efficiency.memory_kernels``);
- collective of kind k on n ranks, S bytes: ``steps_k(n) a_i + share_k(n) S / B_i``;
- on a GPU (``sm_count`` SMs), GEMM ``(batch, m, n, k)``: ``max(W / (P / sm_count * g),
  M / B_copy)``, ``W`` the wave model's per-SM FLOPs (``waves * 2 tm tn k`` of the best
  tile, :func:`wave_flops`; ``simulator.roofline``'s model, repeated here because the
  executor does not import the simulator) and ``g`` = ``efficiency.gemm``, the plateau
  (:func:`fit_plateau`).

Every fit minimises *relative* squared error (each sample's residual divided by its
measured time), so a 20 us op weighs as much as a 2 ms one.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from clusters.spec import MIN_POSITIVE
from executor.errors import ExecutorError


class FitError(ExecutorError, ValueError):
    """Too few or degenerate samples for a fit; names the quantity."""


def relative_lstsq(columns: Sequence[Sequence[float]], t: Sequence[float], what: str) -> np.ndarray:
    """Least squares of ``t ~ sum_j x_j columns[j]`` minimising sum ((t_i - fit_i) / t_i)^2.
    Raises FitError for fewer samples than unknowns or a non-positive time."""
    a = np.asarray(columns, float).T
    y = np.asarray(t, float)
    if a.shape[0] < a.shape[1] or np.any(y <= 0):
        raise FitError(f"{what}: need >= {a.shape[1]} samples with positive times, got {len(y)}")
    w = 1.0 / y
    x, *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    return x


def fit_overhead(view_seconds: Sequence[float]) -> float:
    """Per-op overhead ``o``: median time of the executor's kernel-less ops (views): its
    interpreter loop plus one torch dispatch."""
    if not view_seconds:
        raise FitError("kernel overhead: no view ops were timed")
    return float(statistics.median(view_seconds))


def fit_gemm(flops: Sequence[float], seconds: Sequence[float], o: float) -> tuple[float, float]:
    """(P FLOP/s, F_half FLOPs) from GEMM samples: ``t - o = F / P + F_half / P``.
    F_half is clamped to >= 1 FLOP (a noisy negative intercept means no small-size penalty).
    When noise swamps the size dependence (the fitted 1/P comes out <= 0), P falls back to
    the fastest observed rate ``max(F / (t - o))`` with F_half = 1. Raises FitError when no
    sample has FLOPs."""
    t = [max(s - o, 1e-9) for s in seconds]
    inv_p, half_over_p = relative_lstsq([list(flops), [1.0] * len(flops)], t, "GEMM rate")
    if inv_p <= 0:
        rates = [f / x for f, x in zip(flops, t, strict=True) if f > 0]
        if not rates:
            raise FitError("GEMM rate: no timed GEMM had any FLOPs")
        return float(max(rates)), 1.0
    return 1.0 / inv_p, max(half_over_p / inv_p, 1.0)


def fit_ratio(amount: Sequence[float], seconds: Sequence[float], o: float, what: str) -> float:
    """Achieved rate ``sum(amount) / sum(t - o)`` (time-weighted: the rate a mix of these
    ops achieves). Raises FitError when nothing was timed."""
    busy = sum(max(s - o, 1e-9) for s in seconds)
    if not amount or busy <= 0 or sum(amount) <= 0:
        raise FitError(f"{what}: no samples")
    return float(sum(amount) / busy)


def fit_by_op(samples: Sequence, o: float, bandwidth: float, rate: float
              ) -> dict[str, tuple[float, int]]:
    """Per ``op:phase`` key, (efficiency, sample count) of memory-bound and attention
    samples (objects with ``kind``, ``op_type``, ``phase``, ``flops``, ``bytes``,
    ``seconds``): ``fit_ratio`` of bytes over ``bandwidth`` (memory) or of executed FLOPs
    over ``rate`` (attention) -- the time-weighted achieved rate of that kernel."""
    groups: dict[str, list] = {}
    for smp in samples:
        groups.setdefault(f"{smp.op_type}:{smp.phase or 'F'}", []).append(smp)
    out = {}
    for key, group in groups.items():
        attention = group[0].kind == "attention"
        amount = [smp.flops if attention else smp.bytes for smp in group]
        try:
            r = fit_ratio(amount, [smp.seconds for smp in group], o, key)
        except FitError:
            continue
        out[key] = (r / (rate if attention else bandwidth), len(group))
    return out


def split_representable(by_op: dict[str, tuple]) -> tuple[dict[str, tuple], list[str]]:
    """``(kept, dropped)`` of a ``fit_by_op`` result (values ``(efficiency, ...)``): an
    efficiency below ``clusters.spec.MIN_POSITIVE`` is an op of a few bytes whose time is
    overhead, not bytes (``full_like`` of a scalar: ~1e-7 of the copy bandwidth); a cluster
    spec cannot hold it (parse_spec refuses it), so it is dropped and the overall
    memory-bound (attention) efficiency applies to that op. ``dropped`` is sorted."""
    kept = {k: v for k, v in by_op.items() if v[0] >= MIN_POSITIVE}
    return kept, sorted(k for k in by_op if k not in kept)


def collective_terms(kind: str, n: int) -> tuple[float, float]:
    """(latency steps, bandwidth share) of ``kind`` on ``n`` ranks of one node in the
    single-node model of ``clusters.collectives`` (ring all_reduce: 2(n-1), 2(n-1)/n;
    reduce_scatter / all_gather / all_to_all: n-1, (n-1)/n; send_recv: 1, 1)."""
    if kind == "send_recv":
        return 1.0, 1.0
    if kind == "all_reduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    return float(n - 1), (n - 1) / n


def fit_links(points: dict[str, list[tuple[float, float]]]) -> tuple[float, float]:
    """(step latency a_i seconds, bandwidth B_i bytes/s): one joint relative least-squares
    fit of every (kind/n, S, t) point to ``steps a + share S / B``.

    When noise swamps the byte term (small messages on a loaded host: the fitted 1/B comes
    out <= 0), B falls back to the fastest byte rate observed, ``max(share S / t)`` (a lower
    bound on the link bandwidth: it charges the whole time to the bytes), and a to the
    median of ``(t - share S / B) / steps`` over the points (>= 0). Raises FitError when no
    point moved any bytes."""
    lat, byt, ts = [], [], []
    for key, pts in points.items():
        kind, n = key.split("/")
        steps, share = collective_terms(kind, int(n))
        for s, t in pts:
            lat.append(steps)
            byt.append(share * s)
            ts.append(t)
    a, inv_b = relative_lstsq([lat, byt], ts, "collective alpha/beta")
    if inv_b <= 0:
        rates = [b / t for b, t in zip(byt, ts, strict=True) if b > 0]
        if not rates:
            raise FitError("collective alpha/beta: no timed collective moved any bytes")
        inv_b = 1.0 / max(rates)
        a = float(np.median([(t - b * inv_b) / k for k, b, t in zip(lat, byt, ts, strict=True)]))
    return max(float(a), 0.0), 1.0 / float(inv_b)


#: Candidate output tiles of the wave model: ``simulator.roofline.GEMM_TILES`` (NVIDIA
#: "Matrix Multiplication Background" user's guide, ch. 2.3), repeated because the
#: executor does not import the simulator; tests/executor/test_gemm_model.py checks they agree.
GEMM_TILES: tuple[tuple[int, int], ...] = (
    (256, 128), (128, 256), (128, 128), (256, 64), (64, 256), (128, 64), (64, 128), (64, 64),
)


def wave_flops(shape: tuple[int, int, int, int], sms: int,
               tiles: Sequence[tuple[int, int]] = GEMM_TILES) -> tuple[float, tuple[int, int], int]:
    """(W, tile, waves) of a ``(batch, m, n, k)`` GEMM on ``sms`` SMs: for each tile
    ``waves = ceil(batch * ceil(m/tm) * ceil(n/tn) / sms)`` and ``W = waves * 2 tm tn k``
    FLOPs on each SM's critical path; the smallest ``W`` wins, ties to the earlier
    (larger) tile (``simulator.roofline.Roofline.gemm_tiling``: compute time = ``W /
    (peak / sm_count * gemm)``). Raises FitError for ``sms`` < 1 or a negative dim."""
    if sms < 1 or min(shape) < 0:
        raise FitError(f"GEMM waves: need sms >= 1 and dims >= 0, got sms={sms}, shape={shape}")
    batch, m, n, k = shape
    best: tuple[float, tuple[int, int], int] | None = None
    for tm, tn in tiles:
        waves = -(-(batch * -(-m // tm) * -(-n // tn)) // sms)
        work = waves * 2.0 * tm * tn * k
        if best is None or work < best[0]:
            best = (work, (tm, tn), waves)
    if best is None:
        raise FitError("GEMM waves: no candidate tiles")
    return best


def fit_plateau(compute_s: Sequence[float], memory_s: Sequence[float],
                seconds: Sequence[float], o: float = 0.0) -> tuple[float, int]:
    """(plateau g, samples used) of GEMM samples whose model time is ``max(C_i / g, M_i)
    + o``: ``C_i`` the compute seconds at g = 1 (wave model), ``M_i`` the memory seconds.
    The samples compute-bound at the current g (``C_i / g >= M_i``; g = 1 first) enter a
    relative least-squares fit of ``t_i - o = C_i x`` (each residual over its time, as
    every fit here), g = 1 / x, repeated until the compute-bound set stops changing (at
    most 20 rounds). Raises FitError when no sample is compute-bound."""
    samples = [(c, mm, max(t - o, 1e-12)) for c, mm, t in zip(compute_s, memory_s, seconds, strict=True)
               if c > 0 and t > 0]
    g, used = 1.0, None
    for _ in range(20):
        rows = [(c, t) for c, mm, t in samples if c / g >= mm]
        if not rows:
            raise FitError("GEMM plateau: no compute-bound GEMM sample")
        if used is not None and len(rows) == used:
            break
        (x,) = relative_lstsq([[c for c, _ in rows]], [t for _, t in rows], "GEMM plateau")
        if x <= 0:
            raise FitError("GEMM plateau: the fit gave a non-positive 1/plateau")
        g, used = 1.0 / float(x), len(rows)
    return g, len(rows)
