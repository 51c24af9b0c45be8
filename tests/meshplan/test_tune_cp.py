"""Context parallelism in the search: cp is a searched dimension wherever the framework
runs it (issue 36: before, only with ``tune --search-cp``; by default the degrees keeping
8,192 tokens per cp rank, ``--search-cp`` every one, ``--no-search-cp`` none),
``--cp-comm`` / ``--cp-comm-type`` chooses its K/V
exchange, and a framework profile states the exchanges it runs (``kernels.cp_comms``:
DeepSpeed, Megatron-LM 2021 and llm-foundry run none), so a plan that cannot run is never
searched, and ``cost`` says when one is costed."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from meshplan.engine import Engine
from meshplan.errors import MeshplanError
from meshplan.plan import Plan
from meshplan.tune_setup import tune_config
from meshplan.tuning import framework_cp_comms, search_cp_degrees, to_strategy
from simulator.profiles import ProfileError, load_profile
from tests._cli import one_line_error, run_main
from tuner.space import Candidate


def test_each_catalog_framework_states_its_cp_exchanges():
    for name in ("megatron-core", "nemo", "megatron-bridge", "fsdp2", "fsdp2-eager", "fsdp2-async-tp"):
        assert framework_cp_comms(name) == ("p2p", "all_gather"), name
    for name in ("deepspeed", "megatron-2021", "megatron-2021-torch-ddp", "llm-foundry"):
        assert framework_cp_comms(name) == (), name
    assert framework_cp_comms("eager") == ("p2p", "all_gather")  # the executor runs both
    assert "--cp-comm-type" in load_profile("megatron-core").kernels.cp_comms.provenance


def test_a_profile_with_an_unknown_cp_exchange_is_refused(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({"extends": "megatron-core", "name": "p", "kernels": {
        "cp_comms": {"value": ["p2p", "a2a"], "provenance": "test"}}}))
    with pytest.raises(ProfileError, match="unknown cp exchange"):
        load_profile(f)


def test_searched_cp_degrees_by_hand():
    # divisors c of the GPUs with 2c | seq: 8 GPUs at 32768 tokens: 1, 2, 4, 8
    assert search_cp_degrees(8, 32768) == (1, 2, 4, 8)
    # 12 tokens: 2*2 = 4 divides 12, 2*4 = 8 and 2*8 = 16 do not
    assert search_cp_degrees(8, 12) == (1, 2)
    # 12 GPUs, 36 tokens: 2 (4 does not divide 36), 3 (6 | 36), 6 (12 | 36); not 4, 12
    assert search_cp_degrees(12, 36) == (1, 2, 3, 6)


def _config(**kw):
    return tune_config("llama2-7b", "dgx-h100", 1, 8, 32768, "pattern-based", 0, False,
                       kw.pop("fix", None), "tpe", 4, False, **kw)


def test_tune_config_searches_cp_and_carries_the_exchange():
    cfg = _config(search_cp=True, cp_comm="allgather", framework="fsdp2")
    assert cfg.space.cp_choices() == [1, 2, 4, 8]
    assert cfg.scorer_config["cp_comm"] == "all_gather"  # Megatron-LM's spelling read
    plain = _config()
    # the default: searched where megatron-core runs it, keeping >= 8,192 tokens per cp rank
    assert plain.space.cp_choices() == [1, 2, 4]
    assert "cp_comm" not in plain.scorer_config  # a study stored before the option resumes
    assert _config(search_cp=False).space.cp_choices() == [1]
    assert _config(framework="deepspeed").space.cp_choices() == [1]  # runs none: not searched
    assert _config(fix="cp=2", cp_comm="all_gather").space.cp_choices() == [2]


@pytest.mark.parametrize("kw, words", [
    ({"search_cp": True, "fix": "cp=2"}, "cp is pinned to 2"),
    ({"search_cp": True, "framework": "deepspeed"}, "framework deepspeed runs no context parallelism"),
    ({"cp_comm": "all_gather", "search_cp": False}, "no plan has cp > 1: add --search-cp or pin --cp N"),
    ({"cp_comm": "all_gather", "fix": "cp=1"}, "no plan has cp > 1"),
])
def test_cp_options_that_cannot_hold_are_refused(kw, words):
    with pytest.raises(MeshplanError, match=words.replace("(", r"\(").replace(")", r"\)")):
        _config(**kw)


def test_a_candidate_takes_the_exchange_only_with_cp_above_one():
    two = to_strategy(Candidate(dp=4, tp=1, pp=1, cp=2), 8, "llama2-7b", 32768, cp_comm="all_gather")
    one = to_strategy(Candidate(dp=8, tp=1, pp=1), 8, "llama2-7b", 32768, cp_comm="all_gather")
    assert (two.cp, two.cp_comm) == (2, "all_gather")
    assert (one.cp, one.cp_comm) == (1, "p2p")  # nothing exchanged: the Strategy default


def test_tune_searches_cp_and_its_plan_costs_as_scored(tmp_path, capsys):
    """A brute-force search over cp 1, 2, 4, 8 (mesh otherwise pinned; ZeRO 0, which dp 1 at
    cp 8 also takes: a pinned ZeRO-3 has no data-parallel group there,
    ``tuner.legality.zero_needs_dp``, a pin the sampler once dropped) scores one plan per
    cp; the best plan reproduces its time through the Engine, with the all_gather exchange
    it was searched with; all_gather holds the cp gathered K/V blocks where the ring holds 2
    (``simulator.cp_torch.workspace_bytes``), so the cp 8 plan's peak differs."""
    def run(out, *extra):
        rc, _, err = run_main(capsys, "tune", "--model", "llama2-7b", "--cluster", "dgx-h100",
                              "--nodes", "1", "--global-batch", "8", "--seq-len", "32768",
                              "--layers", "2", "--sampler", "bruteforce", "--trials", "4",
                              "--search-cp",
                              "--fix", "tp=1,pp=1,zero=0,micro_batch_size=1,recompute=full",
                              "--framework", "fsdp2", "--storage", "memory", "--output",
                              str(out), "--no-progress", *extra)
        assert rc == 0, err
        hist = pd.read_csv(out / "history.csv")
        return hist[hist.state == "COMPLETE"]
    ag = run(tmp_path / "ag", "--cp-comm", "all_gather")
    assert sorted(ag.cp) == [1, 2, 4, 8]
    assert list(ag.dp * ag.cp) == [8] * 4
    plan = Plan.load(tmp_path / "ag" / "plan.json")
    best = ag.loc[ag.step_time_s.idxmin()]
    assert plan.strategy.cp_comm == ("all_gather" if plan.strategy.cp > 1 else "p2p")
    assert Engine.from_plan(plan).simulate().step_time == pytest.approx(best.step_time_s, rel=1e-9)
    p2p = run(tmp_path / "p2p")
    t_ag = dict(zip(ag.cp, ag.peak_memory_bytes, strict=True))
    t_p2p = dict(zip(p2p.cp, p2p.peak_memory_bytes, strict=True))
    assert t_ag[1] == t_p2p[1]  # cp 1: no exchange, one plan
    assert t_ag[8] > t_p2p[8]  # cp 8: 8 gathered blocks against 2


