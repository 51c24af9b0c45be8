"""The Optuna study: one study per search, define-by-run, resumable, many workers.

The tuner never imports ``meshplan`` (DESIGN.md: meshplan -> tuner -> simulator). Plans are
scored by an injected *scorer*: ``scorer(candidate) -> Score``. Because a worker in another
process (``--workers N``) or on another machine (``meshplan worker``) must build the same
scorer, a search names a *scorer factory* by import path (``"meshplan.tuning:make_scorer"``)
plus a JSON-able ``scorer_config``; both are stored in the study's user attributes with the
search space, so ``run_worker(study, storage)`` needs nothing else.

Trial outcomes: an illegal point is pruned before any simulation (user attr ``illegal``
names the rule); a point the scorer rejects with a ``ValueError`` (an engine limit legality
does not model) is pruned with user attr ``error``; every scored point is COMPLETE with its
step time (and peak memory with ``pareto``), its memory excess recorded as the constraint
``memory = peak / capacity - 1`` (feasible when <= 0) via ``trial.set_constraint`` — an
out-of-memory plan is never a failed trial. Identical plans are scored once (the cache
includes the study's history, so a resumed search or a second worker reuses it).

Samplers (seeded): ``random`` (RandomSampler; full_random's default), ``tpe``
(multivariate grouped TPESampler, Watanabe 2023; pattern-based and semi-auto default),
``bruteforce`` (BruteForceSampler: the exhaustive optimum of a small space). On resume the
sampler seed is ``seed + number of trials already in the study``, so a resumed search does
not replay the points it already has.
"""

from __future__ import annotations

import importlib
import json
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.errors import TunerError
from tuner.space import Candidate, SearchSpace
from tuner.storage import WORKER_ATTR, open_storage, recover_interrupted, worker_id
from tuner.suggest import PATTERN, RANDOM, SEMI, suggest_candidate

MODES = (PATTERN, RANDOM, SEMI)
SAMPLERS = ("random", "tpe", "bruteforce")
CONFIG_ATTR = "meshplan_config"
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


class TuneError(TunerError):
    """A bad search request (mode, sampler, a study that belongs to another search)."""


@dataclass(frozen=True)
class Score:
    """A scored plan: ``time_s`` step time (s), ``memory_bytes`` peak over ranks,
    ``memory_limit_bytes`` the device capacity, ``metrics`` extra numbers (tokens_per_s,
    mfu, bubble_ratio ...)."""

    time_s: float
    memory_bytes: int
    memory_limit_bytes: int
    metrics: Mapping[str, float] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        """True when the plan's peak memory fits the device: memory_bytes <= memory_limit_bytes."""
        return self.memory_bytes <= self.memory_limit_bytes


Scorer = Callable[[Candidate], Score]


