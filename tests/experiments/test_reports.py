"""Issue 20 item 5: honest, complete reports. ``cost`` echoes every input it assumed (text
and ``--json``), names its two bubble figures apart; ``complete`` explains its reshard count;
``tune`` says why its best plan won, or which constraint bound and by how much."""

from __future__ import annotations

import json
import re

import optuna
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.trial import TrialState, create_trial

from meshplan.engine import Engine
from meshplan.strategy import Strategy
from tests._cli import run_main, with_flags
from tuner.explain import why_best, why_none
from tuner.result import GIB, TuneResult

optuna.logging.set_verbosity(optuna.logging.WARNING)
# megatron-1.7b (seq_len 2048 in its config) on one 8-GPU DGX A100 node: dp 2 x pp 2 = 4 GPUs
COST = ["cost", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
        "--dp", "2", "--pp", "2", "--micro-batch-size", "1", "--global-batch", "8",
        "--recompute", "full", "--zero", "1"]


def test_cost_json_echoes_the_inputs_it_assumed(capsys):
    rc, out, err = run_main(capsys, *COST, "--json")
    assert rc == 0
    d = json.loads(out)
    assert (d["seq_len"], d["seq_len_source"]) == (2048, "config")
    assert (d["gpus_used"], d["gpus_available"], d["gpus_idle"]) == (4, 8, 4)
    assert (d["nodes"], d["devices_per_node"]) == (1, 8)
    assert (d["zero"], d["zero_shards"]) == (1, "optimizer states sharded over dp")
    assert (d["framework"], d["attention"], d["attention_source"]) == ("megatron-core", "flash", "framework")
    assert d["num_microbatches"] == 8 // (2 * 1)
    assert d["strategy"]["recompute"] == "full" and d["strategy"]["pp"] == 2
    # 4 of 8 GPUs idle: one warning, in the JSON and on stderr
    assert len(d["warnings"]) == 1 and "uses 4 of the 8 GPUs" in d["warnings"][0]
    assert err.strip() == f"warning: {d['warnings'][0]}"


def test_cost_names_where_seq_len_and_attention_came_from(capsys):
    rc, out, _ = run_main(capsys, *with_flags(COST, "--dp", "4", "--seq-len", "1024", "--attention",
                                              "unfused"), "--json")
    d = json.loads(out)
    assert rc == 0 and (d["seq_len"], d["seq_len_source"]) == (1024, "flag")
    assert (d["attention"], d["attention_source"]) == ("unfused", "flag")
    assert (d["gpus_used"], d["gpus_idle"], d["warnings"]) == (8, 0, [])  # the whole node


def test_cost_of_a_program_says_its_sequence_length_is_unknown(capsys):
    """The seed MLP program has no input_ids [b, s]: seq len 0, and the report says why."""
    from tests.meshplan.test_seed_end_to_end import COST_ARGS

    rc, out, _ = run_main(capsys, *COST_ARGS)
    d = json.loads(out)
    assert rc == 0 and (d["seq_len"], d["seq_len_source"], d["attention_source"]) == (0, "none", "program")
    rc, out, _ = run_main(capsys, *[a for a in COST_ARGS if a != "--json"])
    assert "seq len 0 (from nowhere: the program has no input_ids [batch, seq] input" in out
    assert "global batch 4 = dp 1 x 1 micro-batch of 4" in out


def test_cost_text_report_echoes_inputs_and_warns_of_idle_gpus(capsys):
    rc, out, err = run_main(capsys, *COST)
    assert rc == 0
    assert "seq len 2048 (from the model config's default" in out
    assert "GPUs: 4 used of 8 available (1 node x 8); dp 2 x cp 1 x tp 1 x pp 2" in out
    assert "global batch 8 = dp 2 x 4 micro-batches of 1" in out
    assert "ZeRO stage 1 (optimizer states sharded over dp)" in out
    assert "framework megatron-core; attention flash" in out
    assert "from the framework profile's default" in out
    assert "warning: the plan uses 4 of the 8 GPUs (dp*cp*tp*pp = 2*1*1*2); 4 stay idle" in out
    # the dp that fills them: 8 / (cp 1 x tp 1 x pp 2) = 4 (the new-user pass: Megatron-LM
    # derives dp, and the warning said "pass --nodes" beside a given --nodes)
    assert "--dp 4 fills them (Megatron-LM derives dp from the world size" in out
    rc, out, _ = run_main(capsys, *with_flags(COST, "--dp", "4"))
    assert rc == 0 and "warning" not in out and "GPUs: 8 used of 8" in out


