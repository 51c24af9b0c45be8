"""``goodput``: time to train under failures and checkpoints (issue 41).

Part 1 -- the Llama 3 405B run's effective training time. The Llama 3 report (Dubey et al.
2024, sec. 3.3.4) states 466 job interruptions in a 54-day snapshot on 16,384 H100 (419
unexpected, Table 5 by cause; 47 planned) and "higher than 90% effective training time".
The interruption counts enter as the default reliability section's rates
(``clusters/defaults/goodput.yaml``: each cause's count over the snapshot's GPU-hours or
node-hours), so that 16,384 GPUs in 2,048 nodes see 466 in 54 days; the checkpoint setup
is stated: the model's config (``experiments/data/llama-3.1-405b.json``, Meta's published
config.json), the report's layout for 16K GPUs (Table 4: TP 8, PP 16, DP 128, 16M-token
batches of 8,192-token sequences; here with 4 virtual stages and full recompute, which fit
the memory model), the bytes each GPU saves from the memory model, the report's storage
(sec. 3.3.1: Tectonic, 2 TB/s sustained and 7 TB/s peak, as the aggregate write and read
bandwidth), a synchronous save (the report does not say it saves asynchronously), hot
spare nodes (the run used 16K of a 24K-GPU cluster) and the default relaunch of 5 minutes.
The experiment computes the goodput (``simulator.goodput``: compute / expected wall time)
at the optimal interval, then the longest relaunch that still keeps 90% (bisection; the
goodput falls as the relaunch grows).

Part 2 -- what changes when the objective is the run, not the step. Llama 2 70B (4,096-token
sequences, 4,096-sequence batches, 2T tokens) under the ``deepspeed`` profile (a synchronous
save where the first data-parallel rank writes the replicated states) on DGX H100 nodes,
no hot spare: every plan of a small family (tp 8; pp 4 or 8; ZeRO 0 or 1; full recompute)
on each cluster size, scored by the tuner's objectives (``simulator.goodput.objectives``:
``time``, ``time-to-train``, ``cost-to-train`` at the dated default price). The table gives
each size's best plan by each objective, and the size each objective picks: GPU-hours per
million tokens (``tune --gpus --objective cost``, the step's view) against the dollars of
the whole run, failures included.

The table gives each size's best plan by step time and by the cost to train, its
step-only days, expected days and dollars without and with one hot spare node; the notes
give the size each view picks under deadlines halfway between the step-only and the expected
days of the two largest sizes (where the two views part).

Part 3 -- the tail: Llama 2 7B plans on 2 DGX H100 nodes, the deterministic step against the
P50 / P90 / P99 sampled with the default jitter on the SimPy engine, and what one GPU 10%
slower or one link twice as slow costs each (``simulator.goodput.jitter``).

Outputs: ``goodput.csv`` / ``.md`` (part 2), ``goodput_llama3.csv`` / ``.md`` (part 1),
``goodput_tail.csv`` / ``.md`` (part 3) and ``goodput.png`` (days and dollars to train by
size).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from experiments.base import ExperimentResult, agg_pyplot, register_experiment, require, save_figure
from experiments.tables import to_markdown

NAME = "goodput"
TITLE = "Time to train: the Llama 3 405B run's effective training time, and the plan and size goodput picks"
LLAMA405 = Path(__file__).parent / "data" / "llama-3.1-405b.json"
#: Llama 3 (Dubey et al. 2024) sec. 3.3.1: Tectonic serves 2 TB/s sustained and 7 TB/s peak
TECTONIC_WRITE, TECTONIC_READ = 2.0e12, 7.0e12
SNAPSHOT_DAYS = 54
#: the report's pre-training tokens (sec. 3.1: 15.6T)
LLAMA3_TOKENS = 15.6e12


def _llama3_cluster() -> Any:
    """DGX H100 nodes (2,048) with the Llama 3 report's checkpoint storage."""
    from clusters import Cluster
    from clusters.catalog import catalog_spec
    from clusters.goodput_spec import goodput_sections

    spec = catalog_spec("dgx-h100")
    base = goodput_sections(spec).storage
    src = "Llama 3 (Dubey et al. 2024) sec. 3.3.1: Tectonic, 2 TB/s sustained, 7 TB/s peak"
    storage = base.model_copy(update={
        "aggregate_write_bandwidth": base.node_write_bandwidth.model_copy(
            update={"value": TECTONIC_WRITE, "provenance": src + " (sustained, for writes)"}),
        "aggregate_read_bandwidth": base.node_read_bandwidth.model_copy(
            update={"value": TECTONIC_READ, "provenance": src + " (peak, for reads)"})})
    return Cluster(spec.model_copy(update={"storage": storage}), 2048)