@dataclass(frozen=True)
class TuneConfig:
    """Everything that defines a search (stored in the study; a resume must match it).

    Attributes: space; mode (pattern-based | full_random | semi-auto); template_kinds:
    pattern kind -> template names (pattern-based); annotation: the user's annotation name
    (semi-auto); sampler (random | tpe | bruteforce; None = the mode's default); seed;
    pareto: minimise (time, peak memory) instead of time; scorer_factory: "module:function"
    taking ``scorer_config`` and returning a scorer.
    """

    space: SearchSpace
    mode: str = PATTERN
    template_kinds: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    annotation: str = "megatron"
    sampler: str | None = None
    seed: int = 0
    pareto: bool = False
    scorer_factory: str = ""
    scorer_config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise TuneError(f"mode {self.mode!r} is not one of {list(MODES)}")
        if self.sampler is not None and self.sampler not in SAMPLERS:
            raise TuneError(f"sampler {self.sampler!r} is not one of {list(SAMPLERS)}")

    @property
    def sampler_name(self) -> str:
        """The sampler used: ``sampler`` if set, else random for full_random and TPE otherwise."""
        return self.sampler or ("random" if self.mode == RANDOM else "tpe")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (stored with the study; a resume compares it)."""
        d = asdict(self)
        d["space"] = self.space.to_dict()
        d["template_kinds"] = {k: list(v) for k, v in self.template_kinds.items()}
        return json.loads(json.dumps(d))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TuneConfig:
        """Inverse of ``to_dict``. Raises TuneError / SpaceError as the constructors do."""
        d = dict(d)
        d["space"] = SearchSpace.from_dict(d["space"])
        d["template_kinds"] = {k: tuple(v) for k, v in d.get("template_kinds", {}).items()}
        return cls(**d)


def make_sampler(cfg: TuneConfig, n_existing: int = 0) -> optuna.samplers.BaseSampler:
    """The seeded sampler of ``cfg``; ``n_existing`` shifts the seed on resume."""
    seed = cfg.seed + n_existing
    if cfg.sampler_name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    with warnings.catch_warnings():  # BruteForce and TPE's ``group`` are "experimental"
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if cfg.sampler_name == "bruteforce":
            return optuna.samplers.BruteForceSampler(seed=seed)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                          n_startup_trials=20, constant_liar=True)


def resolve_factory(path: str) -> Callable[[Mapping[str, Any]], Scorer]:
    """Import ``"module:function"``. Raises TuneError naming the path."""
    mod, _, fn = path.partition(":")
    try:
        return getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError, ValueError) as e:
        raise TuneError(f"scorer factory {path!r} cannot be imported: {e}") from None


def open_study(cfg: TuneConfig | None, study_name: str, storage: str | None,
               study_dir: Path | None) -> tuple[optuna.Study, TuneConfig]:
    """Create or load ``study_name``. With ``cfg`` None (a joining worker) the stored
    config is used; otherwise a stored config must equal ``cfg`` (same search).

    Raises TuneError when the study exists for a different search or is missing."""
    st = open_storage(storage, study_dir)
    if st is None:
        st = optuna.storages.InMemoryStorage()
    if cfg is None:
        try:
            study = optuna.load_study(study_name=study_name, storage=st)
        except KeyError:
            raise TuneError(f"study {study_name!r} does not exist in storage {storage!r}") from None
        cfg = TuneConfig.from_dict(study.user_attrs[CONFIG_ATTR])
    directions = ["minimize", "minimize"] if cfg.pareto else ["minimize"]
    study = optuna.create_study(study_name=study_name, storage=st, load_if_exists=True,
                                directions=directions)
    stored = study.user_attrs.get(CONFIG_ATTR)
    if stored is None:
        study.set_user_attr(CONFIG_ATTR, cfg.to_dict())
    elif stored != cfg.to_dict():
        diff = sorted(k for k in stored if stored.get(k) != cfg.to_dict().get(k))
        raise TuneError(f"study {study_name!r} already holds a different search "
                        f"(differs in {diff}); pick another --study name")
    n = len(study.get_trials(deepcopy=False))
    study.sampler = make_sampler(cfg, n)
    return study, cfg


def trial_counts(study: optuna.Study) -> tuple[int, int]:
    """(finished, running) trial counts of ``study`` (finished: complete or pruned)."""
    ts = study.get_trials(deepcopy=False, states=(*FINISHED, TrialState.RUNNING))
    done = sum(t.state in FINISHED for t in ts)
    return done, len(ts) - done


def _history_cache(study: optuna.Study) -> dict[str, dict[str, Any]]:
    out = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        k = t.user_attrs.get("plan_key")
        if k is not None and "time_s" in t.user_attrs:
            out[k] = dict(t.user_attrs)
    return out


class _Objective:
    """Suggest, check, score (cached), record."""

    def __init__(self, study: optuna.Study, cfg: TuneConfig, scorer: Scorer) -> None:
        self.study, self.cfg, self.scorer = study, cfg, scorer
        self.cache = _history_cache(study)
        self.simulated = 0

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, float]:
        got = suggest_candidate(trial, self.cfg.space, self.cfg.mode, self.cfg.template_kinds,
                                self.cfg.annotation)
        if not isinstance(got, Candidate):
            trial.set_user_attr("illegal", str(got))
            raise optuna.TrialPruned(str(got))
        key = json.dumps(got.to_dict(), sort_keys=True)
        trial.set_user_attr("plan", got.to_dict())
        trial.set_user_attr("plan_key", key)
        rec = self.cache.get(key)
        if rec is None:
            self.cache.update(_history_cache(self.study))
            rec = self.cache.get(key)
        if rec is None:
            try:
                s = self.scorer(got)
            except ValueError as e:
                trial.set_user_attr("error", f"{type(e).__name__}: {e}")
                raise optuna.TrialPruned(str(e)) from None
            self.simulated += 1
            rec = {"time_s": float(s.time_s), "memory_bytes": int(s.memory_bytes),
                   "memory_limit_bytes": int(s.memory_limit_bytes),
                   "metrics": {k: float(v) for k, v in s.metrics.items()}}
            self.cache[key] = rec
        else:
            trial.set_user_attr("cached", True)
        # time_s last: each attr is its own storage write, so a trial whose worker is killed
        # mid-way never shows time_s without the memory fields that readers pair with it
        for k in ("metrics", "memory_limit_bytes", "memory_bytes", "time_s"):
            trial.set_user_attr(k, rec[k])
        trial.set_constraint("memory", rec["memory_bytes"] / rec["memory_limit_bytes"] - 1.0)
        if self.cfg.pareto:
            return rec["time_s"], float(rec["memory_bytes"])
        return rec["time_s"]


def optimize(study: optuna.Study, cfg: TuneConfig, scorer: Scorer, n_trials: int,
             timeout: float | None = None,
             on_trial: Callable[[optuna.Study, optuna.trial.FrozenTrial], None] | None = None
             ) -> int:
    """Run trials until the study holds ``n_trials`` finished (complete + pruned) trials
    (running ones of other workers count), ``timeout`` seconds pass, or the sampler has
    exhausted the space (bruteforce). Returns the number of trials this call ran."""
    recover_interrupted(study)
    done, running = trial_counts(study)
    if done + running >= n_trials:
        return 0
    obj = _Objective(study, cfg, scorer)
    me = worker_id()
    ran = 0

    def objective(trial: optuna.Trial) -> float | tuple[float, float]:
        study._storage.set_trial_system_attr(trial._trial_id, WORKER_ATTR, me)
        return obj(trial)

    def callback(st: optuna.Study, ft: optuna.trial.FrozenTrial) -> None:
        nonlocal ran
        ran += 1
        if on_trial is not None:
            on_trial(st, ft)
        d, r = trial_counts(st)
        if d + r >= n_trials:
            st.stop()

    study.optimize(objective, timeout=timeout, callbacks=[callback])
    return ran


def run_worker(study_name: str, storage: str | None, n_trials: int | None = None,
               timeout: float | None = None, study_dir: str | None = None,
               factory: Callable[[Mapping[str, Any]], Scorer] | None = None) -> int:
    """Join an existing study (``meshplan worker``): rebuild its scorer from the stored
    factory path and config, and run trials until the study's target (``n_trials``, default
    the stored ``target_trials``) is reached. Returns the trials this worker ran."""
    study, cfg = open_study(None, study_name, storage, Path(study_dir) if study_dir else None)
    scorer = (factory or resolve_factory(cfg.scorer_factory))(cfg.scorer_config)
    target = n_trials if n_trials is not None else int(study.user_attrs.get("target_trials", 0))
    return optimize(study, cfg, scorer, target, timeout)