def test_two_bubble_figures_by_their_definitions(capsys):
    """From the timeline, independently: the ZB bubble rate (Qi et al. 2024 sec. 5.3) is
    (largest rank span - largest rank busy) / largest rank span; the critical rank's idle
    fraction is its last end minus its busy time, over the step time. 1F1B, p = 2, m = 4:
    they differ (rank 0 waits for rank 1's backwards at the end of the step)."""
    s = Strategy(dp=2, pp=2, micro_batch_size=1, global_batch_size=8, recompute="full", zero=1)
    res = Engine("megatron-1.7b", "dgx-a100-80g", s, nodes=1).simulate()
    tl = res.sim.timeline
    span, busy, end = {}, {}, {}
    for r in range(2):
        ev = [e for e in tl if e.rank == r]
        busy[r] = sum(e.end - e.start for e in ev) * 1e-9
        end[r] = max(e.end for e in ev) * 1e-9
        span[r] = end[r] - min(e.start for e in ev) * 1e-9
    zb = (max(span.values()) - max(busy.values())) / max(span.values())
    assert res.zb_bubble_rate == pytest.approx(zb, rel=1e-6)
    crit = max(range(2), key=lambda r: end[r])  # equal tails: the last to end finishes the step
    assert res.time_breakdown["bubble"] == pytest.approx(end[crit] - busy[crit], rel=1e-6)
    idle = (end[crit] - busy[crit]) / res.step_time
    assert res.critical_rank_idle_fraction == pytest.approx(idle, rel=1e-6)
    assert abs(zb - idle) > 1e-3  # two different figures, so two names
    rc, out, _ = run_main(capsys, *COST, "--json")
    d = json.loads(out)
    assert d["zb_bubble_rate"] == pytest.approx(zb, rel=1e-6) == d["bubble_ratio"]
    assert d["critical_rank_idle_fraction"] == pytest.approx(idle, rel=1e-6)
    rc, out, _ = run_main(capsys, *COST)
    assert f"ZB bubble rate {zb:.4f}" in out and f"critical rank idle {idle:.4f} of the step" in out


def test_complete_explains_the_reshard_count(capsys):
    rc, out, _ = run_main(capsys, "complete", "--model", "llama2-7b", "--layers", "2", "--dp", "2",
                          "--tp", "2", "--megatron", "--summary-only")
    assert rc == 0
    lines = out.splitlines()
    (i,) = [k for k, ln in enumerate(lines) if ln.startswith("// operands needing a reshard:")]
    (h,) = [k for k, ln in enumerate(lines) if ln.startswith("// per-op summary")]
    marked = sum(ln.count("*") for ln in lines[h + 1:i])  # the op lines mark each such operand
    assert lines[i] == f"// operands needing a reshard: {marked}"
    note = " ".join(lines[i + 1:])
    assert "inserts a reshard op there" in note and "marked *" in note and "meshplan cost" in note


# -- tune: why the best plan won -----------------------------------------------------------
def _plan(dp, tp, pp, mbs=1):
    return {"dp": dp, "cp": 1, "tp": tp, "pp": pp, "vpp": 1, "schedule": "1F1B",
            "micro_batch_size": mbs, "recompute": "none", "zero": 0, "sequence_parallel": False,
            "templates": {}, "annotation": "megatron", "annotation_seed": None}


def _study(rows):
    """rows: (plan, time_s, memory GiB, limit GiB) -> COMPLETE trials as the tuner writes them;
    (plan, rule) -> a PRUNED illegal trial."""
    study = optuna.create_study()
    for r in rows:
        if len(r) == 2:
            study.add_trial(create_trial(state=TrialState.PRUNED, user_attrs={"illegal": r[1]}))
            continue
        plan, t, mem, lim = r
        mem, lim = int(mem * GIB), int(lim * GIB)
        study.add_trial(create_trial(
            state=TrialState.COMPLETE, values=[t], system_attrs={"constraints:memory": mem / lim - 1},
            user_attrs={"plan": plan, "plan_key": json.dumps(plan, sort_keys=True), "time_s": t,
                        "memory_bytes": mem, "memory_limit_bytes": lim, "metrics": {}}))
    return TuneResult(study, 8)


