"""Time to train as a user asks for it (issue 41): the parsing of ``--tokens`` (15T, 300B),
durations (``--deadline`` 30d, 720h) and the GPU-hour price, one rule each
(:func:`parse_tokens`, :func:`parse_duration`, :func:`resolve_price`); the text ``cost``
prints (:func:`render`, :func:`goodput_report`) and the objective ``tune`` searches
(:func:`search_objective`). The options that carry them: ``meshplan.commands.goodput_options``.
"""

from __future__ import annotations

import math
import re
from typing import Any

from meshplan.errors import MeshplanError

_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def parse_tokens(text: str | None) -> float | None:
    """Tokens of ``--tokens``: a number with an optional K, M, B (or G), T or P suffix
    (``15T`` = 1.5e13, ``300B`` = 3e11). Raises MeshplanError naming the flag and value."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtTpP]?)\s*", str(text))
    if m is None:
        raise MeshplanError(f"--tokens {text!r}: give a number of tokens, e.g. 15T, 300B or 2.5e12")
    val = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if not 1 <= val <= 1e18:
        raise MeshplanError(f"--tokens {text!r}: must be between 1 and 1e18 tokens")
    return val


def parse_duration(text: str | None, flag: str = "--deadline") -> float | None:
    """Seconds of a duration: a number with s, m (min), h, d or w (``30d``, ``720h``; a bare
    number is seconds). Raises MeshplanError naming ``flag`` and the value."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(s|min|m|h|d|w)?\s*", str(text))
    if m is None or not float(m.group(1)) > 0:
        raise MeshplanError(f"{flag} {text!r}: give a positive duration, e.g. 30d, 720h or 3600s")
    return float(m.group(1)) * _UNITS[m.group(2) or ""]


def resolve_price(cluster: Any, price: float | None, prices: str | None,
                  required: bool = False) -> tuple[float | None, str]:
    """(dollars per GPU-hour, where it comes from) for ``cluster``: ``--price``, else the
    ``--prices`` table's entry for its device, else the default table's; (None, why) when
    the device has no price and none is ``required``. Raises MeshplanError for both flags at
    once, a bad price or table, or a missing price that is ``required``."""
    from clusters.errors import ClusterSpecError
    from clusters.prices import load_prices, price_of

    if price is not None and prices is not None:
        raise MeshplanError(f"give --price {price} or --prices {prices}, not both")
    if price is not None:
        if not (0 <= price < math.inf):
            raise MeshplanError(f"--price must be dollars per GPU-hour >= 0, got {price}")
        return float(price), "--price"
    try:
        p = price_of(cluster, load_prices(prices))
    except ClusterSpecError as e:
        if required or prices is not None and "price file" in str(e):
            raise MeshplanError(str(e)) from None
        return None, str(e)
    return p.usd_per_gpu_hour, f"{prices or 'clusters/defaults/prices.yaml'}: {p.date}, {p.provenance}"


def _days(s: float) -> str:
    return f"{s / 86400:8.2f} d" if s >= 3600 else f"{s / 60:8.1f} min"


