"""``--layers-per-stage``: the pipeline layer split pinned from the command line (cost,
compare, export), and compare's MoE routing options.

The frameworks split the decoder layers evenly by default (Megatron-LM d98e8a64
``--decoder-first-pipeline-num-layers`` help: "Default None is even split"); the cost model
balances the stages' times instead. 8 layers of Qwen3-30B-A3B on pp 2 are the case where the
two differ: the balanced split puts fewer layers beside the loss ([5, 3])."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from meshplan import Engine, Strategy
from tests._cli import one_line_error, run_main

BASE = ("-m", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--dp", "4", "--pp", "2", "--ep", "4",
        "--global-batch", "16", "--seq-len", "2048", "--layers", "8", "--zero", "1")
STRATEGY = Strategy(dp=4, pp=2, ep=4, micro_batch_size=1, global_batch_size=16, zero=1)


def _engine(split: tuple[int, ...] | None) -> Engine:
    s = STRATEGY if split is None else STRATEGY.replace(layers_per_stage=split)
    return Engine("qwen3-30b-a3b", "dgx-h100", s, seq_len=2048, num_layers=8)


def _cost(capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    rc, out, err = run_main(capsys, "cost", *BASE, "--json", *extra)
    assert rc == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def steps() -> dict[str, float]:
    """Step seconds of the API's balanced, even (4, 4) and (6, 2) splits."""
    return {name: _engine(split).simulate().step_time
            for name, split in (("balanced", None), ("even", (4, 4)), ("6,2", (6, 2)))}


def test_even_and_a_list_cost_what_the_api_costs_for_that_split(capsys, steps):
    balanced = _cost(capsys)
    assert balanced["layers_per_vstage"] == [5, 3]
    assert balanced == _cost(capsys, "--layers-per-stage", "balanced")
    even = _cost(capsys, "--layers-per-stage", "even")
    assert even["layers_per_vstage"] == [4, 4]
    assert even["step_time_ms"] == pytest.approx(steps["even"] * 1e3, rel=1e-12)
    assert even["step_time_ms"] != pytest.approx(balanced["step_time_ms"], rel=1e-3)
    pinned = _cost(capsys, "--layers-per-stage", "6, 2")
    assert pinned["layers_per_vstage"] == [6, 2]
    assert pinned["step_time_ms"] == pytest.approx(steps["6,2"] * 1e3, rel=1e-12)
    # the balanced split is the fastest of the three (what balancing is for)
    assert balanced["step_time_ms"] < min(even["step_time_ms"], pinned["step_time_ms"])


@pytest.mark.parametrize(("value", "needle"), [
    ("5,2,1", "--layers-per-stage has 3 entries; --pp * --vpp = 2 * 1 = 2 virtual stages"),
    ("5,4", "--layers-per-stage [5, 4] sums to 9, but model 'qwen3-30b-a3b' has 8 layers"),
    ("five,3", "--layers-per-stage 'five,3': give 'even', 'balanced' or the layers"),
    ("", "--layers-per-stage '': give 'even'"),
    ("\u0665,\u0663", "give 'even', 'balanced' or the layers"),  # Arabic-Indic digits: not ASCII
    ("5_0,3", "give 'even', 'balanced' or the layers"),  # int() would read 50
])
def test_a_split_that_does_not_fit_names_the_flag(capsys, value, needle):
    line = one_line_error(*run_main(capsys, "cost", *BASE, "--layers-per-stage", value))
    assert needle in line, line


def test_even_on_layers_that_do_not_divide_is_refused_with_the_count(capsys):
    args = [a if a != "8" else "7" for a in BASE]  # --layers 7 on pp 2
    line = one_line_error(*run_main(capsys, "cost", *args, "--layers-per-stage", "even"))
    assert "the model's 7 decoder layers do not divide over --pp * --vpp = 2 * 1 = 2" in line, line


