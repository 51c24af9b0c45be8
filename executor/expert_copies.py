"""Running a plan whose ep groups span fewer data-parallel ranks than dp (``completion
.expert_layout``: ep < dp with etp = tp, ep / tp < dp with etp = 1): edp expert-data-parallel
copies of one ep group's program (the text below says ep for the ep group's data-parallel
ranks and tp for its tensor-parallel ones).

``completion.plan_program.build_plan_program`` builds such a plan as the program of one
ep group (``expert_group_strategy``: dp = ep, ranks 0 .. ep*tp - 1, ``PlanProgram.replicas``
= E = dp / ep copies). World rank ``w = d * tp + t`` (one stage: pp = 1) with dp rank
``d = g * ep + e`` runs that program as program rank ``q = e * tp + t`` of copy ``g``
(Megatron-Core's expert rank order ``tp-ep-dp``: ep groups are consecutive dp ranks,
``simulator.expert_parallel``). Its collectives run on the program's groups shifted to copy
``g``'s ranks (:class:`CopyGroups`); its data are copy ``g``'s rows of each global
micro-batch (rows ``g * mbs * ep`` .. of the ``mbs * dp`` a micro-batch has, the rows dp
ranks ``g*ep .. g*ep + ep - 1`` take); before the optimizer every gradient the update reads
is averaged over the copy group (the E ranks with the same ``q``): the dense gradients end
averaged over dp, the expert ones over the expert-data-parallel group -- Megatron-Core
reduces expert gradients over ``intra_expt_dp_group`` with the factor edp / dp
(``megatron/core/distributed/distributed_data_parallel.py`` at d98e8a64) -- so every copy
applies the one-process update. Per-micro-batch losses are averaged over the copies the
same way. Pipeline parallelism with ep < dp is refused (:func:`copies_of`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from completion.expert_layout import layout_of
from executor.errors import ExecutorError


class ExpertCopyError(ExecutorError, ValueError):
    """A plan with ep < dp the executor cannot run as copies (names the field)."""


@dataclass(frozen=True)
class ExpertCopies:
    """The copy layout of a plan with ``count`` = dp / ep copies of a program on ``size``
    = ep * tp ranks; ``copy`` is this rank's copy index."""

    size: int
    count: int
    copy: int

    def world_rank(self, q: int, copy: int | None = None) -> int:
        """World rank of program rank ``q`` in copy ``copy`` (default: this rank's)."""
        return (self.copy if copy is None else copy) * self.size + q

    def program_rank(self, world: int) -> int:
        """Program rank that world rank ``world`` runs."""
        return world % self.size

    def world_groups(self, groups: Iterable[Sequence[int]]) -> list[tuple[int, ...]]:
        """Every world group any rank uses: each program group in every copy, and the copy
        groups (one per program rank) -- the same list on every rank."""
        out = {tuple(self.world_rank(r, g) for r in grp) for grp in groups for g in range(self.count)}
        out.update(self.copy_group(q) for q in range(self.size))
        return sorted(out)

    def copy_group(self, q: int) -> tuple[int, ...]:
        """World ranks running program rank ``q`` (one per copy)."""
        return tuple(self.world_rank(q, g) for g in range(self.count))


class CopyGroups:
    """The process groups of one copy: ``get(program ranks)`` returns the world group of
    those ranks in this rank's copy (``executor.collectives.Groups`` underneath)."""

    def __init__(self, groups: Any, copies: ExpertCopies) -> None:
        self.inner, self.copies = groups, copies

    def get(self, ranks: Sequence[int]) -> Any:
        """The process group of program ranks ``ranks`` in this copy."""
        return self.inner.get([self.copies.world_rank(int(r)) for r in ranks])

    def __getattr__(self, name: str) -> Any:  # timeout and anything else of Groups
        return getattr(self.inner, name)


def copies_of(plan_program: Any, rank: int) -> ExpertCopies | None:
    """The copy layout of world rank ``rank`` for a ``PlanProgram`` with ``replicas`` > 1,
    None otherwise. Raises ExpertCopyError for pp > 1 (its stages would need the copies'
    point-to-point peers too)."""
    n = int(getattr(plan_program, "replicas", 1) or 1)
    if n <= 1:
        return None
    s = plan_program.strategy
    if s.pp > 1:
        raise ExpertCopyError(f"strategy field 'ep' = {s.ep} below dp = {s.dp} with 'pp' = {s.pp}: "
                              "the executor runs expert-data-parallel copies on one pipeline stage "
                              "only; use pp 1 or ep = dp")
    size = layout_of(s).group_dp * s.tp  # ep * tp when etp = tp
    return ExpertCopies(size=size, count=n, copy=rank // size)