def render(pr: Any, price_from: str, jitter: dict[str, Any] | None = None) -> list[str]:
    """The lines ``cost --tokens`` prints for a ``simulator.goodput.plan.PlanRun`` (and
    ``--jitter-samples``' percentiles and sensitivity)."""
    b, c, r, f = pr.breakdown, pr.checkpoint, pr.restart, pr.failures
    tokens = pr.steps * pr.tokens_per_step
    cost = "" if pr.cost_usd is None else f"; cost ${pr.cost_usd:,.0f} at ${pr.price:.2f}/GPU-h ({price_from})"
    span = b.interval * pr.run.step_s
    mtbf = "none" if not math.isfinite(f.mtbf_s) else f"MTBF {f.mtbf_s / 3600:.1f} h"
    spare = f"{pr.spares} hot spare node(s)" if pr.spares else "no hot spare"
    lines = [
        f"time to train {tokens:.3g} tokens ({pr.steps:,} steps of {pr.run.step_s:.3f} s on {pr.degrees.gpus} GPUs"
        f"): {b.total_s / 86400:.2f} days, goodput {b.goodput:.1%}{cost}",
        f"  compute    {_days(b.compute_s)}  steps x step time",
        f"  checkpoint {_days(b.checkpoint_s)}  {c.mode} saves every {b.interval} steps ({span / 60:.1f} min; "
        f"Young {pr.young_s / 60:.1f}, Daly {pr.daly_s / 60:.1f} min): stall {c.stall_s:.2f} s each"
        + (f", then {c.background_s:.2f} s written behind" if c.mode == "async" else "")
        + f"; {c.max_gpu_bytes / 2**30:.2f} GiB a GPU, {c.total_bytes / 2**40:.3f} TiB in all ({c.replicas} writes)",
        f"  restart    {_days(b.restart_s)}  {b.failures:.1f} interruptions ({mtbf}), {r.unplanned_s:.0f} s each: "
        f"relaunch {r.relaunch:.0f} s, NCCL init {r.nccl_init:.2f} s, restore {r.restore:.1f} s, "
        f"node replacement {r.replace:.0f} s ({spare})",
        f"  lost work  {_days(b.lost_s)}  work and saves redone after interruptions",
        f"  planned    {_days(b.planned_s)}  {b.planned:.1f} planned interruptions (a save and a restart each)",
        f"  startup    {_days(b.startup_s)}  relaunch and NCCL initialisation once",
    ]
    if pr.defaulted:
        lines.append(f"  (the cluster's {', '.join(pr.defaulted)} are the defaults of "
                     "clusters/defaults/goodput.yaml; give your cluster's own in its YAML)")
    return lines + render_jitter_only(jitter)


def goodput_report(engine: Any, res: Any, tokens: float | None, price: float | None, prices: str | None,
                   checkpoint: str, interval: int | None, spares: int, samples: int | None,
                   seed: int) -> tuple[dict[str, Any], list[str]]:
    """``cost``'s time-to-train and jitter parts of a simulated plan: ({json keys}, text
    lines); both empty without ``--tokens`` and ``--jitter-samples`` (the step's output then
    unchanged). Raises MeshplanError for bad settings."""
    if tokens is None and samples is None:
        if any(v is not None for v in (price, prices, interval)) or spares or checkpoint != "auto":
            raise MeshplanError("--price, --prices, --checkpoint, --checkpoint-interval and --spares "
                                "price and time a training run: give --tokens too")
        return {}, []
    from clusters.goodput_spec import goodput_sections
    from simulator.errors import SimulatorError
    from simulator.goodput.jitter import StepShape, percentiles, sample_steps, sensitivity
    from simulator.goodput.plan import TrainSettings, plan_run

    model = engine.step_model()
    sections = goodput_sections(engine.cluster)
    out: dict[str, Any] = {}
    jit = None
    try:
        if samples is not None:
            shape = StepShape.of(model, res)
            jit = {"samples": samples, "seed": seed,
                   "percentiles": percentiles(sample_steps(shape, sections.jitter, samples, seed)),
                   "sensitivity": sensitivity(shape).to_dict()}
            out["jitter"] = jit
        if tokens is None:
            return out, render_jitter_only(jit)
        usd, where = resolve_price(engine.cluster, price, prices)
        pr = plan_run(model, res, TrainSettings(tokens=tokens, mode=checkpoint, interval=interval,
                                                spares=spares, price=usd), sections)
    except SimulatorError as e:
        raise MeshplanError(str(e)) from None
    out["time_to_train"] = {**pr.to_dict(), "price_source": where}
    return out, render(pr, where, jit)


