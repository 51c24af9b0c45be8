"""A search's objective in the scorer (``meshplan tune --objective``): the value of a plan and
the lower bound branch and bound prunes with, from the registry
``simulator.goodput.objectives.OBJECTIVES``.

The scorer config's ``objective`` (absent: ``time``, the step time; a study stored before
the option resumes unchanged) is an ``ObjectiveSettings`` dict. A plan's score ``time_s``
is then the objective in seconds per step (the expected wall time to train over the steps,
or the sampled P90 step time); its metrics keep the simulated ``step_time_s`` and the
objective's own figures (``time_to_train_s``, ``goodput``, ``cost_usd``, ``step_p90_s`` ...).
The bounds of ``meshplan.tuning.make_scorer`` (``bound``, ``cheap_bound``, and a bound's
``layout_time``) give step-time lower bounds; :class:`ObjectiveBound` maps each through the
objective's ``bound`` (nondecreasing in the step time: the derivation is in
``simulator.goodput.objectives``), so a pruned plan still cannot beat the incumbent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simulator.goodput.objectives import ObjectiveSettings, objective_bound, objective_value
from simulator.goodput.plan import Degrees


def objective_of(config: Mapping[str, Any]) -> ObjectiveSettings:
    """The objective of a scorer config (``time`` when it states none)."""
    return ObjectiveSettings.from_dict(config.get("objective"))


def degrees_of(c: Any, devices_per_node: int) -> Degrees:
    """A candidate's degrees for its run: dp with cp folded in, tp, pp."""
    return Degrees(dp=c.dp * getattr(c, "cp", 1), tp=c.tp, pp=c.pp, devices_per_node=devices_per_node)


class ObjectiveBound:
    """``inner``'s bound with its time mapped to the objective's lower bound (module
    docstring); memory bounds pass through. ``layout_time`` exists when ``inner`` has one."""

    def __init__(self, inner: Any, settings: ObjectiveSettings, sections: Any, tokens_per_step: int,
                 devices_per_node: int) -> None:
        self.inner, self.settings, self.sections = inner, settings, sections
        self.tokens_per_step, self.gpn = tokens_per_step, devices_per_node
        if hasattr(inner, "layout_time"):
            self.layout_time = self._layout_time

    def _map(self, c: Any, step_lb: float) -> float:
        if not step_lb > 0:  # no bound (-inf) or a trivial one: still below any objective
            return step_lb
        return objective_bound(self.settings, step_lb, degrees_of(c, self.gpn), self.tokens_per_step,
                               self.sections)

    def __call__(self, c: Any) -> Any:
        b = self.inner(c)
        return type(b)(self._map(c, float(b.time_s)), b.memory_bytes, b.memory_limit_bytes)

    def _layout_time(self, c: Any) -> float:
        return self._map(c, float(self.inner.layout_time(c)))


def objective_score(settings: ObjectiveSettings, engine: Any, sections: Any) -> tuple[float, Any, dict[str, float]]:
    """(seconds per step, the step result, the objective's metrics) of one plan's Engine."""
    model = engine.step_model()
    res = model.run()
    value, metrics = objective_value(settings, model, res, sections)
    return value, res, metrics


__all__ = ["ObjectiveBound", "degrees_of", "objective_of", "objective_score"]
