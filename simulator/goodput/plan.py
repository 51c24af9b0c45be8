"""Time to train and cost of one simulated plan: its checkpoint, its interruptions, its
restart and the expected wall time for a token budget (``simulator.goodput.checkpoint``,
``.failures``, ``.goodput``), with the cluster's goodput sections
(``clusters.goodput_spec.goodput_sections``) and the framework profile's checkpoint facts
(``ProfileSpec.checkpointing``).

One rule for the settings (:class:`TrainSettings`), shared by ``meshplan cost --tokens``,
the tuner's objectives and the experiments: ``tokens`` to train; the save ``mode``
(``auto``: asynchronous where the framework saves asynchronously, else synchronous; ``sync``;
``async``, refused under a framework that cannot); the checkpoint ``interval`` in steps
(None: the optimal one); ``spares`` (hot spare nodes, billed); ``price`` (dollars per
GPU-hour; None: no cost).

Steps: ``ceil(tokens / tokens_per_step)``. GPUs: dp x tp x pp (cp folded into dp, as the
step model folds it); nodes: ``ceil(GPUs / devices_per_node)``. Communicators initialised at a
(re)start: the world, tp, dp and pp groups. The start pays the relaunch and the NCCL
initialisation once; an unplanned interruption the restart with the restore (and the
replacement wait without a spare); a planned one a synchronous save and the restart.
Cost: ``total hours x (GPUs + spares x devices_per_node) x price``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from simulator.dp_groups import shard_degree
from simulator.errors import SimulatorError
from simulator.goodput.checkpoint import CheckpointCost, Layout, checkpoint_cost, stage_states
from simulator.goodput.failures import FailureModel, RestartCost, nccl_init_s, restart_cost
from simulator.goodput.goodput import (
    Breakdown,
    Run,
    daly_interval_s,
    time_to_train,
    young_interval_s,
)

#: save modes a user may ask for
SAVE_MODES = ("auto", "sync", "async")
#: the most tokens a run may train (1e18: far above any corpus; guards float overflow)
MAX_TOKENS = 1e18


class GoodputError(SimulatorError):
    """Bad time-to-train settings (tokens, save mode, interval, spares, price); names the
    setting and its value."""


@dataclass(frozen=True)
class TrainSettings:
    """What to train and how (module docstring)."""

    tokens: float
    mode: str = "auto"
    interval: int | None = None
    spares: int = 0
    price: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int | float) \
                or not 1 <= self.tokens <= MAX_TOKENS:
            raise GoodputError(f"tokens must be a number in 1 .. {MAX_TOKENS:g}, got {self.tokens!r}")
        if self.mode not in SAVE_MODES:
            raise GoodputError(f"checkpoint mode must be one of {', '.join(SAVE_MODES)}, got {self.mode!r}")
        if self.interval is not None and (isinstance(self.interval, bool) or not isinstance(self.interval, int)
                                          or self.interval < 1):
            raise GoodputError(f"checkpoint interval must be a whole number of steps >= 1, got {self.interval!r}")
        if isinstance(self.spares, bool) or not isinstance(self.spares, int) or self.spares < 0:
            raise GoodputError(f"spares must be a whole number of nodes >= 0, got {self.spares!r}")
        if self.price is not None and (isinstance(self.price, bool) or not isinstance(self.price, int | float)
                                       or not 0 <= self.price < math.inf):
            raise GoodputError(f"price must be a number of dollars per GPU-hour >= 0, got {self.price!r}")


@dataclass(frozen=True)
class Degrees:
    """A plan's degrees for its run: dp (cp folded in), tp, pp, devices per node."""

    dp: int
    tp: int
    pp: int
    devices_per_node: int

    @property
    def gpus(self) -> int:
        """dp * tp * pp."""
        return self.dp * self.tp * self.pp

    @property
    def nodes(self) -> int:
        """Nodes the GPUs occupy."""
        return -(-self.gpus // self.devices_per_node)

    def groups(self) -> tuple[int, ...]:
        """Communicator sizes a rank initialises: world, tp, dp, pp."""
        return (self.gpus, self.tp, self.dp, self.pp)


def save_mode(mode: str, profile: Any) -> str:
    """The save mode of ``mode`` under framework ``profile`` (``auto``: asynchronous where
    it saves asynchronously). Raises GoodputError for ``async`` under a framework that
    saves only synchronously (naming its provenance)."""
    facts = profile.checkpointing
    if mode == "auto":
        return "async" if facts.async_save.value else "sync"
    if mode == "async" and not facts.async_save.value:
        raise GoodputError(f"checkpoint mode async: the {profile.name} profile saves synchronously "
                           f"({facts.async_save.provenance})")
    return mode


@dataclass(frozen=True)
class PlanRun:
    """A plan's run (module docstring): ``steps``, ``degrees``, ``checkpoint``, ``failures``,
    ``restart``, the closed form's ``run`` and ``breakdown``, Young's and Daly's intervals
    (seconds of work), ``cost_usd`` (None without a price) and the cluster sections taken
    from the defaults (``defaulted``)."""

    steps: int
    tokens_per_step: int
    degrees: Degrees
    checkpoint: CheckpointCost
    failures: FailureModel
    restart: RestartCost
    run: Run
    breakdown: Breakdown
    young_s: float
    daly_s: float
    cost_usd: float | None
    price: float | None
    spares: int
    defaulted: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view (seconds, bytes, dollars)."""
        b = self.breakdown
        return {"tokens": self.steps * self.tokens_per_step, "steps": self.steps, "gpus": self.degrees.gpus,
                "nodes": self.degrees.nodes, "spare_nodes": self.spares, "breakdown_s": b.to_dict(),
                "days": b.total_s / 86400, "goodput": b.goodput, "checkpoint": self.checkpoint.to_dict(),
                "checkpoint_interval_steps": b.interval, "young_interval_s": self.young_s,
                "daly_interval_s": self.daly_s, "mtbf_s": self.failures.mtbf_s,
                "interruptions_per_day": self.failures.rate * 86400,
                "planned_per_day": self.failures.planned_rate * 86400, "restart_s": self.restart.to_dict(),
                "price_usd_per_gpu_hour": self.price, "cost_usd": self.cost_usd,
                "defaulted_sections": list(self.defaulted)} | _finite(
                    young_interval_s=self.young_s, daly_interval_s=self.daly_s, mtbf_s=self.failures.mtbf_s)


def _finite(**values: float) -> dict[str, float | None]:
    """``values`` with an infinite one (no interruption: no MTBF, no interval) as None (JSON
    has no infinity)."""
    return {k: (v if math.isfinite(v) else None) for k, v in values.items()}


def build_run(degrees: Degrees, sections: Any, steps: int, step_s: float, ckpt: CheckpointCost | None,
              spares: int) -> tuple[Run, FailureModel, RestartCost]:
    """The closed form's :class:`Run` of a plan; ``ckpt`` None: a free checkpoint (stall,
    background and restore 0: the lower bound of :mod:`simulator.goodput.objectives`)."""
    rel = sections.reliability
    fails = FailureModel.of(rel, degrees.gpus, degrees.nodes)
    rst = restart_cost(rel.restart, fails, degrees.groups(), ckpt.restore_s if ckpt else 0.0, spares)
    run = Run(steps=steps, step_s=step_s, stall_s=ckpt.stall_s if ckpt else 0.0,
              background_s=ckpt.background_s if ckpt else 0.0, rate=fails.rate,
              restart_s=rst.unplanned_s, planned_rate=fails.planned_rate, planned_restart_s=rst.planned_s,
              write_s=ckpt.write_s if ckpt else 0.0,
              startup_s=rst.relaunch + nccl_init_s(rel.restart, degrees.groups()))
    return run, fails, rst


def plan_run(step_model: Any, result: Any, settings: TrainSettings, sections: Any,
             step_s: float | None = None) -> PlanRun:
    """The run of a simulated plan (``simulator.step.StepModel`` and its ``StepResult``) for
    ``settings`` on the cluster's ``sections`` (``clusters.goodput_spec.goodput_sections``);
    ``step_s`` replaces the step time (e.g. a sampled percentile). Raises GoodputError as
    :class:`TrainSettings` and :func:`save_mode` do."""
    c = step_model.cfg
    deg = Degrees(c.dp, c.tp, c.pp, step_model.cluster.devices_per_node)
    mode = save_mode(settings.mode, c.profile) if c.profile is not None else (
        "sync" if settings.mode == "auto" else settings.mode)
    replicas = c.profile.checkpointing.replicas.value if c.profile is not None else "first"
    layout = Layout(dp=c.dp, tp=c.tp, pp=c.pp, shard=shard_degree(c), devices_per_node=deg.devices_per_node)
    ckpt = checkpoint_cost(stage_states(result.memory_per_stage, c.zero), layout, sections.storage, mode, replicas)
    steps = max(1, math.ceil(settings.tokens / c.tokens_per_step))
    run, fails, rst = build_run(deg, sections, steps, result.step_time if step_s is None else step_s,
                                ckpt, settings.spares)
    b = time_to_train(run, settings.interval)
    billed = deg.gpus + settings.spares * deg.devices_per_node
    cost = None if settings.price is None else b.total_s / 3600 * billed * settings.price
    return PlanRun(steps=steps, tokens_per_step=c.tokens_per_step, degrees=deg, checkpoint=ckpt,
                   failures=fails, restart=rst, run=run, breakdown=b,
                   young_s=young_interval_s(ckpt.stall_s, fails.mtbf_s),
                   daly_s=daly_interval_s(ckpt.stall_s, fails.mtbf_s), cost_usd=cost,
                   price=settings.price, spares=settings.spares, defaulted=sections.defaulted)


__all__ = ["MAX_TOKENS", "SAVE_MODES", "Degrees", "GoodputError", "PlanRun", "TrainSettings", "build_run",
           "plan_run", "save_mode"]