def render_jitter_only(jit: dict[str, Any] | None) -> list[str]:
    """The jitter line alone (``--jitter-samples`` without ``--tokens``)."""
    if jit is None:
        return []
    p, s = jit["percentiles"], jit["sensitivity"]
    return [f"step time with stragglers and jitter ({jit['samples']} samples, seed {jit['seed']}): "
            f"P50 {p['p50'] * 1e3:.2f} ms, P90 {p['p90'] * 1e3:.2f} ms, P99 {p['p99'] * 1e3:.2f} ms; "
            f"a GPU {s['factor']:g}x slower costs {s['slow_rank']:+.1%} (stage {s['rank_stage']}), "
            f"a link {s['link_factor']:g}x slower {s['slow_link']:+.1%} (stage {s['link_stage']})"]


#: tune objectives that score plans by a whole run (``simulator.goodput.objectives``)
RUN_OBJECTIVES = ("time-to-train", "cost-to-train", "p90")


def search_objective(objective: str, cluster: Any, tokens: str | None, price: float | None,
                     prices: str | None, checkpoint: str, interval: int | None, spares: int,
                     samples: int | None, seed: int) -> dict[str, Any] | None:
    """The scorer config's ``objective`` of ``tune`` (``meshplan.objective_scoring``): None
    for ``time`` and ``cost`` (the step time's search), else an ``ObjectiveSettings`` dict
    with the tokens, the save, the spares, the cluster's price (``cost-to-train`` requires
    one; the others carry it when the device has one) and the jitter samples. Raises
    MeshplanError for settings the objective does not read or cannot do without."""
    from simulator.errors import SimulatorError
    from simulator.goodput.objectives import ObjectiveSettings

    run_flags = [f for f, v in (("--tokens", tokens), ("--price", price), ("--prices", prices),
                                ("--checkpoint-interval", interval), ("--jitter-samples", samples))
                 if v is not None] + (["--spares"] if spares else []) + (
                     ["--checkpoint"] if checkpoint != "auto" else [])
    if objective not in RUN_OBJECTIVES:
        if run_flags:
            raise MeshplanError(f"{', '.join(run_flags)}: read by --objective "
                                f"{', '.join(RUN_OBJECTIVES)}, not {objective}")
        return None
    if objective == "p90" and tokens is None:
        settings = ObjectiveSettings(name="p90", samples=samples or 200, seed=seed)
        return settings.to_dict()
    usd, _ = resolve_price(cluster, price, prices, required=objective == "cost-to-train")
    try:
        settings = ObjectiveSettings(name=objective, tokens=parse_tokens(tokens), mode=checkpoint,
                                     interval=interval, spares=spares, price=usd, samples=samples or 200,
                                     seed=seed)
    except SimulatorError as e:
        raise MeshplanError(str(e).replace("(--tokens", "(give --tokens")) from None
    return settings.to_dict()


def run_note(rec: Any, deadline_s: float | None) -> tuple[str, bool]:
    """The best plan's run figures for ``tune``'s report line (expected days to train,
    goodput, dollars; the P90 step) and whether it misses ``deadline_s``."""
    m = rec.get("metrics") or {}
    parts = []
    if "time_to_train_s" in m:
        parts.append(f"{m['time_to_train_s'] / 86400:.2f} days to train (goodput {m['goodput']:.1%}, "
                     f"a checkpoint every {int(m['checkpoint_interval'])} steps)")
    if "cost_usd" in m:
        parts.append(f"${m['cost_usd']:,.0f}")
    if "step_p90_s" in m:
        parts.append(f"P90 step {m['step_p90_s'] * 1e3:.1f} ms (P50 {m['step_p50_s'] * 1e3:.1f}, "
                     f"P99 {m['step_p99_s'] * 1e3:.1f})")
    missed = deadline_s is not None and m.get("time_to_train_s", 0.0) > deadline_s
    if missed and deadline_s is not None:
        parts.append(f"misses --deadline {deadline_s / 86400:.2f} days")
    return ("; " + ", ".join(parts)) if parts else "", missed
