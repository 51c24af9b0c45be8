"""Stragglers and jitter: a plan's step played on SimPy with sampled slowdowns, many times,
for its step-time percentiles; and what one slow GPU or one slow link costs it.

The step (:class:`StepShape`) is the deterministic engine's: the same schedule, the same
dependency templates (``simulator.pipeline_sim``), stage times and p2p hop, then per
pipeline rank its tail -- the data-parallel synchronisation not hidden behind the backward
(``sync``) and the optimizer (``optimizer``) -- as ``simulator.step.StepModel._rank`` adds
them. Each sampled step (:func:`sample_steps`) draws, from the cluster's ``jitter`` section
(``clusters.goodput_spec``, slowdowns X >= 0 so that a time t becomes t (1 + X)):

- per rank: one draw per GPU; a pipeline rank of a data-parallel replica is a tensor-parallel
  group whose collectives synchronise every layer, so its actions and its optimizer run at
  the slowest of its tp GPUs; under ZeRO-3 every layer's parameter all-gather also waits for
  the slowest of the stage's dp ranks (``gather_every_layer``), so the whole stage runs at it;
- per kernel: one draw per action of each replica;
- per collective: one draw per action's incoming p2p hop(s) and one per stage's
  data-parallel synchronisation.

Each data-parallel replica plays its pipeline on its own SimPy environment (its actions in
schedule order, each after its inputs and their hops); replicas meet at the
synchronisation: the step is ``max_r (max_d end[d][r] + sync_r (1 + Z_r) + optimizer_r
max_d A[d][r])``. With every draw 0 this is the deterministic step (a test checks it on
the engine's own plans). Slowdowns only: no sampled step is shorter than the
deterministic one.

Sensitivity (:func:`sensitivity`, deterministic): the step with one GPU slower by a factor
(the worst stage for it) and with one link slower (the worst stage's p2p hops, in and out, and in-stage
collectives -- tp, cp, ZeRO-3 gathers: ``comm_share`` of its action time -- in one replica,
or its data-parallel synchronisation, whose ring runs at its slowest link), each relative
to the step. A pipeline charges a slow stage its own actions only, the others'
warm-up and cool-down pass at full speed (1F1B, p = 2, m micro-batches: a last stage slower
by s costs m (s - 1) / (m + 1)); a synchronous data-parallel step charges all of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from simulator.errors import SimulatorError
from simulator.pipeline_sim import dependency_templates
from simulator.schedules.base import Schedule

#: step-time percentiles reported (:func:`percentiles`)
PERCENTILES = (50, 90, 99)
#: the most sampled steps one call plays
MAX_SAMPLES = 100_000


def draw(dist: Any, rng: np.random.Generator, size: Any) -> np.ndarray:
    """Slowdowns X >= 0 of a ``clusters.goodput_spec.JitterDist`` (``exponential``: mean a;
    ``lognormal``: a e^{b N(0,1)}, median a; ``uniform``: in [a, b]; ``none``: 0), shaped
    ``size``. Raises SimulatorError for an unknown family."""
    kind = dist.dist
    if kind == "none":
        return np.zeros(size)
    if kind == "exponential":
        return rng.exponential(dist.a, size)
    if kind == "lognormal":
        return dist.a * np.exp(dist.b * rng.standard_normal(size))
    if kind == "uniform":
        return rng.uniform(dist.a, dist.b, size)
    raise SimulatorError(f"unknown jitter distribution {kind!r}")


@dataclass(frozen=True)
class StepShape:
    """What a sampled step plays (module docstring): the ``schedule``, per virtual stage its
    ``stage_times`` (``{F, B, W[, BW]}`` seconds), the p2p hop ``comm_s`` and whether sends
    are synchronous, per pipeline rank ``sync_s`` and ``optimizer_s``, the degrees ``dp``
    and ``tp`` and ``gather_every_layer`` (ZeRO-3)."""

    schedule: Schedule
    stage_times: Sequence[Any]
    comm_s: float
    sync_s: Sequence[float]
    optimizer_s: Sequence[float]
    dp: int = 1
    tp: int = 1
    p2p_sync: bool = False
    gather_every_layer: bool = False
    comm_share: Sequence[float] = ()
    """Per virtual stage, the share of its action time that is in-stage collectives (tp,
    cp, ZeRO-3 gathers; ``StepResult.stage_parts``), which a slow link slows too (empty:
    none)."""
    _templates: list = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self) -> None:
        p = self.schedule.num_stages
        if len(self.sync_s) != p or len(self.optimizer_s) != p:
            raise SimulatorError(f"step shape: {p} pipeline ranks need {p} sync and optimizer times, "
                                 f"got {len(self.sync_s)} and {len(self.optimizer_s)}")
        if self.dp < 1 or self.tp < 1:
            raise SimulatorError(f"step shape: dp and tp must be >= 1, got {self.dp}, {self.tp}")
        self._templates.extend(dependency_templates(self.schedule, self.stage_times, self.comm_s, self.p2p_sync))

    @classmethod
    def of(cls, model: Any, result: Any) -> StepShape:
        """The shape of a simulated step: ``model`` a ``simulator.step.StepModel``,
        ``result`` its ``StepResult`` (stage times, hop, the tails of
        ``StepResult.rank_tails``)."""
        sync, opt = [], []
        for tail in result.rank_tails:
            opt.append(float(tail.get("optimizer", 0.0)))
            sync.append(float(sum(v for k, v in tail.items() if k not in ("end", "optimizer"))))
        c = model.cfg
        share = []
        for times, parts in zip(result.stage_times, result.stage_parts, strict=True):
            busy = sum(times.get(k, 0.0) for k in ("F", "B", "W"))
            share.append(min(1.0, parts.get("comm", 0.0) / busy) if busy > 0 else 0.0)
        return cls(schedule=result.schedule, stage_times=result.stage_times, comm_s=result.comm_time,
                   sync_s=sync, optimizer_s=opt, dp=c.dp, tp=c.tp, p2p_sync=model.sync_p2p(),
                   gather_every_layer=c.zero == 3, comm_share=tuple(share))


def _replica(shape: StepShape, rank_f: np.ndarray, kernel_f: list[np.ndarray],
             hop_f: list[np.ndarray]) -> list[float]:
    """Play one replica's pipeline on SimPy with each action's time scaled by its rank's and
    its own factor and its hops by theirs; the end (ns) of each rank's last action."""
    sched = shape.schedule
    env = simpy.Environment()
    nkeys = 3 * sched.num_vstages * sched.num_microbatches
    finish = [-1.0] * nkeys
    waiters: dict[int, simpy.Event] = {}
    ends = [0.0] * sched.num_stages

    def rank(r: int):
        chunks = shape._templates[r]
        for j, (kind, _, mb, c) in enumerate(sched.actions[r]):
            dur, post, k1, d1, k2, d2, o1, o2, _vs = chunks[c][kind]
            ready = env.now
            for key, delay in ((k1, d1), (k2, d2)):
                if key < 0:
                    continue
                key += mb
                if finish[key] < 0:
                    yield waiters.setdefault(key, env.event())
                ready = max(ready, finish[key] + delay * hop_f[r][j], env.now)
            end = ready + dur * rank_f[r] * kernel_f[r][j]
            for out in (o1, o2):
                if out >= 0:
                    finish[out + mb] = end
                    ev = waiters.pop(out + mb, None)
                    if ev is not None:
                        ev.succeed()
            end += post * hop_f[r][j]
            yield env.timeout(end - env.now)
        ends[r] = env.now

    for r in range(sched.num_stages):
        env.process(rank(r))
    env.run()
    return ends


