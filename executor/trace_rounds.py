"""Which recorded rounds of an executor trace a calibration fits, and the host time of a
recorded step that no op span holds (issue 19).

``executor.profile`` records ``PAIRED_STEPS`` rounds, each one step whose plan ops run
inside named spans (``meshplan-step <i>`` around the whole step). One round is one draw
of a shared host's noise: per-op CPU time moves by +-30% from step to step on a 2-core
VM, so a fit to one round (the round of median time) re-predicted the step within 10%
in only 9 of 12 trials even when that round's time matched the measured median. The
fit pools the middle third of the rounds by time instead (:func:`middle_rounds`): a
trimmed mean of the rounds around the median, whose fitted rates move far less from
trial to trial than one round's.

A recorded step also holds host work outside every top-level span: the executor's
schedule loop between actions and between the optimizer's ops (3 to 4% of a step of the
2-layer test plan, measured; the 1/m gradient scaling and the expert-copy average, which
the cost model charges on their own, run inside spans of their own,
``executor.profile.GRAD_SCALE_LABEL``). Part of it follows the gradient all_reduce, in
the optimizer's segment, and is folded before it all the same (the segments'
comparison of replicas in ``trace_match.slowest_segments`` shifts by that much). The cost model charges serial host work per pipeline
action pass (``Roofline.action_overhead``, fitted as the mean ``action`` sample of
``trace_match.match_trace``), so :func:`fold_step_gap` spreads the step's uncovered
time (:func:`step_gap`) over the step's action samples: the per-pass host time the
executor spends, inside its unit calls and between them. Only for one-stage plans
(``meshplan calibrate --from-trace``): with a pipeline the uncovered time also holds the wait for the
sends to the next stage, which the simulated schedule charges already."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from executor.calibrate_ops import OpSample
from executor.errors import ExecutorError

#: the share of the rounds, by time around the median, whose samples a fit pools
POOLED_SHARE = 1 / 3


def slowest_per_round(metas: list[dict], *keys: str) -> list[list[float]]:
    """Per metadata series ``keys`` (``executor.profile``: ``span_steps_s``,
    ``paired_cpu_s`` ...), the slowest rank's value of each round (seconds), over the rounds
    every rank recorded in every one of them ([] each when a rank has none): the step
    time a round of several ranks takes, as ``executor.run.gathered_measurement`` counts
    it."""
    runs = [[m.get(k) or [] for m in metas] for k in keys]
    n = min((len(r) for per_key in runs for r in per_key), default=0)
    return [[max(float(r[i]) for r in per_key) for i in range(n)] for per_key in runs]


def round_times(metas: list[dict]) -> list[float]:
    """Per recorded round, the slowest rank's step time (seconds; ``span_steps_s`` of each
    rank's metadata, ``executor.profile``), over the rounds every rank recorded."""
    return slowest_per_round(metas, "span_steps_s")[0]


def middle_rounds(metas: list[dict], share: float = POOLED_SHARE) -> list[int]:
    """Indices (ascending) of the recorded rounds a fit pools: the ``ceil(share * n)``
    rounds (at least one; an even count made odd by one more round where there is one,
    so the median round sits at its centre) whose time (:func:`round_times`) ranks around the median,
    ties broken by round index. [] when a rank recorded no round. Raises ValueError for a
    share outside (0, 1]."""
    if not 0 < share <= 1:
        raise ExecutorError(f"the pooled share of rounds must be in (0, 1], got {share}")
    times = round_times(metas)
    n = len(times)
    if n == 0:
        return []
    k = max(1, math.ceil(share * n - 1e-9))  # 1e-9: 1/3 * 9 is 3.0000000000000004
    if k % 2 == 0:
        k = min(n, k + 1)
    order = sorted(range(n), key=lambda i: (times[i], i))
    lo = (n - 1) // 2 - (k - 1) // 2
    lo = max(0, min(lo, n - k))
    return sorted(order[lo:lo + k])


def _covered(events: list[dict]) -> tuple[float, int]:
    """(microseconds of the union of the spans ``events``, the number of disjoint runs of
    overlapping spans in it): spans that nest or partly overlap count once."""
    covered, runs = 0.0, 0
    start = end = float("-inf")
    for e in sorted(events, key=lambda e: e["ts"]):
        if e["ts"] > end:
            covered += max(0.0, end - start) if runs else 0.0
            start, end, runs = e["ts"], e["ts"] + e["dur"], runs + 1
        else:
            end = max(end, e["ts"] + e["dur"])
    return covered + (max(0.0, end - start) if runs else 0.0), runs


def step_gap(step: dict, inner: list[dict], eps: float = 0.0) -> float:
    """Seconds of the recorded step ``step`` (a complete event, ``dur`` in us) outside
    the spans ``inner`` (the events it encloses; other step spans among them, a
    duplicate's, are left out): the step's duration less the union of theirs, less
    ``eps`` (the recorder's cost per span, seconds) per disjoint run of spans; never
    below 0."""
    from executor.profile import STEP_PREFIX

    covered, runs = _covered([e for e in inner if not str(e.get("name", "")).startswith(STEP_PREFIX)])
    return max(0.0, (step["dur"] - covered) * 1e-6 - eps * runs)


def fold_step_gap(samples: list[OpSample], gap: float) -> list[OpSample]:
    """``samples`` of one rank's recorded step with ``gap`` seconds (:func:`step_gap`)
    spread evenly over its ``action`` samples (module docstring); unchanged when it has
    none (the gap then stays out of the fit). Raises ValueError for a negative gap."""
    if gap < 0:
        raise ExecutorError(f"a step's uncovered host time cannot be negative, got {gap} s")
    n = sum(s.kind == "action" for s in samples)
    if n == 0 or gap == 0:
        return list(samples)
    return [dataclasses.replace(s, seconds=s.seconds + gap / n) if s.kind == "action" else s for s in samples]


def step_span(events: list[dict], i: int) -> dict[str, Any] | None:
    """The span ``meshplan-step <i>`` of ``events`` (``executor.profile.step_label``), or
    None."""
    from executor.profile import step_label

    name = step_label(i)
    return next((e for e in events if e.get("name") == name), None)


__all__ = ["POOLED_SHARE", "fold_step_gap", "middle_rounds", "round_times", "slowest_per_round", "step_gap",
           "step_span"]
