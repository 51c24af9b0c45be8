"""The Optuna study: one study per search, define-by-run, resumable, many workers.

The tuner imports neither ``meshplan`` nor the simulator (docs/design.md: meshplan -> tuner -> completion). Plans are
scored by an injected *scorer*: ``scorer(candidate) -> Score``. Because a worker in another
process (``--workers N``) or on another machine (``meshplan worker``) must build the same
scorer, a search names a *scorer factory* by import path (``"meshplan.tuning:make_scorer"``)
plus a JSON-able ``scorer_config``; both are stored in the study's user attributes with the
search space, so ``run_worker(study, storage)`` needs nothing else.

Trial outcomes: a trial draws only legal plans (``tuner.legal_draw``: the sampler chooses
among the enumerated legal candidates, so no draw is illegal); a point the scorer rejects
with a ``ValueError`` (an engine limit legality does not model: a bug to fix with a rule)
is pruned with user attr ``error``; every scored point is COMPLETE with its
step time (and peak memory with ``pareto``), its memory excess recorded as the constraint
``memory = peak / capacity - 1`` (feasible when <= 0) via ``trial.set_constraint`` — an
out-of-memory plan is never a failed trial — and the user attrs ``feasible``,
``memory_bytes``, ``memory_limit_bytes`` (and both in GiB) that optuna-dashboard lists
(:func:`record_attrs`). A search's trial target counts distinct plans (:func:`distinct_plans`):
a draw of a plan scored already is a COMPLETE trial answered from the cache (``cached``)
that does not count. Identical plans are scored once per study,
whichever process scores them: the cache includes the study's history (scores and scorer
errors), so a resumed search or a second worker reuses it, and a worker that draws a plan
another live worker is scoring right now (a RUNNING trial with the same ``plan_key``) waits
for that score instead of computing it again (the claim protocol of
:meth:`_Objective._claim`; at most :data:`PEER_WAIT_S`; a dead peer is not waited for).

Samplers (seeded): ``exhaustive`` (the default: no Optuna sampler, branch and bound over
the enumerated space with the scorer's lower bounds, :mod:`tuner.exhaustive`; a Pareto
search defaults to TPE), ``random`` (RandomSampler; full_random's default), ``tpe``
(multivariate grouped TPESampler, Watanabe 2023), ``bruteforce`` (BruteForceSampler: every
plan of a small space). On resume the
sampler seed is ``seed + number of trials already in the study``, so a resumed search does
not replay the points it already has. Every process that opens the study registers in it
(a study system attr per worker); when another live worker is registered, the seed also
mixes in this worker's identity (:func:`worker_seed`), so two ``tune`` processes, or a
``tune`` and its ``--workers``, started on one storage at once never draw the same startup
points. (Of two processes registering together at least one sees the other: each
registers before it looks.) A search alone on its study keeps the plain, reproducible seed.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import re
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.errors import TunerError
from tuner.journal import JournalWriteError, write_failure
from tuner.result import MEMORY_CONSTRAINT, history_cache, memory_constraint, record_attrs
from tuner.space import Candidate, SearchSpace
from tuner.storage import (
    WORKER_ATTR,
    open_storage,
    recover_interrupted,
    trial_owners,
    worker_alive,
    worker_id,
    worker_token,
)
from tuner.suggest import FRAMEWORK, PATTERN, RANDOM, SEMI

MODES = (FRAMEWORK, PATTERN, RANDOM, SEMI)
SAMPLERS = ("random", "tpe", "bruteforce", "exhaustive")
CONFIG_ATTR = "meshplan_config"
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


#: the tuner's one error class under its older name (a bad search request: mode, sampler, a
#: study that belongs to another search): ``TuneError is TunerError``
TuneError = TunerError


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

    Attributes: space; mode (framework | pattern-based | full_random | semi-auto);
    template_kinds: pattern kind -> template names (pattern-based); annotation: the user's
    annotation name (semi-auto); sampler (exhaustive | random | tpe | bruteforce; None = the
    mode's default, :attr:`sampler_name`); seed;
    pareto: minimise (time, peak memory) instead of time; scorer_factory: "module:function"
    taking ``scorer_config`` and returning a scorer.
    """

    space: SearchSpace
    mode: str = FRAMEWORK
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
        """The sampler used: ``sampler`` if set, else random for full_random (its annotation
        seeds cannot be enumerated), TPE for a Pareto search (the branch and bound minimises
        step time) and otherwise ``exhaustive``, the branch and bound that proves the
        optimum or bounds the gap (issue 36: a proof by default)."""
        if self.sampler:
            return self.sampler
        return "random" if self.mode == RANDOM else "tpe" if self.pareto else "exhaustive"

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