def _goodput_at(model: Any, res: Any, sections: Any, relaunch: float) -> Any:
    """The Llama 3 plan's run with the relaunch set to ``relaunch`` seconds."""
    from simulator.goodput.plan import TrainSettings, plan_run

    rel = sections.reliability
    restart = rel.restart.model_copy(update={"relaunch_s": rel.restart.relaunch_s.model_copy(
        update={"value": relaunch})})
    secs = type(sections)(storage=sections.storage, reliability=rel.model_copy(update={"restart": restart}),
                          jitter=sections.jitter, defaulted=sections.defaulted)
    return plan_run(model, res, TrainSettings(tokens=LLAMA3_TOKENS, mode="sync", spares=1), secs)


def llama3_rows(quick: bool = True) -> tuple[pd.DataFrame, list[str]]:
    """Part 1 (module docstring): one row per relaunch time, and the notes."""
    Engine = require(NAME, "meshplan.engine", "Engine")
    Strategy = require(NAME, "meshplan.strategy", "Strategy")
    sections_of = require(NAME, "clusters.goodput_spec", "goodput_sections")
    eng = Engine(str(LLAMA405), _llama3_cluster(),
                 Strategy(dp=128, tp=8, pp=16, vpp=4, schedule="VPP", sequence_parallel=True,
                          global_batch_size=2048, micro_batch_size=1, zero=1, recompute="full"), seq_len=8192)
    model = eng.step_model()
    res = model.run()
    sections = sections_of(eng.cluster)
    rows = []
    for relaunch in (60.0, 300.0, 600.0, 900.0, 1200.0):
        pr = _goodput_at(model, res, sections, relaunch)
        b = pr.breakdown
        rows.append({"relaunch_s": relaunch, "interruptions_54d": (pr.failures.rate + pr.failures.planned_rate)
                     * SNAPSHOT_DAYS * 86400, "mtbf_h": pr.failures.mtbf_s / 3600,
                     "save_stall_s": pr.checkpoint.stall_s, "save_GiB_per_gpu": pr.checkpoint.max_gpu_bytes / 2**30,
                     "interval_steps": b.interval, "interval_min": b.interval * res.step_time / 60,
                     "restore_s": pr.restart.restore, "step_s": res.step_time, "goodput": b.goodput,
                     "days_to_train": b.total_s / 86400})
    lo, hi = 0.0, 7200.0  # the longest relaunch keeping 90%: goodput falls as it grows
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _goodput_at(model, res, sections, mid).breakdown.goodput > 0.9 else (lo, mid)
    df = pd.DataFrame(rows)
    at5 = df.loc[df.relaunch_s == 300.0].iloc[0]
    mc_note = _monte_carlo_note(_goodput_at(model, res, sections, 300.0), 8 if quick else 40)
    notes = [f"Llama 3 405B on 16,384 H100: {at5.interruptions_54d:.0f} interruptions in 54 days (report: 466); "
             f"with a 5-minute relaunch, hot spares and a synchronous save of {at5.save_GiB_per_gpu:.2f} GiB a GPU "
             f"({at5.save_stall_s:.1f} s) every {at5.interval_min:.1f} min, goodput {at5.goodput:.1%} "
             f"(report: higher than 90%)",
             f"goodput stays above 90% for a relaunch up to {lo / 60:.1f} min (the report's figure bounds the "
             f"mean relaunch at about that)", mc_note]
    return df, notes


def _monte_carlo_note(pr: Any, replicas: int) -> str:
    """The 5-minute case played on SimPy with injected interruptions (``simulator.goodput
    .montecarlo``; its unplanned part, which the Monte Carlo plays) against the closed form."""
    from dataclasses import replace

    from simulator.goodput.goodput import expected_time
    from simulator.goodput.montecarlo import simulate_runs

    run = replace(pr.run, planned_rate=0.0)
    k = pr.breakdown.interval
    closed = expected_time(run, k).total_s
    mc = simulate_runs(run, k, replicas=replicas, seed=0)
    return (f"SimPy Monte Carlo of that run ({replicas} replicas, unplanned interruptions injected): "
            f"{mc.mean_s / 86400:.3f} +- {mc.stderr_s / 86400:.3f} days against the closed form's "
            f"{closed / 86400:.3f} ({mc.mean_s / closed - 1:+.2%})")


