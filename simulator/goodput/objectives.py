"""What a plan search minimises (``meshplan tune --objective``), and a lower bound of it for
branch and bound: a registry, ``name -> Objective``.

Every objective is a number of seconds per step, so that one search (one cluster size, one
global batch: every plan runs the same steps on the same GPUs) ranks plans by it and its
reports read as times:

- ``time``: the simulated step time (the default);
- ``time-to-train``: the expected wall time to train the token budget over the steps
  (``simulator.goodput.plan``): step time, checkpoint stalls and interruption losses;
- ``cost-to-train``: the same seconds per step, which on a fixed number of GPUs ranks plans
  as dollars do; its metrics carry the dollars (needs a price), and ``tune --gpus`` compares
  sizes by those;
- ``p90``: the 90th percentile of the step time with sampled stragglers and jitter
  (``simulator.goodput.jitter``).

Lower bounds from the step-time lower bound ``T_lb`` of a plan (``Engine.lower_bound``):
the expected time to train is nondecreasing in the step time, the save stall, the
background write and the restart (every piece's time E1 grows with its lengths and with
R, so does its minimum over the interval), so the run with ``T_lb``, a free checkpoint
(stall, write and restore 0; then a save every step is optimal) and the plan's own
relaunch, NCCL initialisation and replacement wait (functions of its degrees) is a lower
bound of the plan's expected time. ``p90``: the jitter draws are slowdowns, so every
sampled step is at least the deterministic one, itself at least ``T_lb``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from simulator.goodput.goodput import expected_time
from simulator.goodput.jitter import StepShape, percentiles, sample_steps
from simulator.goodput.plan import Degrees, GoodputError, TrainSettings, build_run, plan_run


@dataclass(frozen=True)
class ObjectiveSettings:
    """An objective and its settings (JSON round trip for a study's scorer config): ``name``
    (:data:`OBJECTIVES`), the :class:`simulator.goodput.plan.TrainSettings` fields
    (``tokens`` ... ``price``), and for ``p90`` the jitter ``samples`` and ``seed``."""

    name: str = "time"
    tokens: float | None = None
    mode: str = "auto"
    interval: int | None = None
    spares: int = 0
    price: float | None = None
    samples: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        spec = OBJECTIVES.get(self.name)
        if spec is None:
            raise GoodputError(f"objective {self.name!r}: choose one of {', '.join(OBJECTIVES)}")
        if spec.needs_tokens and self.tokens is None:
            raise GoodputError(f"objective {self.name}: give the tokens to train (--tokens, e.g. 15T)")
        if spec.needs_price and self.price is None:
            raise GoodputError(f"objective {self.name}: give a price per GPU-hour (--price, or --prices FILE)")
        if self.tokens is not None:
            self.train()  # validates tokens, mode, interval, spares, price

    def train(self) -> TrainSettings:
        """The :class:`TrainSettings` of these settings (tokens required)."""
        return TrainSettings(tokens=float(self.tokens or 0), mode=self.mode, interval=self.interval,
                             spares=self.spares, price=self.price)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> ObjectiveSettings:
        """Inverse of :meth:`to_dict` (None: the ``time`` objective)."""
        return cls(**dict(d or {}))


Value = Callable[[ObjectiveSettings, Any, Any, Any], tuple[float, dict[str, float]]]
Bound = Callable[[ObjectiveSettings, float, Degrees, int, Any], float]


@dataclass(frozen=True)
class Objective:
    """A registered objective: ``value(settings, step_model, result, sections) -> (seconds
    per step, metrics)`` and ``bound(settings, step_lb_s, degrees, tokens_per_step,
    sections) -> seconds per step`` no greater than ``value``; ``what`` says what it is."""

    name: str
    what: str
    value: Value
    bound: Bound
    needs_tokens: bool = False
    needs_price: bool = False
    metrics: tuple[str, ...] = field(default=())


def _time_value(s: ObjectiveSettings, model: Any, result: Any, sections: Any) -> tuple[float, dict[str, float]]:
    return float(result.step_time), {}


def _step_bound(s: ObjectiveSettings, lb: float, deg: Degrees, tokens_per_step: int, sections: Any) -> float:
    return lb


def _train_value(s: ObjectiveSettings, model: Any, result: Any, sections: Any) -> tuple[float, dict[str, float]]:
    pr = plan_run(model, result, s.train(), sections)
    b = pr.breakdown
    out = {"step_time_s": float(result.step_time), "time_to_train_s": b.total_s, "goodput": b.goodput,
           "checkpoint_interval": float(b.interval), "checkpoint_stall_s": pr.checkpoint.stall_s}
    if pr.cost_usd is not None:
        out["cost_usd"] = pr.cost_usd
    return b.total_s / pr.steps, out


def _train_bound(s: ObjectiveSettings, lb: float, deg: Degrees, tokens_per_step: int, sections: Any) -> float:
    steps = max(1, -(-int(s.train().tokens) // tokens_per_step))
    run, _, _ = build_run(deg, sections, steps, lb, None, s.spares)
    return expected_time(run, s.interval or 1).total_s / steps


def _p90_value(s: ObjectiveSettings, model: Any, result: Any, sections: Any) -> tuple[float, dict[str, float]]:
    pct = percentiles(sample_steps(StepShape.of(model, result), sections.jitter, s.samples, s.seed))
    return pct["p90"], {"step_time_s": float(result.step_time), **{f"step_{k}_s": v for k, v in pct.items()}}


#: objective name -> :class:`Objective`
OBJECTIVES: dict[str, Objective] = {
    "time": Objective("time", "the simulated step time", _time_value, _step_bound),
    "time-to-train": Objective("time-to-train", "expected wall time to train the tokens, per step",
                               _train_value, _train_bound, needs_tokens=True),
    "cost-to-train": Objective("cost-to-train", "expected wall time to train the tokens, per step "
                               "(dollars in the metrics)", _train_value, _train_bound,
                               needs_tokens=True, needs_price=True),
    "p90": Objective("p90", "90th percentile step time under sampled stragglers and jitter",
                     _p90_value, _step_bound),
}


def objective_value(settings: ObjectiveSettings, model: Any, result: Any,
                    sections: Any) -> tuple[float, dict[str, float]]:
    """(seconds per step, metrics) of a simulated plan under ``settings``."""
    return OBJECTIVES[settings.name].value(settings, model, result, sections)


def objective_bound(settings: ObjectiveSettings, step_lb_s: float, degrees: Degrees,
                    tokens_per_step: int, sections: Any) -> float:
    """A lower bound (seconds per step) of :func:`objective_value` from the step-time lower
    bound (module docstring)."""
    return OBJECTIVES[settings.name].bound(settings, step_lb_s, degrees, tokens_per_step, sections)


__all__ = ["OBJECTIVES", "Objective", "ObjectiveSettings", "objective_bound", "objective_value"]
