"""The space ``tune`` searches by default is the one practitioners run (issue 36 items 2 and
3): the Megatron tensor-parallel layout, every knob the framework runs, and only legal
plans drawn -- no plan of it is refused by the engine, and no repeat counts as a trial."""

from __future__ import annotations

import random

import optuna
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from completion.models.source import resolve_model
from completion.plan_program import check_plan
from meshplan.errors import MeshplanError
from meshplan.tune_setup import VPP_DEGREES, tune_config
from meshplan.tuning import make_scorer, to_strategy
from tests._cli import run_main
from tuner import legality as L
from tuner.legal_draw import LegalTree, draw_candidate, legal_tree
from tuner.space import ModelDims, SearchProblem, SearchSpace, parse_fix
from tuner.suggest import enumerate_candidates

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _cfg(model="llama2-7b", cluster="dgx-h100", mode="framework", fix=None, layers=2, gb=16,
         seq=1024, **kw):
    return tune_config(model, cluster, 1, gb, seq, mode, 0, False, fix, None, layers, False, **kw)


def test_the_default_space_is_the_frameworks():
    """megatron-core on H100: the Megatron layout only, Megatron-LM's recompute modes,
    vpp 2-8, 1F1B and VPP, any pp up to the layers (the balanced split is an explicit
    layout), cp where each cp rank keeps 8,192 tokens (none at 1,024; 1, 2, 4 at 32,768 on
    8 GPUs), BF16 (FP8 on request: it changes the numerics); torchtitan (fsdp2) its own
    recompute (op-level SAC), ZeRO stages and FP8 recipes; DeepSpeed no cp."""
    s = _cfg().space
    assert s.cp_choices() == [1] and s.fp8_choices() == [None]
    assert _cfg(seq=32768).space.cp_choices() == [1, 2, 4]
    assert s.recompute_choices() == ["none", "selective", "full"] and tuple(s.vpp_choices()) == VPP_DEGREES
    assert s.schedule_choices() == ["1F1B", "VPP"] and s.problem.uneven_pp
    cands = enumerate_candidates(s, "framework")
    assert all(c.annotation == "megatron" and not c.templates for c in cands)
    assert {c.sequence_parallel for c in cands} == {False, True}
    assert {c.pp for c in enumerate_candidates(_cfg(layers=3).space, "framework")} == {1, 2}  # 2 + 1 layers
    assert _cfg(fp8=True).space.fp8_choices() == [None, "te-delayed"]
    fsdp = _cfg(framework="fsdp2", fp8=True).space
    assert fsdp.recompute_choices() == ["none", "selective-op", "full"]
    assert fsdp.fp8_choices() == [None, "tensorwise", "rowwise"] and fsdp.zero_choices() == [0, 2, 3]
    ds = _cfg(framework="deepspeed", seq=32768).space
    assert ds.cp_choices() == [1] and ds.recompute_choices() == ["none", "full"]
    assert not _cfg(layer_split="even").space.problem.uneven_pp


def test_narrowing_options_and_what_they_refuse():
    """--no-search-cp narrows the space, --search-cp widens it to every degree; --search-fp8
    on an A100 and --search-cp under DeepSpeed are refused naming why; a pin wins."""
    assert _cfg(search_cp=False, seq=32768).space.cp_choices() == [1]
    assert _cfg(search_cp=True).space.cp_choices() == [1, 2, 4, 8]
    assert _cfg(fix="cp=2").space.cp_choices() == [2] and _cfg(fix="fp8=none").space.fp8_choices() == [None]
    with pytest.raises(MeshplanError, match="no FP8 peak"):
        _cfg(cluster="dgx-a100-80g", fp8=True)
    with pytest.raises(MeshplanError, match="runs no context parallelism"):
        _cfg(framework="deepspeed", search_cp=True)


def test_pattern_variants_only_on_request():
    """The replicated attention / MLP / head layouts are in --mode pattern-based only; there
    a mixture-of-experts plan with ep > 1 keeps Megatron's layout (the plan pipeline places
    experts with it: tuner.legality.ep_needs_megatron_layout)."""
    kw = {"layers": 2, "gb": 16, "fix": "pp=1"}
    framework = enumerate_candidates(_cfg(**kw).space, "framework")
    cfg = _cfg(mode="pattern-based", **kw)
    pattern = enumerate_candidates(cfg.space, "pattern-based", cfg.template_kinds)
    assert any(dict(c.templates).get("attention") == "replicated" for c in pattern)
    assert len(pattern) > len(framework)
    moe = _cfg("mixtral-8x7b", mode="pattern-based", **kw)
    moe_cands = enumerate_candidates(moe.space, "pattern-based", moe.template_kinds)
    assert any(c.ep > 1 for c in moe_cands)
    assert all(L.megatron_layout(c) for c in moe_cands if c.ep > 1)


