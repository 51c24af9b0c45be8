"""Best-so-far traces of one search against wall time, for ``search_quality_time``.

A :class:`SpaceSpec` names one search problem of ``meshplan tune`` (model, cluster, nodes,
global batch, sequence; optional ``--layers`` and ``--fix``) with its default
pattern-based space (:func:`tune_config`: the space, templates and scorer config
``meshplan tune`` builds for the same options). One traced search is a :class:`Trace`:

* ``exhaustive``: ``tuner.suggest.enumerate_candidates`` then
  ``tuner.exhaustive.run_exhaustive`` (branch and bound with the tier-0 and tight bounds,
  an in-memory study); one point after every simulated candidate (a pruned candidate does
  not change the best), the clock started before the enumeration (part of the method's
  cost); the :class:`tuner.exhaustive_report.ExhaustiveReport` is kept.
* ``tpe`` / ``random``: ``tuner.study.optimize`` on an in-memory study with the seeded
  sampler of ``tuner.study.make_sampler`` (what ``meshplan tune --sampler tpe|random``
  runs; on these spaces of more than 1,000 plans ``--seed-from-bound`` is off by default,
  and it is off here), one point after every finished trial, the clock started just
  before the first trial.

A point is ``(t_s, best_s)``: seconds since the clock started, and the smallest step time
(s) of a scored plan that fits in memory (``memory_bytes <= memory_limit_bytes``) found so
far (``inf`` until one is found). :func:`traced` runs one search in a fresh process
(``spawn``) so that no run reuses another's process caches (block costs, schedules,
plays); the start-up and imports are outside the clock.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any

from experiments.base import ExperimentError

#: the methods a trace can run, by name
METHODS = ("exhaustive", "tpe", "random")


@dataclass(frozen=True)
class SpaceSpec:
    """One search problem (the options of ``meshplan tune``) and its time allowances.

    Attributes:
        label: short name (table rows, panel titles).
        model, cluster, nodes, global_batch, seq_len: ``--model --cluster --nodes
            --global-batch --seq-len``.
        budget_s: wall seconds every method gets (the comparison window).
        proof_cap_s: wall seconds the exhaustive run may take to prove (>= budget_s).
        layers: ``--layers`` (None: the model's own).
        fix: ``--fix`` text (None: nothing pinned).
        source: where the problem comes from (Markdown, for the report).
    """

    label: str
    model: str
    cluster: str
    nodes: int
    global_batch: int
    seq_len: int
    budget_s: float
    proof_cap_s: float
    layers: int | None = None
    fix: str | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if not (self.budget_s > 0 and self.proof_cap_s >= self.budget_s):
            raise ExperimentError(f"space {self.label!r}: need 0 < budget_s <= proof_cap_s, got "
                                  f"{self.budget_s} and {self.proof_cap_s}")

    def command(self, sampler: str) -> str:
        """The ``meshplan tune`` command line searching the same space with ``sampler``."""
        parts = [f"meshplan tune --model {self.model} --cluster {self.cluster} --nodes {self.nodes}",
                 f"--global-batch {self.global_batch} --seq-len {self.seq_len}"]
        if self.layers is not None:
            parts.append(f"--layers {self.layers}")
        if self.fix:
            parts.append(f"--fix {self.fix}")
        parts.append(f"--sampler {sampler}")
        return " ".join(parts)


@dataclass
class Trace:
    """One traced search: ``points`` ``[(t_s, best_s), ...]`` in time order (module
    docstring), ``trials`` finished trials (samplers) or simulated candidates (exhaustive),
    ``seconds`` on the clock at the end, and for the exhaustive run its report
    (``ExhaustiveReport.to_dict()``)."""

    space: str
    method: str
    seed: int
    budget_s: float
    points: list[tuple[float, float]] = field(default_factory=list)
    trials: int = 0
    seconds: float = 0.0
    report: dict[str, Any] | None = None
    cpu_s: float = 0.0
    """CPU seconds of the run's process over the run (on a loaded host, wall > CPU)."""
    load: tuple[float, float] = (math.nan, math.nan)
    """1-minute load average of the host at the start and at the end of the run."""

    @property
    def best_s(self) -> float:
        """Best feasible step time (s) at the end (inf: none found)."""
        return self.points[-1][1] if self.points else math.inf


def tune_config(spec: SpaceSpec, sampler: str, seed: int = 0) -> Any:
    """The ``tuner.study.TuneConfig`` of ``meshplan tune --all-schedules`` with ``spec``'s
    options, ``--sampler sampler --seed seed`` and every other option at its default
    (bfloat16, megatron-core, the model's attention, the default memory headroom; no HSDP,
    no FP8): the search quality over every schedule the tuner knows, ZB-H1 and ZB-2p
    included, not only the ones Megatron-LM runs (``meshplan.tune_setup.tune_config``, the
    builder tune uses). Raises SpaceError / ValueError naming a bad option, as tune does."""
    from meshplan.tune_setup import tune_config as build

    return build(spec.model, spec.cluster, spec.nodes, spec.global_batch, spec.seq_len,
                 "pattern-based", seed, False, spec.fix, sampler, spec.layers, False,
                 all_schedules=True)


def _study_name(spec: SpaceSpec, method: str, seed: int) -> str:
    """A legal study name (``tuner.study.STUDY_NAME``) for one run of ``spec``."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", f"sq-{spec.label}-{method}-{seed}")[:128]


def _fits(rec: Mapping[str, Any]) -> bool:
    """A scored record (no ``error``) whose peak fits the device."""
    return "error" not in rec and rec["memory_bytes"] <= rec["memory_limit_bytes"]


def _exhaustive(spec: SpaceSpec, trace: Trace) -> Trace:
    from tuner.exhaustive import plan_key, run_exhaustive
    from tuner.study import open_study, resolve_factory
    from tuner.suggest import enumerate_candidates

    t0 = time.monotonic()
    cfg = tune_config(spec, "exhaustive")
    cands = enumerate_candidates(cfg.space, cfg.mode, cfg.template_kinds, cfg.annotation)
    study, cfg = open_study(cfg, _study_name(spec, "exhaustive", 0), None, None)
    scorer = resolve_factory(cfg.scorer_factory)(cfg.scorer_config)
    history: dict[str, dict[str, Any]] = {}
    best = math.inf

    def on_scored(i: int) -> None:
        nonlocal best
        rec = history[plan_key(cands[i])]
        if _fits(rec):
            best = min(best, float(rec["time_s"]))
        trace.points.append((time.monotonic() - t0, best))

    left = max(1e-3, spec.proof_cap_s - (time.monotonic() - t0))
    rep = run_exhaustive(study, cands, scorer, history, left, on_scored=on_scored)
    trace.points.append((time.monotonic() - t0, best))
    found = math.inf if rep.best_time_s is None else rep.best_time_s
    if found != best:
        raise ExperimentError(f"space {spec.label!r}: the exhaustive report's best {found} s is not "
                              f"the best of its simulated plans {best} s")
    trace.trials, trace.report = rep.simulated, rep.to_dict()
    return trace


def _sampler(spec: SpaceSpec, trace: Trace) -> Trace:
    import optuna
    from optuna.trial import TrialState

    from tuner.result import scored
    from tuner.study import open_study, optimize, resolve_factory

    cfg = tune_config(spec, trace.method, trace.seed)
    study, cfg = open_study(cfg, _study_name(spec, trace.method, trace.seed), None, None)
    scorer = resolve_factory(cfg.scorer_factory)(cfg.scorer_config)
    best = math.inf
    t0 = time.monotonic()

    def on_trial(_st: optuna.Study, ft: optuna.trial.FrozenTrial) -> None:
        nonlocal best
        ua = ft.user_attrs
        if ft.state == TrialState.COMPLETE and scored(ua) and _fits(ua):
            best = min(best, float(ua["time_s"]))
        trace.points.append((time.monotonic() - t0, best))

    trace.trials = optimize(study, cfg, scorer, 10**9, timeout=spec.budget_s, on_trial=on_trial)
    return trace


#: method name -> the function running it (``fn(spec, empty trace) -> filled trace``)
RUNNERS = {"exhaustive": _exhaustive, "tpe": _sampler, "random": _sampler}


def run_trace(spec: SpaceSpec, method: str, seed: int = 0) -> Trace:
    """One traced search of ``spec`` by ``method`` (:data:`METHODS`) in this process; the
    exhaustive run ignores ``seed`` (it samples nothing). Raises ExperimentError for an
    unknown method, or when the exhaustive report's best differs from its trace."""
    if method not in RUNNERS:
        raise ExperimentError(f"experiment search_quality_time: unknown method {method!r}; "
                              f"known: {', '.join(METHODS)}")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trace = Trace(spec.label, method, seed, spec.budget_s)
    start, cpu = os.getloadavg()[0], time.process_time()
    trace = RUNNERS[method](spec, trace)
    trace.load, trace.cpu_s = (start, os.getloadavg()[0]), time.process_time() - cpu
    trace.seconds = trace.points[-1][0] if trace.points else 0.0
    return trace


def traced(spec: SpaceSpec, method: str, seed: int = 0, isolate: bool = True) -> Trace:
    """:func:`run_trace`, in a fresh ``spawn``-ed process when ``isolate`` (cold caches:
    each method pays for the block costs, schedules and plays it needs)."""
    if not isolate:
        return run_trace(spec, method, seed)
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(run_trace, spec, method, seed).result()


__all__ = ["METHODS", "SpaceSpec", "Trace", "run_trace", "traced", "tune_config"]
