"""Expected wall time to train: steps x step time + checkpoint stalls + the expected losses to
interruptions, and the checkpoint interval that minimises it.

The run (:class:`Run`): S steps of T seconds; a checkpoint after every k steps and after the
last one (the final save); each save stalls the loop for delta seconds and, when
asynchronous, is durable w seconds after the stall (``simulator.goodput.checkpoint``).
Unplanned interruptions arrive as a Poisson process of rate lambda (mean time between
them M = 1 / lambda), also during restarts; each costs a restart of R seconds (which a new
interruption starts over) and the work since the last durable checkpoint. Planned ones
(rate nu) each cost a save and a restart, C_p = write + R_p, and lose no work.

Exact expected time (exponential interruptions; Daly 2006, "A higher order estimate of the
optimum checkpoint interval for restart dumps", FGCS 22(3), eq. 5 is the synchronous case):
a piece of L seconds that must run without interruption, retried after each restart,
takes in expectation

    E2(L) = (e^{lambda L} - 1) (1/lambda + G),   G = (e^{lambda R} - 1) / lambda

(G: a restart that interruptions start over). From one durable checkpoint to the next the
first try needs L1 = k T + delta (the previous save's background write already ran w
seconds into it) and every retry L2 = k T + delta + w (it starts from the checkpoint,
before which nothing is pending):

    E1 = (1 - e^{-lambda L1}) / lambda + (1 - e^{-lambda L1}) (G + E2(L2)),

which is E2(L) when L1 = L2 = L (a synchronous save, w = 0). The first piece has no
earlier write running: L1 = L2 = k T + delta + w. The job's unplanned part is the sum over
its ceil(S / k) pieces (the last of S - (n-1) k steps) plus the start (relaunch and NCCL
initialisation once); planned interruptions, nu per second of it, add C_p each:
T = T_u / (1 - nu C_p). When the background write outlasts the next interval (w > k T),
the next save waits for it (Megatron-LM and DCP finish a pending save first): delta grows
by w - k T and w shrinks to k T (approx.: the overlap within that save is not modelled).

Breakdown (:class:`Breakdown`, seconds, each an expectation): compute (S T), checkpoint
(the stalls of the pieces that completed, n delta, and the final write w), restart
(interruptions N = lambda T_u, each starting a restart attempt that lasts
E[min(X, R)] = (1 - e^{-lambda R}) / lambda), startup, planned (T - T_u) and lost (the rest:
work and stalls redone). goodput = compute / total.

Optimal interval (:func:`optimal_interval`): the k that minimises the exact expected time
(searched over whole steps), beside Young's first-order interval sqrt(2 delta M)
(Young 1974, "A first order approximation to the optimum checkpoint interval", CACM 17(9))
and Daly's higher-order one sqrt(2 delta M) [1 + (1/3) sqrt(delta / 2M) + delta / 18M] -
delta for delta < 2M, else M (Daly 2006, eq. 37).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from simulator.errors import SimulatorError


@dataclass(frozen=True)
class Run:
    """A training run (seconds, events per second): ``steps`` of ``step_s``; a save stalls
    ``stall_s`` and is durable ``background_s`` later (0: synchronous); ``write_s`` a whole
    synchronous write (what a planned interruption saves with); unplanned interruptions at
    ``rate``, each a restart of ``restart_s``; planned ones at ``planned_rate``, each a
    restart of ``planned_restart_s`` after a save; ``startup_s`` once at the start."""

    steps: int
    step_s: float
    stall_s: float
    background_s: float = 0.0
    rate: float = 0.0
    restart_s: float = 0.0
    planned_rate: float = 0.0
    planned_restart_s: float = 0.0
    write_s: float = 0.0
    startup_s: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise SimulatorError(f"a run's steps must be a whole number >= 1, got {self.steps!r}")
        vals = {"step_s": self.step_s, "stall_s": self.stall_s, "background_s": self.background_s,
                "rate": self.rate, "restart_s": self.restart_s, "planned_rate": self.planned_rate,
                "planned_restart_s": self.planned_restart_s, "write_s": self.write_s,
                "startup_s": self.startup_s}
        bad = {k: v for k, v in vals.items() if not (isinstance(v, int | float) and 0 <= v < math.inf)}
        if bad or self.step_s <= 0:
            k, v = next(iter(bad.items())) if bad else ("step_s", self.step_s)
            raise SimulatorError(f"a run's {k} must be a finite number >= 0 (step_s > 0), got {v!r}")

    @property
    def mtbf_s(self) -> float:
        """Mean seconds between unplanned interruptions (inf without any)."""
        return 1.0 / self.rate if self.rate > 0 else math.inf


@dataclass(frozen=True)
class Breakdown:
    """Expected time to train (seconds) and its parts (module docstring); ``interval`` the
    checkpoint interval in steps, ``failures`` the expected unplanned interruptions,
    ``planned`` the expected planned ones."""

    total_s: float
    compute_s: float
    checkpoint_s: float
    restart_s: float
    lost_s: float
    planned_s: float
    startup_s: float
    interval: int
    failures: float
    planned: float

    @property
    def goodput(self) -> float:
        """compute / total: the share of the wall time that trains."""
        return self.compute_s / self.total_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view (seconds; ``goodput`` a fraction)."""
        return {**self.__dict__, "goodput": self.goodput}


