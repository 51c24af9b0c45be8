"""Gantt charts of a pipeline timeline or a whole step (matplotlib, Agg backend).

One row per pipeline rank; a bar per action coloured by kind (:data:`COLORS`), chunks of
one rank told apart by hatching (:data:`HATCHES`: chunk 0 plain, chunk 1 ``//``, ...); the
legend sits outside the axes, right of the bars, so it never hides one. A step chart
(:func:`draw_step`) adds a thin lane under each rank for its communication (pipeline
send/recv and the gradient sync) and draws the optimizer step on the compute lane. Times
in ms on the x axis.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from simulator.errors import SimulatorError

#: action kind -> colour (pipeline actions, then the step's other work)
COLORS = {"F": "#4C72B0", "B": "#55A868", "W": "#8C613C", "BW": "#DD8452",
          "optimizer": "#C44E52", "dp_sync": "#8172B3", "pp_comm": "#937860"}
#: legend labels of the kinds that are not pipeline actions
LABELS = {"optimizer": "optimizer", "dp_sync": "DP/FSDP sync", "pp_comm": "PP send/recv"}
#: chunk index (mod len) -> matplotlib hatch
HATCHES = ("", "//", "..", "xx", "\\\\", "++", "--", "oo")
#: fraction of the figure width kept right of the axes for the legend
LEGEND_WIDTH = 0.13


class Bar(NamedTuple):
    """One bar: row (rank), lane (0 compute, 1 communication), start and duration in ms,
    colour key (a key of :data:`COLORS`) and chunk (-1: none)."""

    row: int
    lane: int
    start_ms: float
    dur_ms: float
    kind: str
    chunk: int


def pipeline_bars(timeline: Iterable[Any]) -> list[Bar]:
    """The bars of a pipeline timeline (``SimResult.timeline``, integer ns)."""
    return [Bar(e.rank, 0, e.start / 1e6, (e.end - e.start) / 1e6, e.kind, e.chunk) for e in timeline]


def step_bars(events: Iterable[Any]) -> list[Bar]:
    """The bars of a step's events (``simulator.step_trace.step_events``): compute actions
    and the optimizer on lane 0, pipeline send (not the matching recv, the same interval)
    and gradient sync on lane 1; the in-stage collectives are inside the actions."""
    out = []
    for e in events:
        if e.stream == "compute":
            out.append(Bar(e.rank, 0, e.start / 1e6, (e.end - e.start) / 1e6, e.kind, e.chunk))
        elif e.stream == "optimizer":
            out.append(Bar(e.rank, 0, e.start / 1e6, (e.end - e.start) / 1e6, "optimizer", -1))
        elif e.stream == "dp_sync" or (e.stream == "pp_comm" and e.kind == "send"):
            out.append(Bar(e.rank, 1, e.start / 1e6, (e.end - e.start) / 1e6, e.stream, -1))
    return out


def draw(ax: Any, bars: Sequence[Bar], num_rows: int, title: str) -> None:
    """Draw ``bars`` on ``ax``: rank r's lane 0 at [r - 0.4, r + 0.2] (the whole row
    [r - 0.4, r + 0.4] when no bar uses lane 1), lane 1 at [r + 0.22, r + 0.4]."""
    two = any(b.lane for b in bars)
    lanes = {0: (-0.4, 0.6 if two else 0.8), 1: (0.22, 0.18)}
    groups: dict[tuple[int, int, str, int], list[tuple[float, float]]] = {}
    for b in bars:
        groups.setdefault((b.row, b.lane, b.kind, max(b.chunk, 0)), []).append((b.start_ms, b.dur_ms))
    for (row, lane, kind, chunk), xs in groups.items():
        off, h = lanes[lane]
        ax.broken_barh(xs, (row + off, h), facecolors=COLORS.get(kind, "#999999"),
                       edgecolor="white", linewidth=0.3, hatch=HATCHES[chunk % len(HATCHES)] or None)
    ax.set_yticks(range(num_rows), [f"rank {r}" for r in range(num_rows)])
    ax.set_ylim(num_rows - 0.5, -0.5)
    ax.set_title(title, fontsize=10)


def legend_handles(bars: Iterable[Bar]) -> list[Any]:
    """Legend entries: one per colour used, then one per chunk (hatch) when more than one."""
    from matplotlib.patches import Patch

    bars = list(bars)
    kinds = {b.kind for b in bars}
    chunks = sorted({b.chunk for b in bars if b.chunk >= 0})
    out = [Patch(facecolor=c, label=LABELS.get(k, k)) for k, c in COLORS.items() if k in kinds]
    if len(chunks) > 1:
        out += [Patch(facecolor="white", edgecolor="black", hatch=HATCHES[c % len(HATCHES)] or None,
                      label=f"chunk {c}") for c in chunks]
    return out


def layout(fig: Any, bars: Iterable[Bar]) -> Any:
    """Put the legend of ``bars`` right of the axes (the figure's last
    :data:`LEGEND_WIDTH`, outside every bar) and lay the axes out left of it; returns the
    legend."""
    leg = fig.legend(handles=legend_handles(bars), loc="upper left", fontsize=8,
                     bbox_to_anchor=(1 - LEGEND_WIDTH + 0.005, 0.98), borderaxespad=0)
    fig.tight_layout(rect=(0, 0, 1 - LEGEND_WIDTH, 1))
    return leg


def save(fig: Any, bars: Iterable[Bar], path: str | Path, dpi: int = 100) -> Path:
    """:func:`layout` ``fig``, write it as PNG at ``path``, close it; returns the path.
    Raises OSError when the path cannot be written."""
    import matplotlib.pyplot as plt

    layout(fig, bars)
    out = Path(path)
    try:
        fig.savefig(out, dpi=dpi)
    finally:
        plt.close(fig)
    return out


def figure(rows: Sequence[int]) -> tuple[Any, list[Any]]:
    """A 12-inch-wide figure with one axes per entry of ``rows`` (its rank count), stacked
    with a shared time axis; 0.4 inch per rank plus 1.5 (0.9 per extra panel)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    height = sum(0.4 * n for n in rows) + 1.5 + 0.9 * (len(rows) - 1)
    fig, axes = plt.subplots(len(rows), 1, figsize=(12, height), sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": [max(n, 1) for n in rows]})
    axes = [a[0] for a in axes]
    axes[-1].set_xlabel("time (ms)")
    return fig, axes


def step_title(label: str, result: Any) -> str:
    """``LABEL: SCHEDULE p=.. m=.. v=.., step X ms, bubble ratio Y`` of a StepResult."""
    s = result.sim
    return (f"{label}{': ' if label else ''}{s.schedule_name} p={s.num_stages} "
            f"m={s.num_microbatches} v={s.num_chunks}, step {result.step_time * 1e3:.2f} ms, "
            f"bubble ratio {s.bubble_ratio:.4f}")


def plot_steps(panels: Sequence[tuple[str, Any]], path: str | Path) -> Path:
    """A PNG of one or more steps side by side (stacked, one shared time axis so their
    lengths compare): ``panels`` = [(label, StepResult)]. Raises ValueError when empty."""
    if not panels:
        raise SimulatorError("plot_steps needs at least one step")
    fig, axes = figure([res.sim.num_stages for _, res in panels])
    allbars: list[Bar] = []
    for ax, (label, res) in zip(axes, panels, strict=True):
        bars = step_bars(res.events())
        draw(ax, bars, res.sim.num_stages, step_title(label, res))
        allbars += bars
    return save(fig, allbars, path)
