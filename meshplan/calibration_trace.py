"""``meshplan calibrate --from-trace TRACE --plan PLAN.json``: the executor's own traces
(``executor.profile``), matched to the plan's ops and fitted (``executor.trace_match``,
``executor.trace_plan_fit``); prints measured vs predicted per kernel class and the
plan's step before and after calibration (the simulator, ``meshplan.validation.predict``).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from completion.errors import InputFileNotFoundError
from meshplan.errors import MeshplanError
from meshplan.terminal import echo

#: Most rank traces one calibration reads from a directory
MAX_TRACES = 64


def check_fit(spec: dict, out: Any, trace: str) -> None:
    """``parse_spec`` of a fitted spec before it is written; a constant outside the spec's
    bounds is the trace's doing, so the error names the trace and nothing is written."""
    from clusters.errors import ClusterSpecError
    from clusters.spec import parse_spec

    try:
        parse_spec(spec, str(out))
    except ClusterSpecError as e:
        raise ClusterSpecError(f"the fit to {trace} is implausible, {out} not written: "
                               f"{str(e).removeprefix(f'{out}: ')}") from None


def executor_traces(trace: str) -> list[Path]:
    """The executor trace files of ``trace``: a directory's ``rank*.json`` (sorted by
    rank), or the file itself when it carries the executor's metadata; [] for any other
    trace (a foreign profiler trace). Raises FileNotFoundError for a missing path and
    ValueError for a directory without rank traces or with more than
    :data:`MAX_TRACES`."""
    from executor.profile import META_KEY

    p = Path(trace)
    if p.is_dir():
        files = sorted(p.glob("rank*.json"), key=lambda f: int("".join(c for c in f.stem if c.isdigit()) or 0))
        if not files:
            raise MeshplanError(f"--from-trace {p}: the directory holds no rank*.json trace")
        if len(files) > MAX_TRACES:
            raise MeshplanError(f"--from-trace {p}: {len(files)} rank traces, above the {MAX_TRACES} read")
        return files
    if not p.is_file():
        raise InputFileNotFoundError(f"trace file not found: {p}")
    try:  # the executor writes its metadata after the events: the whole file is read
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return []  # not JSON: the foreign-trace reader names what is wrong with it
    return [p] if isinstance(doc, dict) and META_KEY in doc else []


def _meta(path: Path) -> tuple[dict, list[dict]]:
    from executor.profile import META_KEY
    from executor.trace_calibrate import TraceError, read_trace
    from executor.trace_meta import check_meta

    doc, events = read_trace(path)
    meta = doc.get(META_KEY) if isinstance(doc, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("rank"), int):
        raise TraceError(f"{path}: no '{META_KEY}' metadata with the rank (not recorded by "
                         f"meshplan validate --profile-trace)")
    return check_meta(meta, path), events


def measured_step(metas: list[dict]) -> tuple[float, str] | None:
    """The step the fit is checked against (seconds) and the series it is from: per step
    the slowest rank's, median, of the unrecorded steps that alternated with the recorded
    ones (``paired_steps_s``, ``executor.profile``: the same moments of the host as the
    fitted steps), else of the rank's timed steps (``step_times_s``, an older trace);
    None without either."""
    from executor.trace_rounds import slowest_per_round

    for key in ("paired_steps_s", "step_times_s"):
        (steps,) = slowest_per_round(metas, key)
        if steps:
            return statistics.median(steps), key
    return None


def cpu_medians(metas: list[dict]) -> tuple[float, float] | None:
    """(recorded, unrecorded) median over the rounds of the slowest rank's CPU time of its
    thread in the round's step (``span_cpu_s``, ``paired_cpu_s``; seconds), or None without
    them: the recorder's cost apart from the host's other work, which adds wall time only."""
    from executor.trace_rounds import slowest_per_round

    rec, plain = slowest_per_round(metas, "span_cpu_s", "paired_cpu_s")
    return (statistics.median(rec), statistics.median(plain)) if rec else None


def recording_cost(metas: list[dict]) -> tuple[float, float, float] | None:
    """(median recorded step, median unrecorded step of the same rounds, the recorder's
    cost per step) in seconds, per step the slowest rank's; None without the span
    recorder's metadata. The cost per step is ``span_event_s`` x the spans of one
    recorded step (``span_count`` over the rounds), the largest over the ranks."""
    from executor.trace_rounds import slowest_per_round

    rec, plain = slowest_per_round(metas, "span_steps_s", "paired_steps_s")
    if not rec:
        return None
    cost = max(float(m.get("span_event_s") or 0.0) * int(m.get("span_count") or 0) / len(rec) for m in metas)
    return statistics.median(rec), statistics.median(plain), cost