def test_why_best_names_the_margin_and_each_mesh_shapes_best():
    res = _study([(_plan(8, 1, 1), 0.500, 60, 75), (_plan(8, 1, 1, 2), 0.520, 70, 75),
                  (_plan(4, 2, 1), 0.550, 40, 75), (_plan(4, 2, 1, 2), 0.600, 45, 75),
                  (_plan(2, 1, 4), 0.400, 90, 75), (_plan(1, 8, 1), 0.900, 80, 75)])
    lines = why_best(res)
    # runner-up: dp8 mbs2 at 520 ms, 20 ms = +4.00% over the winner's 500 ms
    assert lines[0] == ("why it won (among the 6 plans this search scored): the runner-up, dp8 tp1 "
                        "pp1 1F1B mbs2 rc=none zero0, takes 520.0 ms per step: 20.00 ms (+4.00%) "
                        "more than the winner")
    assert lines[1].startswith("a sampled search: plans it did not score may be faster")
    assert lines[2].startswith("best plan of each other mesh shape (the winner: dp8 tp1 pp1, 500.0 ms)")
    assert re.fullmatch(r"  dp4 tp2 pp1 +550\.0 ms +\+10\.00%  dp4 tp2 pp1 1F1B mbs1 .*", lines[3])
    # then the shapes where nothing fits, closest to fitting first: dp1 tp8 (80 of 75 GiB:
    # +5 GiB, +6.7%), then dp2 pp4 (90 of 75 GiB: +15 GiB, +20%)
    assert "dp1 tp8 pp1" in lines[4] and "needs 80.0 GiB of the 75.0 GiB limit (+5.0 GiB, +6.7%)" in lines[4]
    assert "dp2 tp1 pp4" in lines[5] and "(+15.0 GiB, +20.0%)" in lines[5]
    assert len(lines) == 6


def test_why_none_names_the_binding_constraint():
    res = _study([(_plan(8, 1, 1), 0.5, 90, 75), (_plan(4, 2, 1), 0.6, 78, 75)])
    lines = why_none(res)
    assert lines[0].startswith("no feasible plan: the memory constraint binds -- all 2 scored trials")
    assert "the closest, dp4 tp2 pp1 1F1B mbs1 rc=none zero0, needs 78.0 GiB of the 75.0 GiB " \
           "limit (+3.0 GiB, +4.0%)" in lines[0]
    assert lines == why_best(res) and len(lines) == 4  # + one line per mesh shape
    res = _study([(None, "mesh_matches_world: 3 != 8"), (None, "mesh_matches_world: 5 != 8"),
                  (None, "tp_divides_heads: 3 heads")])
    (line,) = why_none(res)
    assert "legality rules pruned 2 by mesh_matches_world, 1 by tp_divides_heads" in line


TUNE = ["tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
        "--global-batch", "32", "--seq-len", "4096", "--layers", "4", "--no-progress",
        "--storage", "memory", "--seed", "2"]


def test_tune_cli_says_why_against_its_own_history(tmp_path, capsys):
    out = tmp_path / "run"
    rc, text, _ = run_main(capsys, *TUNE, "--sampler", "tpe", "--trials", "30", "--output", str(out))
    assert rc == 0
    h = pd.read_csv(out / "history.csv")
    feas = h[(h.state == "COMPLETE") & h.feasible].sort_values(["step_time_s", "peak_memory_bytes", "trial"])
    feas = feas.drop_duplicates(["dp", "tp", "pp", "cp", "vpp", "schedule", "micro_batch_size",
                                 "recompute", "zero", "sequence_parallel", "templates", "fp8", "ep"])
    runner = feas.iloc[1]
    gap = runner.step_time_s - feas.iloc[0].step_time_s
    if gap > 0:
        assert f"takes {runner.step_time_s * 1e3:.1f} ms per step: {gap * 1e3:.2f} ms" in text
    else:
        assert "as fast as the runner-up" in text
    from tuner.explain import SHAPE_LINES

    # the fastest shapes come first, SHAPE_LINES of them named, the rest summed up
    shapes = feas.drop_duplicates(["dp", "tp", "pp", "cp"]).iloc[1:SHAPE_LINES + 1]
    for _, r in shapes.iterrows():
        cp = f" cp{int(r.cp)}" if r.cp > 1 else ""
        name = f"dp{int(r.dp)}{cp} tp{int(r.tp)} pp{int(r.pp)}"
        assert re.search(rf"^  {name} +{r.step_time_s * 1e3:.1f} ms", text, re.M), name
    assert "why it won" in (out / "report.txt").read_text()