def _step(shape: StepShape, ends: np.ndarray, rank_f: np.ndarray, sync_f: np.ndarray) -> float:
    """Seconds of the step from each replica's rank ends (ns, [dp, pp]) and factors."""
    fin = ends.max(axis=0) * 1e-9 + np.asarray(shape.sync_s) * sync_f + \
        np.asarray(shape.optimizer_s) * rank_f.max(axis=0)
    return float(fin.max())


def _counts(shape: StepShape) -> list[int]:
    return [len(a) for a in shape.schedule.actions]


def deterministic_step(shape: StepShape) -> float:
    """The step with no slowdown (seconds): what the engine simulated."""
    p = shape.schedule.num_stages
    ones = [np.ones(n) for n in _counts(shape)]
    ends = np.array([_replica(shape, np.ones(p), ones, ones)])
    return _step(shape, ends, np.ones((1, p)), np.ones(p))


def sample_steps(shape: StepShape, jitter: Any, samples: int = 200, seed: int = 0) -> np.ndarray:
    """``samples`` step times (seconds) with the slowdowns of a
    ``clusters.goodput_spec.JitterSpec`` (module docstring), seeded. Raises SimulatorError
    for ``samples`` outside 1 .. :data:`MAX_SAMPLES`."""
    if not (isinstance(samples, int) and 1 <= samples <= MAX_SAMPLES):
        raise SimulatorError(f"jitter samples must be an integer in 1 .. {MAX_SAMPLES}, got {samples!r}")
    rng = np.random.default_rng(seed)
    p, dp, counts = shape.schedule.num_stages, shape.dp, _counts(shape)
    out = np.empty(samples)
    for i in range(samples):
        rank_f = 1.0 + draw(jitter.rank, rng, (dp, p, shape.tp)).max(axis=2)
        if shape.gather_every_layer:
            rank_f = np.broadcast_to(rank_f.max(axis=0), (dp, p))
        ends = np.array([_replica(shape, rank_f[d],
                                  [1.0 + draw(jitter.kernel, rng, n) for n in counts],
                                  [1.0 + draw(jitter.collective, rng, n) for n in counts])
                         for d in range(dp)])
        out[i] = _step(shape, ends, rank_f, 1.0 + draw(jitter.collective, rng, p))
    return out


