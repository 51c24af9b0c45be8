"""The README.md of the demo's report directory: the question, the setup, the best plan and
why it wins (its time and memory breakdowns and the nearest alternatives), the top plans,
the local validation and the list of files. Every number comes from the search result, the
best plan's simulation and (when it ran) ``meshplan validate``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clusters import load_cluster
from meshplan.demo_report import FILES, GIB, BestPlan, SearchOutcome, ranked
from tuner.result import plan_label


def annotation_label(plan: Mapping[str, Any]) -> str:
    """How the plan shards inside a rank: pattern templates, a full_random seed, or none."""
    if plan.get("tp", 1) == 1:
        return "none (tp=1)"
    if plan.get("annotation_seed") is not None:
        return f"full_random seed {plan['annotation_seed']}"
    t = {k: v for k, v in (plan.get("templates") or {}).items() if k != "loss"}
    return ", ".join(f"{k}={v}" for k, v in sorted(t.items())) or str(plan.get("annotation"))


def model_parameters(model: str, seq_len: int, num_layers: int | None = None) -> int:
    """Parameters of the whole model: the one-layer template program's non-layer parameters
    plus ``num_layers`` (default: the config's) times its layer-0 parameters."""
    from completion.models import get_model_config
    from meshplan.tuning import template_program

    prog, _ = template_program(model, seq_len)
    n = num_layers or get_model_config(model).num_layers
    layer = sum(_numel(v.shape) for v in prog.parameters() if ".layers.0." in (v.name or ""))
    return prog.num_parameters() - layer + n * layer


def _numel(shape: Sequence[int]) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def _row(i: int, t: Any) -> str:
    p, ua = t.user_attrs["plan"], t.user_attrs
    m = ua.get("metrics", {})
    cells = [str(i), f"{p['dp']}-{p['tp']}-{p['pp']}", p["schedule"], str(p["vpp"]),
             str(p["micro_batch_size"]), p["recompute"], str(p["zero"]),
             "yes" if p["sequence_parallel"] else "no", annotation_label(p),
             f"{ua['time_s']:.3f}", f"{m.get('tokens_per_s', 0.0):,.0f}",
             f"{m.get('mfu', 0.0):.3f}", f"{ua['memory_bytes'] / GIB:.1f}",
             f"{m.get('bubble_ratio', 0.0):.3f}"]
    return "| " + " | ".join(cells) + " |"


def top_table(outcome: SearchOutcome, k: int = 10) -> list[str]:
    """Markdown table of the ``k`` best distinct feasible plans."""
    head = ("| # | mesh dp-tp-pp | schedule | vpp | micro-batch | recompute | ZeRO | SP | "
            "annotation | step time (s) | tokens/s | MFU | peak memory (GiB) | bubble ratio |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    lines += [_row(i, t) for i, t in enumerate(ranked(outcome.result, k), 1)]
    from simulator.step import MFU_NOTE

    return [*lines, "", MFU_NOTE.split(" (--json")[0] + "."]


def _gap(t: Any, best_time: float) -> str:
    return f"{(t.user_attrs['time_s'] / best_time - 1) * 100:+.1f}%"


def alternatives(outcome: SearchOutcome, best: BestPlan) -> list[str]:
    """Bullets comparing the best plan with the runner-up, the best plan of each kind of
    parallelism it does not use, and the fastest plan that does not fit in memory."""
    feas = ranked(outcome.result)
    bt = best.record["time_s"]
    key = best.record.get("plan_key")
    others = [t for t in feas if t.user_attrs.get("plan_key") != key]
    out = []
    if others:
        t = others[0]
        out.append(f"Runner-up: {plan_label(t.user_attrs['plan'])}, {t.user_attrs['time_s']:.3f} s "
                   f"({_gap(t, bt)}), {t.user_attrs['memory_bytes'] / GIB:.1f} GiB.")
    bp = best.candidate
    for knob, word in (("tp", "tensor parallelism"), ("pp", "pipeline parallelism")):
        uses = getattr(bp, knob) > 1
        alt = [t for t in others if (t.user_attrs["plan"][knob] > 1) != uses]
        if alt:
            t = alt[0]
            extra = (f", bubble ratio {t.user_attrs['metrics'].get('bubble_ratio', 0):.3f}"
                     if knob == "pp" and not uses else "")
            what = f"without {word} ({knob} = 1)" if uses else f"with {word} ({knob} > 1)"
            out.append(f"Best plan {what}: {plan_label(t.user_attrs['plan'])}, "
                       f"{t.user_attrs['time_s']:.3f} s ({_gap(t, bt)}){extra}.")
    oom = [t for t in outcome.result.trials() if "time_s" in t.user_attrs
           and t.user_attrs["memory_bytes"] > t.user_attrs["memory_limit_bytes"]
           and t.user_attrs["time_s"] < bt]
    if oom:
        t = min(oom, key=lambda t: t.user_attrs["time_s"])
        out.append(f"Faster but does not fit: {plan_label(t.user_attrs['plan'])}, "
                   f"{t.user_attrs['time_s']:.3f} s, needs {t.user_attrs['memory_bytes'] / GIB:.1f} "
                   f"GiB per GPU (limit {t.user_attrs['memory_limit_bytes'] / GIB:.1f} GiB).")
    return out


def why_lines(outcome: SearchOutcome, best: BestPlan) -> list[str]:
    """The best plan's time breakdown (critical rank) and memory breakdown (heaviest rank)
    against the device memory, then :func:`alternatives`."""
    step = best.step
    total = sum(step.time_breakdown.values()) or 1.0
    parts = ", ".join(f"{k} {v:.3f} s ({v / total:.1%})" for k, v in step.time_breakdown.items()
                      if v > 0)
    limit = best.record["memory_limit_bytes"]
    mem = ", ".join(f"{k} {v / GIB:.1f}" for k, v in step.memory_breakdown.items()
                    if k != "total" and v > 0)
    lines = [f"- Time of the critical rank: {parts}.",
             f"- Memory of the heaviest rank (GiB): {mem}; total "
             f"{step.max_memory_bytes / GIB:.1f} of {limit / GIB:.1f} GiB "
             f"({1 - step.max_memory_bytes / limit:.0%} headroom)."]
    return lines + [f"- {a}" for a in alternatives(outcome, best)]


def setup_lines(outcome: SearchOutcome) -> list[str]:
    """The model, the cluster, the search and how to reproduce it."""
    s = outcome.setup
    from completion.models import get_model_config

    cfg = get_model_config(s.model)
    layers = s.num_layers or cfg.num_layers
    cl = load_cluster(s.cluster, s.nodes)
    n = cl.spec.node
    counts = outcome.result.counts()
    return [
        f"- Model: {s.model} ({cfg.family}, {layers} layers, hidden {cfg.hidden_size}, "
        f"{cfg.num_heads} heads, FFN {cfg.ffn_hidden_size}, vocabulary {cfg.vocab_size}; "
        f"{model_parameters(s.model, s.seq_len, s.num_layers) / 1e9:.2f} B parameters), "
        f"bf16 with AdamW.",
        f"- Cluster: {s.nodes} x {s.cluster} = {cl.world_size} x {cl.device.name} "
        f"({cl.device.memory_bytes.value / 2**30:g} GiB each; {cl.devices_per_node} per node at "
        f"{n.intra_bandwidth.value / 1e9:g} GB/s all-reduce bus bandwidth, "
        f"{n.nic_count.value} x {n.nic_bandwidth.value / 1e9:g} GB/s NICs per node).",
        f"- Step: {s.global_batch} sequences x {s.seq_len} tokens = "
        f"{s.global_batch * s.seq_len:,} tokens.",
        f"- Search: {s.mode}, {outcome.config.sampler_name} sampler, seed {s.seed}, "
        f"{s.trials} trials in {outcome.seconds:.1f} s: {counts.get('complete', 0)} scored "
        f"({counts.get('cached', 0)} repeats served from the cache, {counts.get('oom', 0)} out "
        f"of memory), {counts.get('pruned', 0)} pruned as illegal before simulation. Each plan "
        f"is completed, partitioned and simulated (`Engine.simulate`).",
        f"- Reproduce the search: `{s.command()}`.",
    ]


def validation_lines(validation: Mapping[str, Any] | None) -> list[str]:
    """The predicted vs measured table of ``meshplan validate --json`` (``rows``), with the
    plan it ran (``label``); a note when validation was skipped or failed (``error``)."""
    if not validation:
        return ["Skipped (`python -m meshplan.demo --no-validate`)."]
    if validation.get("error"):
        return [f"Failed: {validation['error']}"]
    lines = [f"Plan: {validation.get('label', '')}; `{validation.get('command', '')}`.", "",
             "| quantity | predicted | measured | relative error |", "|---|---|---|---|"]
    for r in validation["rows"]:
        p, m = r["predicted"], r["measured"]
        err = "" if p is None or not m else f"{(p - m) / m:+.1%}"
        lines.append(f"| {r['quantity']} | {'-' if p is None else f'{p:.3f}'} | {m:.3f} | {err} |")
    if validation.get("note"):
        lines += ["", validation["note"]]
    return lines


def readme_text(outcome: SearchOutcome, best: BestPlan | None, files: Sequence[str],
                validation: Mapping[str, Any] | None = None) -> str:
    """The whole README.md (see module docstring); ``files``: names written, listed with
    their descriptions from ``demo_report.FILES``."""
    s = outcome.setup
    cl = load_cluster(s.cluster, s.nodes)
    lines = [f"# meshplan demo: {s.model} on {s.nodes} x {s.cluster}", "", "## The question", "",
             f"How should {s.model} be split over {cl.world_size} GPUs ({s.nodes} x {s.cluster}) "
             f"so that one training step of {s.global_batch} sequences of {s.seq_len} tokens is "
             f"as fast as possible while every GPU stays within its "
             f"{cl.device.memory_bytes.value / 2**30:g} GiB of memory?", "", "## Setup", ""]
    lines += setup_lines(outcome)
    lines += ["", "## Best plan", ""]
    if best is None:
        lines.append("No scored plan fits in device memory; see trials.csv.")
    else:
        st = best.plan.strategy
        r = best.step
        lines += [
            f"**{plan_label(best.record['plan'])}** (annotation: "
            f"{annotation_label(best.record['plan'])}; {st.num_microbatches} micro-batches "
            f"per step): step time **{r.step_time:.3f} s**, {r.tokens_per_s:,.0f} tokens/s, "
            f"{r.tflops_per_gpu:.1f} TFLOP/s per GPU, MFU {r.mfu:.1%} (causal attention "
            f"counted in full, as Megatron-LM does; {r.mfu_causal:.1%} counting it as "
            f"executed), peak memory "
            f"{r.max_memory_bytes / GIB:.1f} GiB, bubble ratio {r.sim.bubble_ratio:.3f}.", "",
            "Why this plan:", ""]
        lines += why_lines(outcome, best)
    lines += ["", "## Top 10 plans (distinct, fitting in memory, fastest first)", ""]
    lines += top_table(outcome, 10)
    lines += ["", "## Local validation (2 ranks on this machine)", ""]
    lines += validation_lines(validation)
    lines += ["", "## Files", ""]
    lines += [f"- `{f}`: {FILES.get(f, '')}" for f in files]
    return "\n".join(lines) + "\n"