def test_export_writes_a_pinned_split_as_costed_without_the_even_split_note(capsys):
    rc, out, err = run_main(capsys, "export", "--to", "megatron", *BASE, "--layers-per-stage", "6,2")
    assert rc == 0, err
    assert "--pipeline-model-parallel-layout 'E,t*6|t*2,L'" in out  # shell-quoted
    assert "splits the layers evenly" not in err
    rc, out, err = run_main(capsys, "export", "--to", "megatron", *BASE, "--layers-per-stage", "even")
    assert rc == 0 and "E,t*4|t*4,L" in out and "splits the layers evenly" not in err, err
    # balanced named: the cost model's own split [5, 3] is written, as costed
    rc, out, err = run_main(capsys, "export", "--to", "megatron", *BASE, "--layers-per-stage", "balanced")
    assert rc == 0 and "'E,t*5|t*3,L'" in out and "splits the layers evenly" not in err, err
    # not named: Megatron's even split (no layout), both costed in the note
    rc, out, err = run_main(capsys, "export", "--to", "megatron", *BASE)
    assert rc == 0 and "pipeline-model-parallel-layout" not in out
    assert "--layers-per-stage balanced exports the balanced one" in err


def test_compare_puts_the_even_split_beside_the_balanced_one(capsys, steps):
    rc, out, err = run_main(capsys, "compare", *BASE, "--layers-per-stage", "balanced,even", "--json")
    assert rc == 0, err
    rows = json.loads(out)
    assert [r["layers_per_stage"] for r in rows] == ["balanced", "even"]
    assert [r["step_time_ms"] for r in rows] == pytest.approx(
        [steps["balanced"] * 1e3, steps["even"] * 1e3], rel=1e-12)
    assert [r["layers_per_vstage"] for r in rows] == [[5, 3], [4, 4]]
    rc, out, err = run_main(capsys, "compare", *BASE, "--layers-per-stage", "balanced,even")
    assert rc == 0 and "balanced [5, 3]" in out and "even [4, 4]" in out, out + err
    line = one_line_error(*run_main(capsys, "compare", *BASE, "--layers-per-stage", "6,2"))
    assert "--layers-per-stage: '6' is not one of balanced, even" in line, line


def test_compare_takes_the_moe_routing_options_as_lists(capsys):
    """A busier expert (load imbalance f = 2) is costed at twice the mean tokens: the step is
    slower, as the API costs it; a capacity factor is passed through the same way."""
    rc, out, err = run_main(capsys, "compare", *BASE, "--moe-load-imbalance", "1,2",
                            "--moe-capacity-factor", "1.5", "--json")
    assert rc == 0, err
    rows = json.loads(out)
    want = [Engine("qwen3-30b-a3b", "dgx-h100",
                   STRATEGY.replace(moe_load_imbalance=f, moe_capacity_factor=1.5),
                   seq_len=2048, num_layers=8).simulate().step_time * 1e3 for f in (1.0, 2.0)]
    assert [r["moe_load_imbalance"] for r in rows] == [1.0, 2.0]
    assert [r["step_time_ms"] for r in rows] == pytest.approx(want, rel=1e-12)
    assert want[1] > want[0]
    line = one_line_error(*run_main(capsys, "compare", *BASE, "--moe-load-imbalance", "0.5"))
    assert "--moe-load-imbalance must be a finite number >= 1" in line, line


def test_compare_names_a_refused_plan_in_the_flags_typed(capsys):
    """A plan compare refuses is explained in the command line's words, as cost explains it:
    the flag as typed, never the Strategy's field name ('cp')."""
    args = ("compare", "-m", "llama2-7b", "--cluster", "dgx-h100", "--dp", "2", "--global-batch", "8")
    rc, out, err = run_main(capsys, *args, "--context-parallel-size", "3,4")
    assert rc == 0, err
    text = " ".join(out.split())
    assert "[1] --context-parallel-size = 3: --seq-len 4096 must be a multiple of 2 * " \
           "--context-parallel-size = 6" in text, text
    assert "field" not in text
    line = one_line_error(*run_main(capsys, *args, "--cp", "3"))
    assert line.startswith("error: --cp = 3: --seq-len 4096"), line


