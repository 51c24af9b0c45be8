"""Search results: history, best plans, tables, progress.

History columns use the project's one vocabulary (issue 40): the plan's knobs by the
names of ``completion.strategy.Strategy`` (``dp``, ``tp``, ``pp``, ``vpp``, ``cp``, ``ep``,
``micro_batch_size``, ``zero``, ``fsdp_shard_size``, ``recompute``, ``sequence_parallel``,
``schedule``, ``fp8``, ``annotation``), ``num_microbatches`` and the metrics by the names of
``meshplan cost --json`` (``tokens_per_s``, ``mfu``, ``bubble_ratio``,
``memory_limit_bytes``), the step time and peak as ``sizes.csv`` names them
(``step_time_s``, ``peak_memory_bytes``), and the search's own columns (``trial``, Optuna's
trial number; ``state``; ``templates``; ``oom``, ``feasible``, ``cached``,
``pruned_reason``). Units: ``step_time_s`` is the step time in seconds (empty for a pruned
trial); ``peak_memory_bytes`` is the peak memory over ranks in bytes; ``oom`` says the plan
needs more than ``memory_limit_bytes``. Integer columns are integers (pandas ``Int64``,
empty where a pruned trial has no value) and flags are booleans.

PaddlePaddle's auto-tuner names (``dp_degree``, ``mp_degree``, ``sharding_stage``,
``use_recompute``, ``time``, ``max_mem_usage``, ...; Paddle 2.6
``python/paddle/distributed/auto_tuner/recorder.py`` writes them) only on request:
:func:`paddle_view`, ``TuneResult.to_dataframe(names="paddle")``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from optuna.trial import TrialState

from tuner.errors import TunerError
from tuner.space import Candidate

HISTORY_COLUMNS = (
    "trial", "state", "dp", "tp", "pp", "vpp", "cp", "ep", "micro_batch_size", "num_microbatches",
    "zero", "fsdp_shard_size", "recompute", "sequence_parallel", "schedule", "fp8", "annotation",
    "templates", "step_time_s", "tokens_per_s", "mfu", "bubble_ratio", "peak_memory_bytes",
    "memory_limit_bytes", "oom", "feasible", "cached", "pruned_reason",
)
#: history columns holding integers (nullable: a pruned trial may have none) and flags
INT_COLUMNS = ("trial", "dp", "tp", "pp", "vpp", "cp", "ep", "micro_batch_size", "num_microbatches",
               "zero", "fsdp_shard_size", "peak_memory_bytes", "memory_limit_bytes")
BOOL_COLUMNS = ("sequence_parallel", "oom", "feasible", "cached")
#: the project's history column -> PaddlePaddle's auto-tuner name (``paddle_view``)
PADDLE_NAMES = {"trial": "job_id", "dp": "dp_degree", "tp": "mp_degree", "pp": "pp_degree",
                "vpp": "vpp_degree", "cp": "cp_degree", "ep": "ep_degree",
                "num_microbatches": "acc_steps", "zero": "sharding_stage",
                "schedule": "schedule_mode", "step_time_s": "time",
                "peak_memory_bytes": "max_mem_usage"}
GIB = 1024**3

SCORE_KEYS = ("time_s", "memory_bytes", "memory_limit_bytes")


#: the name of the trial constraint that says whether a plan fits (``trial.set_constraint``)
MEMORY_CONSTRAINT = "memory"


def memory_constraint(rec: Mapping[str, Any]) -> float:
    """The ``memory`` constraint of a score record: ``memory_bytes / memory_limit_bytes - 1``
    (dimensionless; <= 0 when the plan fits, Optuna's feasibility rule)."""
    return rec["memory_bytes"] / rec["memory_limit_bytes"] - 1.0


def record_attrs(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The user attrs a scored trial carries, in the order they are written (``time_s``
    last: a reader that sees it sees the rest): ``metrics``, ``memory_limit_bytes``,
    ``memory_gib`` and ``memory_limit_gib`` (the same figures in GiB, for optuna-dashboard's
    trial table), ``feasible`` (peak <= limit: optuna-dashboard shows an out-of-memory
    plan as such, beside its ``memory`` constraint), ``memory_bytes``, ``time_s``."""
    mem, lim = int(rec["memory_bytes"]), int(rec["memory_limit_bytes"])
    return {"metrics": rec["metrics"], "memory_limit_bytes": lim,
            "memory_gib": round(mem / GIB, 3), "memory_limit_gib": round(lim / GIB, 3),
            "feasible": mem <= lim, "memory_bytes": mem, "time_s": rec["time_s"]}


def scored(user_attrs: Mapping[str, Any]) -> bool:
    """True when a trial carries a whole score record (a worker killed while writing it
    can leave part of it)."""
    return all(k in user_attrs for k in SCORE_KEYS)


def _fits(t: optuna.trial.FrozenTrial) -> bool:
    """A scored trial fits in memory: every constraint it carries is <= 0 (Optuna's rule;
    the ``memory`` constraint is peak / limit - 1), and its peak is at most the limit."""
    ua = t.user_attrs
    return (all(v <= 0.0 for v in t.constraints.values())
            and ua.get("memory_bytes", 1) <= ua.get("memory_limit_bytes", 0))


def _one_per_plan(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """``trials`` sorted by (time_s, memory_bytes, number), keeping the first of each plan_key."""
    seen, out = set(), []
    for t in sorted(trials, key=lambda t: (t.user_attrs["time_s"], t.user_attrs["memory_bytes"], t.number)):
        k = t.user_attrs.get("plan_key")
        if k not in seen:
            seen.add(k)
            out.append(t)
    return out


def _row(t: optuna.trial.FrozenTrial, global_batch: int) -> dict[str, Any]:
    ua = t.user_attrs
    plan = ua.get("plan") or {}
    row: dict[str, Any] = dict.fromkeys(HISTORY_COLUMNS)
    # oom: True only for a scored plan over the limit (an unscored trial needs nothing)
    row.update(trial=t.number, state=t.state.name, oom=False,
               pruned_reason=ua.get("illegal") or ua.get("error") or
               ("interrupted" if ua.get("interrupted") else None))
    if plan:
        dp, mbs = plan["dp"], plan["micro_batch_size"]
        row.update({k: plan.get(k) for k in ("dp", "tp", "pp", "vpp", "recompute", "zero", "schedule",
                                             "sequence_parallel", "annotation", "fsdp_shard_size")},
                   micro_batch_size=mbs, num_microbatches=global_batch // (dp * mbs),
                   fp8=plan.get("fp8") or "none", cp=plan.get("cp", 1), ep=plan.get("ep", 1),
                   templates=",".join(f"{k}={v}" for k, v in sorted(plan["templates"].items()))
                   or (f"seed={plan['annotation_seed']}"
                       if plan.get("annotation_seed") is not None else None))
    if scored(ua):
        mem, lim = ua["memory_bytes"], ua["memory_limit_bytes"]
        m = ua.get("metrics", {})
        row.update(step_time_s=ua["time_s"], tokens_per_s=m.get("tokens_per_s"), mfu=m.get("mfu"),
                   bubble_ratio=m.get("bubble_ratio"), peak_memory_bytes=mem, memory_limit_bytes=lim,
                   oom=mem > lim, feasible=mem <= lim, cached=bool(ua.get("cached")))
    return row


def paddle_view(history: pd.DataFrame) -> pd.DataFrame:
    """``history`` (:data:`HISTORY_COLUMNS`) under PaddlePaddle's auto-tuner names
    (:data:`PADDLE_NAMES`; Paddle 2.6 ``python/paddle/distributed/auto_tuner``), with its
    derived columns: ``sharding_degree`` (the ranks ZeRO shards over: the HSDP group, else
    dp; 1 without ZeRO), ``use_recompute`` and ``recompute_granularity`` in place of
    ``recompute``. Units as in the history (``time`` in seconds, ``max_mem_usage`` in
    bytes, never Paddle's string ``OOM``: the ``oom`` column says it)."""
    df = history.copy()
    zero, dp = df["zero"], df["dp"]
    shard = df["fsdp_shard_size"].fillna(dp).where(zero.fillna(0) > 0, 1).where(dp.notna())
    rc = df["recompute"]
    df.insert(df.columns.get_loc("fsdp_shard_size"), "sharding_degree", shard.astype("Int64"))
    df.insert(df.columns.get_loc("recompute"), "use_recompute", (rc != "none").where(rc.notna()).astype("boolean"))
    df["recompute"] = rc.where(rc != "none")
    df = df.drop(columns=["fsdp_shard_size"]).rename(columns={**PADDLE_NAMES, "recompute": "recompute_granularity"})
    return df


@dataclass
class TuneResult:
    """The outcome of a search over one study.

    Attributes: study (the Optuna study); global_batch_size (for acc_steps); pareto:
    whether the study minimised (time, memory).
    """

    study: optuna.Study
    global_batch_size: int
    pareto: bool = False
    exhaustive: Any = None
    """The ``tuner.exhaustive.ExhaustiveReport`` of an exhaustive search (else None)."""
    bound_gap: Any = None
    """The ``tuner.bound_seed.BoundGap`` of a search seeded from the bound (else None)."""
    answer: Any = None
    """The ``tuner.gap.SearchAnswer`` of the search: its best plan and the proven lower
    bound on the optimum (None: a result built by hand, or a study written before it)."""

    def trials(self) -> list[optuna.trial.FrozenTrial]:
        """All trials of the study, in trial-number order (not copied)."""
        return self.study.get_trials(deepcopy=False)

    def history_trials(self) -> list[optuna.trial.FrozenTrial]:
        """The trials of the history, in trial-number order: every trial except a failed
        one (a kill interrupted it, user attr ``interrupted``, or a journal write failed
        under it) whose plan was enqueued again (a trial with ``retry_of`` its number,
        :func:`tuner.storage.recover_interrupted`): that plan's row is its retry's, so the
        history has one row per plan drawn."""
        trials = self.trials()
        retried = {t.user_attrs.get("retry_of") for t in trials}
        return [t for t in trials if not (t.state == TrialState.FAIL and t.number in retried)]

    def to_dataframe(self, names: str = "meshplan") -> pd.DataFrame:
        """One row per trial of :meth:`history_trials` with :data:`HISTORY_COLUMNS`, ordered
        by trial number; ``names="paddle"``: PaddlePaddle's auto-tuner columns instead
        (:func:`paddle_view`). Raises ValueError for another ``names``."""
        if names not in ("meshplan", "paddle"):
            raise TunerError(f"names: 'meshplan' or 'paddle', got {names!r}")
        rows = [_row(t, self.global_batch_size) for t in self.history_trials()]
        df = pd.DataFrame(rows, columns=list(HISTORY_COLUMNS))
        df = df.astype({**{c: "Int64" for c in INT_COLUMNS}, **{c: "boolean" for c in BOOL_COLUMNS}})
        return paddle_view(df) if names == "paddle" else df

    def write_history_csv(self, path: str | Path) -> Path:
        """Write :meth:`to_dataframe` as CSV to ``path`` (parent directories created);
        returns the path. Raises OSError when the path cannot be written."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        self.to_dataframe().to_csv(p, index=False)
        return p

    def _tagged(self) -> list[tuple[str, list[str]]]:
        """Each trial's state (lower case, Optuna's names) and the subsets it is in:
        ``illegal`` or ``error`` (pruned), ``oom`` (scored over its memory limit),
        ``cached`` (answered from the score cache)."""
        out = []
        for t in self.trials():
            ua, tags = t.user_attrs, []
            if t.state == TrialState.PRUNED:
                tags.append("illegal" if "illegal" in ua else "error")
            if scored(ua) and ua["memory_bytes"] > ua["memory_limit_bytes"]:
                tags.append("oom")
            if ua.get("cached"):
                tags.append("cached")
            out.append((t.state.name.lower(), tags))
        return out

    def counts(self) -> dict[str, int]:
        """complete / pruned (illegal, error) / failed / oom / cached trial counts."""
        c: Counter[str] = Counter()
        for state, tags in self._tagged():
            c[state] += 1
            c.update(tags)
        return dict(c)

    def counts_text(self) -> str:
        """The trial counts in words, each subset inside the state it belongs to, e.g.
        ``"12 trials: 9 complete (2 over memory, 3 cached), 3 pruned (2 illegal, 1 error)"``
        (``cached``: answered from the study's score cache, in either state; a state or
        subset of 0 is left out; ``"0 trials"`` for an empty study). :meth:`counts` has the
        same figures as a flat dict, where the subsets overlap their states."""
        states: Counter[str] = Counter()
        subsets: dict[str, Counter[str]] = {}
        for state, tags in self._tagged():
            state = "failed" if state == "fail" else state
            states[state] += 1
            subsets.setdefault(state, Counter()).update("over memory" if g == "oom" else g for g in tags)
        parts = []
        for state in ("complete", "pruned", "failed", "running", "waiting"):
            if states[state]:
                sub = subsets[state]
                inner = ", ".join(f"{sub[k]} {k}" for k in ("over memory", "illegal", "error", "cached")
                                  if sub[k])
                parts.append(f"{states[state]} {state}" + (f" ({inner})" if inner else ""))
        return f"{sum(states.values())} trials" + (": " + ", ".join(parts) if parts else "")

    def feasible(self) -> list[optuna.trial.FrozenTrial]:
        """Complete trials that fit in memory (the ``memory`` constraint <= 0), fastest
        first (equal times: lower peak memory first, then trial number), one per distinct
        plan."""
        return _one_per_plan([t for t in self.trials() if t.state == TrialState.COMPLETE
                              and scored(t.user_attrs) and _fits(t)])

    def best_trial(self) -> optuna.trial.FrozenTrial | None:
        """The best feasible trial, chosen by Optuna (which honours the ``memory``
        constraint each trial carries, ``trial.set_constraint``): ``study.best_trial`` of a
        single-objective study, the fastest of :meth:`pareto_front` (``study.best_trials``)
        of a (time, memory) study. Among trials exactly as fast as Optuna's choice the one
        with the lowest peak memory, then the lowest number, is taken (Optuna returns the
        first it finds; a plan that is as fast and lighter is the better answer). None when
        no trial is complete or none fits (Optuna raises ValueError then).

        With ``--sampler exhaustive`` this is the proven optimum (its time equals
        ``exhaustive.best_time_s``): every simulated candidate is a trial of the study."""
        if len(self.study.directions) > 1:
            front = self.pareto_front()
            return front[0] if front else None
        try:
            t = self.study.best_trial
        except ValueError:  # no complete trial, or none feasible
            return None
        ties = [u for u in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if u.value == t.value and _fits(u) and scored(u.user_attrs)]
        return min(ties, key=lambda u: (u.user_attrs["memory_bytes"], u.number), default=t)

    def best(self) -> tuple[Candidate, Mapping[str, Any]] | None:
        """The best feasible plan (:meth:`best_trial`) and its record (time_s,
        memory_bytes, memory_limit_bytes, metrics); None when nothing fits."""
        t = self.best_trial()
        if t is None:
            return None
        return Candidate.from_dict(t.user_attrs["plan"]), t.user_attrs

    def pareto_front(self) -> list[optuna.trial.FrozenTrial]:
        """Feasible trials not dominated in (time, peak memory), fastest first (equal
        times: lower memory first, then trial number), one per distinct plan: Optuna's
        ``study.best_trials`` (constrained: only trials whose constraints are all <= 0).
        A single-objective study (the demo's) has one value per trial; its front is
        taken over (time_s, memory_bytes) of :meth:`feasible` by one sweep in time order
        (a plan is on it when it needs less memory than every faster plan). Empty when
        nothing fits."""
        if len(self.study.directions) > 1:
            front = [t for t in self.study.best_trials if scored(t.user_attrs)]
        else:
            front, lightest, prev = [], math.inf, None
            for t in self.feasible():  # (time, memory) ascending
                a = (t.user_attrs["time_s"], t.user_attrs["memory_bytes"])
                if a[1] < lightest or a == prev:
                    front.append(t)
                    lightest, prev = min(lightest, a[1]), a
        return _one_per_plan(front)

    def top(self, k: int = 10) -> list[optuna.trial.FrozenTrial]:
        """The first ``k`` of the Pareto front (``pareto`` studies) or of :meth:`feasible`."""
        return (self.pareto_front() if self.pareto else self.feasible())[:k]


def zero_label(plan: Mapping[str, Any]) -> str:
    """The ZeRO stage of a plan record, with its HSDP shard group (``3 hsdp8``)."""
    n = plan.get("fsdp_shard_size")
    return f"{plan['zero']} hsdp{n}" if n else str(plan["zero"])


def mesh_words(plan: Mapping[str, Any]) -> str:
    """``dp8 cp2 tp4 pp2 ep4``: a plan's mesh (cp and ep only when > 1), as the report's lines
    name it (``tuner.explain.mesh_name``, :func:`plan_label`)."""
    cp, ep = plan.get("cp", 1), plan.get("ep", 1)
    return (f"dp{plan['dp']}" + (f" cp{cp}" if cp > 1 else "") + f" tp{plan['tp']} pp{plan['pp']}"
            + (f" ep{ep}" if ep > 1 else ""))


def plan_label(plan: Mapping[str, Any]) -> str:
    """Short one-line plan description for the progress bar."""
    s = mesh_words(plan) + f" {plan['schedule']}"
    if plan["vpp"] > 1:
        s += f" vpp{plan['vpp']}"
    s += f" mbs{plan['micro_batch_size']} rc={plan['recompute']} zero{plan['zero']}"
    if plan.get("fsdp_shard_size"):
        s += f" hsdp{plan['fsdp_shard_size']}"
    if plan.get("fp8"):
        s += f" fp8={plan['fp8']}"
    if plan.get("ep", 1) > 1:
        s += f" ep{plan['ep']}"
    s += " sp" if plan["sequence_parallel"] else ""
    off = _off_megatron(plan)
    return s + (f" [{' '.join(f'{k}={v}' for k, v in off)}]" if off else "")


def _off_megatron(plan: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The pattern templates of a pattern-based plan with tp > 1 that differ from Megatron's
    layout (``tuner.patterns.megatron_templates``; the norm's variant is the ``sp`` flag, a
    tied head has one choice): what sets it apart from ``meshplan cost`` with the same
    knobs, which lays the model out the Megatron way."""
    from tuner.patterns import megatron_templates

    templates = plan.get("templates") or {}
    if plan.get("tp", 1) <= 1 or not templates:
        return []
    std = megatron_templates()
    return [(k, v) for k, v in sorted(templates.items())
            if k in std and k not in ("norm", "loss") and v not in (std[k], "tied")]


TOP_COLUMNS = ("#", "dp-tp-pp-cp", "schedule", "vpp", "mbs", "recompute", "ZeRO", "SP", "FP8",
               "annotation", "step ms", "tokens/s", "MFU", "peak GiB", "bubble")
#: columns shown only when a plan of the table sets them (a search of BF16 plans has no FP8)
OPTIONAL_COLUMNS = {"FP8": lambda p: bool(p.get("fp8"))}
#: terminal columns an optional column takes ("te-delayed" and its borders)
OPTIONAL_WIDTH = 13
#: the FP8 recipes' names in a table narrower than 100 columns (report.txt has them whole)
FP8_SHORT = {"te-delayed": "TE", "tensorwise": "tensor", "rowwise": "row"}
#: columns a narrow terminal leaves out, first dropped first (the full table is in report.txt)
NARROW_DROPS = (("annotation", 150), ("tokens/s", 110), ("bubble", 100), ("SP", 100), ("vpp", 90))


def top_columns(width: int | None) -> tuple[str, ...]:
    """The columns of :func:`top_table` that fit ``width`` terminal columns (None: all):
    every column at 150 and wider; below, :data:`NARROW_DROPS` leaves out the annotation,
    tokens/s, bubble, SP and vpp columns at their thresholds, so that every cell stays whole
    at 80 columns."""
    drop = {c for c, w in NARROW_DROPS if width is not None and width < w}
    return tuple(c for c in TOP_COLUMNS if c not in drop)


def mesh_cell(plan: Mapping[str, Any]) -> str:
    """The top table's mesh cell: ``dp-tp-pp-cp``, then `` ep4`` when the plan splits its
    experts over ep > 1 ranks (two MoE plans of one mesh with other ep read apart)."""
    ep = plan.get("ep", 1)
    return f"{plan['dp']}-{plan['tp']}-{plan['pp']}-{plan.get('cp', 1)}" + (f" ep{ep}" if ep > 1 else "")


def top_table(result: TuneResult, k: int = 10, width: int | None = None) -> Any:
    """A rich Table of the top plans (mesh dp-tp-pp-cp and ep, schedule, vpp, mbs, recompute, ZeRO,
    SP, the FP8 recipe when a plan has one, templates, step time, tokens/s, MFU, peak
    memory, bubble); ``width``: the terminal's columns (:func:`top_columns` leaves out what
    does not fit; None: all). Without the vpp column an interleaved schedule's cell carries
    its chunks per rank (``VPP4``), so two plans never read alike."""
    from rich.table import Table

    title = "Pareto front (step time, peak memory)" if result.pareto else "Top plans"
    tab = Table(title=title)
    top = result.top(k)
    shown = {c for c, has in OPTIONAL_COLUMNS.items() if any(has(t.user_attrs["plan"]) for t in top)}
    # an optional column shown takes its room from the others (FP8: up to 13 characters)
    room = None if width is None else width - OPTIONAL_WIDTH * len(shown)
    cols = tuple(c for c in top_columns(room) if c not in OPTIONAL_COLUMNS or c in shown)
    short = room is not None and room < 100  # shorter headers so that no cell is cut
    for col in cols:
        head = {"schedule": "sched", "recompute": "rc", "peak GiB": "GiB",
                "dp-tp-pp-cp": "mesh"}.get(col, col) if short else col
        tab.add_column(head, justify="right" if col not in ("annotation", "schedule") else "left",
                       no_wrap=col != "annotation")
    for i, t in enumerate(top, 1):
        p, ua = t.user_attrs["plan"], t.user_attrs
        m = ua.get("metrics", {})
        ann = ",".join(f"{a}={b}" for a, b in sorted(p["templates"].items()) if a != "loss")
        if p["tp"] == 1:
            ann = "- (tp=1)"
        elif p.get("annotation_seed") is not None:
            ann = f"random seed {p['annotation_seed']}"
        ann = ann or str(p.get("annotation"))
        sched = p["schedule"]
        if "vpp" not in cols and p["vpp"] > 1:  # no vpp column: VPP4 = VPP with 4 chunks
            sched = f"{sched}{p['vpp']}"
        cells = dict(zip(TOP_COLUMNS, (
            str(i), mesh_cell(p), sched, str(p["vpp"]),
            str(p["micro_batch_size"]), p["recompute"], zero_label(p),
            "y" if p["sequence_parallel"] else "n",
            (FP8_SHORT.get(p["fp8"], p["fp8"]) if short else p["fp8"]) if p.get("fp8") else "-",
            ann, f"{ua['time_s'] * 1e3:.1f}",
            f"{m.get('tokens_per_s', float('nan')):.0f}", f"{m.get('mfu', float('nan')):.3f}",
            f"{ua['memory_bytes'] / GIB:.1f}", f"{m.get('bubble_ratio', float('nan')):.3f}"), strict=True))
        tab.add_row(*(cells[c] for c in cols))
    return tab


class _RichBar:
    """The default bar of :class:`ProgressReporter`: a rich progress bar over ``total``
    steps with ``description`` after it (the interface of ``meshplan.terminal.Progress``,
    which the ``meshplan`` commands pass instead)."""

    def __init__(self, total: int, description: str, enabled: bool = True, done: int = 0) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(TextColumn("trials"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.description}"),
                                 disable=not enabled, transient=False)
        self.task = self.progress.add_task(description, total=total, completed=done)

    def __enter__(self) -> _RichBar:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def advance(self, n: int = 1, note: str | None = None) -> None:
        """``n`` more steps; ``note`` replaces the description."""
        if note:
            self.progress.update(self.task, advance=n, description=note)
        else:
            self.progress.update(self.task, advance=n)


class ProgressReporter:
    """A progress bar over the trial target, showing the best feasible plan so far; an
    Optuna callback (``reporter(study, trial)``). ``bar``: the bar class, called as
    ``bar(total, description, enabled=..., done=...)``, a context manager with
    ``advance(n, note=...)`` (default: a rich bar; ``meshplan tune`` passes
    ``meshplan.terminal.Progress``)."""

    def __init__(self, total: int, done: int = 0, enabled: bool = True, bar: Any = None) -> None:
        self.enabled = enabled
        self.best: tuple[float, str] | None = None
        self.bar = (bar or _RichBar)(total, "best: -", enabled=enabled, done=done)

    def __enter__(self) -> ProgressReporter:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)

    def __call__(self, study: optuna.Study, t: optuna.trial.FrozenTrial) -> None:
        ua = t.user_attrs
        if (t.state == TrialState.COMPLETE and ua.get("memory_bytes", 1) <= ua.get(
                "memory_limit_bytes", 0) and (self.best is None or ua["time_s"] < self.best[0])):
            self.best = (ua["time_s"], plan_label(ua["plan"]))
        desc = "best: -" if self.best is None else f"best {self.best[0] * 1e3:.1f} ms  {self.best[1]}"
        self.bar.advance(1, note=desc)


def history_cache(study: optuna.Study) -> dict[str, dict[str, Any]]:
    """plan_key -> the record of a plan the study already scored: its score fields (a
    COMPLETE trial with the whole record) or ``{"error": message}`` (a trial pruned because
    the scorer refused the plan)."""
    out = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        ua = t.user_attrs
        k = ua.get("plan_key")
        if k is None:
            continue
        if t.state == TrialState.COMPLETE and scored(ua):
            out[k] = dict(ua)
        elif t.state == TrialState.PRUNED and "error" in ua and k not in out:
            out[k] = {"error": ua["error"]}
    return out