def test_cli_notes_and_warnings_for_cp_a_framework_does_not_run(capsys, tmp_path):
    rc, _, err = run_main(capsys, "tune", "--model", "llama2-7b", "--cluster", "dgx-h100", "--nodes", "1",
                          "--global-batch", "8", "--seq-len", "32768", "--layers", "2", "--trials", "1",
                          "--cp", "2", "--framework", "llm-foundry", "--storage", "memory",
                          "--output", str(tmp_path), "--no-progress")
    assert rc == 0, err
    assert ("note: the llm-foundry profile's framework runs no context parallelism: plans with cp 2 "
            "are costed as asked, but cannot run under it") in err
    rc, out, err = run_main(capsys, "cost", "--model", "llama2-7b", "--cluster", "dgx-h100", "--dp", "2",
                            "--cp", "4", "--seq-len", "32768", "--global-batch", "8", "--framework",
                            "deepspeed", "--layers", "2")
    assert rc == 0, err
    assert "the deepspeed profile's framework runs no context parallelism: cp 4 costed as asked" in out + err
    line = one_line_error(*run_main(capsys, "tune", "--model", "llama2-7b", "--cluster", "dgx-h100",
                                    "--nodes", "1", "--global-batch", "8", "--cp-comm-type", "allgather",
                                    "--no-search-cp", "--storage", "memory"))
    assert "--cp-comm all_gather" in line and "--search-cp" in line


def test_a_pinned_cp_under_a_framework_without_cp_is_noted_whatever_its_exchange():
    """The review: --cp 2 under DeepSpeed was a note, --cp 2 --cp-comm all_gather an error;
    both plans cannot run there alike: both are noted (by the CLI), neither refused."""
    for comm in ("p2p", "all_gather"):
        assert _config(fix="cp=2", cp_comm=comm, framework="deepspeed").space.cp_choices() == [2]
