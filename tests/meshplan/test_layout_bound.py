"""meshplan.bounds.layout: the tight bound from one costed program per layout, shared by its
dp degrees and recompute modes, equals ``Engine.lower_bound`` on random candidates of three spaces and frameworks, and costs each layout
once."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusters import load_cluster
from meshplan.bounds.layout import (
    SHARED_DP,
    LayoutCosts,
    SharedLayoutBound,
    candidate_layout,
    layout_key,
    shares_layout,
)
from meshplan.engine import Engine
from meshplan.tuning import make_scorer, search_problem, template_kinds, to_strategy
from tuner.space import SearchSpace
from tuner.suggest import enumerate_candidates

#: 16 GPUs so that dp runs over 2, 4, 8 and 16 and crosses the node boundary
CONFIGS = {
    "megatron-a100": {"model": "llama2-7b", "cluster": "dgx-a100-80g", "nodes": 2, "global_batch_size": 64,
                      "seq_len": 4096, "num_layers": 4},
    "fsdp2-h100-fp8": {"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 2, "global_batch_size": 64,
                       "seq_len": 4096, "num_layers": 4, "framework": "fsdp2"},
    "deepspeed-h100-cp": {"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 2, "global_batch_size": 64,
                          "seq_len": 8192, "num_layers": 4, "framework": "deepspeed"},
}


def _strategy_of(sc):
    return lambda c: to_strategy(c, sc["global_batch_size"], sc["model"], sc["seq_len"], "bfloat16",
                                 "megatron", framework=sc.get("framework") or "megatron-core",
                                 attention=None)


@functools.cache
def _space(name):
    """(config, candidates, scorer) of the space ``name`` (built once; a plain function so
    that hypothesis reports only the name)."""
    sc = CONFIGS[name]
    prob = search_problem(sc["model"], sc["cluster"], sc["nodes"], sc["global_batch_size"],
                          sc["seq_len"], num_layers=sc["num_layers"])
    space = SearchSpace(prob, cp_degrees=(1, 2) if name.endswith("-cp") else (1,),
                        fp8_recipes=(None, "te-delayed") if "fp8" in name else (None,))
    cands = enumerate_candidates(space, "pattern-based", template_kinds(sc["model"], sc["seq_len"]))
    return sc, cands, make_scorer(sc)


def _engine(sc, c):
    return Engine(sc["model"], load_cluster(sc["cluster"], sc["nodes"]), _strategy_of(sc)(c),
                  seq_len=sc["seq_len"], num_layers=sc["num_layers"])


@settings(max_examples=15, deadline=None)
@given(name=st.sampled_from(sorted(CONFIGS)), rnd=st.randoms(use_true_random=False))
def test_shared_bound_equals_the_engine_bound(name, rnd):
    """The scorer's bound (shared layouts) is ``Engine.lower_bound``: time to the rounding
    of one float sum, memory exactly."""
    sc, cands, scorer = _space(name)
    c = rnd.choice(cands)
    try:
        t, mem = _engine(sc, c).lower_bound()
    except ValueError:
        with pytest.raises(ValueError):
            scorer.bound(c)
        return
    b = scorer.bound(c)
    assert b.time_s == pytest.approx(t, rel=1e-12, abs=1e-15)
    assert b.memory_bytes == mem


def test_layout_costs_equal_the_engine_costs_at_every_dp():
    """One layout (tp 2, its templates) at dp 4 and 8 (one node, two nodes): the shared
    program's block costs equal the engine's own, field by field; the post block's forward
    comm differs from the dp = 2 one by the loss all_reduce on the wider group."""
    sc, cands, _ = _space("megatron-a100")
    base = next(c for c in cands if c.tp == 2 and c.pp == 1 and c.dp == 8 and c.micro_batch_size == 1)
    cl = load_cluster(sc["cluster"], sc["nodes"])
    lay = LayoutCosts(_engine(sc, base), sc["num_layers"])
    for dp in (4, 8):
        c = base.replace(dp=dp, pp=16 // (dp * 2))
        e = _engine(sc, c)
        real = e.program_costs()
        got = lay.costs(dp, 2, e.strategy.recompute)
        for a, b in zip([real.pre, *real.layers, real.post], [got.pre, *got.layers, got.post], strict=True):
            assert a.compute == b.compute and a.comm_count == b.comm_count
            assert a.comm == pytest.approx(b.comm, rel=1e-12, abs=1e-18)
            assert a.grad_sync == b.grad_sync and a.params == b.params
        assert real.activations == got.activations and real.boundary_bytes == got.boundary_bytes
        assert real.loss == got.loss and real.layer_keys == got.layer_keys
        # by hand: the loss scalar (bf16, 2 bytes) all_reduced over (0, 2, .., 2 (dp-1))
        # instead of (0, 2)
        delta = (cl.collective_time("all_reduce", 2, tuple(range(0, 2 * dp, 2)))
                 - cl.collective_time("all_reduce", 2, (0, 2)))
        assert lay.loss_bytes == [2]
        assert got.post.comm["F"] - lay.post.comm["F"] == pytest.approx(delta, rel=1e-9)


def test_one_program_per_layout():
    """Candidates differing only in dp, pp, schedule, ZeRO and recompute share one costed
    program; dp = 1 and cp = 2 candidates take the engine's own bound (no entry)."""
    sc, cands, _ = _space("megatron-a100")
    sb = SharedLayoutBound(sc, _strategy_of(sc), load_cluster(sc["cluster"], sc["nodes"]), 1 << 40)
    tmpl = next(c for c in cands if c.tp == 2 and c.dp >= SHARED_DP).templates
    group = [c for c in cands if c.tp == 2 and c.templates == tmpl and c.micro_batch_size == 1
             and c.sequence_parallel is False and c.dp >= SHARED_DP]
    assert len({(c.dp, c.recompute, c.pp, c.schedule, c.zero) for c in group}) >= 10
    for c in group:
        try:
            sb(c)
        except ValueError:
            pass
    assert len(sb.layouts) == 1
    one = next(c for c in cands if c.dp == 1)
    s1 = _strategy_of(sc)(one)
    assert not shares_layout(s1)
    sb(one)
    assert len(sb.layouts) == 1
    s = _strategy_of(sc)(group[0])
    assert layout_key(s).dp == SHARED_DP and layout_key(s).recompute == "none"
    assert not shares_layout(s.replace(cp=2, dp=s.dp // 2))


@settings(max_examples=15, deadline=None)
@given(name=st.sampled_from(sorted(CONFIGS)), rnd=st.randoms(use_true_random=False))
def test_layout_time_is_below_the_tight_bound_and_the_simulation(name, rnd):
    """tier-0 <= layout_time <= the tight bound <= the simulated step, on random candidates."""
    sc, cands, scorer = _space(name)
    c = rnd.choice(cands)
    try:
        mid = scorer.bound.layout_time(c)
        tight = scorer.bound(c).time_s
        sim = scorer(c).time_s
    except ValueError:
        return
    assert mid <= tight <= sim
    if mid != float("-inf"):
        assert mid > 0


def test_layout_time_by_hand():
    """The formula on a costed layout: (m * W + sum_{r=1}^{pp-1} (r * F_min + F_pre)) / pp
    less 1 ns per action, W from the layout's own block times."""
    sc, cands, scorer = _space("megatron-a100")
    c = next(c for c in cands if c.tp == 2 and c.pp == 2 and c.dp == 4 and c.schedule == "1F1B"
             and c.recompute == "none")
    sb = scorer.bound
    got = sb.layout_time(c)
    lay = sb._of_candidate[candidate_layout(c)]
    t = [b.times(lay.profile) for b in lay.layers]
    w = sum(x["F"] + x["BW"] for x in t) + sum(lay.pre.times(lay.profile)[p] for p in ("F", "BW"))
    w += sum(lay.post.compute.values())
    m = 64 // (4 * c.micro_batch_size)
    chains = 1 * min(x["F"] for x in t) + lay.pre.times(lay.profile)["F"]
    assert got == pytest.approx((m * w + chains) / 2 - (m * 2 * 3 + 2 * 2 + 2) * 1e-9, rel=1e-12)


point = st.tuples(st.floats(0.5, 10.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0),
                  st.floats(0.0, 1.0), st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(point, min_size=1, max_size=40), st.floats(0.2, 1.0))
def test_prove_tiered_with_a_middle_bound_equals_brute_force(points, limit):
    """cheap <= middle <= tight <= time on random candidates: the three-tier search finds
    the brute-force optimum, its counts add up, and it tight-bounds no more candidates
    than the two-tier search."""
    from tuner.exhaustive_tiered import prove_tiered

    time_s = [p[0] for p in points]
    cheap_t = [p[0] * p[1] for p in points]
    mid_t = [c + (t - c) * p[2] for c, t, p in zip(cheap_t, time_s, points, strict=True)]
    tight_t = [m + (t - m) * p[4] for m, t, p in zip(mid_t, time_s, points, strict=True)]
    mem = [p[3] for p in points]
    refused = [p[5] and i % 3 == 0 for i, p in enumerate(points)]
    calls = {"tight": 0, "middle": 0}

    def tight(i):
        calls["tight"] += 1
        return tight_t[i], mem[i] * 0.9, limit

    def middle(i):
        calls["middle"] += 1
        return mid_t[i]

    def evaluate(i):
        return None if refused[i] else (time_s[i], mem[i], limit)

    rep = prove_tiered(cheap_t, [0.0] * len(points), [limit] * len(points), tight, evaluate, middle=middle)
    feasible = [t for t, m, r in zip(time_s, mem, refused, strict=True) if m <= limit and not r]
    assert rep.proven
    assert rep.simulated + rep.pruned_memory + rep.pruned_time + rep.pruned_cheap == len(points)
    assert rep.best_time_s == (min(feasible) if feasible else None)
    n_tight = calls["tight"]
    calls["tight"] = 0
    two = prove_tiered(cheap_t, [0.0] * len(points), [limit] * len(points), tight, evaluate)
    assert two.best_time_s == rep.best_time_s and n_tight <= calls["tight"]
