"""The demo's building blocks at a small size (a 4-layer llama2-7b on one DGX A100 node, 30
trials) written into a temporary report directory: every listed file exists and holds what
it says. The full ``meshplan demo`` (``python -m meshplan.demo``) is not run here (it is
timed by hand)."""

from __future__ import annotations

import csv
import json

import matplotlib.image as mpimg
import pytest

from meshplan.cli import main
from meshplan.demo import run_validation, write_validation_plan
from meshplan.demo_markdown import readme_text, validation_lines
from meshplan.demo_report import (
    FILES,
    MARKER,
    DemoError,
    DemoSetup,
    best_plan,
    prepare_dir,
    run_search,
    scored_points,
    write_artifacts,
)
from meshplan.engine import Engine
from meshplan.plan import Plan
from tuner.result import plan_label

SETUP = DemoSetup(nodes=1, global_batch=16, seq_len=1024, trials=30, num_layers=4)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = prepare_dir(tmp_path_factory.mktemp("demo") / "reports" / "demo")
    outcome = run_search(SETUP)
    best = best_plan(outcome)
    files = write_artifacts(out, outcome, best)
    names = ["README.md", *files]
    (out / "README.md").write_text(readme_text(outcome, best, names))
    return out, outcome, best, names


@pytest.mark.slow
def test_every_listed_file_exists_and_is_not_trivial(report):
    out, _, best, names = report
    assert best is not None
    assert set(names) == {"README.md", "trials.csv", "plan.json", "best_plan_timeline.png",
                          "best_plan_trace.json", "time_vs_memory.png"}
    for name in names:
        assert (out / name).stat().st_size > 200, name
        assert name in FILES


def test_pngs_decode_with_their_figure_sizes(report):
    out, _, best, _ = report
    img = mpimg.imread(out / "time_vs_memory.png")
    assert img.shape[:2] == (650, 1000)  # figsize (10, 6.5) inches at 100 dpi
    assert img[..., :3].std() > 0.05  # not a blank canvas
    gantt = mpimg.imread(out / "best_plan_timeline.png")
    pp = best.plan.strategy.pp
    assert gantt.shape[:2] == (round((0.4 * pp + 1.5) * 100), 1200)  # SimResult.plot_timeline


def test_csv_has_one_row_per_trial(report):
    out, outcome, _, _ = report
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert len(rows) == len(outcome.result.trials())
    scored = [r for r in rows if r["step_time_s"]]
    assert len(scored) == outcome.result.counts()["complete"]
    assert len({r["trial"] for r in rows}) == len(rows)
    # --trials counts distinct plans (issue 36): the repeats are the rows served from the cache
    assert sum(r["cached"] != "True" for r in rows) == SETUP.trials


def test_readme_names_the_best_plan_and_its_numbers(report):
    out, outcome, best, names = report
    text = (out / "README.md").read_text()
    label = plan_label(best.record["plan"])
    assert f"**{label}**" in text
    assert f"step time **{best.record['time_s']:.3f} s**" in text
    top = [ln for ln in text.splitlines() if ln.startswith("| 1 |")]
    assert top and f"| {best.record['time_s']:.3f} |" in top[0]
    n_rows = sum(1 for ln in text.splitlines() if ln.startswith("| ") and ln[2].isdigit())
    assert n_rows == min(10, len(outcome.result.feasible()))
    for name in names:
        assert f"- `{name}`" in text
    assert f"{SETUP.trials} trials" in text and "## Local validation" in text


def test_plan_json_reproduces_the_best_plan(report):
    out, _, best, _ = report
    plan = Plan.load(out / "plan.json")
    assert plan == best.plan
    # the best trial's score, the plan.json round trip and the plotted timeline agree
    assert Engine.from_plan(plan).simulate().step_time == pytest.approx(best.record["time_s"])
    assert best.step.step_time == pytest.approx(best.record["time_s"])


def test_chrome_trace_holds_every_action(report):
    out, _, best, _ = report
    events = json.loads((out / "best_plan_trace.json").read_text())["traceEvents"]
    sim = best.step.sim
    # the whole step (issue 20 item 7): each rank's compute thread (tid 0) holds its
    # pipeline actions, a process is named per rank, the last event ends the step
    assert sum(e["ph"] == "X" and e["tid"] == 0 for e in events) == len(sim.timeline)
    assert sum(e["name"] == "process_name" for e in events) == sim.num_stages
    end_us = max(e["ts"] + e["dur"] for e in events if e["ph"] == "X")
    assert end_us == pytest.approx(best.step.step_time * 1e6, abs=0.05)


def test_scored_points_are_the_distinct_scored_plans(report):
    _, outcome, _, _ = report
    keys = {t.user_attrs["plan_key"] for t in outcome.result.trials() if "time_s" in t.user_attrs}
    pts = scored_points(outcome.result)
    assert len(pts) == len(keys)
    assert sum(p["feasible"] for p in pts) == len(outcome.result.feasible())


def test_output_dir_is_recreated_but_a_foreign_dir_is_refused(tmp_path, capsys):
    d = prepare_dir(tmp_path / "demo")
    (d / "old.txt").write_text("stale")
    d = prepare_dir(tmp_path / "demo")
    assert sorted(p.name for p in d.iterdir()) == [MARKER]
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("x")
    with pytest.raises(DemoError, match="not written by the demo"):
        prepare_dir(foreign)
    assert main(["demo", "--output", str(foreign), "--no-validate"]) == 2
    assert "not written by the demo" in capsys.readouterr().err
    assert (foreign / "keep.txt").read_text() == "x"


def test_validation_table_relative_errors():
    rows = [{"quantity": "step time (ms)", "predicted": 12.0, "measured": 10.0},
            {"quantity": "peak memory (MiB)", "predicted": None, "measured": 4.0}]
    lines = validation_lines({"rows": rows, "label": "tiny", "command": "meshplan validate"})
    assert "| step time (ms) | 12.000 | 10.000 | +20.0% |" in lines
    assert "| peak memory (MiB) | - | 4.000 |  |" in lines
    assert validation_lines({"error": "boom"}) == ["Failed: boom"]


@pytest.mark.slow
@pytest.mark.distributed
def test_demo_validation_runs_meshplan_validate(tmp_path):
    plan_path = write_validation_plan(tmp_path)
    got = run_validation(plan_path, tmp_path, steps=2)
    assert "error" not in got, got.get("error")
    # the prediction is the simulator's for this executor: Engine.cost() plus the
    # executor's separate gradient-accumulation adds (meshplan.validation.predict)
    from meshplan.validation import predict

    pred, _ = predict(Plan.load(plan_path))
    t_ms, _ = Engine.from_plan(Plan.load(plan_path)).cost()
    step = next(r for r in got["rows"] if r["quantity"] == "step time (ms)")
    assert step["predicted"] == pytest.approx(pred["step_time"] * 1e3) and step["measured"] > 0
    assert t_ms <= step["predicted"] < 1.2 * t_ms
    assert len(got["losses"]) == 2 and got["losses"][1] < got["losses"][0]  # SGD descends
    assert len(list(csv.DictReader((tmp_path / "validation.csv").open()))) == 1