def _run_plan(plan: Any, meta: dict) -> Any:
    """The plan as the traced run ran it (its layer split, when the plan fixes none)."""
    import dataclasses

    lps = meta.get("layers_per_stage")
    s = plan.strategy
    if lps and s.layers_per_stage is None:
        return dataclasses.replace(plan, strategy=s.replace(layers_per_stage=tuple(lps)))
    return plan


@dataclass
class _Pooled:
    """What the fit reads from a set of rank traces (:func:`_pooled_samples`)."""

    samples: list  # OpSample, every pooled round's
    streams: list  # (bytes, seconds) of the profiler pass's in-place streaming ops
    rounds: list  # the pooled round indices, [None] for traces without rounds
    gaps: list  # seconds of uncovered host time folded, one per rank and round
    folded: bool  # whether the uncovered host time was folded (one-stage plans)


def _recorded_round(meta: dict, spans: list[dict], labels: dict, rnd: int,
                    fold: bool) -> tuple[list, float, list[str]]:
    """One rank's recorded round ``rnd``: (its ops matched to ``labels``, with the step's
    uncovered host time folded into its actions when ``fold``; the seconds folded; the
    sorted names of its plan-op spans). Raises TraceMatchError as ``round_step`` and
    ``match_trace`` do."""
    from executor.profile import PREFIX
    from executor.trace_match import event_cost, match_trace, round_step
    from executor.trace_rounds import fold_step_gap, step_gap, step_span

    timed, eps = round_step(spans, rnd), event_cost(meta, "span_event_s")
    ops = sorted(str(e["name"]) for e in timed if str(e.get("name", "")).startswith(PREFIX))
    gap = step_gap(step_span(spans, rnd), timed, eps) if fold else 0.0
    return fold_step_gap(match_trace(timed, labels, eps), gap), gap, ops


def _pooled_samples(plan: Any, loaded: list[tuple[dict, list[dict]]], files: list[Path]) -> _Pooled:
    """The samples of the middle third of the recorded rounds by time (the same rounds on
    every rank, ``executor.trace_rounds``), each round's: every rank's ops matched to
    ``plan`` (a one-stage plan's uncovered host time folded into its actions), the
    collectives at their shortest rank, the other ops of each set of replicas from the
    slowest replica of each segment between collectives. A trace without rounds gives
    its step of median time. Raises TraceError naming the file (and round) for recorder
    spans without a step span, a pooled round whose plan ops differ from the rank's
    other pooled rounds, or spans that are no op of the plan."""
    from executor.profile import STEP_PREFIX
    from executor.trace_calibrate import TraceError
    from executor.trace_match import (
        TraceMatchError,
        event_cost,
        match_trace,
        median_step,
        merge_collectives,
        plan_labels,
        recorded_spans,
        slowest_segments,
        stream_samples,
    )
    from executor.trace_rounds import middle_rounds

    metas = [m for m, _ in loaded]
    rounds: list[int | None] = [*middle_rounds(metas)] or [None]
    streams, spans_of, labels_of = [], [], []
    for (meta, events), f in zip(loaded, files, strict=True):
        spans_of.append(recorded_spans(events))
        if spans_of[-1] and not any(str(e.get("name", "")).startswith(STEP_PREFIX) for e in spans_of[-1]):
            raise TraceError(f"{f}: recorder spans but no '{STEP_PREFIX}<i>' span around a step: not a "
                             f"trace meshplan validate --profile-trace wrote")
        streams += stream_samples([e for e in events if e.get("cat") == "cpu_op"] if spans_of[-1] else
                                  median_step(events), event_cost(meta))
        labels_of.append(plan_labels(_run_plan(plan, meta), meta["rank"]))
    sigs = [frozenset(labels.items()) for labels in labels_of]
    # the host time outside the recorded spans is the executor's own with one stage; with a
    # pipeline it also holds the wait for the sends to the next stage (RankExecutor.run_step),
    # which the schedule's simulation already charges
    fold = _run_plan(plan, metas[0]).strategy.pp == 1
    out = _Pooled([], streams, rounds, [], fold)
    names: dict[int, tuple[int, list[str]]] = {}  # per rank: the first pooled round's plan ops
    for rnd in rounds:
        per_rank = []
        for i, ((meta, events), spans, labels, f) in enumerate(zip(loaded, spans_of, labels_of, files,
                                                                   strict=True)):
            try:
                if spans and rnd is not None:  # the span recorder's round
                    samples, gap, ops = _recorded_round(meta, spans, labels, rnd, fold)
                    first = names.setdefault(i, (rnd, ops))
                    if ops != first[1]:
                        raise TraceError(f"round {rnd} holds other plan ops than round {first[0]} "
                                         f"({len(ops)} vs {len(first[1])} spans): a step span cut short, "
                                         f"or spans moved out of it")
                    out.gaps.append(gap)
                    per_rank.append(samples)
                else:  # a trace of profiler spans only (recorded before the span recorder)
                    eps = event_cost(meta, "span_event_s") if spans else event_cost(meta)
                    per_rank.append(match_trace(median_step(spans or events), labels, eps))
            except (TraceError, TraceMatchError) as e:
                raise TraceError(f"{f}: {e}") from None
        out.samples += [x for r in slowest_segments(per_rank, sigs) for x in r]
        out.samples += [x for x in merge_collectives(per_rank) if x.kind == "collective"]
    return out


