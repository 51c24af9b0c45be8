"""Expert parallelism as a tune dimension (issue 21; folding, issue 42): a mixture-of-experts
model's ep is searched over the divisors of dp x cp that divide its experts (etp = tp) and,
with tp > 1, the multiples of tp dividing dp x cp x tp (etp 1), ZeRO <= 1; the legality rule
names what breaks it; a dense model's space is unchanged."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from tuner import legality as L
from tuner.space import Candidate, ModelDims, SearchProblem, SearchSpace, iter_base_candidates
from tuner.suggest import enumerate_candidates

#: a Qwen-MoE-like toy: 60 experts (divisible by 1, 2, 4 of dp 8's divisors, not 8)
MOE = ModelDims("toy-moe", 4, 1024, 16, 4, 4096, 32000, num_experts=60)
DENSE = ModelDims("toy", 4, 1024, 16, 4, 4096, 32000)


def _space(dims: ModelDims, **kw) -> SearchSpace:
    prob = SearchProblem(dims, world_size=8, devices_per_node=8, global_batch_size=64, seq_len=1024)
    fix = {"tp": 1, "pp": 1, **kw.pop("fix", {})}
    return SearchSpace(prob, micro_batch_sizes=(1,), recompute=("none",), sequence_parallel=(False,),
                       fix=fix, **kw)


def test_ep_choices_are_divisors_of_dp_dividing_the_experts():
    """dp 8: divisors 1, 2, 4, 8; 60 experts take 1, 2, 4 (60 % 8 = 4). ZeRO-2/3: ep 1 only;
    cp 2 folds into dp x cp = 16 (still 1, 2, 4); tp 2 adds the multiples of 2 dividing 16
    and 60 with etp 1 (2, 4); a dense model: 1; --fix ep=2: 2."""
    sp = _space(MOE)
    assert sp.ep_choices(8, 1, 0) == [(1, None), (2, None), (4, None)] == sp.ep_choices(8, 1, 1)
    assert sp.ep_choices(8, 1, 2) == [(1, None)]
    assert sp.ep_choices(8, 2, 0) == [(1, None), (2, None), (4, None)]
    assert sp.ep_choices(8, 1, 0, tp=2) == [(1, None), (2, None), (4, None), (2, 1), (4, 1)]
    assert _space(DENSE).ep_choices(8, 1, 0) == [(1, None)]
    assert _space(MOE, fix={"ep": 2}).ep_choices(8, 1, 0) == [(2, None)]
    assert _space(MOE, fix={"ep": 4}).ep_choices(2, 1, 0, tp=2) == [(4, 1)]


def test_the_enumerated_space_holds_each_legal_ep_once():
    """pp 1, tp 1, dp 8, ZeRO 0-3: ZeRO 0 and 1 with ep 1, 2, 4 and ZeRO 2, 3 with ep 1: 8
    plans; the dense model: the 4 ZeRO stages."""
    moe = enumerate_candidates(_space(MOE), "semi-auto")
    assert sorted((c.zero, c.ep) for c in moe) == [(0, 1), (0, 2), (0, 4), (1, 1), (1, 2), (1, 4), (2, 1), (3, 1)]
    assert sorted(c.zero for c in enumerate_candidates(_space(DENSE), "semi-auto")) == [0, 1, 2, 3]
    assert all(c.to_dict().get("ep", 1) == c.ep and ("ep" in c.to_dict()) == (c.ep > 1) for c in moe)


def test_ep_layout_rule_names_the_numbers():
    p = _space(MOE).problem
    assert L.ep_layout(Candidate(8, 1, 1, ep=4), p) is None
    assert "ep=8 must divide num_experts=60" in L.ep_layout(Candidate(8, 1, 1, ep=8), p)
    assert "needs ZeRO <= 1" in L.ep_layout(Candidate(8, 1, 1, zero=2, ep=2), p)
    assert L.ep_layout(Candidate(2, 2, 1, ep=4, etp=1), p) is None  # folded over dp x tp
    assert "'ep' = 4 must divide dp = 2" in L.ep_layout(Candidate(2, 2, 1, ep=4), p)
    assert "has no mixture-of-experts layer" in L.ep_layout(Candidate(8, 1, 1, ep=2), _space(DENSE).problem)


@settings(max_examples=30, deadline=None)
@given(experts=st.integers(2, 64), zero=st.integers(0, 3))
def test_every_enumerated_ep_passes_the_rule(experts, zero):
    dims = ModelDims("m", 4, 1024, 16, 4, 4096, 32000, num_experts=experts)
    sp = _space(dims, zero_stages=(zero,))
    for c in iter_base_candidates(sp):
        assert L.ep_layout(c, sp.problem) is None
        assert experts % c.ep == 0 and (c.dp * c.cp * c.tp) % (c.ep * (c.etp or c.tp)) == 0


def test_a_config_whose_experts_no_layer_uses_is_dense_and_ep_is_refused(tmp_path):
    """A Qwen2-MoE config.json whose ``mlp_only_layers`` names every layer has experts no
    layer routes to: the tuner sees a dense model (0 experts; --fix ep=2 refused up front)
    and cost refuses --ep naming the layers (it costed ep=4 on a dense model)."""
    import json

    import pytest

    from completion import get_model_config
    from completion.models.source import resolve_model
    from completion.plan_program import PlanProgramError, check_plan
    from completion.strategy import Strategy
    from tuner.space import SpaceError

    raw = {"model_type": "qwen2_moe", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
           "num_key_value_heads": 4, "intermediate_size": 512, "moe_intermediate_size": 128,
           "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 1000, "max_position_embeddings": 512,
           "mlp_only_layers": [0, 1]}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(raw))
    cfg = get_model_config(f)
    assert cfg.num_experts == 8 and ModelDims.of(cfg).num_experts == 0
    with pytest.raises(SpaceError, match="--fix: ep=2 but model .* has no mixture-of-experts layer"):
        _space(ModelDims.of(cfg), fix={"ep": 2})
    with pytest.raises(SpaceError, match="has no mixture-of-experts layer"):
        _space(DENSE, fix={"ep": 2})
    source = resolve_model(str(f), 512)
    with pytest.raises(PlanProgramError, match="'ep' = 4: .* no mixture-of-experts layer in its 2 layers"):
        check_plan(source, Strategy(dp=8, ep=4, micro_batch_size=1, global_batch_size=8))
    raw["mlp_only_layers"] = [0]  # layer 1 routes; --layers 1 keeps only the dense layer 0
    f.write_text(json.dumps(raw))
    with pytest.raises(PlanProgramError, match="in its 1 layer [(]--layers 1 keeps only layers the config"):
        check_plan(resolve_model(str(f), 512, num_layers=1),
                   Strategy(dp=8, ep=4, micro_batch_size=1, global_batch_size=8))
    check_plan(resolve_model(str(f), 512), Strategy(dp=8, ep=4, micro_batch_size=1, global_batch_size=8))
    assert ModelDims.of(get_model_config(f)).num_experts == 8


def test_a_pinned_ep_that_does_not_divide_the_experts_is_refused_up_front():
    import pytest

    from tuner.space import SpaceError

    with pytest.raises(SpaceError, match="--fix: ep=8 does not divide the model's 60 experts"):
        _space(MOE, fix={"ep": 8})
    assert _space(MOE, fix={"ep": 4}).ep_choices(8, 1, 0) == [(4, None)]


def test_tune_pins_ep_by_its_megatron_name_and_reports_it(tmp_path, capsys):
    """tune takes --ep / --expert-model-parallel-size like --tp (it had only --fix ep=N);
    the best-plan line and history.csv name ep (and cp)."""
    import csv

    from tests._cli import run_main

    out = tmp_path / "run"
    rc, text, err = run_main(capsys, "tune", "-m", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--global-batch", "16",
                             "--layers", "2", "--seq-len", "1024", "--expert-model-parallel-size", "8",
                             "--trials", "3", "--output", str(out))
    assert rc == 0, err
    assert re.search(r"best plan: dp=\d+ tp=\d+ pp=1 cp=1 ep=8 ", text)  # etp 1 folds ep over dp x tp
    rows = list(csv.DictReader((out / "history.csv").open()))
    assert rows and all(r["ep"] == "8" and r["cp"] == "1" for r in rows if r["state"] == "COMPLETE")


def test_the_top_table_and_the_mesh_lines_tell_ep_apart():
    """A hunt found two MoE plans of one dp-tp-pp-cp, ep 4 and ep 1, reading alike in the top
    table ("8-1-1-1") and grouped as one mesh shape in the report: ep is part of both."""
    from tuner.explain import mesh_name, mesh_shape
    from tuner.result import mesh_cell, plan_label

    moe = {"dp": 8, "tp": 1, "pp": 1, "cp": 1, "ep": 4, "schedule": "1F1B", "vpp": 1,
           "micro_batch_size": 2, "recompute": "full", "zero": 1, "sequence_parallel": False,
           "templates": {}}
    dense = {**moe, "ep": 1}
    assert (mesh_cell(moe), mesh_cell(dense)) == ("8-1-1-1 ep4", "8-1-1-1")
    assert mesh_shape(moe) != mesh_shape(dense)
    assert (mesh_name(mesh_shape(moe)), mesh_name(mesh_shape(dense))) == ("dp8 tp1 pp1 ep4", "dp8 tp1 pp1")
    assert plan_label(moe).startswith("dp8 tp1 pp1 ep4 1F1B") and " ep" not in plan_label(dense)
