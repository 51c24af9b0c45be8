"""``--sampler exhaustive`` on a shared study: many workers, one proof (issue 18 item 5).

The enumerated space (``tuner.suggest.enumerate_candidates``: the same list, in the same
order, in every process of one search) is cut into ``S`` slices, slice ``k`` holding the
candidates whose index ``i`` has ``i mod S == k``. Each slice is proven on its own by
:func:`tuner.exhaustive.run_exhaustive` (bounded, then simulated in the order of its own
bounds), pruning against the best feasible step time found so far by *any* worker (the
study's best at the start, then what each worker posts, :class:`Incumbent`). Why the union is the optimum: let ``T*`` be the fastest
feasible plan of the space, in slice ``k``. The incumbent is always the time of a feasible
plan, so it is ``>= T*``; the worker of slice ``k`` prunes a candidate only when its bound
is ``>= min(slice best, incumbent)``, and the bound of ``T*`` is ``<= T*`` -- so ``T*`` is
either simulated or tied by a plan already found. The best over all slices' simulations is
therefore the optimum, and the counts of the slices (disjoint, their union the space) add
up to the space size.

Claims (so that no slice, hence no plan, is worked on by two live workers): the slices are
the trials of a companion study ``NAME.exhaustive-slices`` in the same storage, one
WAITING trial per slice (user attr ``slice``). A worker takes a slice by moving its trial
from WAITING to RUNNING -- Optuna's own atomic hand-out of enqueued trials: the journal's
log order, or PostgreSQL's row lock, gives the trial to exactly one worker -- and keeps it
only when no other unfailed trial of the same slice has a lower number (a duplicate made
by two repairs at once is dropped, ``duplicate_of``). A worker writes a ``heartbeat``
every :data:`BEAT_S` seconds; a RUNNING slice whose owner is dead (a dead pid on this
host, or no heartbeat for :data:`STALE_S` seconds from another host) is failed
(``interrupted``) and a fresh WAITING trial is made for every slice left without an
unfailed one, so a killed worker's slice is finished by the others, or by the next
``tune`` on resume; its finished plans are read back from the study (``resumed``), never
simulated again. A finished slice is COMPLETE with its report (user attr ``report``), and
the search's report sums them (:func:`merged_report`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import TunerError
from tuner.exhaustive import ExhaustiveReport, plan_key, run_exhaustive
from tuner.result import scored
from tuner.storage import WORKER_ATTR, trial_owners, worker_alive, worker_token

#: the companion study of a study NAME that holds its slices: NAME + this suffix
SLICE_STUDY_SUFFIX = ".exhaustive-slices"
#: user attrs of the search's study: the number of slices and the space size they cut
SLICES_ATTR, SIZE_ATTR = "exhaustive_slices", "exhaustive_space_size"
#: slices per local worker process (more slices than workers: a late worker finds some)
SLICES_PER_WORKER = 4
#: seconds between two heartbeats of a worker on its slice
BEAT_S = 5.0
#: seconds without a heartbeat after which a slice of a worker on another host is taken over
STALE_S = 60.0
#: seconds between two reads of the study's best time (a stale incumbent only prunes less)
INCUMBENT_REFRESH_S = 0.2
#: seconds between two looks for a slice while other workers finish theirs
POLL_S = 0.2
#: seconds a joining worker waits for the lead to record the slices of a new search
JOIN_WAIT_S = 60.0


def slice_study_name(study_name: str) -> str:
    """The companion study that holds the slices of ``study_name``."""
    return study_name + SLICE_STUDY_SUFFIX


def is_slice_study(study_name: str) -> bool:
    """True for a companion study of slices (tools that list a storage's studies skip it)."""
    return study_name.endswith(SLICE_STUDY_SUFFIX)


def study_best(study: optuna.Study) -> float:
    """The smallest step time (s) of a feasible scored trial of ``study`` (inf: none)."""
    best = float("inf")
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        ua = t.user_attrs
        if scored(ua) and ua["memory_bytes"] <= ua["memory_limit_bytes"]:
            best = min(best, float(ua["time_s"]))
    return best


#: companion study system attr prefix under which each worker posts its best time (s)
BEST_PREFIX = "best:"


class Incumbent:
    """``incumbent()`` -> the best feasible step time (s) found by any worker: the study's
    best when created, then the best each worker posts to the companion study
    (:meth:`post`, one small attr per worker: cheaper to read than every trial), re-read at
    most every :data:`INCUMBENT_REFRESH_S` seconds (never larger than a value it returned)."""

    def __init__(self, study: optuna.Study, cs: optuna.Study) -> None:
        self.cs, self.best, self.at, self.mine = cs, study_best(study), -float("inf"), float("inf")
        self.key = BEST_PREFIX + worker_token()

    def post(self, time_s: float) -> None:
        """Record a feasible step time this worker found (posted when it is its best)."""
        if time_s < self.mine:
            self.mine = time_s
            self.cs._storage.set_study_system_attr(self.cs._study_id, self.key, time_s)
        self.best = min(self.best, time_s)

    def __call__(self) -> float:
        now = time.monotonic()
        if now - self.at >= INCUMBENT_REFRESH_S:
            self.at = now
            posted = [float(v) for k, v in self.cs._storage.get_study_system_attrs(self.cs._study_id).items()
                      if k.startswith(BEST_PREFIX) and isinstance(v, (int, float))]
            self.best = min([self.best, *posted])
        return self.best


def _slice(t: FrozenTrial) -> int | None:
    k = t.user_attrs.get("slice")
    return k if isinstance(k, int) else None


def _new_slice_trial(cs: optuna.Study, k: int) -> None:
    """One WAITING trial for slice ``k`` (one storage operation)."""
    cs._storage.create_new_trial(cs._study_id, template_trial=FrozenTrial(
        number=-1, state=TrialState.WAITING, value=None, datetime_start=None,
        datetime_complete=None, params={}, distributions={}, user_attrs={"slice": k},
        system_attrs={}, intermediate_values={}, trial_id=-1))


def open_slices(study: optuna.Study, n_slices: int | None, space_size: int) -> tuple[optuna.Study, int]:
    """The companion study of ``study``'s slices and their number ``S``. The first call
    (``n_slices``: the lead's choice) records ``S`` and the space size in the study; later
    ones (a joining worker passes None, a resume its own choice) use what is recorded; a
    joining worker waits up to :data:`JOIN_WAIT_S` for the lead to record them.

    Raises TunerError when a joining worker finds no slices then or its enumerated space
    differs in size from the recorded one (another meshplan version), or ``n_slices < 1``."""
    ua = study.user_attrs
    end = time.monotonic() + JOIN_WAIT_S
    while n_slices is None and SLICES_ATTR not in ua and time.monotonic() < end:
        time.sleep(POLL_S)  # a worker started with the search: the lead is still cutting
        ua = study._storage.get_study_user_attrs(study._study_id)
    if SLICES_ATTR not in ua:
        if n_slices is None:
            raise TunerError(f"study {study.study_name!r} has no exhaustive slices yet: start the "
                             f"search with `meshplan tune ... --sampler exhaustive` first")
        if n_slices < 1:
            raise TunerError(f"exhaustive slices must be >= 1, got {n_slices}")
        study.set_user_attr(SIZE_ATTR, space_size)
        study.set_user_attr(SLICES_ATTR, n_slices)
        ua = study._storage.get_study_user_attrs(study._study_id)
    if ua.get(SIZE_ATTR, space_size) != space_size:
        raise TunerError(f"study {study.study_name!r} was cut for a space of {ua[SIZE_ATTR]} "
                         f"candidates but this process enumerates {space_size} (another meshplan "
                         f"version?); every worker must enumerate the same space")
    cs = optuna.create_study(study_name=slice_study_name(study.study_name),
                             storage=study._storage, load_if_exists=True)
    s = int(ua[SLICES_ATTR])
    repair(cs, s)
    return cs, s


def _dead(t: FrozenTrial) -> bool:
    """A RUNNING slice whose worker is gone: every owner on this host is dead, or (owner on
    another host) no heartbeat for :data:`STALE_S` seconds."""
    alive = [worker_alive(w) for w in trial_owners(t)]
    if any(a is True for a in alive):
        return False
    if alive and all(a is False for a in alive):
        return True
    beat = t.user_attrs.get("heartbeat")
    if beat is None and t.datetime_start is not None:
        beat = t.datetime_start.timestamp()
    return beat is None or time.time() - float(beat) > STALE_S


def recover(cs: optuna.Study) -> list[int]:
    """Fail the RUNNING slices of dead workers (``interrupted``); returns their slices."""
    out = []
    for t in cs.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if _dead(t):
            try:
                cs._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
                cs._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            except UpdateFinishedTrialError:
                continue  # another worker recovered it first
            out.append(_slice(t))
    return out


def repair(cs: optuna.Study, n_slices: int) -> None:
    """A WAITING trial for every slice that has no unfailed trial (new study, or failed)."""
    live = {_slice(t) for t in cs.get_trials(deepcopy=False) if t.state != TrialState.FAIL}
    for k in range(n_slices):
        if k not in live:
            _new_slice_trial(cs, k)


def claim(cs: optuna.Study, n_slices: int, prefer: Sequence[int] | None = None) -> FrozenTrial | None:
    """Take one open slice (module docstring: the claim rule), or None when none is open;
    ``prefer``: slices in the order to take them (:func:`slice_order`; the others after
    them), else in the order of their trials."""
    recover(cs)
    repair(cs, n_slices)
    st = cs._storage
    rank = {k: r for r, k in enumerate(prefer or ())}
    waiting = cs.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    for t in sorted(waiting, key=lambda u: (rank.get(_slice(u), len(rank)), u.number)):
        try:
            if not st.set_trial_state_values(t._trial_id, TrialState.RUNNING):
                continue  # another worker took it
        except UpdateFinishedTrialError:
            continue
        k = _slice(t)
        lower = [u.number for u in cs.get_trials(deepcopy=False)
                 if _slice(u) == k and u.number < t.number and u.state != TrialState.FAIL]
        if lower or k is None or not 0 <= k < n_slices:
            st.set_trial_user_attr(t._trial_id, "duplicate_of", lower[0] if lower else None)
            st.set_trial_state_values(t._trial_id, TrialState.FAIL)
            continue
        st.set_trial_user_attr(t._trial_id, "heartbeat", time.time())
        return st.get_trial(t._trial_id)
    return None


class _Beat:
    """The ``tick`` of one slice: a heartbeat every :data:`BEAT_S` seconds."""

    def __init__(self, cs: optuna.Study, t: FrozenTrial) -> None:
        self.st, self.tid, self.at = cs._storage, t._trial_id, time.monotonic()

    def __call__(self) -> None:
        if time.monotonic() - self.at >= BEAT_S:
            self.at = time.monotonic()
            try:
                self.st.set_trial_user_attr(self.tid, "heartbeat", time.time())
            except UpdateFinishedTrialError:
                pass  # failed as dead by a peer: the slice is redone there; finish harmlessly


def slice_members(k: int, n_slices: int, space_size: int) -> range:
    """Indices of slice ``k``: ``k, k + S, k + 2S, ... < space_size``."""
    return range(k, space_size, n_slices)


def merged_report(cs: optuna.Study, n_slices: int, space_size: int) -> ExhaustiveReport:
    """The search's report: the sum of every finished slice's report (the first finished
    trial of each slice), the best over them; proven when every slice is finished."""
    rep = ExhaustiveReport(space_size=space_size, slices=n_slices)
    seen: dict[int, ExhaustiveReport] = {}
    owners = set()
    for t in sorted(cs.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda u: u.number):
        k = _slice(t)
        if k is None or k in seen or "report" not in t.user_attrs:
            continue
        seen[k] = ExhaustiveReport.from_dict(t.user_attrs["report"])
        w = t.system_attrs.get(WORKER_ATTR)
        owners.add(worker_token(w) if w else str(t.number))
    for r in seen.values():
        for f in ("simulated", "resumed", "refused", "pruned_memory", "pruned_time", "pruned_cheap"):
            setattr(rep, f, getattr(rep, f) + getattr(r, f))
        rep.refusal = rep.refusal or r.refusal
        if r.best_time_s is not None and (rep.best_time_s is None or r.best_time_s < rep.best_time_s):
            rep.best_time_s, rep.best_index = r.best_time_s, r.best_index
    rep.slices_done, rep.workers = len(seen), len(owners)
    rep.proven = len(seen) == n_slices
    return rep


#: the shortest turn (s) of branch and bound a worker spends on one slice when a time
#: budget is shared among the open slices (:func:`run_shared`)
MIN_TURN_S = 2.0


def _open_slices(cs: optuna.Study, n_slices: int) -> int:
    """Slices without a finished (COMPLETE) trial."""
    done = {_slice(t) for t in cs.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}
    return sum(k not in done for k in range(n_slices))


def _last_stop(cs: optuna.Study, k: int) -> FrozenTrial | None:
    """The latest trial of slice ``k`` stopped with its open bound known (a stop during
    the bounding records None: nothing is known below the candidates not bounded)."""
    ts = [t for t in cs.get_trials(deepcopy=False, states=(TrialState.FAIL,))
          if _slice(t) == k and t.user_attrs.get("open_bound") is not None]
    return max(ts, key=lambda t: t.number, default=None)


def _cheap_bounds(candidates: Sequence[Any], members: Sequence[int], scorer: Any,
                  memo: dict[str, dict[int, Any]] | None = None) -> tuple[float | None, dict[str, Any]]:
    """(smallest cheap bound, per-shape bounds) of a slice no worker has started: each
    member's ``scorer.cheap_bound`` (else ``bound``; ``memo``: those already computed,
    as :func:`tuner.exhaustive.run_exhaustive` keeps them); a member that cannot fit is
    left out, one without a bound makes the bound unknown (None)."""
    import numpy as np

    from tuner.exhaustive import candidate_bounds
    from tuner.gap import open_min, shape_bounds

    cheap = getattr(scorer, "cheap_bound", None)
    known = (memo or {}).get("cheap" if cheap is not None else "tight", {})
    bound = cheap or scorer.bound
    cands = [candidates[i] for i in members]
    bounds = (known.get(i) or candidate_bounds(bound, x) for i, x in zip(members, cands, strict=True))
    lower = np.array([t if m <= c else np.inf for t, m, c in bounds])
    return open_min(lower)[1], shape_bounds(cands, lower)


def open_bound(cs: optuna.Study, n_slices: int, candidates: Sequence[Any], scorer: Any,
               memo: dict[str, dict[int, Any]] | None = None) -> tuple[float | None, dict[str, Any]]:
    """The smallest lower bound (s) over every candidate of the unfinished slices that was
    not decided, and the per-shape bounds of the whole space (``tuner.gap.merge_shapes``):
    a finished slice gives its report's, a stopped one the open bound it recorded when it
    stopped (a bound on fewer candidates since, so still a bound), one never started (or
    stopped before its bounds were known) the cheap bounds of its members
    (:func:`_cheap_bounds`, ``memo`` the bounds this process computed). The bound is None
    when unknown or when nothing is open."""
    from tuner.gap import merge_shapes

    done: dict[int, dict[str, Any]] = {}
    for t in sorted(cs.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda u: u.number):
        k = _slice(t)
        if k is not None and "report" in t.user_attrs:
            done.setdefault(k, t.user_attrs["report"].get("shapes") or {})
    low: float | None = float("inf")
    parts = list(done.values())
    for k in range(n_slices):
        if k in done:
            continue
        last = _last_stop(cs, k)
        if last is not None:
            b, shapes = last.user_attrs["open_bound"], last.user_attrs.get("shapes") or {}
        else:
            b, shapes = _cheap_bounds(candidates, slice_members(k, n_slices, len(candidates)), scorer, memo)
        parts.append(shapes)
        low = None if b is None or low is None else min(low, float(b))
    return (None if low is None or math.isinf(low) else low), merge_shapes(parts)


def slice_order(candidates: Sequence[Any], n_slices: int, scorer: Any, memo: dict[str, dict[int, Any]],
                deadline: float | None = None) -> list[int] | None:
    """The slices, most promising first: by the smallest first-tier bound of a member that
    may fit (``scorer.cheap_bound``, else ``bound``, as :func:`tuner.exhaustive.run_exhaustive`
    takes them, kept in ``memo`` for its turns), ties by slice number; a slice whose
    members all cannot fit last. A slice that holds a fast plan is searched first, and its
    incumbent prunes the others by their cheap bounds before their layouts are costed
    (Llama-3.1-405B on 2,048 GPUs with cp and FP8: one slice's smallest cheap bound is
    16.1 s, the optimum 12.06 s). The order only changes which slice is worked on first,
    not what is proven. None when ``deadline`` (``time.monotonic()``) passes first."""
    from tuner.exhaustive import first_tier_bounds

    first = first_tier_bounds(scorer, candidates, memo)
    low = [math.inf] * n_slices
    for j in range(len(candidates)):
        if j % 1024 == 0 and deadline is not None and time.monotonic() > deadline:
            return None
        b = first(j)
        if b[1] <= b[2]:
            low[j % n_slices] = min(low[j % n_slices], b[0])
    return sorted(range(n_slices), key=lambda k: (low[k], k))


def _release(cs: optuna.Study, t: FrozenTrial, r: ExhaustiveReport) -> None:
    """Fail a slice whose turn or budget ended (``stopped``), recording its open bound (None:
    unknown) and per-shape bounds, so that a resume redoes it from the study's history."""
    ob = r.open_bound_s
    st = cs._storage
    st.set_trial_user_attr(t._trial_id, "stopped", True)
    st.set_trial_user_attr(t._trial_id, "open_bound", ob if ob is not None and math.isfinite(ob) else None)
    st.set_trial_user_attr(t._trial_id, "shapes", r.shapes or {})
    st.set_trial_state_values(t._trial_id, TrialState.FAIL)


def run_shared(study: optuna.Study, candidates: Sequence[Any], scorer: Any, *,
               n_slices: int | None, timeout: float | None = None, wait: bool = True,
               max_simulated: int | None = None) -> tuple[ExhaustiveReport, int]:
    """Work on the slices of ``study`` until none is open; with ``wait`` (the ``tune``
    process) also until every slice is finished, taking over the slices of workers that
    die meanwhile; the first turns go to the most promising slices (:func:`slice_order`).
    ``n_slices``: the slices to cut a new search into (None: join one).

    With a ``timeout`` (s) a worker takes turns: a slice gets at most the time left divided
    by the slices still open (at least :data:`MIN_TURN_S` of branch and bound), then it is
    released (failed, ``stopped``, with its open bound) and the next open slice is taken,
    so that when the budget ends every slice has been searched alike and the answer's
    bound covers them all (a slice never started is bounded by its cheap bounds). When the
    time or ``max_simulated`` (plans scored by this process) runs out, the slice in hand is
    released and the report is not proven: its ``open_bound_s`` is then the smallest
    bound over every undecided candidate of the space (:func:`open_bound`), and its
    ``shapes`` the per-shape bounds.

    Returns (the merged report, plans this process scored). Raises TunerError as
    :func:`open_slices` and :func:`tuner.exhaustive.run_exhaustive` do."""
    t0 = time.monotonic()
    deadline = None if timeout is None else t0 + timeout
    n = len(candidates)
    cs, s = open_slices(study, n_slices, n)
    incumbent, history, mine = Incumbent(study, cs), {}, 0
    memo: dict[str, dict[int, Any]] = {}  # this process's bounds, reused when a slice comes round again
    order = slice_order(candidates, s, scorer, memo, deadline)
    taken: set[int] = set()  # slices this process had a turn on: then in the claim's own order

    def on_scored(i: int) -> None:  # post a feasible score so that peers prune against it
        rec = history[plan_key(candidates[i])]
        if "error" not in rec and rec["memory_bytes"] <= rec["memory_limit_bytes"]:
            incumbent.post(float(rec["time_s"]))

    from tuner.result import history_cache

    budget_out = False
    while not budget_out and (deadline is None or time.monotonic() < deadline):
        t = claim(cs, s, None if order is None else [k for k in order if k not in taken])
        if t is None:
            if not wait or merged_report(cs, s, n).proven:
                break
            time.sleep(POLL_S)
            continue
        history.update(history_cache(study))
        taken.add(_slice(t))
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        turn = None if left is None else max(MIN_TURN_S, left / max(1, _open_slices(cs, s)))
        cap = None if max_simulated is None else max(0, max_simulated - mine)
        r = run_exhaustive(study, candidates, scorer, history, left, on_scored=on_scored,
                           members=slice_members(_slice(t), s, n), incumbent=incumbent,
                           tick=_Beat(cs, t), max_simulated=cap, quantum=turn, memo=memo)
        mine += r.simulated - r.resumed
        budget_out = ((deadline is not None and time.monotonic() >= deadline)
                      or (max_simulated is not None and mine >= max_simulated))
        try:
            if r.proven:
                cs._storage.set_trial_user_attr(t._trial_id, "report", r.to_dict())
                cs._storage.set_trial_state_values(t._trial_id, TrialState.COMPLETE, [float(r.simulated)])
            else:
                _release(cs, t, r)
        except UpdateFinishedTrialError:
            pass  # a peer took this slice as dead meanwhile; its copy will be counted
    rep = merged_report(cs, s, n)
    if not rep.proven:
        rep.open_bound_s, rep.shapes = open_bound(cs, s, candidates, scorer, memo)
        rep.open = n - rep.decided
    else:
        rep.shapes = open_bound(cs, s, candidates, scorer, memo)[1]
    rep.seconds = time.monotonic() - t0
    return rep, mine


__all__ = ["BEAT_S", "Incumbent", "MIN_TURN_S", "open_bound", "SLICES_PER_WORKER", "SLICE_STUDY_SUFFIX", "STALE_S", "claim",
           "is_slice_study", "merged_report", "open_slices", "recover", "repair", "run_shared",
           "slice_members", "slice_order", "slice_study_name", "study_best"]
