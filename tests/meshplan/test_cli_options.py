"""The strategy options ``cost``, ``tune`` and ``complete`` share (meshplan.commands.options):
aliases give the same Strategy, schedule names are case-insensitive, closed value sets are
choices that reject bad values with exit code 2, Strategy errors name the flag typed."""

from __future__ import annotations

import json

import pytest

import meshplan.engine
from completion import strategy as cs
from meshplan.cli import main
from meshplan.commands import options as opt
from tests._cli import Stopped, one_line_error, run_main

BASE = ["cost", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80g", "--nodes", "1"]


def _strategy(capsys, strategies, *args):
    rc, _, err = run_main(capsys, *BASE, *args)
    assert rc == 2 and "stopped before simulating" in err, err
    return strategies[-1]


@pytest.mark.parametrize("variants", [
    [["--tp", "2"], ["--mp", "2"], ["--tensor-model-parallel-size", "2"], ["--tp=2"]],
    [["--pp", "2"], ["--pipeline-model-parallel-size", "2"]],
    [["--zero", "2"], ["--zero-stage", "2"]],
    [["--global-batch", "16"], ["--global-batch-size", "16"]],
    [["--cp", "2"], ["--context-parallel-size", "2"], ["--cp=2"]],
    [["--cp", "2", "--cp-comm", "all_gather"], ["--cp", "2", "--cp-comm-type", "all_gather"]],
])
def test_aliases_give_the_same_strategy(capsys, strategies, variants):
    gb = [] if variants[0][0] == "--global-batch" else ["--global-batch", "8"]
    got = [_strategy(capsys, strategies, "--dp", "2", *gb, *v) for v in variants]
    default = _strategy(capsys, strategies, "--dp", "2", "--global-batch", "8")
    assert all(g == got[0] for g in got) and got[0] != default


def test_tp_alias_costs_the_same(capsys):
    out = []
    for flag in ("--tp", "--mp"):
        assert main([*BASE, flag, "2", "--global-batch", "8", "--json"]) == 0
        out.append(json.loads(capsys.readouterr().out))
    assert out[0] == out[1]


@pytest.mark.parametrize("typed,canonical", [
    ("zbvpp", "ZBVPP"), ("ZbVpP", "ZBVPP"), ("zb-v", "ZBVPP"), ("ZBV", "ZBVPP"),
])
def test_schedule_is_case_insensitive_with_aliases(capsys, strategies, typed, canonical):
    s = _strategy(capsys, strategies, "--pp", "2", "--vpp", "2", "--schedule", typed,
                  "--global-batch", "8")
    assert s.schedule == canonical


def test_every_schedule_spelling_reaches_the_strategy(capsys, strategies):
    for name in cs.SCHEDULES + tuple(cs.SCHEDULE_ALIASES):
        want = cs.canonical_schedule(name)
        vpp = "2" if want in cs.INTERLEAVED else "1"
        s = _strategy(capsys, strategies, "--pp", "2", "--vpp", vpp, "--schedule", name.upper(),
                      "--global-batch", "8")
        assert s.schedule == want, name


def test_choices_are_plain_values_in_the_strategy(capsys, strategies):
    s = _strategy(capsys, strategies, "--global-batch", "8", "--recompute", "FULL",
                  "--dtype", "float32")
    assert (s.recompute, s.dtype) == ("full", "float32")
    assert type(s.recompute) is str and type(s.dtype) is str and type(s.schedule) is str


@pytest.mark.parametrize("args,flag", [
    (["--schedule", "bogus"], "--schedule"),
    (["--recompute", "most"], "--recompute"),
    (["--dtype", "fp8"], "--dtype"),
])
def test_bad_choices_are_one_line_errors(capsys, args, flag):
    line = one_line_error(*run_main(capsys, *BASE, "--global-batch", "8", *args))
    assert f"'{flag}'" in line and args[1] in line


def test_bad_tune_mode_is_an_error(capsys):
    line = one_line_error(*run_main(capsys, "tune", "--model", "llama2-7b", "--cluster",
                                    "dgx-a100-80g", "--global-batch", "8", "--mode", "grid"))
    assert "'--mode'" in line and "pattern-based" in line


@pytest.mark.parametrize("args,start", [
    (["--global-batch", "8", "--zero", "5"], "error: --zero (ZeRO stage) must be 0, 1, 2 or 3, got 5"),
    (["--global-batch", "8", "--zero-stage", "5"], "error: --zero-stage (ZeRO stage) must be 0"),
    (["--global-batch", "8", "--dp", "3"],
     "error: --global-batch (8) must be a multiple of --dp * --micro-batch-size = 3"),
    (["--global-batch-size=8", "--dp", "3", "--micro-batch-size", "1"],
     "error: --global-batch-size (8) must be a multiple of --dp * --micro-batch-size = 3"),
    (["--global-batch", "8", "--vpp", "2", "--schedule", "ZBH1"],
     "error: --vpp gives 2 model chunks per pipeline rank, but --schedule ZBH1 runs one"),
    (["--global-batch", "8", "--mp", "0"], "error: --mp must be an integer >= 1, got 0"),
    (["--global-batch", "8", "--context-parallel-size", "0"],
     "error: --context-parallel-size must be an integer >= 1"),
    # checked by the Engine against the model and cluster, named as typed too
    (["--global-batch", "8", "--nodes", "2", "--tensor-model-parallel-size", "16"],
     "error: --tensor-model-parallel-size = 16 does not divide model 'megatron-1.7b' num_heads = 24"),
    (["--global-batch", "8", "--tp", "16"], "error: --dp*--cp*--tp*--pp = 1*1*16*1 = 16 ranks"),
    (["--global-batch", "8", "--cp", "2", "--seq-length", "33"],
     "error: --cp = 2: --seq-length 33 must be a multiple of 2 * --cp = 4"),
])
def test_strategy_errors_name_the_flag_typed(capsys, args, start):
    """Issue 20 item 9: the message is in the flags the user typed, no field names."""
    base = BASE[:-2] if "--nodes" in args else BASE  # one --nodes (a repeat is refused)
    line = one_line_error(*run_main(capsys, *base, *args))
    assert line.startswith(start), line
    assert "strategy field" not in line and "_size" not in line and "seq_len" not in line


def test_complete_shares_the_strategy_options(capsys):
    model = ["complete", "--model", "llama2-7b", "--layers", "4", "--seq-len", "32",
             "--summary-only", "--megatron"]
    outs = []
    for extra in (["--mesh", "dp=2,tp=2,pp=2", "--schedule", "VPP", "--zero-stage", "1"],
                  ["--dp", "2", "--tp", "2", "--pp", "2", "--schedule", "interleaved", "--zero", "1"],
                  ["--dp", "2", "--mp", "2", "--pipeline-model-parallel-size", "2",
                   "--schedule", "vpp", "--zero", "1"]):
        rc, out, err = run_main(capsys, *model, "--vpp", "2", *extra)
        assert rc == 0, err
        outs.append(out)
    assert outs[0] == outs[1] == outs[2] and "stage 1/chunk 1" in outs[0]


def test_complete_errors_name_the_flags(capsys):
    base = ["complete", "--model", "llama2-7b", "--layers", "2"]
    line = one_line_error(*run_main(capsys, *base, "--mesh", "dp=2", "--mp", "2"))
    assert line == "error: give --mesh or --mp, not both"
    line = one_line_error(*run_main(capsys, *base, "--pp", "2", "--vpp", "2"))
    assert line.startswith("error: --vpp is 2")
    line = one_line_error(*run_main(capsys, *base, "--zero-stage", "4"))
    assert line.startswith("error: --zero-stage (ZeRO stage) must be 0, 1, 2 or 3")
    line = one_line_error(*run_main(capsys, *base, "--schedule", "1f1b-x"))
    assert "'--schedule'" in line


def test_tune_passes_plain_choices_to_the_search(monkeypatch, capsys, tmp_path):
    import importlib

    search_module = importlib.import_module("tuner.search")  # tuner.search is also a function
    seen = {}

    def search(cfg, name, **kw):
        seen.update(mode=cfg.mode, dtype=cfg.scorer_config["dtype"], name=name)
        raise Stopped("stopped before searching")

    monkeypatch.setattr(search_module, "search", search)
    rc, _, err = run_main(capsys, "tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g",
                          "--nodes", "1", "--global-batch-size", "16", "-s", "1024",
                          "--layers", "2", "--mode", "FULL_RANDOM", "--dtype", "float16",
                          "--output", str(tmp_path))
    assert rc == 2 and "stopped before searching" in err
    assert seen["mode"] == "full_random" and type(seen["mode"]) is str
    assert seen["dtype"] == "float16" and seen["name"].startswith("llama2-7b-full_random-")


def test_choices_are_generated_from_the_registries():
    """The CLI's choices are ``completion.choices``' registries (no mirror): the Strategy,
    the simulator and the tuner read the same objects."""
    from clusters.collectives import KINDS
    from completion import choices
    from meshplan.commands.clusters import KINDS as CLI_KINDS
    from simulator.recompute import RECOMPUTE_POLICIES
    from tuner.space import RECOMPUTE as SPACE_RECOMPUTE
    from tuner.study import MODES

    assert cs.SCHEDULES is choices.SCHEDULES and cs.RECOMPUTE is choices.RECOMPUTE
    assert cs.FRAMEWORKS is choices.FRAMEWORKS and SPACE_RECOMPUTE is choices.RECOMPUTE
    assert tuple(s.value for s in opt.Schedule) == cs.SCHEDULES + tuple(cs.SCHEDULE_ALIASES)
    assert tuple(r.value for r in opt.Recompute) == cs.RECOMPUTE == tuple(RECOMPUTE_POLICIES)
    assert tuple(d.value for d in opt.Dtype) == cs.DTYPES + tuple(cs.FP8_DTYPES)
    assert tuple(f.value for f in opt.Framework) == cs.FRAMEWORKS
    assert tuple(a.value for a in opt.Attention) == cs.ATTENTIONS
    assert tuple(c.value for c in opt.CpComm) == cs.CP_COMMS + tuple(cs.CP_COMM_ALIASES)
    assert tuple(m.value for m in opt.Mode) == MODES == choices.MODES
    assert opt.Dtype.fp8_delayed.value == "fp8-delayed" and opt.Mode.pattern_based.value == "pattern-based"
    assert CLI_KINDS == KINDS
    from meshplan.pipeline_split import SPLIT_WORDS
    from simulator.layer_split import SPLITS

    assert SPLIT_WORDS is SPLITS is choices.SPLITS  # one list
    fields = {f for f in cs.Strategy.__dataclass_fields__}
    assert set(opt.FLAGS) <= fields


def test_the_registries_module_is_light():
    """``completion.choices`` imports nothing: ``meshplan --help`` may load it."""
    import ast
    import pathlib

    tree = ast.parse(pathlib.Path(choices_path := cs.__file__).with_name("choices.py").read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [getattr(n, "module", None) for n in imports] == ["__future__"], choices_path


def test_size_bounds_mirror_their_packages():
    """Issue 16 item 8: the CLI's bounds are the packages' documented constants."""
    from clusters.spec import MAX_WORLD_SIZE
    from completion.models.config import MAX_MODEL_SIZES
    from executor.launch import MAX_LOCAL_RANKS
    from meshplan.cluster_inputs import MAX_RANKS
    from simulator.schedules import base

    assert opt.MAX_SEQ_LEN == MAX_MODEL_SIZES["seq_len"]
    assert opt.MAX_LAYERS == MAX_MODEL_SIZES["num_layers"] == cs.MAX_LAYERS
    assert opt.MAX_NODES == MAX_WORLD_SIZE == cs.MAX_DEGREE == MAX_RANKS
    assert opt.MAX_BATCH == cs.MAX_BATCH and opt.MAX_VPP == cs.MAX_VPP
    assert opt.MAX_ACTIONS == base.MAX_ACTIONS and opt.MAX_TIME_S == base.MAX_TIME_S
    assert opt.MAX_MEMORY_LIMIT == base.MAX_MEMORY_LIMIT
    assert opt.MAX_LOCAL_RANKS == MAX_LOCAL_RANKS
    from clusters.spec import DEFAULT_MEMORY_HEADROOM

    assert opt.DEFAULT_MEMORY_HEADROOM == DEFAULT_MEMORY_HEADROOM


def test_the_three_commands_share_one_definition():
    """cost, tune and complete take the shared option objects themselves (one definition)."""
    import inspect

    from meshplan.commands.complete import complete_cmd
    from meshplan.commands.cost import cost_cmd
    from meshplan.commands.tune import tune_cmd

    shared = {id(v) for k, v in vars(opt).items() if k.isupper() and hasattr(v, "param_decls")}

    def used(fn):
        return {p.name for p in inspect.signature(fn).parameters.values() if id(p.default) in shared}

    assert used(cost_cmd) >= {"model", "cluster", "nodes", "dp", "tp", "pp", "vpp", "schedule",
                              "micro_batch_size", "global_batch", "seq_len", "recompute", "zero",
                              "sequence_parallel", "dtype"}
    assert used(tune_cmd) >= {"model", "cluster", "nodes", "global_batch", "seq_len", "dtype",
                              "mode"}
    assert used(complete_cmd) >= {"dp", "tp", "pp", "vpp", "schedule", "zero",
                                  "sequence_parallel", "seq_len"}


@pytest.mark.parametrize("schedule, alias", [("VPP", "interleaved"), ("ZBVPP", "ZBVPP")])
def test_an_interleaved_schedule_without_vpp_runs_two_chunks(capsys, strategies, schedule, alias):
    """``--schedule VPP`` alone used to run vpp = 1, i.e. plain 1F1B under the VPP name; an
    interleaved schedule without a typed ``--vpp`` now runs 2 chunks per rank, like
    ``compare``; an explicit ``--vpp`` is kept."""
    s = _strategy(capsys, strategies, "--pp", "2", "--global-batch", "16", "--schedule", alias)
    assert (s.schedule, s.vpp) == (schedule, 2)
    if schedule == "VPP":
        s = _strategy(capsys, strategies, "--pp", "2", "--global-batch", "16", "--schedule", alias, "--vpp", "4")
        assert (s.schedule, s.vpp) == ("VPP", 4)


@pytest.mark.parametrize("flag", ["--vpp", "--num-virtual-stages-per-pipeline-rank"])
def test_a_typed_vpp_of_one_with_vpp_is_refused(capsys, flag):
    line = one_line_error(*run_main(capsys, *BASE, "--pp", "2", "--global-batch", "16", "--schedule", "VPP",
                                           flag, "1"))
    assert f"{flag} 1 with schedule VPP runs one model chunk per pipeline rank, which is 1F1B: give {flag} 2" in line


@pytest.mark.parametrize("args, first, second", [
    (["--tp", "2", "--tensor-model-parallel-size", "1"], "--tp 2", "--tensor-model-parallel-size 1"),
    (["--global-batch-size", "16"], "--global-batch 8", "--global-batch-size 16"),
    (["--layers", "4", "--num-layers=8"], "--layers 4", "--num-layers 8"),
])
def test_one_setting_typed_twice_with_different_values_is_refused(capsys, args, first, second):
    """click keeps the last of two aliases silently (``--tp 2 --tensor-model-parallel-size
    1`` ran tp = 1); now both flags are named and nothing runs. The same value twice is
    accepted."""
    rc, out, err = run_main(capsys, *BASE, "--global-batch", "8", *args)
    assert rc == 2 and f"{first} and {second} set the same thing" in err and not out
    assert opt.conflicting_flags(["--tp", "2", "--mp", "2", "--pp=4", "--pp", "4"]) is None


def test_an_interrupted_command_says_how_to_resume(capsys, monkeypatch):
    """Ctrl-C (KeyboardInterrupt) exits 130, as typer maps it, with one line saying that a
    stored search resumes; it used to exit silently."""
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(meshplan.engine, "Engine", interrupted)
    rc, out, err = run_main(capsys, *BASE, "--global-batch", "8")
    assert rc == 130 and err.startswith("interrupted:") and "resume" in err and not out


def test_megatron_cp_comm_spelling_round_trips(capsys):
    """export --to megatron writes --cp-comm-type allgather (Megatron-LM's spelling); cost
    refused that value (a new-user pass): it is all_gather, and Megatron's a2a is refused in
    words."""
    from meshplan.strategy import Strategy
    from tests._cli import run_main

    assert Strategy(dp=2, cp=2, cp_comm="allgather", global_batch_size=4).cp_comm == "all_gather"
    base = ("cost", "--model", "llama2-7b", "--cluster", "dgx-h100", "--layers", "2", "--dp", "2",
            "--cp", "2", "--seq-len", "8192", "--global-batch", "4", "--json")
    got = {}
    for v in ("allgather", "all_gather"):
        rc, out, err = run_main(capsys, *base, "--cp-comm-type", v)
        assert rc == 0, err
        got[v] = json.loads(out)["step_time_ms"]
    assert got["allgather"] == got["all_gather"]
    import pytest

    from completion.strategy import StrategyError
    with pytest.raises(StrategyError, match="'a2a' .* is not modelled"):
        Strategy(dp=2, cp=2, cp_comm="a2a", global_batch_size=4)