#: part 2's plan family: (pp, zero)
FAMILY = ((4, 0), (4, 1), (8, 0), (8, 1))


def _plan_rows(gpus: int, quick: bool) -> list[dict[str, Any]]:
    """Every plan of :data:`FAMILY` that fits on ``gpus`` GPUs, scored by the
    ``cost-to-train`` objective without and with one hot spare node (part 2)."""
    Engine = require(NAME, "meshplan.engine", "Engine")
    Strategy = require(NAME, "meshplan.strategy", "Strategy")
    sections_of = require(NAME, "clusters.goodput_spec", "goodput_sections")
    from clusters import load_cluster
    from clusters.prices import price_of
    from simulator.goodput.objectives import ObjectiveSettings, objective_value

    cluster = load_cluster("dgx-h100", gpus // 8)
    price = price_of(cluster).usd_per_gpu_hour
    goals = [ObjectiveSettings(name="cost-to-train", tokens=2e12, price=price, spares=n) for n in (0, 1)]
    sections = sections_of(cluster)
    rows = []
    for pp, zero in FAMILY[:2] if quick else FAMILY:
        dp = gpus // (8 * pp)
        eng = Engine("llama2-70b", cluster, Strategy(dp=dp, tp=8, pp=pp, sequence_parallel=True, zero=zero,
                                                     recompute="full", global_batch_size=4096,
                                                     framework="deepspeed"), seq_len=4096)
        model = eng.step_model()
        res = model.run()
        if res.max_memory_bytes > cluster.device.memory_limit():
            continue
        (_, m0), (_, m1) = (objective_value(g, model, res, sections) for g in goals)
        steps = -(-int(2e12) // (4096 * 4096))
        rows.append({"gpus": gpus, "plan": f"tp8 pp{pp} dp{dp} zero{zero}", "step_s": res.step_time,
                     "gpu_h_per_mtok": res.step_time * gpus / 3600 / (4096 * 4096 / 1e6),
                     "step_days": steps * res.step_time / 86400, "days_to_train": m0["time_to_train_s"] / 86400,
                     "goodput": m0["goodput"], "save_stall_s": m0["checkpoint_stall_s"], "cost_usd": m0["cost_usd"],
                     "days_1_spare": m1["time_to_train_s"] / 86400, "cost_1_spare": m1["cost_usd"]})
    return rows


def choice_rows(quick: bool) -> pd.DataFrame:
    """Part 2: per size, the best plan by step time and by the run (module docstring)."""
    sizes = (512, 4096) if quick else (512, 1024, 2048, 4096, 8192)
    plans = pd.DataFrame([r for g in sizes for r in _plan_rows(g, quick)])
    out = []
    for g, grp in plans.groupby("gpus"):
        by_step, by_run = grp.loc[grp.step_s.idxmin()], grp.loc[grp.cost_usd.idxmin()]
        out.append({"gpus": g, "best_by_step": by_step.plan, "best_by_cost_to_train": by_run.plan,
                    "step_s": by_run.step_s, "gpu_h_per_mtok": by_step.gpu_h_per_mtok,
                    "step_days": by_run.step_days, "days_to_train": by_run.days_to_train,
                    "goodput": by_run.goodput, "save_stall_s": by_run.save_stall_s,
                    "cost_usd": by_run.cost_usd, "days_1_spare": by_run.days_1_spare,
                    "cost_1_spare": by_run.cost_1_spare})
    return pd.DataFrame(out)


def _cheapest(df: pd.DataFrame, days: str, cost: str, deadline: float) -> str:
    """The cheapest size (by ``cost``) whose ``days`` meet ``deadline``; "none"."""
    ok = df[df[days] <= deadline]
    return "none" if ok.empty else str(int(ok.loc[ok[cost].idxmin(), "gpus"]))


def tail_rows(quick: bool) -> pd.DataFrame:
    """Part 3: Llama 2 7B plans on 2 DGX H100 nodes, deterministic step against the sampled
    P50 / P90 / P99 with the default jitter, and what a slow GPU or link costs each."""
    Engine = require(NAME, "meshplan.engine", "Engine")
    Strategy = require(NAME, "meshplan.strategy", "Strategy")
    sections_of = require(NAME, "clusters.goodput_spec", "goodput_sections")
    from simulator.goodput.jitter import StepShape, percentiles, sample_steps, sensitivity

    plans = [("fsdp2 zero3 dp16", dict(dp=16, zero=3, framework="fsdp2", recompute="full")),
             ("tp2 dp8 zero1", dict(dp=8, tp=2, zero=1, recompute="full")),
             ("tp2 pp2 dp4 zero1", dict(dp=4, tp=2, pp=2, zero=1)),
             ("pp4 dp4 zero1", dict(dp=4, pp=4, zero=1)),
             ("tp2 pp4 dp2 zero1", dict(dp=2, tp=2, pp=4, zero=1))]
    rows = []
    for label, kw in plans[:3] if quick else plans:
        eng = Engine("llama2-7b", "dgx-h100", Strategy(global_batch_size=64, **kw), nodes=2, seq_len=4096)
        model = eng.step_model()
        res = model.run()
        shape = StepShape.of(model, res)
        pct = percentiles(sample_steps(shape, sections_of(eng.cluster).jitter, 50 if quick else 300, 0))
        sens = sensitivity(shape)
        rows.append({"plan": label, "step_s": res.step_time, "p50_s": pct["p50"], "p90_s": pct["p90"],
                     "p99_s": pct["p99"], "p90_over_step": pct["p90"] / res.step_time - 1,
                     "slow_gpu_10pct": sens.slow_rank, "slow_link_2x": sens.slow_link})
    return pd.DataFrame(rows)


@register_experiment(NAME, TITLE)
def run(quick: bool, out_dir: Path) -> ExperimentResult:
    """Both parts (module docstring)."""
    llama, notes = llama3_rows(quick)
    (out_dir / "goodput_llama3.csv").write_text(llama.to_csv(index=False))
    (out_dir / "goodput_llama3.md").write_text(to_markdown(llama, ".4g") + "\n")
    df = choice_rows(quick)
    by_gpuh = int(df.loc[df.gpu_h_per_mtok.idxmin(), "gpus"])
    by_usd = int(df.loc[df.cost_usd.idxmin(), "gpus"])
    changed = df[df.best_by_step != df.best_by_cost_to_train]
    notes.append(f"the step's cheapest size (GPU-hours per million tokens) is {by_gpuh} GPUs; the run's "
                 f"(dollars to train, failures and restarts included) {by_usd} GPUs")
    notes.append(f"the best plan changes with the objective on {len(changed)} of {len(df)} sizes"
                 + (f" ({', '.join(f'{r.gpus}: {r.best_by_step} -> {r.best_by_cost_to_train}' for r in changed.itertuples())})"
                    if len(changed) else " (these plans' saves and restarts cost alike: the step decides)"))
    # deadlines between a size's step-only days and its expected days: where the two views part
    for d in sorted({round((r.step_days + r.days_to_train) / 2, 1) for r in df.tail(2).itertuples()}):
        notes.append(f"deadline {d} days: the cheapest size that meets it by the step alone is "
                     f"{_cheapest(df, 'step_days', 'gpu_h_per_mtok', d)} GPUs, by the expected run (no spare) "
                     f"{_cheapest(df, 'days_to_train', 'cost_usd', d)}, with one hot spare "
                     f"{_cheapest(df, 'days_1_spare', 'cost_1_spare', d)}")
    spare = df[df.cost_1_spare < df.cost_usd]
    notes.append("a hot spare node pays for itself from "
                 + (f"{int(spare.gpus.min())} GPUs on" if len(spare) else "no size here"))
    tail = tail_rows(quick)
    (out_dir / "goodput_tail.csv").write_text(tail.to_csv(index=False))
    (out_dir / "goodput_tail.md").write_text(to_markdown(tail, ".4g") + "\n")
    det, p90 = tail.loc[tail.step_s.idxmin(), "plan"], tail.loc[tail.p90_s.idxmin(), "plan"]
    notes.append(f"tail (2 nodes, Llama 2 7B): P90 is {tail.p90_over_step.min():.1%} to "
                 f"{tail.p90_over_step.max():.1%} above the step; best by step {det}, by P90 {p90}")
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(df.gpus, df.days_to_train, "o-", label="days to train")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("expected days to train 2T tokens")
    ax2 = ax.twinx()
    ax2.plot(df.gpus, df.cost_usd / 1e6, "s--", color="C1", label="cost (M$)")
    ax2.set_ylabel("cost to train (M$)")
    ax.set_title("Llama 2 70B, DeepSpeed, no hot spare")
    fig.legend(loc="upper center", fontsize=8)
    figs = [save_figure(fig, out_dir / "goodput.png")]
    return ExperimentResult(NAME, TITLE, df, __doc__ or "", notes, figs, float_format=".4g")


__all__ = ["FAMILY", "choice_rows", "llama3_rows", "run", "tail_rows"]