def _print_step_diagnostics(loaded: list[tuple[dict, list[dict]]], pooled: _Pooled) -> None:
    """Print the recorded rounds' diagnostics (uncovered host time, the recorder's cost,
    the ranks' CPU time, their alignment on one clock)."""
    from executor.trace_match import recorded_spans, round_alignment

    metas = [m for m, _ in loaded]
    if pooled.gaps and pooled.folded:
        echo(f"host time outside the recorded spans: median {statistics.median(pooled.gaps) * 1e3:.3f} ms "
                   f"a rank's step, spread over its actions (the per-action overhead)")
    cost = recording_cost(metas)
    if cost is not None:
        rec, plain, per_step = cost
        echo(f"recorded steps: median {rec * 1e3:.3f} ms vs {plain * 1e3:.3f} ms unrecorded, "
                   f"alternating ({rec / plain - 1:+.1%}); the recorder's cost per span accounts for "
                   f"{per_step / plain:+.1%} and is taken off the spans")
    cpu = cpu_medians(metas)
    if cpu is not None and cpu[1] > 0:
        echo(f"CPU time of the ranks' threads: median {cpu[0] * 1e3:.3f} ms recorded vs "
                   f"{cpu[1] * 1e3:.3f} ms unrecorded ({cpu[0] / cpu[1] - 1:+.1%}; the host's other "
                   f"work adds wall time only)")
    align = round_alignment([(m, recorded_spans(ev)) for m, ev in loaded])
    if align is not None:
        echo(f"ranks' start of each recorded step (one host's clock): up to {max(align.skew) * 1e3:.3f} ms "
                   f"apart (median {statistics.median(align.skew) * 1e3:.3f} ms); median step "
                   f"{statistics.median(align.slowest) * 1e3:.3f} ms as the slowest rank's own duration "
                   f"(the measured step's rule), {statistics.median(align.synced) * 1e3:.3f} ms from the "
                   f"last rank's start (the model starts every rank together)")


