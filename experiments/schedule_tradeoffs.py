"""``schedule_tradeoffs``: step time and peak activation memory of each pipeline schedule
for one model as the number of micro-batches m grows.

Model: the Zero Bubble 1.5B GPT (22 layers, h 2304, 24 heads, seq 1024, micro-batch 6) on
p = 8 stages, with the per-stage times of Table 9's m = 24 row (Qi et al. 2024) for every
m, and T_comm from the same row. Activation memory per stage and micro-batch follows the
Zero Bubble paper's per-layer counts (shared/reference/formulas.md):
M_B = s b (34 h + 5 a s) bytes, M_W = 32 s b h bytes, times 3 layer-equivalents per stage
((22 + 2) / 8, embedding and loss counting as one layer each). Parameters, gradients and
optimizer states are not included (they do not depend on the schedule).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.base import ExperimentResult, agg_pyplot, register_experiment, save_figure
from experiments.zero_bubble_data import MODELS, TABLE9, interleaved_chunks, stage_times

NAME = "schedule_tradeoffs"
GIB = float(1 << 30)
P = 8
M_FULL = (8, 16, 24, 32, 40, 48, 56, 64)
M_QUICK = (8, 16, 32)
# label -> (our schedule name, chunks or None for the 1F1B-I count, ZB memory limit)
SCHEDULES = {
    "FThenB": ("FThenB", 1, None),
    "1F1B": ("1F1B", 1, None),
    "VPP": ("VPP", None, None),
    "ZBH1": ("ZBH1", 1, None),
    "ZBH2": ("ZBH2", 1, None),
    "ZBVPP": ("ZBVPP", 2, None),
    "ZB": ("ZB", 1, 2 * P),
}


def activation_bytes() -> dict[str, float]:
    """``{"M_B", "M_W"}`` bytes per stage and micro-batch of the 1.5B model on p = 8
    (Zero Bubble paper's per-layer M_B and M_W, formulas.md, times the layers per stage)."""
    cfg = MODELS["1.5B"]
    s, b, h, a = cfg.seq, cfg.micro_batch, cfg.hidden, cfg.heads
    layers = interleaved_chunks(cfg, P)
    return {"M_B": layers * s * b * (34 * h + 5 * a * s), "M_W": layers * 32 * s * b * h}


def simulate_one(label: str, m: int) -> dict:
    """One (schedule, m) point: step time (ms), bubble ratio, peak activation GiB."""
    from simulator import build_schedule, simulate_pipeline

    row = TABLE9[0]
    st, comm = stage_times(row)
    name, v, limit = SCHEDULES[label]
    v = interleaved_chunks(MODELS[row.model], P) if v is None else v
    opts = {"stage_times": st, "comm_time": comm} if name == "ZB" else {}
    sched = build_schedule(name, P, m, v, limit, **opts)
    res = simulate_pipeline(sched, st, comm, memory=activation_bytes())
    return {"schedule": label, "v": v, "m": m, "step_time_ms": res.step_time * 1e3,
            "bubble_ratio": res.bubble_ratio, "peak_activation_GiB": res.max_peak_memory / GIB,
            "samples_per_s": m * row_micro_batch() / res.step_time}


def row_micro_batch() -> int:
    """Sequences per micro-batch of the 1.5B setup (paper Table 3)."""
    return MODELS["1.5B"].micro_batch or 1


def plot(df: pd.DataFrame, path: Path) -> Path:
    """Two panels against m: step time (ms) and peak activation memory (GiB)."""
    plt = agg_pyplot()
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.8))
    markers = "os^vD<>"
    for i, (label, sub) in enumerate(df.groupby("schedule", sort=False)):
        kw = {"marker": markers[i % len(markers)], "label": label}
        ax_t.plot(sub["m"], sub["step_time_ms"], **kw)
        ax_m.plot(sub["m"], sub["peak_activation_GiB"], **kw)
    ax_t.set(xlabel="micro-batches per step m", ylabel="step time (ms)",
             title="Step time (1.5B GPT, p = 8)")
    ax_m.set(xlabel="micro-batches per step m", ylabel="peak activation memory per GPU (GiB)",
             title="Peak activation memory (max over ranks)")
    for ax in (ax_t, ax_m):
        ax.grid(alpha=0.3)
        ax.legend(title="schedule", fontsize=9)
    return save_figure(fig, path)


@register_experiment(NAME, "Schedule trade-offs: step time and peak memory vs micro-batches")
def run(quick: bool, out_dir: Path) -> ExperimentResult:
    """Simulate every schedule of ``SCHEDULES`` for m in ``M_FULL`` (quick: ``M_QUICK``)
    and plot both metrics to ``out_dir/schedule_tradeoffs.png``."""
    ms = M_QUICK if quick else M_FULL
    df = pd.DataFrame.from_records([simulate_one(label, m) for label in SCHEDULES for m in ms])
    png = plot(df, Path(out_dir) / f"{NAME}.png")
    mem = activation_bytes()
    desc = (
        f"1.5B GPT of the Zero Bubble paper on p = {P} stages; per-stage T_F/T_B/T_W/T_comm "
        "from Table 9 (m = 24 row) for every m. VPP uses v = 3 chunks (one layer-equivalent "
        "each), ZBVPP the V of 2 chunks, ZB the automatic schedule with a 2p limit. "
        f"Activations per stage and micro-batch: M_B = {mem['M_B'] / GIB:.3f} GiB, "
        f"M_W = {mem['M_W'] / GIB:.3f} GiB (Zero Bubble paper's per-layer counts x 3 layers); "
        "model states are excluded."
    )
    last = df[df["m"] == max(ms)].set_index("schedule")
    fastest = last["step_time_ms"].idxmin()
    notes = [
        f"At m = {max(ms)}: fastest {fastest} ({last.loc[fastest, 'step_time_ms']:.1f} ms), "
        f"1F1B {last.loc['1F1B', 'step_time_ms']:.1f} ms; lowest memory "
        f"{last['peak_activation_GiB'].idxmin()} ({last['peak_activation_GiB'].min():.2f} GiB).",
        f"Peak activations at m = {max(ms)} in micro-batches of one stage (M_B): "
        + ", ".join(f"{k} {v * GIB / mem['M_B']:.2f}"
                    for k, v in last["peak_activation_GiB"].items())
        + ".",
    ]
    title = "Schedule trade-offs: step time and peak memory vs micro-batches"
    return ExperimentResult(NAME, title, df, desc, notes, [png], float_format=".3f")
