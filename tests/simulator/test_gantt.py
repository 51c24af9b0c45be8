"""Gantt charts (issue 20 item 7): the legend outside the bars, chunks told apart by
hatching, schedule and bubble ratio in the title; the step chart of ``cost --plot``."""

from __future__ import annotations

import matplotlib.image as mpimg
import pytest

from simulator import gantt
from simulator.pipeline_sim import simulate_pipeline
from simulator.schedules import build_schedule


@pytest.fixture(scope="module")
def vpp():
    return simulate_pipeline(build_schedule("VPP", 4, 8, 2), {"F": 1e-3, "B": 2e-3}, 1e-4)


def test_legend_is_outside_every_bar_and_chunks_are_hatched(vpp):
    bars = gantt.pipeline_bars(vpp.timeline)
    fig, (ax,) = gantt.figure([4])
    gantt.draw(ax, bars, 4, "t")
    leg = gantt.layout(fig, bars)
    fig.canvas.draw()
    assert leg.get_window_extent().x0 >= ax.get_window_extent().x1
    hatches = {c.get_hatch() for c in ax.collections}
    assert hatches == {None, "//"}  # chunk 0 plain, chunk 1 hatched
    labels = [t.get_text() for t in leg.get_texts()]
    assert labels == ["F", "BW", "chunk 0", "chunk 1"]
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_plot_timeline_title_and_size(tmp_path, vpp):
    import matplotlib.pyplot as plt

    saved = {}
    real = gantt.save

    def spy(fig, bars, path, dpi=100):
        saved["title"] = fig.axes[0].get_title()
        return real(fig, bars, path, dpi)

    gantt.save = spy
    try:
        png = vpp.plot_timeline(tmp_path / "v.png")
    finally:
        gantt.save = real
    assert saved["title"] == f"VPP: p=4 m=8 v=2, bubble ratio {vpp.bubble_ratio:.4f}"
    assert mpimg.imread(png).shape[:2] == (round((0.4 * 4 + 1.5) * 100), 1200)
    assert not plt.get_fignums()  # closed


def test_step_bars_put_the_tail_on_the_chart():
    from meshplan.engine import Engine
    from meshplan.strategy import Strategy

    s = Strategy(dp=2, pp=2, global_batch_size=8, zero=1)
    res = Engine("megatron-1.7b", "dgx-a100-80g", s, nodes=1, seq_len=512).simulate()
    bars = gantt.step_bars(res.events())
    kinds = {(b.lane, b.kind) for b in bars}
    assert kinds == {(0, "F"), (0, "BW"), (0, "optimizer"), (1, "dp_sync"), (1, "pp_comm")}
    end = max(b.start_ms + b.dur_ms for b in bars)
    assert end == pytest.approx(res.step_time * 1e3, abs=1e-4)
    assert gantt.step_title("x", res).startswith("x: 1F1B p=2 m=4 v=1, step ")
    with pytest.raises(ValueError, match="at least one"):
        gantt.plot_steps([], "never.png")