def percentiles(steps: np.ndarray) -> dict[str, float]:
    """``{"p50": s, "p90": s, "p99": s, "mean": s}`` of sampled step times (seconds)."""
    vals = np.percentile(steps, PERCENTILES)
    return {**{f"p{q}": float(v) for q, v in zip(PERCENTILES, vals, strict=True)},
            "mean": float(steps.mean())}


@dataclass(frozen=True)
class Sensitivity:
    """Relative step-time increase (fractions) with one GPU ``factor`` times slower
    (``slow_rank``, worst stage ``rank_stage``) and one link ``link_factor`` times slower
    (``slow_link``, worst stage ``link_stage``; its p2p hops in one replica or its dp
    synchronisation)."""

    factor: float
    slow_rank: float
    rank_stage: int
    link_factor: float
    slow_link: float
    link_stage: int

    def to_dict(self) -> dict[str, float]:
        """JSON-friendly view."""
        return dict(self.__dict__)


def _link_hops(sched: Schedule, stage: int, factor: float) -> list[np.ndarray]:
    """Per rank and action, the factor of its incoming hop when ``stage``'s links are
    ``factor`` times slower: every hop into or out of that rank (an F's input comes from the
    rank of the previous virtual stage, a B's from the next one's)."""
    owner = {vs: r for r, row in enumerate(sched.vstage) for vs in row}
    out = []
    for r, actions in enumerate(sched.actions):
        f = np.ones(len(actions))
        for j, a in enumerate(actions):
            vs = sched.vstage[r][a.chunk]
            src = owner.get(vs - 1) if a.kind == "F" else owner.get(vs + 1) if a.kind in ("B", "BW") else None
            if src is not None and src != r and stage in (r, src):
                f[j] = factor
        out.append(f)
    return out


def _one_replica_slow(shape: StepShape, stage: int, rank: float, hop: float, sync: float) -> float:
    """The step with replica 0's stage ``stage`` scaled by ``rank`` (every replica's under
    ZeRO-3), its hops into that stage by ``hop`` and the stage's dp sync by ``sync``."""
    p, counts = shape.schedule.num_stages, _counts(shape)
    dp = shape.dp
    rank_f = np.ones((dp, p))
    rank_f[0, stage] = rank
    if shape.gather_every_layer:
        rank_f[:, stage] = rank
    ones = [np.ones(n) for n in counts]
    hops = _link_hops(shape.schedule, stage, hop)
    share = list(shape.comm_share) or [0.0] * shape.schedule.num_vstages
    vst = shape.schedule.vstage[stage]
    kern = list(ones)  # the slow link also slows the stage's in-stage collectives
    kern[stage] = np.array([1.0 + (hop - 1.0) * share[vst[a[3]]] for a in shape.schedule.actions[stage]])
    plays = [np.asarray(_replica(shape, rank_f[0], kern, hops))]
    if dp > 1:  # the other replicas: alike unless ZeRO-3 slows them all
        plays += [np.asarray(_replica(shape, rank_f[1], ones, ones))]
    sync_f = np.ones(p)
    sync_f[stage] = sync
    return _step(shape, np.array(plays), rank_f, sync_f)


def sensitivity(shape: StepShape, factor: float = 1.1, link_factor: float = 2.0) -> Sensitivity:
    """:class:`Sensitivity` of a step (module docstring). Raises SimulatorError for a factor
    below 1."""
    if factor < 1 or link_factor < 1:
        raise SimulatorError(f"slowdown factors must be >= 1, got {factor}, {link_factor}")
    base = deterministic_step(shape)
    p = shape.schedule.num_stages
    ranks = [_one_replica_slow(shape, r, factor, 1.0, 1.0) / base - 1 for r in range(p)]
    links = [max(_one_replica_slow(shape, r, 1.0, link_factor, 1.0),
                 _one_replica_slow(shape, r, 1.0, 1.0, link_factor)) / base - 1 for r in range(p)]
    rs, ls = int(np.argmax(ranks)), int(np.argmax(links))
    return Sensitivity(factor=factor, slow_rank=ranks[rs], rank_stage=rs, link_factor=link_factor,
                       slow_link=links[ls], link_stage=ls)


__all__ = ["MAX_SAMPLES", "PERCENTILES", "Sensitivity", "StepShape", "deterministic_step", "draw",
           "percentiles", "sample_steps", "sensitivity"]