def test_with_layer_split_even_balanced_and_refusals():
    from meshplan.tuning import with_layer_split

    s = Strategy(dp=1, pp=2, vpp=2, schedule="VPP", micro_batch_size=1, global_batch_size=4)
    assert with_layer_split(s, {}, lambda: 8) is s
    assert with_layer_split(s, {"layer_split": "balanced"}, lambda: 8) is s
    assert with_layer_split(s, {"layer_split": "even"}, lambda: 8).layers_per_stage == (2, 2, 2, 2)
    one = Strategy(dp=1, micro_batch_size=1, global_batch_size=4)
    assert with_layer_split(one, {"layer_split": "even"}, lambda: 7) is one  # one stage: nothing to split
    with pytest.raises(ValueError, match="the 6 layers to divide over pp \\* vpp = 2 \\* 2 = 4"):
        with_layer_split(s, {"layer_split": "even"}, lambda: 6)
    with pytest.raises(ValueError, match="'layer_split' must be one of"):
        with_layer_split(s, {"layer_split": "4,4"}, lambda: 8)


def test_tune_costs_each_plan_with_the_even_split_and_states_it(capsys, tmp_path):
    """tune --layers-per-stage even: every trial's time is the even split's (the history's
    best equals the API's for that split), plan.json pins [4, 4]; without it plan.json
    leaves the split to the cost model, as before, and its best costed with the even split
    is another step (the balanced split is a local search: not always the faster one)."""
    import csv

    from meshplan.plan import Plan

    args = ("tune", "-m", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--nodes", "1", "--global-batch",
            "16", "-s", "2048", "--layers", "8", "--pp", "2", "--vpp", "1", "--trials", "3", "--no-progress")
    times, plans = {}, {}
    for split in ("balanced", "even"):
        rc, out, err = run_main(capsys, *args, "--output", str(tmp_path / split), "--layers-per-stage", split)
        assert rc == 0, err
        plan = plans[split] = Plan.load(str(tmp_path / split / "plan.json"))
        assert plan.strategy.layers_per_stage == (None if split == "balanced" else (4, 4))
        with open(tmp_path / split / "history.csv") as f:
            rows = [r for r in csv.DictReader(f) if r["state"] == "COMPLETE" and r["feasible"] == "True"]
        times[split] = min(float(r["step_time_s"]) for r in rows)
        assert times[split] == pytest.approx(Engine.from_plan(plan, None).simulate().step_time, rel=1e-9)
    bal = plans["balanced"]
    as_even = Engine.from_plan(replace(bal, strategy=bal.strategy.replace(layers_per_stage=(4, 4))), None)
    assert as_even.simulate().step_time != pytest.approx(times["balanced"], rel=1e-6)
    line = one_line_error(*run_main(capsys, *args, "--output", str(tmp_path / "x"),
                                    "--layers-per-stage", "4,4"))
    assert "--layers-per-stage '4,4': tune takes balanced or even" in line
    assert not (tmp_path / "x").exists()


def test_a_list_beside_megatrons_layers_per_virtual_stage_is_refused(capsys):
    line = one_line_error(*run_main(capsys, "cost", "-m", "llama2-7b", "--cluster", "dgx-a100-80g",
                                    "--dp", "2", "--pp", "4", "--global-batch", "32",
                                    "--num-layers-per-virtual-pipeline-stage", "4",
                                    "--layers-per-stage", "5,3,4,4,4,4,4,4"))
    assert "--layers-per-stage 5,3,4,4,4,4,4,4 and --num-layers-per-virtual-pipeline-stage both" in line


def test_compare_json_rows_share_their_keys_and_empty_items_name_the_flags_example(capsys):
    args = ("compare", "-m", "llama2-7b", "--cluster", "dgx-h100", "--dp", "2", "--global-batch", "8")
    rc, out, err = run_main(capsys, *args, "--cp", "3,4", "--json")
    assert rc == 0, err
    refused, costed = json.loads(out)
    assert sorted(refused) == sorted(costed)
    assert refused["step_time_ms"] is None and refused["error"] and costed["error"] is None
    line = one_line_error(*run_main(capsys, *args, "--layers-per-stage", "even,"))
    assert "--layers-per-stage: empty item in 'even,' (a comma list, e.g. balanced,even)" in line