def retry_time(length: float, rate: float, restart: float) -> float:
    """E2: expected seconds to run a piece of ``length`` s without interruption, retried
    after each restart of ``restart`` s (module docstring); ``length`` when ``rate`` is 0."""
    if rate <= 0:
        return length
    if rate * max(length, restart) > _EXP_MAX:  # never done in any time a float holds
        return math.inf
    return math.expm1(rate * length) * (1.0 / rate + math.expm1(rate * restart) / rate)


def piece_time(first: float, retry: float, rate: float, restart: float) -> float:
    """E1: a piece whose first try needs ``first`` s and each retry ``retry`` s."""
    if rate <= 0:
        return first
    if rate * restart > _EXP_MAX:
        return math.inf
    p_fail = -math.expm1(-rate * first)
    g = math.expm1(rate * restart) / rate
    return p_fail / rate + p_fail * (g + retry_time(retry, rate, restart))


#: the largest rate x length whose e^x a float holds (e^709 ~ 8e307)
_EXP_MAX = 700.0


def _effective(run: Run, k: int) -> tuple[float, float]:
    """(stall, background) per save at an interval of ``k`` steps: a background write longer
    than the interval makes the next save wait for it (module docstring)."""
    span = k * run.step_s
    over = max(0.0, run.background_s - span)
    return run.stall_s + over, run.background_s - over


def expected_time(run: Run, k: int) -> Breakdown:
    """The expected time to train with a checkpoint every ``k`` steps (module docstring).
    Raises SimulatorError for k < 1, an interval (or restart) so far beyond the mean time
    between interruptions that the job never finishes in a float's range, or a
    planned-interruption load that never lets the job run (nu C_p >= 1)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise SimulatorError(f"checkpoint interval must be a whole number of steps >= 1, got {k!r}")
    b = _expected(run, k)
    if not math.isfinite(b.total_s):
        raise SimulatorError(f"a checkpoint every {b.interval} steps ({b.interval * run.step_s:.3g} s) with "
                             f"restarts of {run.restart_s:.3g} s, interrupted every {run.mtbf_s:.3g} s on "
                             f"average: the run never finishes (save more often)")
    return b


def _expected(run: Run, k: int) -> Breakdown:
    """:func:`expected_time` without the checks (an infinite total when it overflows)."""
    k = min(k, run.steps)
    stall, w = _effective(run, k)
    lam, r, t = run.rate, run.restart_s, run.step_s
    n = -(-run.steps // k)
    last = run.steps - (n - 1) * k
    first = piece_time(k * t + stall + w, k * t + stall + w, lam, r)
    unplanned = run.startup_s + first
    if n > 1:
        unplanned += (n - 2) * piece_time(k * t + stall, k * t + stall + w, lam, r)
        unplanned += piece_time(last * t + stall, last * t + stall + w, lam, r)
    cost_p = run.write_s + run.planned_restart_s
    load = run.planned_rate * cost_p
    if load >= 1:
        raise SimulatorError(f"planned interruptions ({run.planned_rate * 3600:.3g} per hour, "
                             f"{cost_p:.3g} s each) leave no time to train")
    total = unplanned / (1.0 - load)
    if not math.isfinite(total):
        return Breakdown(math.inf, run.steps * t, math.inf, math.inf, math.inf, 0.0, run.startup_s, k,
                         math.inf, 0.0)
    failures = lam * unplanned
    restarts = failures * (-math.expm1(-lam * r) / lam) if lam > 0 else 0.0
    compute = run.steps * t
    ckpt = n * stall + w
    return Breakdown(total_s=total, compute_s=compute, checkpoint_s=ckpt, restart_s=restarts,
                     lost_s=unplanned - run.startup_s - compute - ckpt - restarts,
                     planned_s=total - unplanned, startup_s=run.startup_s, interval=k,
                     failures=failures, planned=run.planned_rate * total)


def young_interval_s(stall_s: float, mtbf_s: float) -> float:
    """Young (1974): the first-order optimum seconds of work between saves,
    ``sqrt(2 delta M)``."""
    return math.sqrt(2.0 * stall_s * mtbf_s)


def daly_interval_s(stall_s: float, mtbf_s: float) -> float:
    """Daly (2006, eq. 37): ``sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + delta / 18M] -
    delta`` for delta < 2M, else M (seconds of work between saves)."""
    if stall_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = stall_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * stall_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - stall_s


def optimal_interval(run: Run) -> int:
    """The checkpoint interval (steps, 1 .. steps) of least expected time: a geometric scan
    of the steps, then every interval between the best one's neighbours (the expected time
    is smooth and unimodal in k but for the whole-step rounding of the last piece)."""
    s = run.steps
    grid = sorted({max(1, min(s, round(1.1 ** i))) for i in range(int(math.log(s) / math.log(1.1)) + 2)})
    times = [_expected(run, k).total_s for k in grid]
    i = min(range(len(grid)), key=times.__getitem__)
    lo, hi = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
    span = range(lo, hi + 1) if hi - lo <= 4000 else range(lo, hi + 1, (hi - lo) // 4000 + 1)
    return min(span, key=lambda k: (_expected(run, k).total_s, k))


def time_to_train(run: Run, interval: int | None = None) -> Breakdown:
    """:func:`expected_time` at ``interval`` steps, or at :func:`optimal_interval` (None)."""
    return expected_time(run, optimal_interval(run) if interval is None else interval)


def without_failures(run: Run) -> Run:
    """The run with no interruption (what the step time alone promises)."""
    return replace(run, rate=0.0, planned_rate=0.0)


__all__ = ["Breakdown", "Run", "daly_interval_s", "expected_time", "optimal_interval",
           "piece_time", "retry_time", "time_to_train", "without_failures", "young_interval_s"]
