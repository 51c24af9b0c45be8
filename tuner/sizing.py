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

#: objectives of :func:`choose`
OBJECTIVES = ("time", "cost")
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
    optimum_at_least_s: float | None = None
    """A proven lower bound on the step time of every plan of this size's space
    (``tuner.gap.SearchAnswer.optimum_at_least_s``; None: unknown)."""
    proven: bool = False
    """The size's best plan is its proven optimum (or, with none, no plan of it fits)."""

    @property
    def gap(self) -> float | None:
        """``(step - lower bound) / lower bound`` of the size's answer: at most how much
        slower than the size's optimum its plan is (``tuner.gap.SearchAnswer.gap``; 0 when
        proven; None: no plan or no positive bound)."""
        if self.proven and self.step_time_s is not None:
            return 0.0
        low = self.optimum_at_least_s
        if self.step_time_s is None or low is None or low <= 0:
            return None
        return max(0.0, (self.step_time_s - low) / low)

    def bound(self, objective: str) -> float | None:
        """The smallest value of ``objective`` any plan of this size can reach, by its
        lower bound (``cost``: GPU-hours per million tokens; ``time``: seconds); None when
        unknown, inf when proven that no plan fits."""
        low = self.step_time_s if self.proven else self.optimum_at_least_s
        if low is None:
            return math.inf if self.proven else None
        if objective == "time":
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


def choose(outcomes: Sequence[SizeOutcome], objective: str = "cost",
           max_step_time: float | None = None) -> SizeOutcome | None:
    """The size to use: among feasible outcomes whose step meets ``max_step_time``
    (seconds; None: no deadline), the lowest GPU-hours per million tokens (``cost``) or
    the shortest step (``time``); ties go to fewer GPUs. None when no size qualifies.
    Raises SizingError for an unknown objective or a non-positive deadline."""
    if objective not in OBJECTIVES:
        raise SizingError(f"--objective {objective!r}: choose one of {', '.join(OBJECTIVES)}")
    if max_step_time is not None and not (max_step_time > 0 and math.isfinite(max_step_time)):
        raise SizingError(f"--max-step-time must be > 0 seconds, got {max_step_time}")
    ok = [o for o in outcomes if o.step_time_s is not None
          and (max_step_time is None or o.step_time_s <= max_step_time)]
    if not ok:
        return None
    if objective == "cost":
        return min(ok, key=lambda o: (o.gpu_hours_per_mtok, o.gpus))
    return min(ok, key=lambda o: (o.step_time_s, o.gpus))


def choice_proven(chosen: SizeOutcome, outcomes: Sequence[SizeOutcome], objective: str,
                  max_step_time: float | None = None) -> tuple[bool, list[str]]:
    """Whether no other size can beat ``chosen`` on ``objective``: (True, []) when every
    other size's lower bound (:meth:`SizeOutcome.bound`) is at least the chosen value,
    else (False, the sizes that might, each with its bound or ``no bound``). A size whose
    bound misses ``max_step_time`` cannot qualify. ``chosen`` itself must be proven."""
    value = chosen.gpu_hours_per_mtok if objective == "cost" else chosen.step_time_s
    open_: list[str] = []
    for o in outcomes:
        if o is chosen:
            continue
        low = o.bound(objective)
        step_low = o.bound("time")
        if step_low is not None and max_step_time is not None and step_low > max_step_time:
            continue
        if low is None:
            open_.append(f"{o.gpus} GPUs (no bound)")
        elif value is not None and low < value:
            unit = "GPU-h per million tokens" if objective == "cost" else "s"
            open_.append(f"{o.gpus} GPUs (could reach {low:.4g} {unit})")
    proven = chosen.proven and not open_
    return proven, ([] if proven or open_ else [f"{chosen.gpus} GPUs itself is not proven"]) + open_


def why_none(outcomes: Sequence[SizeOutcome], max_step_time: float | None) -> str:
    """Why :func:`choose` found nothing: no size scored any plan (every point refused by a
    legality rule or the scorer), no size had a plan that fits, or the fastest feasible
    step misses the deadline (by how much)."""
    feas = [o for o in outcomes if o.step_time_s is not None]
    if not feas:
        if outcomes and all(o.scored == 0 for o in outcomes):
            return ("no size has a plan to score: legality rules or the scorer refused every point "
                    "drawn (each size's report names the rules; loosen --fix or the search space)")
        return "no size has a plan that fits in memory"
    best = min(feas, key=lambda o: o.step_time_s)
    return (f"the fastest feasible step ({best.step_time_s:.3f} s on {best.gpus} GPUs) misses "
            f"--max-step-time {max_step_time} s by {best.step_time_s - (max_step_time or 0):.3f} s")
