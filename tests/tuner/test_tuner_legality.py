"""Legality rules of the strategy search space: one test per named rule, plus properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner import legality as L
from tuner.space import (
    Candidate,
    ModelDims,
    SearchProblem,
    SearchSpace,
    SpaceError,
    divisors,
    iter_base_candidates,
    parse_fix,
)

# llama2-70b-like dims (64 heads, 8 kv heads) so heads and kv heads disagree for tp=16.
DIMS = ModelDims("toy-70b", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
                 ffn_hidden_size=28672, vocab_size=32000)
PROB = SearchProblem(DIMS, world_size=64, devices_per_node=8, global_batch_size=128, seq_len=4096)


def c(**kw):
    base = dict(dp=8, tp=8, pp=1)
    base.update(kw)
    return Candidate(**base)


def fails(rule, cand, prob=PROB):
    return rule(cand, prob)


def test_mesh_matches_world():
    assert fails(L.mesh_matches_world, c()) is None
    r = fails(L.mesh_matches_world, c(dp=4))
    assert r is not None and "32" in r and "64" in r


def test_mp_divides_heads_and_kv_heads():
    p = SearchProblem(DIMS, 16, 16, 128, 4096)
    # 64 heads split 16 ways fine; 8 kv heads do not split 16 ways.
    assert fails(L.tp_divides_heads, c(dp=1, tp=16), p) is None
    r = fails(L.tp_divides_kv_heads, c(dp=1, tp=16), p)
    assert r is not None and "num_kv_heads=8" in r
    odd = ModelDims("odd", 4, 96, 12, 12, 384, 100)
    r = L.tp_divides_heads(c(dp=1, tp=8), SearchProblem(odd, 8, 8, 8, 64))
    assert r is not None and "num_heads=12" in r


def test_mp_divides_hidden_ffn_vocab():
    odd = ModelDims("odd", 4, 96, 4, 4, 200, 50257)
    p = SearchProblem(odd, 4, 8, 8, 64)
    assert L.tp_divides_hidden(c(dp=1, tp=4), p) is None  # 96 / 4
    r = L.tp_divides_hidden(c(dp=1, tp=4), SearchProblem(
        ModelDims("o", 4, 98, 2, 2, 200, 64), 4, 8, 8, 64))
    assert r is not None and "hidden_size=98" in r
    assert L.tp_divides_ffn_hidden(c(dp=1, tp=4), p) is None  # 200 / 4 = 50
    r = L.tp_divides_vocab(c(dp=1, tp=4), p)
    assert r is not None and "vocab_size=50257" in r  # GPT-2's odd vocabulary
    assert L.tp_divides_vocab(c(dp=4, tp=1), p) is None


def test_rule_names_are_the_function_names():
    assert L.tp_divides_heads.__name__ == "tp_divides_heads"
    assert L.tp_divides_kv_heads.__name__ == "tp_divides_kv_heads"
    assert L.tp_divides_hidden.__name__ == "tp_divides_hidden"
    assert L.tp_divides_vocab.__name__ == "tp_divides_vocab"
    assert set(L.RULES_BY_NAME) == {r.__name__ for r in L.RULES}
    assert len(L.RULES_BY_NAME) == len(L.RULES)


def test_mp_within_node():
    p = SearchProblem(DIMS, 64, 8, 128, 4096)
    assert fails(L.tp_within_node, c(dp=4, tp=16), p) is not None
    assert fails(L.tp_within_node, c(dp=8, tp=8), p) is None
    allowed = SearchProblem(DIMS, 64, 8, 128, 4096, allow_cross_node_tp=True)
    assert fails(L.tp_within_node, c(dp=4, tp=16), allowed) is None


def test_pp_divides_layers_and_uneven():
    # 80 layers: pp=16 divides, pp=32 does not.
    assert fails(L.pp_divides_layers, c(dp=1, tp=4, pp=16)) is None
    r = fails(L.pp_divides_layers, c(dp=1, tp=2, pp=32))
    assert r is not None and "80" in r and "pp=32" in r
    uneven = SearchProblem(DIMS, 64, 8, 128, 4096, uneven_pp=True)
    assert fails(L.pp_divides_layers, c(dp=1, tp=2, pp=32), uneven) is None
    assert fails(L.pp_divides_layers, c(dp=1, tp=1, pp=64).replace(pp=96), uneven) is not None


def test_layers_divisible_by_pp_times_vpp():
    # 80 layers, pp=8: vpp=2 -> 16 chunks (80/16=5) ok; vpp=4 -> 32 chunks, 80 % 32 = 16.
    assert fails(L.layers_divisible_by_chunks, c(dp=1, pp=8, vpp=2, schedule="VPP")) is None
    r = fails(L.layers_divisible_by_chunks, c(dp=1, pp=8, vpp=4, schedule="VPP"))
    assert r is not None and "80" in r and "32" in r


def test_vpp_needs_interleaved_schedule():
    assert fails(L.vpp_needs_interleaved_schedule, c(dp=1, pp=8, vpp=2, schedule="1F1B"))
    assert fails(L.vpp_needs_interleaved_schedule, c(dp=1, pp=8, vpp=1, schedule="VPP"))
    assert fails(L.vpp_needs_interleaved_schedule, c(dp=1, pp=8, vpp=2, schedule="VPP")) is None


def test_zbvpp_needs_vpp2():
    assert fails(L.zbvpp_needs_vpp2, c(dp=1, pp=8, vpp=2, schedule="ZBVPP")) is None
    r = fails(L.zbvpp_needs_vpp2, c(dp=1, pp=8, vpp=4, schedule="ZBVPP"))
    assert r is not None and "vpp=4" in r


def test_global_batch_divisible():
    # B=128, dp=8: mbs 16 ok (m=1), mbs 3 not (8*3=24 does not divide 128).
    assert fails(L.global_batch_divisible, c(micro_batch_size=16)) is None
    r = fails(L.global_batch_divisible, c(micro_batch_size=3))
    assert r is not None and "24" in r


def test_microbatches_at_least_pp():
    # dp=2, mbs=8 -> m = 128 / 16 = 8; pp=4 ok, pp=16 not.
    assert fails(L.microbatches_at_least_pp, c(dp=2, tp=8, pp=4, micro_batch_size=8)) is None
    bad = c(dp=2, tp=2, pp=16, micro_batch_size=8)
    r = fails(L.microbatches_at_least_pp, bad)
    assert r is not None and "8 micro-batches" in r


def test_vpp_needs_m_multiple_of_pp():
    # dp=1, tp=8, pp=8, B=128: mbs=8 -> m=16 (multiple of 8); mbs=16 -> m=8 ok; B=100 mbs 2
    ok = c(dp=1, tp=8, pp=8, vpp=2, schedule="VPP", micro_batch_size=8)
    assert fails(L.vpp_microbatches_multiple_of_pp, ok) is None
    p = SearchProblem(DIMS, 64, 8, 100, 4096)
    bad = c(dp=1, tp=8, pp=8, vpp=2, schedule="VPP", micro_batch_size=2)  # m = 50
    r = fails(L.vpp_microbatches_multiple_of_pp, bad, p)
    assert r is not None and "m=50" in r
    # ZBVPP has no such requirement
    assert fails(L.vpp_microbatches_multiple_of_pp, bad.replace(schedule="ZBVPP"), p) is None


def test_sequence_parallel_rules():
    assert fails(L.sequence_parallel_needs_tp, c(dp=64, tp=1, sequence_parallel=True))
    assert fails(L.sequence_parallel_needs_tp, c(sequence_parallel=True)) is None
    p = SearchProblem(DIMS, 64, 8, 128, 4100)
    r = fails(L.sequence_parallel_seq_divisible, c(sequence_parallel=True), p)
    assert r is not None and "4100" in r
    assert fails(L.sequence_parallel_seq_divisible, c(sequence_parallel=True)) is None


def test_a_framework_that_always_shards_the_sequence_runs_no_tp_plan_without_it():
    """sp_always (torchtitan's profile, kernels.sequence_parallel always): tp 8 without
    sequence parallelism is refused, with it or at tp 1 (nothing to shard) it is legal; the
    same plan is legal where the framework makes it optional."""
    import dataclasses

    tt = dataclasses.replace(PROB, sp_always=True)
    assert fails(L.sequence_parallel_always, c(), tt) == "the framework runs tp > 1 with sequence parallelism only"
    assert fails(L.sequence_parallel_always, c(sequence_parallel=True), tt) is None
    assert fails(L.sequence_parallel_always, c(dp=64, tp=1), tt) is None
    assert fails(L.sequence_parallel_always, c()) is None
    assert "sp_always" not in PROB.to_dict() and tt.to_dict()["sp_always"] is True
    assert SearchProblem.from_dict(tt.to_dict()) == tt


def test_duplicate_removal_rules():
    assert fails(L.schedule_needs_pipeline, c(schedule="ZBH1"))
    assert fails(L.schedule_needs_pipeline, c(schedule="1F1B")) is None
    assert fails(L.zero_needs_dp, c(dp=1, tp=8, pp=8, zero=1))
    assert fails(L.zero_needs_dp, c(zero=3)) is None


def test_check_legality_returns_name_and_reason():
    bad = c(dp=8, tp=8, pp=1, micro_batch_size=3, sequence_parallel=True)
    vs = L.check_legality(bad, SearchProblem(DIMS, 64, 8, 128, 4100))
    names = [v.rule for v in vs]
    assert names == ["global_batch_divisible", "sequence_parallel_seq_divisible"]
    assert str(vs[0]).startswith("global_batch_divisible: ")
    assert L.first_violation(bad, PROB).rule == "global_batch_divisible"
    assert L.is_legal(c(), PROB)


def test_enumeration_count_by_hand():
    # 4 layers, 8 GPUs (one node), B=16: meshes with tp | 32 heads, pp | 4 layers.
    dims = ModelDims("small", 4, 4096, 32, 32, 11008, 32000)
    prob = SearchProblem(dims, 8, 8, 16, 4096)
    space = SearchSpace(prob, schedules=("1F1B",), micro_batch_sizes=(1,), recompute=("none",),
                        zero_stages=(0,), sequence_parallel=(False,))
    legal = [x for x in iter_base_candidates(space) if L.is_legal(x, prob)]
    meshes = sorted((x.dp, x.tp, x.pp) for x in legal)
    # pp in {1,2,4} (8 does not divide 4 layers); all tp | 8 are fine.
    assert meshes == sorted([(8, 1, 1), (4, 2, 1), (2, 4, 1), (1, 8, 1), (4, 1, 2), (2, 2, 2),
                             (1, 4, 2), (2, 1, 4), (1, 2, 4)])


def test_parse_fix():
    assert parse_fix("dp=8,tp=8") == {"dp": 8, "tp": 8}
    assert parse_fix("zero=1, sp=true, schedule=VPP") == {
        "zero": 1, "sequence_parallel": True, "schedule": "VPP"}
    with pytest.raises(SpaceError, match="unknown knob 'foo'"):
        parse_fix("foo=1")
    with pytest.raises(SpaceError, match="tp='x'"):
        parse_fix("tp=x")


@settings(deadline=None, max_examples=60)
@given(w=st.sampled_from([8, 16, 32]), b=st.sampled_from([8, 16, 64, 512]),
       layers=st.sampled_from([4, 6, 32]))
def test_legal_points_satisfy_every_invariant(w, b, layers):
    dims = ModelDims("m", layers, 4096, 32, 8, 11008, 32000)
    prob = SearchProblem(dims, w, 8, b, 4096)
    space = SearchSpace(prob, recompute=("none",), zero_stages=(0, 1))
    for x in iter_base_candidates(space):
        if not L.is_legal(x, prob):
            continue
        m = b // (x.dp * x.micro_batch_size)
        assert x.dp * x.tp * x.pp == w and x.dp * x.micro_batch_size * m == b
        assert x.tp <= 8 and 8 % x.tp == 0 and layers % (x.pp * x.vpp) == 0
        assert m >= x.pp and (x.schedule != "VPP" or m % x.pp == 0)
        assert (x.vpp == 2) if x.schedule == "ZBVPP" else True
        assert x.tp in divisors(w)