#: A study name: letters, digits, ``-``, ``_`` and ``.``, not starting with a dot, at most
#: 128 characters. The name becomes a directory (``meshplan-runs/NAME``), so a path
#: separator or ``..`` would write outside the runs folder.
STUDY_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


def check_study_name(name: Any) -> str:
    """``name`` when it is a safe study name (:data:`STUDY_NAME`); else TuneError naming it."""
    if not isinstance(name, str) or STUDY_NAME.fullmatch(name) is None:
        raise TuneError(f"study name {name!r} is not allowed: use letters, digits, '-', '_' and "
                        f"'.', not starting with a dot, at most 128 characters")
    return name


def worker_seed(seed: int, n_existing: int, worker: str | None) -> int:
    """The sampler seed of one worker: ``seed + n_existing`` for a worker alone on its study
    (``worker`` None), else a 32-bit hash of (seed, n_existing, worker identity)."""
    if worker is None:
        return seed + n_existing
    h = hashlib.sha256(f"{seed}:{n_existing}:{worker}".encode()).hexdigest()
    return int(h[:8], 16)


def make_sampler(cfg: TuneConfig, n_existing: int = 0, worker: str | None = None
                 ) -> optuna.samplers.BaseSampler:
    """The seeded sampler of ``cfg``; ``n_existing`` shifts the seed on resume, ``worker``
    (a worker token, when other workers share the study) makes it this worker's own
    (:func:`worker_seed`)."""
    seed = worker_seed(cfg.seed, n_existing, worker)
    if cfg.sampler_name in ("random", "exhaustive"):  # exhaustive samples nothing (tuner.exhaustive)
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

    Raises TuneError when the study name is not safe (:func:`check_study_name`), or the
    study exists for a different search or is missing."""
    check_study_name(study_name)
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
        raise TuneError(f"study {study_name!r} already holds a different search "
                        f"(differs in {_differing(stored, cfg.to_dict())}){_hint(stored)}; pick "
                        "another --study name")
    n = len(study.get_trials(deepcopy=False))
    study.sampler = make_sampler(cfg, n, worker_token() if _register(study) else None)
    return study, cfg


def _differing(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys where two stored configs differ, down to the first non-mapping values
    (``space.schedules``, not ``space``)."""
    out: list[str] = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if x == y:
            continue
        if isinstance(x, Mapping) and isinstance(y, Mapping):
            out += _differing(x, y, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}")
    return out


def _hint(stored: Mapping[str, Any]) -> str:
    """A hint for a study stored before tune searched only the framework's schedules: its
    space holds every schedule the tuner knows, which ``--all-schedules`` searches."""
    from tuner.space import SCHEDULES

    space = stored.get("space")
    if isinstance(space, Mapping) and tuple(space.get("schedules", ())) == SCHEDULES:
        return " (it searched every schedule: add --all-schedules to resume it)"
    return ""


#: study system attr prefix under which each worker process registers (:func:`_register`)
REGISTER_PREFIX = "meshplan_registered:"


def _register(study: optuna.Study) -> bool:
    """Register this process in ``study``; True when another registered worker may be alive
    (on this host: its pid lives; on another host: unknown, counted as alive)."""
    me = worker_token()
    storage, sid = study._storage, study._study_id
    storage.set_study_system_attr(sid, REGISTER_PREFIX + me, worker_id())
    for k, w in storage.get_study_system_attrs(sid).items():
        if k.startswith(REGISTER_PREFIX) and k != REGISTER_PREFIX + me and isinstance(w, dict) \
                and worker_alive(w) is not False:
            return True
    return False


def trial_counts(study: optuna.Study) -> tuple[int, int]:
    """(finished, running) trial counts of ``study`` (finished: complete or pruned)."""
    ts = study.get_trials(deepcopy=False, states=(*FINISHED, TrialState.RUNNING))
    done = sum(t.state in FINISHED for t in ts)
    return done, len(ts) - done


#: Longest wait (s) for a live peer that is scoring the same plan; then score it here.
PEER_WAIT_S = 600.0
#: Poll interval (s) while waiting for a peer's score.
PEER_POLL_S = 0.05
#: Trial user attr: this worker's decision on a plan a live peer also drew (:meth:`_Objective._claim`).
CLAIM_ATTR = "plan_claim"


