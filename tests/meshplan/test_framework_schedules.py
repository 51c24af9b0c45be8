"""The pipeline schedules a framework runs (profile ``pipeline.schedules``): a hunt tuned
under the default megatron-core profile and got ZB-H1 / ZBVPP plans, which Megatron-LM
cannot run (it runs 1F1B and interleaved 1F1B: ``get_forward_backward_func``). ``tune``
now searches the framework's schedules (all with ``--all-schedules``), a pinned other one
gets a note, and ``cost`` warns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from meshplan.commands.tune import _tune_config
from meshplan.tuning import framework_schedules
from simulator.profiles import ProfileError, load_profile
from tests._cli import run_main
from tuner.space import SCHEDULES


def test_each_catalog_framework_states_what_it_runs():
    assert framework_schedules("megatron-core") == ("1F1B", "VPP")
    for child in ("nemo", "megatron-bridge"):  # extends megatron-core: inherited
        assert framework_schedules(child) == ("1F1B", "VPP")
    assert framework_schedules("megatron-2021") == ("1F1B", "VPP")
    assert framework_schedules("deepspeed") == ("1F1B",)
    assert framework_schedules("fsdp2") == ("FThenB", "1F1B", "VPP", "ZBVPP")
    assert framework_schedules("eager") == SCHEDULES  # this project's executor: every one
    assert framework_schedules("megatron-core", every=True) == SCHEDULES
    assert "ZBH1" in SCHEDULES and "ZB" in SCHEDULES
    assert load_profile("megatron-core").pipeline.schedules.provenance.startswith("MC ")


def test_a_profile_with_an_unknown_schedule_is_refused(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({"extends": "megatron-core", "name": "p", "pipeline": {
        "schedules": {"value": ["1F1B", "Looped"], "provenance": "test"}}}))
    with pytest.raises(ProfileError, match="unknown schedule"):
        load_profile(f)


def test_tune_searches_the_framework_schedules():
    def space(framework: str, every: bool = False):
        return _tune_config("llama2-7b", "dgx-a100-80g", 1, 32, 2048, "pattern-based", 0, False,
                            None, "tpe", 4, False, framework=framework, all_schedules=every).space
    assert space("megatron-core").schedule_choices() == ["1F1B", "VPP"]
    assert space("megatron-core", every=True).schedule_choices() == list(SCHEDULES)
    assert space("fsdp2").schedule_choices() == ["FThenB", "1F1B", "VPP", "ZBVPP"]
    assert space("eager").schedule_choices() == list(SCHEDULES)


def test_a_pinned_schedule_the_framework_does_not_run_is_noted(capsys, tmp_path):
    base = ("tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
            "--global-batch", "32", "--layers", "4", "--trials", "2", "--storage", "memory",
            "--no-progress", "--pp", "2", "--output", str(tmp_path / "a"))
    rc, out, err = run_main(capsys, *base, "--schedule", "ZBH1")
    assert rc == 0, err
    assert "note: the megatron-core profile's framework does not run ZBH1 (it runs 1F1B, VPP)" in err
    rc, out, err = run_main(capsys, *base[:-1], str(tmp_path / "b"), "--schedule", "ZBH1",
                            "--framework", "eager")  # another search: its own folder
    assert rc == 0 and "does not run" not in err


def test_cost_warns_about_a_schedule_the_framework_does_not_run(capsys):
    base = ("cost", "--model", "llama2-7b", "--cluster", "dgx-h100", "--dp", "4", "--pp", "2",
            "--global-batch", "64", "--layers", "8", "--json")
    rc, out, err = run_main(capsys, *base, "--schedule", "ZBH1")
    assert rc == 0, err
    want = "the megatron-core profile's framework does not run ZBH1 (it runs 1F1B, VPP)"
    assert any(w.startswith(want) for w in json.loads(out)["warnings"]) and want in err
    for ok in (("--schedule", "VPP", "--vpp", "2"), ("--schedule", "ZBH1", "--framework", "eager")):
        rc, out, err = run_main(capsys, *base, *ok)
        assert rc == 0 and "does not run" not in err


def test_zb_is_zb_2p_in_both_vocabularies():
    """The tuner's ZB is ZB-2p: a profile listing either runs both (a review found the two
    name lists compared as strings)."""
    from meshplan.tuning import runs_schedule

    assert runs_schedule(("ZB-2p",), "ZB") and runs_schedule(("ZB",), "ZB-2p")
    assert not runs_schedule(("ZB-1p",), "ZB") and not runs_schedule(("1F1B", "VPP"), "ZBH1")


def test_a_pinned_vpp_needs_an_interleaved_schedule_the_framework_runs(capsys):
    """DeepSpeed runs 1F1B only: --fix vpp=2 was dropped silently (every plan vpp 1)."""
    rc, out, err = run_main(capsys, "tune", "-m", "llama2-7b", "--cluster", "dgx-h100", "--nodes", "1",
                            "--global-batch", "16", "--framework", "deepspeed", "--fix", "vpp=2,pp=2",
                            "--trials", "2", "--storage", "memory", "--no-progress")
    assert rc == 2 and "--fix: vpp=2 needs an interleaved schedule (VPP or ZBVPP), and the search " \
                       "tries ['1F1B']" in " ".join(err.split())


def test_a_study_stored_with_every_schedule_says_how_to_resume_it(capsys, tmp_path):
    base = ("tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "1", "--global-batch",
            "16", "--layers", "2", "--trials", "2", "--study", "s1", "--output", str(tmp_path), "--no-progress")
    rc, _, err = run_main(capsys, *base, "--all-schedules")
    assert rc == 0, err
    rc, _, err = run_main(capsys, *base)
    flat = " ".join(err.split())
    assert rc == 2 and "differs in ['space.schedules']" in flat and "add --all-schedules to resume it" in flat
    rc, _, err = run_main(capsys, *base, "--all-schedules")
    assert rc == 0, err


def test_tune_on_a_cpu_host_says_which_plans_validate_can_compare(capsys):
    """A new-user pass tuned on a calibrated CPU cluster with the defaults (bf16,
    megatron-core) and got a ZeRO-2 bf16 plan that validate could not compare."""
    model = Path(__file__).resolve().parents[2] / "benchmarks" / "plans" / "llama_l2.json"
    base = ("tune", "--model", str(model), "--cluster", "cpu-local",
            "--global-batch", "8", "--seq-len", "128", "--trials", "2", "--storage", "memory",
            "--no-progress")
    rc, _, err = run_main(capsys, *base)
    assert rc in (0, 1) and "note: cpu-local is a CPU host: meshplan validate predicts a plan" in err
    rc, _, err = run_main(capsys, *base, "--framework", "eager", "--dtype", "float32")
    assert rc in (0, 1) and "CPU host" not in err


@pytest.mark.parametrize("typed, want", [("ZB-2p", "ZB"), ("zb", "ZB"), ("ZBH2", "ZBH2"),
                                         ("zb-1p", "ZB-1p"), ("zbv", "ZBVPP"), ("gpipe", "FThenB"),
                                         ("1F1B-I", "VPP")])
def test_tune_pins_every_schedule_cost_names(typed, want):
    """Found by a bad-input hunt: tune's --schedule help says "names as cost's --schedule",
    but ZB-2p, ZBH2 and ZB-1p were refused, and --fix schedule=zbv / gpipe too. Each spelling
    now pins the tuner's name (ZB-2p is the tuner's ZB); ZB-H2 and ZB-1p, which no search
    tries unasked, can be pinned."""
    from tuner.space import parse_fix, tuner_schedule

    assert tuner_schedule(typed) == want
    assert parse_fix(f"schedule={typed}") == {"schedule": want}
    space = _tune_config("llama2-7b", "dgx-a100-80g", 1, 32, 2048, "pattern-based", 0, False,
                         f"schedule={typed},pp=2", "tpe", 4, False, framework="eager").space
    assert space.schedule_choices() == [want]


def test_an_unknown_pinned_schedule_names_the_known_ones(capsys):
    from tuner.space import SpaceError, parse_fix

    with pytest.raises(SpaceError, match=r"--fix: schedule 'Looped' is not one of \['FThenB'.*'ZB-1p'\]"):
        parse_fix("schedule=Looped")
    rc, out, err = run_main(capsys, "tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g",
                            "--global-batch", "16", "--layers", "4", "--trials", "2", "--pp", "2",
                            "--storage", "memory", "--no-progress", "--schedule", "ZBH2")
    assert rc == 0, err
    assert "note: the megatron-core profile's framework does not run ZBH2 (it runs 1F1B, VPP)" in err


def test_compare_warns_as_cost_does(capsys):
    """Found by a bad-input hunt: cost warned about ZB-H1 under DeepSpeed, compare of the same
    plans said nothing, and its --json rows had no warnings."""
    args = ("compare", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "2", "--dp", "2",
            "--tp", "4", "--pp", "2", "--global-batch", "16", "--layers", "4", "--framework", "deepspeed",
            "--schedules", "ZBH1,1F1B")
    rc, out, err = run_main(capsys, *args)
    assert rc == 0, err
    assert ("warning: schedule=ZBH1: the deepspeed profile's framework does not run ZBH1 (it runs "
            "1F1B)") in err and "schedule=1F1B:" not in err
    rc, out, err = run_main(capsys, *args, "--json")
    rows = json.loads(out)
    assert [r["schedule"] for r in rows] == ["ZBH1", "1F1B"]
    assert len(rows[0]["warnings"]) == 1 and rows[1]["warnings"] == []


def test_compare_warns_about_the_zero_stage_as_cost_does(capsys):
    """compare warned about schedules and cp exchanges but not a ZeRO stage the framework
    does not run (torchtitan's DDP beside tp; cost warned)."""
    rc, out, err = run_main(capsys, "compare", "--model", "llama2-7b", "--cluster", "dgx-h100", "--dp", "4",
                            "--tp", "2", "--zero", "0,2", "--framework", "fsdp2", "--global-batch", "8",
                            "--layers", "2", "--sequence-parallel")  # torchtitan's tp shards the sequence
    assert rc == 0, err
    assert ("warning: ZeRO=0: the fsdp2 profile's framework runs ZeRO 0 (DDP) only as the one parallel "
            "dimension") in err and "ZeRO=2:" not in err