def test_tune_cli_with_nothing_fitting_says_by_how_much(tmp_path, capsys):
    """--memory-headroom 0.99: the limit is 1% of usable memory (0.79 GiB on an 80 GB A100);
    every plan is over it, and the report names the lightest and its excess."""
    out = tmp_path / "run"
    rc, text, _ = run_main(capsys, *TUNE, "--sampler", "tpe", "--trials", "6", "--memory-headroom",
                           "0.99", "--output", str(out))
    assert rc == 1 and "no feasible plan found" in text  # a script can tell
    h = pd.read_csv(out / "history.csv")
    done = h[h.state == "COMPLETE"]
    lightest = done.loc[done.peak_memory_bytes.idxmin()]
    lim = lightest.memory_limit_bytes
    assert f"all {len(done)} scored trials need more than the limit" in text
    assert (f"needs {lightest.peak_memory_bytes / GIB:.1f} GiB of the {lim / GIB:.1f} GiB limit "
            f"(+{(lightest.peak_memory_bytes - lim) / GIB:.1f} GiB") in text
    assert "memory constraint binds" in (out / "report.txt").read_text()


_SCHEDULES = ("1F1B", "VPP", "ZBH1", "ZB", "FThenB")


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(_SCHEDULES), st.sampled_from(("megatron-core", "megatron-2021", "fsdp2")),
       st.sampled_from((1, 2)), st.sampled_from((0, 1, 3)), st.booleans())
def test_time_breakdown_adds_up_to_the_step(schedule, framework, tp, zero, sp):
    """Issue 20 item 5: the report's lines are a partition of the critical rank's step:
    compute + tp_comm - overlapped + bubble + dp_sync + optimizer (+ pp_comm when sends are
    synchronous) = step time, for overlapping (megatron-core TP overlap, FSDP prefetch) and
    non-overlapping (megatron-2021) profiles alike."""
    pp, vpp = (2, 2) if schedule == "VPP" else (2, 1)
    if framework == "fsdp2" and zero != 3 or framework != "fsdp2" and zero == 3:
        zero = 3 if framework == "fsdp2" else 1
    s = Strategy(dp=2, tp=tp, pp=pp, vpp=vpp, schedule=schedule, micro_batch_size=1,
                 global_batch_size=8, zero=zero, sequence_parallel=sp and tp > 1,
                 framework=framework)
    res = Engine("llama2-7b", "dgx-a100-80g", s, nodes=1, num_layers=4, seq_len=1024).simulate()
    t = res.time_breakdown
    total = (t["compute"] + t["tp_comm"] - t["overlapped"] + t["bubble"] + t["dp_sync"]
             + t["optimizer"] + (t["pp_comm"] if framework == "megatron-2021" else 0.0))
    assert 0.0 <= t["overlapped"] <= t["tp_comm"]
    assert total == pytest.approx(res.step_time, rel=1e-9)


def test_plan_label_names_templates_that_differ_from_megatron():
    """Found by a new-user check: a tune report's line for dp8 tp2 pp2 read like the ``cost``
    plan with the same knobs (15.0 s) at 22.9 s: its MLP and LM head were replicated. The
    label now names the templates that differ from Megatron's layout (tp > 1 only)."""
    from tuner.result import plan_label

    p = {"dp": 8, "tp": 2, "pp": 2, "schedule": "1F1B", "vpp": 1, "micro_batch_size": 1,
         "recompute": "none", "zero": 1, "sequence_parallel": False,
         "templates": {"attention": "megatron", "embedding": "vocab_parallel", "lm_head": "replicated",
                       "mlp": "replicated", "norm": "replicated", "loss": "follow_head"}}
    assert plan_label(p) == "dp8 tp2 pp2 1F1B mbs1 rc=none zero1 [lm_head=replicated mlp=replicated]"
    std = dict(p, templates=dict(p["templates"], lm_head="tied", mlp="megatron"))
    assert plan_label(std) == "dp8 tp2 pp2 1F1B mbs1 rc=none zero1"
    assert plan_label(dict(p, tp=1)) == "dp8 tp1 pp2 1F1B mbs1 rc=none zero1"


