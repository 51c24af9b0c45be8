"""Run a whole search: open (or resume) the study, start local workers, show progress.

``search(cfg, study_name, storage=..., study_dir=..., n_trials=..., workers=N)`` is what
``meshplan tune`` calls; the scorer comes from ``cfg.scorer_factory`` (see
:mod:`tuner.study`). With ``workers > 1`` the other ``workers - 1`` processes are started
with the ``spawn`` method and join the same study through its storage (an in-memory study
cannot be shared: that raises TuneError).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

from tuner.bound_seed import check_seed_option, gap_report, seed_study
from tuner.exhaustive import run_exhaustive
from tuner.exhaustive_shared import (
    SLICES_PER_WORKER,
    is_slice_study,
    open_slices,
    run_shared,
    study_best,
)
from tuner.gap import ANSWER_ATTR, SearchAnswer, from_report, gap_seconds
from tuner.result import ProgressReporter, TuneResult
from tuner.sampled_gap import sampled_gap
from tuner.study import (
    TuneConfig,
    TuneError,
    distinct_plans,
    history_cache,
    open_study,
    optimize,
    resolve_factory,
    run_worker,
)
from tuner.suggest import enumerate_candidates

MEMORY = "memory"


def _worker_main(study_name: str, storage: str | None, n_trials: int, timeout: float | None,
                 study_dir: str | None) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        run_worker(study_name, storage, n_trials, timeout, study_dir)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the lead reports it
        raise SystemExit(130) from None
    except ValueError as e:  # a failed journal write (full disk ...): one line, not a traceback
        print(f"error: worker: {' '.join(str(e).split())}", file=sys.stderr)
        raise SystemExit(2) from None


#: trials (distinct plans) of a sampled search when none is given
DEFAULT_TRIALS = 100


def search(cfg: TuneConfig, study_name: str, *, storage: str | None = None,
           study_dir: str | Path | None = None, n_trials: int | None = None,
           timeout: float | None = None, workers: int = 1, progress: bool = False,
           progress_bar: Any = None, seed_from_bound: int | None = None) -> TuneResult:
    """Run (or resume) the search until it is proven, its budget is spent, or (a sampled
    search) the study holds ``n_trials`` distinct scored plans.

    Args:
        cfg: the search; study_name: the study; storage: None (journal file in
            ``study_dir``), ``"memory"`` (in-memory, nothing kept), a journal path or a
            database URL; n_trials: distinct plans to score (a sampled search: default
            :data:`DEFAULT_TRIALS`; the branch and bound: at most that many, None: no
            cap); timeout: the time budget (s; None: none); workers: local processes on
            the study; progress: rich progress bar (``progress_bar``: its class, see
            :class:`tuner.result.ProgressReporter`); seed_from_bound: enqueue the K
            candidates of lowest step-time bound first (:mod:`tuner.bound_seed`; None: its
            default, 0: off); ``result.bound_gap`` is that report.

    With ``cfg.sampler`` ``exhaustive`` (the default) the search is a branch and bound: in
    memory one search (:mod:`tuner.exhaustive`); on a shared storage the space is cut into
    ``SLICES_PER_WORKER * workers`` slices (at its first start) that this process, its
    ``workers - 1`` local workers and any ``meshplan worker`` joining the study share
    (:mod:`tuner.exhaustive_shared`); ``result.exhaustive`` is the report. Every search
    ends with ``result.answer`` (:class:`tuner.gap.SearchAnswer`: the best plan and the
    proven lower bound, the gap), also stored in the study's user attr ``answer``.

    Raises TuneError for workers > 1 on an in-memory study, a study holding another
    search, or an exhaustive Pareto search; TunerError for a ``seed_from_bound`` the
    sampler cannot take.
    """
    t0 = time.monotonic()
    if n_trials is not None and n_trials < 1:
        raise TuneError(f"trials must be >= 1, got {n_trials}")
    if workers < 1:
        raise TuneError(f"workers must be >= 1, got {workers}")
    in_memory = storage == MEMORY or (storage is None and study_dir is None)
    if in_memory and workers > 1:
        raise TuneError("--workers > 1 needs a shared storage (a study directory or a database URL)")
    check_seed_option(cfg.sampler_name, seed_from_bound)
    exhaustive = cfg.sampler_name == "exhaustive"
    if exhaustive:
        check_exhaustive(cfg)
    sdir = None if in_memory else (Path(study_dir) if study_dir is not None else None)
    url = None if storage == MEMORY else storage
    study, cfg = open_study(cfg, study_name, url, sdir)
    target = n_trials if n_trials is not None or exhaustive else DEFAULT_TRIALS
    if target is not None:
        study.set_user_attr("target_trials", target)
    scorer = resolve_factory(cfg.scorer_factory)(cfg.scorer_config)
    if exhaustive:
        res = _branch_and_bound(study, cfg, scorer, in_memory, workers, timeout, target, t0,
                                (study_name, url, sdir))
    else:
        res = _sampled(study, cfg, scorer, workers, timeout, target, t0, (study_name, url, sdir),
                       progress, progress_bar, seed_from_bound)
    study.set_user_attr(ANSWER_ATTR, res.answer.to_dict())
    return res


def _start_workers(workers: int, where: tuple[str, str | None, Path | None], n_trials: int | None,
                   timeout: float | None) -> list[Any]:
    """Start ``workers - 1`` local worker processes on the study ``where`` (name, storage,
    folder)."""
    name, url, sdir = where
    ctx = mp.get_context("spawn")
    procs = []
    for _ in range(workers - 1):
        p = ctx.Process(target=_worker_main, args=(name, url, n_trials or 0, timeout,
                                                   str(sdir) if sdir else None))
        p.start()
        procs.append(p)
    return procs


def _join(procs: list[Any]) -> None:
    """Wait for the local workers; raises TuneError when one failed."""
    for p in procs:
        p.join()
    bad = [p.exitcode for p in procs if p.exitcode]
    if bad:
        raise TuneError(f"{len(bad)} worker process(es) exited with codes {bad}")


def _stopped_by(timeout: float | None, rep: Any, cap: int | None, scored: int) -> str | None:
    """Why an unproven branch and bound stopped: its time budget or its trial budget
    (``scored`` distinct plans in the study)."""
    if rep.proven:
        return None
    if cap is not None and scored >= cap:
        return "trial budget"
    return "time budget" if timeout is not None else None


def _branch_and_bound(study: Any, cfg: TuneConfig, scorer: Any, in_memory: bool, workers: int,
                      timeout: float | None, cap: int | None, t0: float,
                      where: tuple[str, str | None, Path | None]) -> TuneResult:
    """The default search (module :mod:`tuner.exhaustive`): one branch and bound in memory,
    or the shared slices of a stored study; its answer from the report."""
    cands = enumerate_candidates(cfg.space, cfg.mode, cfg.template_kinds, cfg.annotation)
    left = None if timeout is None else max(1e-3, timeout - (time.monotonic() - t0))
    res = TuneResult(study, cfg.space.problem.global_batch_size, cfg.pareto)
    if in_memory:
        rep = run_exhaustive(study, cands, scorer, history_cache(study), left, max_simulated=cap)
    else:
        # cut the space before any worker starts: a worker joins the recorded slices
        open_slices(study, SLICES_PER_WORKER * workers, len(cands))
        procs = _start_workers(workers, where, cap, left) if workers > 1 else []
        try:
            rep, _ = run_shared(study, cands, scorer, n_slices=None, timeout=left, wait=True,
                                max_simulated=cap)
        finally:
            _join(procs)
    rep.seconds = time.monotonic() - t0
    res.exhaustive = rep
    scored = distinct_plans(study)
    best = study_best(study)  # the study's: a slice stopped unfinished may hold the best
    if math.isfinite(best) and (rep.best_time_s is None or best < rep.best_time_s):
        rep.best_time_s = best  # the report's line states the study's best, not the slices'
    res.answer = from_report(rep, "exhaustive", _stopped_by(timeout, rep, cap, scored), scored=scored,
                             best_s=best if math.isfinite(best) else None)
    return res


def _sampled(study: Any, cfg: TuneConfig, scorer: Any, workers: int, timeout: float | None,
             n_trials: int, t0: float, where: tuple[str, str | None, Path | None],
             progress: bool, progress_bar: Any, seed_from_bound: int | None) -> TuneResult:
    """A sampled search (TPE, random, bruteforce) of legal plans only, then its gap
    (:func:`tuner.sampled_gap.sampled_gap`)."""
    from tuner.legal_draw import legal_tree

    tree = legal_tree(cfg.space, cfg.mode, cfg.template_kinds, cfg.annotation)
    done = distinct_plans(study)
    # seeds go in before any worker starts: every worker pops them
    seeds = seed_study(study, cfg.space, cfg.mode, cfg.template_kinds, cfg.annotation,
                       cfg.sampler_name, scorer, seed_from_bound, n_trials - done,
                       None if timeout is None else t0 + timeout, tree)
    left = None if timeout is None else max(1e-3, timeout - (time.monotonic() - t0))
    procs = _start_workers(workers, where, n_trials, left) if workers > 1 else []
    try:
        with ProgressReporter(n_trials, min(done, n_trials), enabled=progress,
                              bar=progress_bar) as rep:
            optimize(study, cfg, scorer, n_trials, left, on_trial=rep, tree=tree)
    finally:
        _join(procs)
    res = TuneResult(study, cfg.space.problem.global_batch_size, cfg.pareto)
    res.bound_gap = None if seeds is None else gap_report(study, seeds)
    elapsed = time.monotonic() - t0
    res.answer = sampled_gap(study, cfg, scorer, gap_seconds(timeout), elapsed)
    return res


def check_exhaustive(cfg: TuneConfig) -> None:
    """Raises TuneError for an exhaustive Pareto search (it minimises step time) and for
    mode full_random (an annotation seed drawn per trial: no space to enumerate), before
    anything is written."""
    if cfg.pareto:
        raise TuneError("--sampler exhaustive minimises step time; it cannot be combined with --pareto")
    if cfg.mode == "full_random":
        raise TuneError("--sampler exhaustive enumerates the space, but --mode full_random draws an "
                        "annotation seed per trial and cannot be enumerated; use --sampler tpe or "
                        "random with it")


def other_studies(output: str | Path, study: str) -> list[str]:
    """The studies other than ``study`` in the journal of a ``meshplan tune --output DIR``
    (``DIR/journal.log``; [] when there is none yet): the searches an earlier command line
    of another configuration left there (an option, or a default a newer meshplan
    changed), which a rerun does not resume. Exhaustive slice studies are left out."""
    import optuna

    from tuner.storage import open_storage

    journal = Path(output) / "journal.log"
    if not journal.is_file():
        return []
    st = open_storage(str(journal), None)
    return [n for n in optuna.get_all_study_names(storage=st) if n != study and not is_slice_study(n)]


def load_result(output: str | Path, study: str | None = None) -> TuneResult:
    """The :class:`tuner.result.TuneResult` of a finished (or interrupted) ``meshplan tune
    --output DIR``: the study in ``DIR/journal.log`` (``output`` may also be the journal
    file itself), by name or, when ``study`` is None, the only one there. For
    ``TuneResult.to_dataframe()`` and friends, e.g. ``load_result("runs/7b").to_dataframe()``.

    Raises TuneError when the journal is missing, holds no study of that name, or several
    studies and none was named."""
    import optuna

    from tuner.storage import open_storage
    from tuner.study import CONFIG_ATTR

    path = Path(output)
    journal = path / "journal.log" if path.is_dir() else path
    if not journal.is_file():
        raise TuneError(f"no tune journal at {str(journal)!r} (the --output of meshplan tune)")
    st = open_storage(str(journal), None)
    names = [n for n in optuna.get_all_study_names(storage=st) if not is_slice_study(n)]
    if study is None:
        if len(names) != 1:
            raise TuneError(f"{journal} holds {len(names)} studies ({', '.join(names)}); name one")
        study = names[0]
    if study not in names:
        raise TuneError(f"{journal} holds no study {study!r}; it holds {', '.join(names) or 'none'}")
    s = optuna.load_study(study_name=study, storage=st)
    cfg = TuneConfig.from_dict(s.user_attrs[CONFIG_ATTR])
    res = TuneResult(s, cfg.space.problem.global_batch_size, cfg.pareto)
    if ANSWER_ATTR in s.user_attrs:
        res.answer = SearchAnswer.from_dict(s.user_attrs[ANSWER_ATTR])
    return res
