"""Why a search's best plan won, or why no plan fits: the lines ``meshplan tune`` prints
under its table (and writes to ``report.txt``).

- :func:`why_best`: the winner's margin over the runner-up (the fastest feasible plan that
  is a different plan), then the best plan of every other mesh shape (dp, cp, tp, pp) the
  search scored, with its step time relative to the winner; a mesh shape where nothing
  fits names its lightest plan and how far over the memory limit it is.
- :func:`why_none`: with no feasible plan, which constraint bound and by how much: the
  ``memory`` constraint (every scored plan over the limit; the closest plan and its
  excess, per mesh shape too), or, when nothing was scored, the legality rules and engine
  refusals that pruned every point (counted by rule).

Every figure is read from the trials' user attrs (``time_s``, ``memory_bytes``,
``memory_limit_bytes``, ``illegal``, ``error``): nothing is re-simulated.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.result import GIB, TuneResult, memory_constraint, mesh_words, plan_label, scored

MeshShape = tuple[int, int, int, int, int]


def mesh_shape(plan: Mapping[str, Any]) -> MeshShape:
    """(dp, cp, tp, pp, ep) of a stored plan (``cp`` and ``ep`` 1 when the plan has none):
    expert parallelism splits the experts over dp ranks, so two plans of one dp x tp x pp
    with another ep are other shapes."""
    return plan["dp"], plan.get("cp", 1), plan["tp"], plan["pp"], plan.get("ep", 1)


def mesh_name(shape: MeshShape) -> str:
    """``dp8 tp4 pp2`` (``cp`` and ``ep`` shown only when > 1: ``dp8 tp1 pp1 ep4``;
    ``tuner.result.mesh_words``)."""
    dp, cp, tp, pp, ep = shape
    return mesh_words({"dp": dp, "cp": cp, "tp": tp, "pp": pp, "ep": ep})


def _scored(result: TuneResult) -> list[optuna.trial.FrozenTrial]:
    return [t for t in result.trials() if t.state == TrialState.COMPLETE and scored(t.user_attrs)]


def _over(t: optuna.trial.FrozenTrial) -> str:
    """``needs X GiB of the Y GiB limit (+Z GiB, +P%)`` for a plan over its limit."""
    ua = t.user_attrs
    mem, lim = ua["memory_bytes"], ua["memory_limit_bytes"]
    return (f"needs {mem / GIB:.1f} GiB of the {lim / GIB:.1f} GiB limit "
            f"(+{(mem - lim) / GIB:.1f} GiB, +{memory_constraint(ua):.1%})")


def _lightest(trials: list[optuna.trial.FrozenTrial]) -> optuna.trial.FrozenTrial:
    """The trial closest to fitting: smallest memory constraint, then fastest, then first."""
    return min(trials, key=lambda t: (memory_constraint(t.user_attrs), t.user_attrs["time_s"], t.number))


def why_best(result: TuneResult) -> list[str]:
    """Lines saying why :meth:`TuneResult.best_trial` won (module docstring); the lines of
    :func:`why_none` when nothing fits."""
    best = result.best_trial()
    if best is None:
        return why_none(result)
    b = best.user_attrs
    bt, key = b["time_s"], b.get("plan_key")
    runner = next((t for t in result.feasible() if t.user_attrs.get("plan_key") != key), None)
    n = len(_scored(result))
    scope = f"among the {n} plan{'s' if n != 1 else ''} this search scored"
    if runner is None:
        lines = [f"why it won: {scope}, it is the only one that fits in memory"]
    else:
        r = runner.user_attrs
        gap = r["time_s"] - bt
        if gap > 0:
            lines = [f"why it won ({scope}): the runner-up, {plan_label(r['plan'])}, takes "
                     f"{r['time_s'] * 1e3:.1f} ms per step: {gap * 1e3:.2f} ms ({gap / bt:+.2%}) "
                     f"more than the winner"]
        else:
            lines = [f"why it won ({scope}): as fast as the runner-up, {plan_label(r['plan'])} "
                     f"({r['time_s'] * 1e3:.1f} ms), and needs no more memory "
                     f"({b['memory_bytes'] / GIB:.1f} vs {r['memory_bytes'] / GIB:.1f} GiB)"]
    ans = result.answer
    if ans is not None and ans.holds:
        lines.append("the winner is the proven optimum of the space: every candidate not scored "
                     "has a lower bound on its step time no better than the winner's, or cannot fit")
    elif ans is not None:
        lines.append(f"not proven: {ans.summary()}")
    elif result.exhaustive is None:
        lines.append("a sampled search: plans it did not score may be faster (the default search "
                     "proves the optimum or bounds the gap)")
    return lines + _per_shape(result, best)


#: lines of the per-shape list before the rest is summed up in one line
SHAPE_LINES = 12


def _per_shape(result: TuneResult, best: optuna.trial.FrozenTrial) -> list[str]:
    """The best plan of every mesh shape other than the winner's, with what is proven of
    it (:func:`_shape_state`), fastest first, then the shapes with no scored plan that fits
    (with their bound, or proven not to fit); after :data:`SHAPE_LINES` lines the rest is
    one line. Without per-shape bounds (a study written before them) only what was scored
    is named."""
    mine = mesh_shape(best.user_attrs["plan"])
    bt = best.user_attrs["time_s"]
    bounds = dict(getattr(result.answer, "shapes", None) or {})
    fits: dict[MeshShape, optuna.trial.FrozenTrial] = {}
    for t in result.feasible():  # fastest first: the first of a shape is its best
        fits.setdefault(mesh_shape(t.user_attrs["plan"]), t)
    tried: dict[MeshShape, list[optuna.trial.FrozenTrial]] = {}
    for t in _scored(result):
        tried.setdefault(mesh_shape(t.user_attrs["plan"]), []).append(t)
    names = {mesh_name(s): s for s in (*fits, *tried)}
    rows: list[tuple[tuple[int, float], str]] = []
    for name in sorted(set(names) | set(bounds)):
        shape = names.get(name)
        if shape == mine:
            continue
        b = bounds.get(name)
        if shape in fits:
            u = fits[shape].user_attrs
            line = (f"  {name:<18} {u['time_s'] * 1e3:10.1f} ms  {(u['time_s'] - bt) / bt:+8.2%}  "
                    f"{plan_label(u['plan'])}{_shape_state(b, u['time_s'], bt)}")
            rows.append(((0, u["time_s"]), line))
        elif b is not None and b["unscored"]:
            low = b["lower_bound_s"]
            what = ("no bound is known on them" if low is None else
                    f"none is faster than {low * 1e3:.1f} ms ({(low - bt) / bt:+.2%})")
            scored_ = "none of its scored plans fits; " if shape in tried else ""
            rows.append(((1, -math.inf if low is None else low),
                         f"  {name:<18} not searched to a proof: {scored_}{b['unscored']} plan(s) "
                         f"not scored may fit, {what}"))
        elif shape in tried:
            t = _lightest(tried[shape])
            n = len({_key(x) for x in tried[shape]})
            proven = " (the rest cannot fit: their memory bounds exceed the limit)" if b is not None else ""
            rows.append(((2, memory_constraint(t.user_attrs)),
                         f"  {name:<18} none fits: none of its {n} scored plan(s) fits{proven}; the "
                         f"lightest, {plan_label(t.user_attrs['plan'])}, {_over(t)}"))
        elif b is not None:
            rows.append(((3, 0.0), f"  {name:<18} none fits: the memory bounds of all its "
                                   f"{b['candidates']} plan(s) exceed the limit"))
    if not rows:
        return [f"every scored plan that fits has the winner's mesh shape ({mesh_name(mine)})"]
    rows.sort(key=lambda r: r[0])
    lines = [f"best plan of each other mesh shape (the winner: {mesh_name(mine)}, {bt * 1e3:.1f} ms):"]
    lines += [line for _, line in rows[:SHAPE_LINES]]
    rest = rows[SHAPE_LINES:]
    if rest:
        cannot = sum(1 for k, _ in rest if k[0] >= 2)
        lines.append(f"  ... and {len(rest)} more shape(s), each slower or with a larger bound than "
                     f"those above" + (f" ({cannot} of them cannot fit)" if cannot else ""))
    return lines


def _shape_state(b: Mapping[str, Any] | None, time_s: float, best_s: float) -> str:
    """What is proven of a shape's best scored plan (``time_s``) from its bounds ``b``
    (``tuner.gap.shape_bounds``): the best of its shape (every plan of it not scored is
    bounded at or above it, or cannot fit), or a bound on what its other plans can reach
    (not searched to a proof)."""
    if b is None:
        return ""
    low = b["lower_bound_s"]
    if not b["unscored"] or (low is not None and low >= time_s):
        return "  [the best of its shape, proven]"
    if low is None:
        return "  [not searched to a proof; no bound on its other plans]"
    return f"  [not searched to a proof: none of its other plans is faster than {low * 1e3:.1f} ms]"


def _key(t: optuna.trial.FrozenTrial) -> str:
    return str(t.user_attrs.get("plan_key") or sorted(t.user_attrs["plan"].items()))


def why_none(result: TuneResult) -> list[str]:
    """Lines saying which constraint bound when no plan fits (module docstring)."""
    done = _scored(result)
    if done:
        t = _lightest(done)
        lines = [f"no feasible plan: the memory constraint binds -- all {len(done)} scored "
                 f"trials need more than the limit (usable device memory less the headroom); "
                 f"the closest, {plan_label(t.user_attrs['plan'])}, {_over(t)}"]
        by_shape: dict[MeshShape, list[optuna.trial.FrozenTrial]] = {}
        for u in done:
            by_shape.setdefault(mesh_shape(u.user_attrs["plan"]), []).append(u)
        if len(by_shape) > 1:
            lines.append("closest plan of each mesh shape:")
            for s in sorted(by_shape, key=lambda s: memory_constraint(_lightest(by_shape[s]).user_attrs)):
                u = _lightest(by_shape[s])
                lines.append(f"  {mesh_name(s):<18} {plan_label(u.user_attrs['plan'])}: {_over(u)}")
        return lines
    pruned = [t for t in result.trials() if t.state == TrialState.PRUNED]
    rules = Counter(str(t.user_attrs["illegal"]).split(":")[0] for t in pruned if "illegal" in t.user_attrs)
    errors = [str(t.user_attrs["error"]) for t in pruned if "error" in t.user_attrs]
    parts = []
    if rules:
        parts.append("legality rules pruned " + ", ".join(f"{n} by {r}" for r, n in rules.most_common()))
    if errors:
        parts.append(f"the engine refused {len(errors)} (first: {errors[0]})")
    ans = result.answer
    if ans is not None and ans.holds and ans.space_size:  # every candidate pruned by memory
        return [f"no feasible plan: the memory constraint binds -- all {ans.space_size} candidates "
                "of the space need more than the limit (usable device memory less the headroom) "
                "by their lower bound on the peak memory (proven; none was worth simulating)"]
    if result.exhaustive is not None and not parts:  # the enumeration itself was empty
        return ["no feasible plan: the search space holds no legal plan (the exhaustive "
                "enumeration found no candidate); widen --fix (a fixed dp x micro-batch must "
                "divide the global batch, tp x pp x dp x cp must fit the cluster)"]
    why = "; ".join(parts) or f"no trial finished ({len(result.trials())} in the study)"
    more = "" if result.exhaustive is not None else " or raise --trials"
    return [f"no feasible plan: no plan was scored -- {why}; widen --fix{more}"]


__all__ = ["mesh_name", "mesh_shape", "why_best", "why_none"]