class _Objective:
    """Draw a legal plan, score it (cached), record it."""

    def __init__(self, study: optuna.Study, cfg: TuneConfig, scorer: Scorer, tree: Any = None) -> None:
        self.study, self.cfg, self.scorer, self.tree = study, cfg, scorer, tree
        self.cache = history_cache(study)
        self.simulated = 0

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, float]:
        from tuner.legal_draw import draw_candidate

        if self.tree is None:
            trial.set_user_attr("illegal", "no_legal_plan: the search space holds no legal plan")
            raise optuna.TrialPruned("the search space holds no legal plan")
        got = draw_candidate(self.tree, trial, self.cfg.mode)
        key = json.dumps(got.to_dict(), sort_keys=True)
        trial.set_user_attr("plan", got.to_dict())
        trial.set_user_attr("plan_key", key)  # the claim: written before this worker looks
        rec = self.cache.get(key)
        if rec is None:
            rec = self._claim(trial, key)
        if rec is not None and "error" in rec:
            trial.set_user_attr("cached", True)
            trial.set_user_attr("error", rec["error"])
            raise optuna.TrialPruned(rec["error"])
        if rec is None:
            try:
                s = self.scorer(got)
            except ValueError as e:
                msg = f"{type(e).__name__}: {e}"
                trial.set_user_attr("error", msg)
                self.cache[key] = {"error": msg}
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
        for k, v in record_attrs(rec).items():
            trial.set_user_attr(k, v)
        trial.set_constraint(MEMORY_CONSTRAINT, memory_constraint(rec))
        if self.cfg.pareto:
            return rec["time_s"], float(rec["memory_bytes"])
        return rec["time_s"]

    def _claim(self, trial: optuna.Trial, key: str) -> dict[str, Any] | None:
        """The record of ``key`` when the study has it or a live peer scores it meanwhile;
        None when this worker is to score the plan itself.

        Peers are the RUNNING trials of other live workers whose ``plan_key`` is ``key``.
        The storage is linearizable (a journal file is one ordered log; an RDB commits), and
        each worker writes its key before it reads, so of two workers that draw one plan at
        once the later writer always sees the earlier one; the earlier may not see the later.
        Seeing is therefore what decides, with the trial number as the tie-break and a
        published decision (user attr :data:`CLAIM_ATTR`: ``"scoring"`` or ``"waiting"``)
        for the case where only one of them sees the other:

        - a visible peer that is ``"scoring"``, or any visible peer of lower number: wait
          (publish ``"waiting"``) until the record appears or the reason is gone;
        - a visible peer of higher number that has not decided yet: poll until it decides
          (it only ever waits on lower numbers or on a scorer, so polling upward cannot
          deadlock);
        - otherwise score (publish ``"scoring"`` when any peer is visible).

        Two workers never both score one plan while both live: if the later writer W saw
        the other, V, then V has a lower number (W waits) or a higher one (W scores only
        once V published ``"waiting"``, and V leaves ``"waiting"`` only by writing
        ``"deciding"`` and reading again, which then sees W, a lower number, and waits).
        A peer that dies is not waited for; after :data:`PEER_WAIT_S` this worker scores.
        """
        me = worker_token()
        published: str | None = None
        deadline = time.monotonic() + PEER_WAIT_S
        while True:
            peers = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                     if t.number != trial.number and t.user_attrs.get("plan_key") == key
                     and (owners := trial_owners(t))
                     and all(worker_token(w) != me for w in owners)
                     and any(worker_alive(w) is not False for w in owners)]
            # read after the RUNNING trials: a peer that finished before that read is in it
            self.cache.update(history_cache(self.study))
            rec = self.cache.get(key)
            if rec is not None:
                return rec
            states = [(t.number, t.user_attrs.get(CLAIM_ATTR)) for t in peers]
            wait = any(s == "scoring" or n < trial.number for n, s in states)
            undecided = any(s not in ("scoring", "waiting") for _, s in states)
            if not wait and not undecided:
                if published == "waiting":  # a peer may have read it: retract, then look again
                    trial.set_user_attr(CLAIM_ATTR, published := "deciding")
                    continue
                if peers:
                    trial.set_user_attr(CLAIM_ATTR, "scoring")
                return None
            if wait and published != "waiting":
                trial.set_user_attr(CLAIM_ATTR, published := "waiting")
            if time.monotonic() > deadline:
                return None
            time.sleep(PEER_POLL_S)


def distinct_plans(study: optuna.Study) -> int:
    """Distinct plans ``study`` has scored (simulated or refused by the scorer); a repeat
    of a plan already scored is not counted (issue 36: ``--trials N`` means N distinct
    plans)."""
    return len(history_cache(study))