def test_why_no_size_qualifies_tells_refused_from_out_of_memory():
    """Found by a bad-input hunt: with every point refused by legality rules the size search
    said no plan fits in memory."""
    from tuner.sizing import SizeOutcome
    from tuner.sizing import why_none as sizes_why_none

    refused = [SizeOutcome(1, 8, None, None, 1000, scored=0), SizeOutcome(2, 16, None, None, 1000, scored=0)]
    assert sizes_why_none(refused, None).startswith("no size has a plan to score: legality rules")
    oom = [SizeOutcome(1, 8, None, None, 1000, scored=3)]
    assert sizes_why_none(oom, None) == "no size has a plan that fits in memory"


def test_an_empty_exhaustive_space_is_named_as_such(tmp_path, capsys):
    """Found by a bad-input hunt: dp 8 x micro-batch 3 cannot divide a global batch of 32,
    so the enumeration is empty; the report told the user to raise --trials, which does not
    apply to exhaustive search."""
    from meshplan.cli import main

    rc = main(["tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--global-batch", "32",
               "--seq-len", "2048", "--layers", "4", "--sampler", "exhaustive", "--no-progress",
               "--fix", "tp=1,pp=1,dp=8,micro_batch_size=3", "--output", str(tmp_path / "e")])
    out = capsys.readouterr()
    text = out.out + out.err
    assert rc == 1  # no plan: the command's failure code, not a usage error
    assert "the search space holds no legal plan" in text and "--trials" not in text.split("no feasible plan:")[-1]


def test_report_only_keeps_the_sections_an_earlier_run_left(tmp_path):
    """Found by a bad-input hunt: ``report --only A`` then ``--only B`` into one folder left a
    README describing B alone, though A's CSV and Markdown were still beside it."""
    from experiments.base import EXPERIMENTS
    from experiments.runner import write_readme

    first, second = list(EXPERIMENTS)[:2]
    (tmp_path / f"{first}.md").write_text(f"# Title of {first}\n\nbody of {first}\n")
    text = write_readme([], tmp_path, quick=True, earlier=True).read_text()
    assert f"## Title of {first}" in text and f"body of {first}" in text
    assert f"_{first}: from an earlier run into this folder (`{first}.md`)_" in text
    assert second not in text  # nothing of an experiment that never ran here
    text = write_readme([], tmp_path, quick=True, earlier=False).read_text()  # a full run: its own only
    assert f"body of {first}" not in text


def test_a_gpu_count_above_the_limit_is_refused_before_any_size_is_searched(tmp_path, capsys):
    """Found by a bad-input hunt: ``--gpus 8,<huge>`` searched the 8-GPU size first and then
    failed with a message that did not name --gpus."""
    from meshplan.cli import main

    rc = main(["tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--global-batch", "64",
               "--seq-len", "2048", "--layers", "4", "--trials", "3", "--no-progress",
               "--gpus", "8,8000000000000", "--output", str(tmp_path / "h")])
    out = capsys.readouterr()
    assert rc == 2 and "--gpus '8,8000000000000': 8000000000000 GPUs is above" in out.err
    assert "--- 8 GPUs" not in out.out  # nothing searched


@pytest.mark.parametrize("schedule,vpp,sends", [("1F1B", 1, 1), ("ZBH1", 1, 1), ("ZBVPP", 2, 2)])
def test_pp_comm_is_the_hops_the_rank_sends(schedule, vpp, sends):
    """A new user saw pp_comm 0 under 1F1B and ZB-H1 (the critical rank was stage 0, whose
    receives were not counted) and 86 ms under VPP. It is the hops the rank sends, T_comm
    each: at pp 2 every rank of 1F1B / ZB-H1 sends m (F outputs forward or B outputs back);
    under ZB-V each rank sends 2m (the turn of the V stays on rank 1)."""
    s = Strategy(dp=4, pp=2, vpp=vpp, schedule=schedule, micro_batch_size=1, global_batch_size=32)
    eng = Engine("llama2-7b", "dgx-a100-80g", s, nodes=1, num_layers=4, seq_len=1024)
    m, t_comm = 32 // 4, eng.step_model().comm_time()
    assert t_comm > 0
    assert eng.simulate().time_breakdown["pp_comm"] == pytest.approx(sends * m * t_comm, rel=1e-12)
