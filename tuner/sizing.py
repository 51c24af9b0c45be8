"""Beyond step time: which cluster size, and which plan on it, trains cheapest (issue 18,
item 6).

``meshplan tune --gpus 256-1024 --objective cost`` searches the best plan on each cluster
size of a range (one study per size, :func:`cluster_sizes`) and picks the size whose best
plan minimises the GPU-hours per million training tokens (:func:`gpu_hours_per_mtok`),
among the plans that meet a per-step deadline (``--max-step-time``) and fit in memory (the
search's own constraint: usable memory less the headroom). ``--objective time`` picks the
fastest step instead (usually the largest size).

Cost model: a step of ``T`` seconds on ``G`` GPUs processes ``B x S`` tokens (global
batch x sequence length), so one million tokens cost ``T G / 3600 / (B S / 1e6)``
GPU-hours. This is the usual rental-price proxy (GPU-hours are what clouds bill);
it ignores the time to start a job and any node idle time between steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.errors import TunerError

#: objectives of :func:`choose`: ``time`` / ``cost`` (step time, GPU-hours per million
#: tokens) and the search objectives that name a whole run (``simulator.goodput.objectives``):
#: ``time-to-train`` (expected wall time), ``cost-to-train`` (its dollars), ``p90`` (the
#: sampled 90th percentile step, the search's own score)
OBJECTIVES = ("time", "cost", "time-to-train", "cost-to-train", "p90")
#: the :class:`SizeOutcome` attribute each objective picks the least of
_CHOOSE_BY = {"time": "step_time_s", "p90": "objective_s", "cost": "gpu_hours_per_mtok",
              "time-to-train": "time_to_train_s", "cost-to-train": "cost_usd"}
#: at most this many cluster sizes in one ``--gpus`` range (each is a whole search)
MAX_SIZES = 16


class SizingError(TunerError, ValueError):
    """A bad ``--gpus`` range, ``--objective`` or deadline; names the flag and the value."""


def gpu_hours_per_mtok(step_time_s: float, gpus: int, tokens_per_step: int) -> float:
    """GPU-hours per million tokens of a plan: ``step_time_s * gpus / 3600 /
    (tokens_per_step / 1e6)``.

    Args: step_time_s: seconds per optimizer step (> 0); gpus: GPUs the plan uses (>= 1);
    tokens_per_step: global batch x sequence length (>= 1).
    Raises SizingError for a non-positive or non-finite argument."""
    if not (step_time_s > 0 and math.isfinite(step_time_s)):
        raise SizingError(f"step time must be > 0 seconds, got {step_time_s}")
    if gpus < 1 or tokens_per_step < 1:
        raise SizingError(f"gpus and tokens per step must be >= 1, got {gpus} and {tokens_per_step}")
    return step_time_s * gpus / 3600.0 / (tokens_per_step / 1e6)


def cluster_sizes(spec: str, gpus_per_node: int, max_nodes: int | None = None) -> list[int]:
    """Node counts of a ``--gpus`` value.

    ``spec``: ``"512"`` (one size), ``"256,512,1024"`` (a list) or ``"256-1024"`` (a
    range: ``lo``, ``2 lo``, ``4 lo`` ... up to ``hi``; doubling, as data-parallel and
    pipeline degrees and global batches are powers of two in practice). Every GPU count
    must be a whole number of nodes (``gpus_per_node``), and at most ``max_nodes`` nodes
    when the cluster states a size limit.

    Returns the node counts in increasing order, without repeats. Raises SizingError
    naming ``--gpus`` and the value at fault (not a number, lo > hi, not a multiple of
    the node size, above the cluster, more than :data:`MAX_SIZES` sizes)."""
    text = spec.strip()
    if not text:
        raise SizingError("--gpus is empty; give e.g. 512, 256,512 or 256-1024")
    try:
        bounds = [int(x) for x in text.split("-", 1)] if "-" in text else None
        counts = [int(x) for x in text.split(",")] if bounds is None else []
    except ValueError:
        raise SizingError(f"--gpus {spec!r}: not a GPU count, list (256,512) or range (256-1024)") from None
    if bounds is not None:
        lo, hi = bounds
        if lo < 1 or hi < lo:
            raise SizingError(f"--gpus {spec!r}: the range must be lo-hi with 1 <= lo <= hi")
        g = lo
        while g <= hi:
            counts.append(g)
            g *= 2
    out: list[int] = []
    for g in counts:
        if g < 1 or g % gpus_per_node:
            raise SizingError(f"--gpus {spec!r}: {g} GPUs is not a whole number of "
                              f"{gpus_per_node}-GPU nodes")
        n = g // gpus_per_node
        if max_nodes is not None and n > max_nodes:
            raise SizingError(f"--gpus {spec!r}: {g} GPUs needs {n} nodes, the cluster has {max_nodes}")
        if n not in out:
            out.append(n)
    if len(out) > MAX_SIZES:
        raise SizingError(f"--gpus {spec!r}: {len(out)} sizes, at most {MAX_SIZES} (each is a search)")
    return sorted(out)


@dataclass(frozen=True)
class SizeOutcome:
    """The best plan found on one cluster size.

    Attributes: nodes, gpus; step_time_s and peak_memory_bytes of its best feasible plan
    (None: no feasible plan); tokens_per_step (global batch x sequence); label: a one-line
    description of the plan; study: the study name that searched this size.
    """

    nodes: int
    gpus: int
    step_time_s: float | None
    peak_memory_bytes: float | None
    tokens_per_step: int
    label: str = ""
    study: str = ""
    scored: int | None = None
    """Plans the size's search scored (None: not counted); 0 means every point it drew was
    refused by a legality rule or the scorer, before any memory was known."""
    time_to_train_s: float | None = None
    """The best plan's expected time to train (searches with a run objective; else None)."""
    cost_usd: float | None = None
    """Its dollars (with a price; else None)."""
    objective_s: float | None = None
    """The search's objective per step of the best plan (``time_s`` of its trial: the step,
    the expected wall time per step, or the P90 step)."""
    cluster: str = ""
    """The cluster searched (``tune --cluster A,B``: one outcome per cluster and size)."""
    optimum_at_least_s: float | None = None
    """A proven lower bound on the search's objective per step over every plan of this
    size's space (``tuner.gap.SearchAnswer.optimum_at_least_s``: the step time under the
    default objective; None: unknown)."""
    proven: bool = False
    """The size's best plan is its proven optimum (or, with none, no plan of it fits)."""

    @property
    def _scored_s(self) -> float | None:
        """The figure the search minimised (``objective_s``, else the step)."""
        return self.objective_s if self.objective_s is not None else self.step_time_s

    @property
    def gap(self) -> float | None:
        """``(objective - lower bound) / lower bound`` of the size's answer: at most how
        much worse than the size's optimum its plan is (``tuner.gap.SearchAnswer.gap``; 0
        when proven; None: no plan or no positive bound)."""
        if self.proven and self.step_time_s is not None:
            return 0.0
        low, val = self.optimum_at_least_s, self._scored_s
        if val is None or low is None or low <= 0:
            return None
        return max(0.0, (val - low) / low)

    def bound(self, objective: str) -> float | None:
        """The smallest value of ``objective`` any plan of this size can reach, by its
        lower bound (``cost``: GPU-hours per million tokens; otherwise the search's
        objective per step, seconds); None when unknown, inf when proven that no plan
        fits."""
        low = self._scored_s if self.proven else self.optimum_at_least_s
        if low is None:
            return math.inf if self.proven else None
        if objective != "cost":
            return low
        return low * self.gpus / 3600.0 / (self.tokens_per_step / 1e6)

    @property
    def feasible(self) -> bool:
        """A plan that fits in memory was found."""
        return self.step_time_s is not None

    @property
    def gpu_hours_per_mtok(self) -> float | None:
        """:func:`gpu_hours_per_mtok` of the best plan (None without one)."""
        if self.step_time_s is None:
            return None
        return gpu_hours_per_mtok(self.step_time_s, self.gpus, self.tokens_per_step)

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second of the whole cluster (None without a plan)."""
        return None if self.step_time_s is None else self.tokens_per_step / self.step_time_s


def qualifying(outcomes: Sequence[SizeOutcome], max_step_time: float | None = None,
               deadline_s: float | None = None) -> list[SizeOutcome]:
    """The feasible outcomes whose step meets ``max_step_time`` and whose expected time to
    train meets ``deadline_s`` (seconds; None: no limit; an outcome without a time to train
    meets no deadline). Raises SizingError for a non-positive limit."""
    for flag, v in (("--max-step-time", max_step_time), ("--deadline", deadline_s)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise SizingError(f"{flag} must be > 0 seconds, got {v}")
    return [o for o in outcomes if o.step_time_s is not None
            and (max_step_time is None or o.step_time_s <= max_step_time)
            and (deadline_s is None or (o.time_to_train_s is not None and o.time_to_train_s <= deadline_s))]


def choose(outcomes: Sequence[SizeOutcome], objective: str = "cost",
           max_step_time: float | None = None, deadline_s: float | None = None) -> SizeOutcome | None:
    """The size to use: among the :func:`qualifying` outcomes, the least of the objective's
    figure (:data:`_CHOOSE_BY`: GPU-hours per million tokens for ``cost``, the step for
    ``time`` and ``p90``, the expected time to train, its dollars); ties go to fewer GPUs.
    None when no size qualifies (or none has the figure). Raises SizingError for an unknown
    objective or a non-positive limit."""
    if objective not in OBJECTIVES:
        raise SizingError(f"--objective {objective!r}: choose one of {', '.join(OBJECTIVES)}")
    attr = _CHOOSE_BY[objective]
    ok = [o for o in qualifying(outcomes, max_step_time, deadline_s) if getattr(o, attr) is not None]
    if not ok:
        return None
    return min(ok, key=lambda o: (getattr(o, attr), o.gpus))


def choice_proven(chosen: SizeOutcome, outcomes: Sequence[SizeOutcome], objective: str,
                  max_step_time: float | None = None) -> tuple[bool, list[str]]:
    """Whether no other size can beat ``chosen`` on ``objective``: (True, []) when every
    other size's lower bound (:meth:`SizeOutcome.bound`) is at least the chosen value,
    else (False, the sizes that might, each with its bound or ``no bound``). A size whose
    step bound misses ``max_step_time`` cannot qualify (known for the step objectives
    ``time`` and ``cost`` only). ``chosen`` itself must be proven. Under a run objective
    (``time-to-train``, ``cost-to-train``, ``p90``) the compared figure is the search's
    objective per step: every size runs the same steps, so it orders the sizes as the run's
    total does."""
    value = chosen.gpu_hours_per_mtok if objective == "cost" else chosen._scored_s
    open_: list[str] = []
    for o in outcomes:
        if o is chosen:
            continue
        low = o.bound(objective)
        step_low = o.bound("time") if objective in ("time", "cost") else None
        if step_low is not None and max_step_time is not None and step_low > max_step_time:
            continue
        if low is None:
            open_.append(f"{o.cluster + ' ' if o.cluster else ''}{o.gpus} GPUs (no bound)")
        elif value is not None and low < value:
            unit = "GPU-h per million tokens" if objective == "cost" else "s"
            open_.append(f"{o.cluster + ' ' if o.cluster else ''}{o.gpus} GPUs (could reach {low:.4g} {unit})")
    proven = chosen.proven and not open_
    return proven, ([] if proven or open_ else [f"{chosen.gpus} GPUs itself is not proven"]) + open_


def why_none(outcomes: Sequence[SizeOutcome], max_step_time: float | None,
             deadline_s: float | None = None) -> str:
    """Why :func:`choose` found nothing: no size scored any plan (every point refused by a
    legality rule or the scorer), no size had a plan that fits, the shortest time to train
    misses ``deadline_s`` or the fastest feasible step ``max_step_time`` (by how much)."""
    feas = [o for o in outcomes if o.step_time_s is not None]
    if not feas:
        if outcomes and all(o.scored == 0 for o in outcomes):
            return ("no size has a plan to score: legality rules or the scorer refused every point "
                    "drawn (each size's report names the rules; loosen --fix or the search space)")
        return "no size has a plan that fits in memory"
    timed = [o for o in feas if o.time_to_train_s is not None
             and (max_step_time is None or o.step_time_s <= max_step_time)]
    if deadline_s is not None and timed:
        t = min(timed, key=lambda o: o.time_to_train_s)
        return (f"the shortest expected time to train ({t.time_to_train_s / 86400:.2f} days on {t.gpus} "
                f"GPUs) misses --deadline {deadline_s / 86400:.2f} days")
    best = min(feas, key=lambda o: o.step_time_s)
    return (f"the fastest feasible step ({best.step_time_s:.3f} s on {best.gpus} GPUs) misses "
            f"--max-step-time {max_step_time} s by {best.step_time_s - (max_step_time or 0):.3f} s")