def optimize(study: optuna.Study, cfg: TuneConfig, scorer: Scorer, n_trials: int,
             timeout: float | None = None,
             on_trial: Callable[[optuna.Study, optuna.trial.FrozenTrial], None] | None = None,
             tree: Any = None) -> int:
    """Run trials until the study holds ``n_trials`` distinct scored plans
    (:func:`distinct_plans`; a draw of a plan scored already is answered from the cache and
    is not counted), ``timeout`` seconds pass, the sampler has exhausted the space
    (bruteforce), or every plan of an enumerable space is scored. Every draw is a legal
    plan (``tuner.legal_draw``: the sampler suggests only legal choices); ``tree`` is the
    space's :class:`tuner.legal_draw.LegalTree` (None: built here). Returns the number of
    trials this call ran."""
    from tuner.legal_draw import legal_tree

    recover_interrupted(study)
    if distinct_plans(study) >= n_trials:
        return 0
    tree = tree if tree is not None else legal_tree(cfg.space, cfg.mode, cfg.template_kinds, cfg.annotation)
    obj = _Objective(study, cfg, scorer, tree)
    # every plan of the space scored: nothing new to draw (full_random's seeds never run out)
    size = None if cfg.mode == RANDOM or tree is None else tree.size
    ran = 0

    def objective(trial: optuna.Trial) -> float | tuple[float, float]:
        if WORKER_ATTR not in study._storage.get_trial_system_attrs(trial._trial_id):
            # a storage without OwnedTrials (in-memory): name the owner now
            study._storage.set_trial_system_attr(trial._trial_id, WORKER_ATTR, worker_id())
        return obj(trial)

    def callback(st: optuna.Study, ft: optuna.trial.FrozenTrial) -> None:
        nonlocal ran
        ran += 1
        if on_trial is not None:
            on_trial(st, ft)
        done = len(obj.cache)
        if done >= n_trials or (size is not None and done >= size) or tree is None:
            st.stop()

    quiet = _InterruptedTrialFilter()
    log = logging.getLogger("optuna.study._optimize")
    log.addFilter(quiet)
    try:
        study.optimize(objective, timeout=timeout, callbacks=[callback])
    except Exception:  # a failed journal write, under Optuna's follow-up errors: say it alone
        failed = write_failure(study._storage)
        if failed is not None:
            raise failed from None
        raise
    finally:
        log.removeFilter(quiet)
    return ran


class _InterruptedTrialFilter(logging.Filter):
    """Drops Optuna's two warnings about a trial that Ctrl-C or a failed journal write
    stopped (its traceback and "failed with value None"): the trial is left FAIL (or
    RUNNING), a resumed search redoes it (:func:`tuner.storage.recover_interrupted`), and
    the CLI prints one ``interrupted:`` or ``error:`` line instead."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[0] if record.exc_info else None
        msg = record.getMessage()
        number = msg.split(" ", 2)[1] if msg.startswith("Trial ") else ""
        if exc is not None and issubclass(exc, (KeyboardInterrupt, JournalWriteError)):
            self.dropped.add(number)
            return False
        return not (number in self.dropped and msg.endswith("failed with value None."))


def run_worker(study_name: str, storage: str | None, n_trials: int | None = None,
               timeout: float | None = None, study_dir: str | None = None,
               factory: Callable[[Mapping[str, Any]], Scorer] | None = None) -> int:
    """Join an existing study (``meshplan worker``): rebuild its scorer from the stored
    factory path and config, and run trials until the study's target (``n_trials``, default
    the stored ``target_trials``) is reached. Returns the trials this worker ran. On an
    exhaustive study it takes open slices of the enumeration until none is left
    (:func:`tuner.exhaustive_shared.run_shared`; ``n_trials`` does not apply) and returns
    the plans it scored."""
    study, cfg = open_study(None, study_name, storage, Path(study_dir) if study_dir else None)
    scorer = (factory or resolve_factory(cfg.scorer_factory))(cfg.scorer_config)
    if cfg.sampler_name == "exhaustive":  # take open slices of the enumeration until none is left
        from tuner.exhaustive_shared import run_shared
        from tuner.suggest import enumerate_candidates

        cands = enumerate_candidates(cfg.space, cfg.mode, cfg.template_kinds, cfg.annotation)
        return run_shared(study, cands, scorer, n_slices=None, timeout=timeout, wait=False)[1]
    target = n_trials if n_trials is not None else int(study.user_attrs.get("target_trials", 0))
    return optimize(study, cfg, scorer, target, timeout)