def test_a_tuned_plan_exports_with_the_split_it_was_costed_with(capsys, tmp_path):
    """A new user's path: tune writes plan.json (split left to the cost model, [5, 3]); export
    of it keeps Megatron's even split and says so, in the file too, and counts that note;
    export PLAN.json --layers-per-stage balanced writes the costed split; any other strategy
    option beside PLAN.json is still refused; a plan file given as --model says what it is."""
    from meshplan.plan import Plan

    plan = tmp_path / "plan.json"
    Plan(model="qwen3-30b-a3b", cluster="dgx-h100", strategy=STRATEGY, seq_len=2048, num_layers=8).save(str(plan))
    out_file = tmp_path / "m.txt"
    rc, out, err = run_main(capsys, "export", str(plan), "--to", "megatron", "-o", str(out_file))
    assert rc == 0, err
    text = out_file.read_text()
    assert text.startswith("# note: layers_per_stage: the cost model balanced the stages as [5, 3]")
    assert "pipeline-model-parallel-layout" not in text
    n_notes = err.count("note: ")
    assert f"(megatron, {n_notes} note(s))" in err
    rc, out, err = run_main(capsys, "export", str(plan), "--to", "megatron", "--layers-per-stage", "balanced")
    assert rc == 0 and "'E,t*5|t*3,L'" in out, err
    line = one_line_error(*run_main(capsys, "export", str(plan), "--to", "megatron", "--tp", "2"))
    assert "not both" in line and "--tp" in line
    rc, out, err = run_main(capsys, "export", str(plan), "--to", "deepspeed")
    assert rc == 0 and "DeepSpeed partitions the layers its own way" in err
    assert "the framework splits the layers evenly" not in err
    line = one_line_error(*run_main(capsys, "cost", "--model", str(plan), "--cluster", "dgx-h100",
                                    "--global-batch", "16"))
    assert "a meshplan plan file, not a model config.json: give its model ('qwen3-30b-a3b')" in line


def test_zero_states_are_said_to_shard_over_dp_x_cp_and_export_takes_hsdp(capsys):
    rc, out, err = run_main(capsys, "cost", "--model", "llama2-7b", "--cluster", "dgx-h100", "--dp", "2",
                            "--cp", "4", "--seq-len", "32768", "--global-batch", "8", "--zero", "1")
    assert rc == 0 and "optimizer states sharded over dp x cp = 8 ranks" in out, err
    rc, out, err = run_main(capsys, "export", "--to", "torchtitan", "--model", "llama2-7b", "--cluster",
                            "dgx-a100-80g", "--nodes", "2", "--dp", "16", "--global-batch", "64",
                            "--framework", "fsdp2", "--zero", "3", "--hsdp", "8")
    assert rc == 0, err
    assert "data_parallel_replicate_degree = 2" in out and "data_parallel_shard_degree = 8" in out


def test_export_of_a_plan_file_moves_to_another_cluster(capsys, tmp_path):
    """A hunt: export's --cluster help said "with PLAN.json: instead of the plan's", and it was
    refused as a strategy option; it moves the plan as cost PLAN.json --cluster does (its
    costed notes are the other cluster's: the balanced split's step time differs)."""
    from meshplan.plan import Plan

    plan = tmp_path / "plan.json"
    Plan(model="qwen3-30b-a3b", cluster="dgx-a100-80g", strategy=STRATEGY, seq_len=2048,
         num_layers=8).save(str(plan))
    rc, _, a100 = run_main(capsys, "export", str(plan), "--to", "megatron")
    assert rc == 0, a100
    rc, _, h100 = run_main(capsys, "export", str(plan), "--to", "megatron", "--cluster", "dgx-h100")
    assert rc == 0, h100
    assert "a step" in a100 and "a step" in h100 and a100 != h100  # the costed notes differ
    line = one_line_error(*run_main(capsys, "export", str(plan), "--to", "megatron", "--tp", "2"))
    assert "not both" in line and "--tp" in line and "--cluster and --nodes move the plan" in line