CASES = [  # model, framework, extra pins: dense and MoE (ep searched, and pinned as --ep does)
    ("llama2-7b", "megatron-core", None),
    ("llama2-7b", "fsdp2", None),
    ("llama2-7b", "deepspeed", None),
    ("mixtral-8x7b", "megatron-core", None),
    ("qwen3-30b-a3b", "megatron-core", "ep=8"),
    ("mixtral-8x7b", "megatron-core-pattern", None),
]


@pytest.mark.parametrize("model, framework, fix", CASES)
def test_no_plan_of_the_default_space_is_refused_by_the_engine(model, framework, fix):
    """Every candidate of the default space of a few models and frameworks (2 layers, one
    node of H100), widened to every cp degree and FP8 recipe, passes the plan pipeline's checks (``check_plan``: the refusal a MoE
    pattern-based search hit, "strategy field 'ep' ... needs annotation 'megatron'") and
    gets a cheap bound; a seeded sample of 6 is simulated. None raises: a refusal after
    the legality rules would be a bug (the proof would not hold)."""
    mode = "pattern-based" if framework.endswith("-pattern") else "framework"
    fw = framework.removesuffix("-pattern")
    # the widest space: every cp degree, and FP8 where the framework has a recipe
    cfg = _cfg(model, mode=mode, framework=fw, fix=fix, search_cp=fw != "deepspeed",
               fp8=fw != "deepspeed")
    cands = enumerate_candidates(cfg.space, cfg.mode, cfg.template_kinds, cfg.annotation)
    assert cands
    src = resolve_model(model, 1024, num_layers=2)
    scorer = make_scorer(cfg.scorer_config)
    for c in cands:
        check_plan(src, to_strategy(c, 16, model, 1024, framework=fw))
        scorer.cheap_bound(c)
    for c in random.Random(0).sample(cands, min(6, len(cands))):
        scorer(c)


# -- legal draws --------------------------------------------------------------------------------
TOY = ModelDims("toy", num_layers=8, hidden_size=1024, num_heads=16, num_kv_heads=4,
                ffn_hidden_size=4096, vocab_size=32000, num_experts=8)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([8, 16, 32]), st.sampled_from([16, 64, 96]),
       st.sampled_from(["", "tp=2", "mbs=1", "zero=1", "pp=2,vpp=2"]), st.integers(0, 2**16))
def test_every_draw_is_a_legal_plan_and_names_keep_their_choices(world, gb, fix, seed):
    """Random spaces of a toy MoE model: a random walk of the legal tree always ends on a
    legal candidate of the space; a parameter name always carries the same choices
    (Optuna's rule), and the enqueued parameters of a candidate draw it back."""
    prob = SearchProblem(TOY, world, 8, gb, 1024, uneven_pp=True)
    space = SearchSpace(prob, fix=parse_fix(fix), vpp_degrees=(2, 3, 4), cp_degrees=(1, 2))
    cands = enumerate_candidates(space, "framework")
    if not cands:
        return
    tree = LegalTree(cands)
    names: dict[str, tuple] = {}

    def pick(name, choices):
        assert names.setdefault(name, choices) == choices
        return rnd.choice(choices)

    rnd = random.Random(seed)
    keys = {c.key() for c in cands}
    for _ in range(20):
        c = tree.walk(pick)
        assert c.key() in keys and L.is_legal(c, prob)
    c = rnd.choice(cands)
    study = optuna.create_study()
    study.enqueue_trial(tree.params_of(c))
    assert draw_candidate(tree, study.ask(), "framework") == c


def test_full_random_draws_legal_plans_with_a_seed_beyond_tp_one():
    """full_random: the tree holds the legal bases (a random annotation cannot place
    experts: no tp > 1 plan with ep > 1); a tp > 1 draw gets its annotation seed."""
    prob = SearchProblem(TOY, 16, 8, 64, 1024)
    tree = legal_tree(SearchSpace(prob), "full_random")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    got = [draw_candidate(tree, study.ask(), "full_random") for _ in range(60)]
    assert all(L.is_legal(c, prob) for c in got)
    assert all((c.annotation_seed is not None) == (c.tp > 1) for c in got)


def test_a_moe_pattern_search_draws_no_refused_plan_and_no_repeat_is_a_trial(capsys, tmp_path):
    """A new user's Mixtral search (pattern-based TPE) had 29 of 200 trials illegal and 9
    refused by the engine; now every trial is a legal plan the engine scores, and
    ``--trials 12`` means 12 distinct plans (repeats are cached rows, not trials)."""
    out = tmp_path / "m"
    rc, text, err = run_main(capsys, "tune", "--model", "mixtral-8x7b", "--cluster", "dgx-h100",
                             "--nodes", "1", "--global-batch", "16", "--seq-len", "1024", "--layers", "2",
                             "--mode", "pattern-based", "--sampler", "tpe", "--trials", "12",
                             "--time-budget", "30", "--no-progress", "--output", str(out))
    assert rc == 0, err
    h = pd.read_csv(out / "history.csv")
    assert (h.state == "COMPLETE").all() and h.pruned_reason.isna().all()
    assert (~h.cached.fillna(False)).sum() == 12