def from_executor_trace(files: list[Path], plan_file: str, cluster: str, base: dict, output: str,
                        name: str) -> None:
    """Fit ``base`` (the cluster spec mapping) to the executor traces ``files`` of
    ``plan_file`` (:func:`_pooled_samples`), write ``output`` and print the comparison:
    per kernel class (per pooled round), the rounds' diagnostics and the plan's step,
    measured and predicted before and after."""
    import yaml

    from executor.trace_meta import check_ranks
    from executor.trace_plan_fit import (
        DTYPE_KEYS,
        apply_plan_fit,
        class_times,
        fit_plan_samples,
        measured_class_times,
    )
    from executor.trace_rounds import round_times
    from meshplan.plan import Plan
    from meshplan.validation import predict

    plan = Plan.load(plan_file)
    loaded = [_meta(f) for f in files]
    metas = [m for m, _ in loaded]
    rank_warnings = check_ranks(metas, files)  # printed once the fit stands
    pooled = _pooled_samples(plan, loaded, files)
    samples, rounds = pooled.samples, pooled.rounds
    run = _run_plan(plan, metas[0])
    dtype = run.strategy.dtype
    key = DTYPE_KEYS.get(dtype, dtype)
    peak = float(base["device"]["peak_flops"][key]["value"]) if key in base["device"]["peak_flops"] else 0.0
    fit = fit_plan_samples(samples, float(base["node"]["intra_latency"]["value"]), peak,
                           float(base["device"]["memory_bandwidth"]["value"]), pooled.streams)
    out = Path(output)
    spec = apply_plan_fit(base, fit, dtype, ", ".join(f.name for f in files))
    spec["name"] = name or out.stem
    check_fit(spec, out, ", ".join(str(f) for f in files))
    out.write_text(f"# Written by `meshplan calibrate --from-trace` from cluster {cluster} and plan "
                   f"{plan_file}; see executor/trace_plan_fit.py.\n"
                   + yaml.safe_dump(spec, sort_keys=False, width=200))
    what = f"the middle {len(rounds)} of {len(round_times(metas))} recorded rounds by time" \
        if rounds != [None] else "the step of median time"
    per_round = {k: v // len(rounds) for k, v in fit.counts.items() if k != "stream"}
    streams = f"; in-place streaming ops of the profiler pass: {fit.counts['stream']}" if "stream" in fit.counts else ""
    echo(f"wrote {out} (cluster {cluster} calibrated from {len(files)} executor trace(s) of "
               f"{plan_file}, {what}; plan ops matched per round: {per_round}{streams})")
    for line in rank_warnings:
        echo(f"warning: {line}", err=True)
    # per round: the pooled rounds' mean
    measured, before, after = ({k: v / len(rounds) for k, v in d.items()} for d in (
        measured_class_times(samples), class_times(samples, base, dtype), class_times(samples, spec, dtype)))
    if fit.dropped:
        echo(f"not fitted per op (efficiency below the spec's minimum): {', '.join(fit.dropped)}")
    echo(f"{'kernel class':<14}{'measured ms':>13}{'before ms':>13}{'after ms':>13}")
    for cls in sorted(measured):
        if cls != "other":
            echo(f"{cls:<14}{measured[cls] * 1e3:>13.3f}{before.get(cls, 0) * 1e3:>13.3f}"
                       f"{after.get(cls, 0) * 1e3:>13.3f}")
    _print_step_diagnostics(loaded, pooled)
    measured = measured_step(metas)
    p0, p1 = predict(run, cluster)[0]["step_time"], predict(run, str(out))[0]["step_time"]
    if measured:
        step, series = measured
        src = ("the unrecorded steps alternating with the recorded ones" if series == "paired_steps_s"
               else "the traced run's timed steps")
        echo(f"step (ms): measured {step * 1e3:.3f} (median of {src}); "
                   f"predicted before {p0 * 1e3:.3f} ({(p0 - step) / step:+.1%}), after "
                   f"{p1 * 1e3:.3f} ({(p1 - step) / step:+.1%})")


def calibrate_from_trace(trace: str, plan: str, cluster: str, output: str, name: str) -> None:
    """``meshplan calibrate --from-trace``: fit a cluster to ``trace`` (an executor trace of
    ``plan``, :func:`from_executor_trace`; or a foreign profiler trace, per kernel class:
    ``executor.trace_calibrate``), write the YAML ``output`` and print measured vs predicted
    per kernel class. ``plan`` or ``cluster`` (exactly one) gives the cluster fitted. Raises
    MeshplanError naming the option for a bad combination."""
    from pathlib import Path

    import yaml

    from clusters import load_cluster
    from executor.trace_calibrate import (
        apply_fit,
        class_times,
        fit_trace,
        load_trace,
        measured_times,
        trace_samples,
    )

    if bool(plan) == bool(cluster):
        raise MeshplanError("--from-trace needs exactly one of --plan PLAN.json or --cluster NAME")
    if plan:
        from meshplan.plan import Plan

        cluster = Plan.load(plan).cluster
    base = load_cluster(cluster).spec.model_dump(exclude_none=True)
    files = executor_traces(trace)
    if files:
        if not plan:
            raise MeshplanError("--from-trace of an executor trace needs --plan PLAN.json (its ops are matched)")
        from_executor_trace(files, plan, cluster, base, output, name)
        return
    samples = trace_samples(load_trace(trace))
    fit = fit_trace(samples)
    out = Path(output)
    spec = apply_fit(base, fit, samples.dtype, Path(trace).name)
    spec["name"] = name or out.stem
    check_fit(spec, out, trace)
    out.write_text(f"# Written by `meshplan calibrate --from-trace {trace}` from cluster {cluster}; "
                   f"see executor/trace_calibrate.py.\n" + yaml.safe_dump(spec, sort_keys=False, width=200))
    echo(f"wrote {out} (cluster {cluster} calibrated from {trace}; {samples.counts})")
    measured, before, after = measured_times(samples), class_times(samples, base), class_times(samples, spec)
    echo(f"{'kernel class':<14}{'measured ms':>13}{'before ms':>13}{'after ms':>13}")
    for cls, t in measured.items():
        if t > 0:
            echo(f"{cls:<14}{t * 1e3:>13.3f}{before[cls] * 1e3:>13.3f}{after[cls] * 1e3:>13.3f}")
