"""MoE parallel folding: how the expert layers map onto the ranks of a pipeline stage, apart
from the attention (``Strategy.ep``, ``Strategy.etp``).

Megatron-Core lays the ranks of the dense layers out as ``tp-cp-ep-dp-pp`` with ep = 1
(rank = (d * cp + c) * tp + t) and those of the expert layers as the same order with cp = 1
and their own sizes: expert tensor parallel ``etp`` innermost, then ``ep``, then the expert
data parallel ``edp`` (rank = (ed * ep + e) * etp + e_t), over the same ranks, so tp x cp x dp
= etp x ep x edp (Megatron-Core's "MoE parallel folding"; NVIDIA/Megatron-LM d98e8a64 ``megatron/core/parallel_state.py`` ``initialize_model_parallel``: the expert
``RankGenerator(tp=expert_tensor_parallel_size, ep=expert_model_parallel_size,
dp=world_size // (etp * ep * pp), cp=1)``, ``expert_tensor_parallel_size`` defaulting to
tp). So ep may exceed dp and cover context- and tensor-parallel ranks.

Modelled: etp = tp (each expert split over the tensor-parallel ranks as a dense MLP; an ep
group is ep consecutive ranks of the folded data-parallel dim dp x cp, ep | dp * cp) and
etp = 1 (whole experts; an ep group covers ep / tp whole tensor-parallel groups, tp | ep:
the expert index is e = t + tp * e_hi, with t the tensor-parallel rank and e_hi the ep
group's index of the folded data-parallel rank). Other etp (1 < etp < tp) are refused: the
program's 2-D stage mesh [dp x cp, tp] holds no third dim for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from completion.errors import CompletionError


@dataclass(frozen=True)
class ExpertLayout:
    """The expert layers' degrees on one stage of ``ranks`` = dp * cp * tp ranks.

    Attributes:
        ep, etp, edp: expert-parallel, expert-tensor-parallel and expert-data-parallel
            degrees (ep * etp * edp = ranks).
        tp, folded_dp: the dense layers' tensor-parallel degree and dp * cp.
        group_dp: folded data-parallel ranks one ep group spans, ep * etp / tp (ep when etp
            = tp, ep / tp when etp = 1).
        group_tp: tensor-parallel ranks of one ep group that hold different experts, tp /
            etp (1 when etp = tp).
    """

    ep: int
    etp: int
    edp: int
    tp: int
    folded_dp: int

    @property
    def group_dp(self) -> int:
        return self.ep * self.etp // self.tp

    @property
    def group_tp(self) -> int:
        return self.tp // self.etp

    @property
    def folded(self) -> bool:
        """Whether the experts spread over tensor-parallel ranks too (etp < tp)."""
        return self.etp < self.tp


def layout_problem(dp: int, cp: int, tp: int, ep: int, etp: int | None) -> str | None:
    """Why (ep, etp) cannot fold onto dp x cp x tp (module docstring), naming the strategy
    field; None when it can. ``etp`` None is tp (Megatron-Core's default)."""
    etp = tp if etp is None else etp
    if isinstance(etp, bool) or not isinstance(etp, int) or etp < 1:
        return f"strategy field 'etp' must be an integer >= 1 or null (tp), got {etp!r}"
    if etp not in (1, tp):
        return (f"strategy field 'etp' = {etp} with tp = {tp}: modelled are etp = tp (each expert "
                "split as a dense MLP) and etp = 1 (whole experts)")
    if ep == 1:
        return None if etp == tp else "strategy field 'etp' = 1 needs ep > 1 (experts to spread)"
    if etp == tp:
        ranks = f"dp = {dp}" if cp == 1 else f"dp x cp = {dp * cp}"
        if (dp * cp) % ep:
            more = (" (or give etp = 1: whole experts, ep a multiple of tp over dp x cp x tp ranks)"
                    if tp > 1 else "")
            return (f"strategy field 'ep' = {ep} must divide {ranks} (experts split over ep of the "
                    f"data-parallel ranks when etp = tp){more}")
        return None
    if ep % tp or (dp * cp * tp) % ep:
        return (f"strategy field 'ep' = {ep} with 'etp' = 1 must be a multiple of tp = {tp} that "
                f"divides dp x cp x tp = {dp * cp * tp} (an ep group covers whole tensor-parallel "
                "groups: etp x ep x edp = tp x cp x dp)")
    return None


def expert_layout(dp: int, cp: int, tp: int, ep: int, etp: int | None) -> ExpertLayout:
    """The :class:`ExpertLayout` of a strategy's degrees. Raises ValueError with
    :func:`layout_problem`'s message when they do not fold."""
    why = layout_problem(dp, cp, tp, ep, etp)
    if why is not None:
        raise CompletionError(why)
    etp = tp if etp is None else etp
    return ExpertLayout(ep=ep, etp=etp, edp=dp * cp * tp // (ep * etp), tp=tp, folded_dp=dp * cp)


def layout_of(strategy: object) -> ExpertLayout:
    """:func:`expert_layout` of a Strategy-like object (``dp``, ``cp``, ``tp``, ``ep``,
    ``etp``; ``cp`` and ``etp`` optional)."""
    g = getattr
    return expert_layout(g(strategy, "dp"), g(strategy, "cp", 1) or 1, g(strategy, "tp"),
                         g(strategy, "ep", 1) or 1, g(strategy, "etp", None))
