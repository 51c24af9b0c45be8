"""Expert data parallelism (issue 21): ZeRO-1 with ep shards expert optimizer states over
the expert-data-parallel group (dp / ep ranks) and dense ones over dp, as Megatron-Core's
distributed optimizer does (``simulator.expert_parallel``); ep < dp puts the all_to_all on
the ep subgroup and reduces expert gradients over dp / ep."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusters import load_cluster
from completion.models.source import resolve_model
from completion.plan_program import PlanProgramError, build_plan_program
from completion.strategy import Strategy, StrategyError
from meshplan import Engine
from simulator.expert_parallel import expert_dp_group, sharded_elements
from tests.completion.test_moe_program import TINY

#: TINY (2 layers, 4 experts of width 32, top-2, h 64) per rank at ep 2 (tp 1): 2 of the 4
#: experts, 2 layers x 2 x 3 * 64*32 = 24,576 expert elements, beside 83,136 dense ones
#: (test_moe_cost.test_ep_strategy_places_experts_and_skips_their_gradient_sync)
DENSE, EXPERT = 83_136, 24_576


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    p = tmp_path_factory.mktemp("edp") / "moe.json"
    p.write_text(json.dumps(TINY))
    return str(p)


def _engine(tiny: str, **kw) -> Engine:
    return Engine(tiny, "dgx-h100", Strategy(micro_batch_size=1, global_batch_size=8, **kw), seq_len=32)


def test_zero1_shards_expert_states_over_the_expert_data_parallel_group(tiny):
    """dp 4, ep 2, ZeRO-1 (megatron-core: 2-byte weights, 4-byte fp32 main grads, 12 bytes
    of fp32 master + Adam): weights and gradients whole, 107,712 elements; optimizer states
    of the dense part over dp = 4, 83,136 / 4 = 20,784, and of the experts over dp / ep = 2,
    24,576 / 2 = 12,288: 12 * 33,072 = 396,864 bytes (dense 249,408 + expert 147,456). At
    ep = dp = 4 each rank has one expert (12,288 elements) and no expert replica: 12 *
    (20,784 + 12,288); at ep 1 every state over dp: 12 * 132,288 / 4 -- the same 396,864
    (the experts' states spread over dp ranks either way)."""
    mb = _engine(tiny, dp=4, ep=2, zero=1).simulate().memory_breakdown
    total = DENSE + EXPERT
    assert (mb["params"], mb["grads"]) == (2 * total, 4 * total) == (215_424, 430_848)
    assert mb["optimizer"] == 12 * (DENSE // 4) + 12 * (EXPERT // 2) == 249_408 + 147_456 == 396_864
    zero0 = _engine(tiny, dp=4, ep=2).simulate().memory_breakdown
    assert zero0["optimizer"] == 12 * total == 1_292_544
    ep4 = _engine(tiny, dp=4, ep=4, zero=1).simulate().memory_breakdown
    assert ep4["params"] == 2 * (DENSE + EXPERT // 2) and ep4["optimizer"] == 12 * (DENSE // 4 + EXPERT // 2)
    ep1 = _engine(tiny, dp=4, zero=1).simulate().memory_breakdown
    assert ep1["optimizer"] == 12 * (DENSE + 2 * EXPERT) // 4 == 396_864


def test_ep_below_dp_all_to_all_on_the_ep_subgroup_by_hand(tiny):
    """dp 4, ep 2: a rank's expert-major tokens are [E 4, mbs 1 x C, h 64] with C = ceil(32
    * 2 / 4) = 16 slots per expert per sequence; the dispatch all_to_all leaves [E/ep 2, ep
    x 16, 64] = 4,096 bf16 elements, 8,192 bytes, on the ep group of dp ranks 0 and 1
    (Megatron-Core's tp-ep-dp order). Per step: 2 layers x 4 all_to_alls (dispatch,
    combine, their backward transposes) x 8,192 bytes x m = 8 / (4 * 1) = 2 micro-batches =
    131,072 bytes a rank. The program is one ep group's (dp 2, batch 2) standing for dp / ep
    = 2 copies: model FLOPs per step equal the ep = dp plan's over the same global batch."""
    s = Strategy(dp=4, ep=2, micro_batch_size=1, global_batch_size=8)
    pp = build_plan_program(resolve_model(tiny, 32), s, representative=True)
    a2a = [(op.attrs["nbytes"], op.attrs["groups"]) for op in pp.program.ops if op.type == "all_to_all"]
    nbytes = 2 * (2 * 16) * 64 * 2
    assert nbytes == 8_192 and a2a == [(nbytes, [[0, 1]])] * 8
    assert (pp.replicas, pp.batch, pp.num_microbatches, pp.strategy.dp) == (2, 2, 2, 4)
    assert sum(n for n, _ in a2a) * pp.num_microbatches == 131_072
    layer = _engine(tiny, dp=4, ep=2).step_model().costs.layers[1]
    cl = load_cluster("dgx-h100")
    assert layer.comm["F"] == pytest.approx(2 * cl.collective_time("all_to_all", nbytes, [0, 1]), rel=1e-9)
    same = _engine(tiny, dp=2, ep=2).simulate().model_flops
    assert _engine(tiny, dp=4, ep=2).simulate().model_flops == pytest.approx(same, rel=1e-12)


def test_expert_gradients_reduce_over_dp_over_ep(tiny):
    """dp 4, ep 2: the dp sync reduces the 83,136 dense elements over the 4 dp ranks (as at
    ep 1 the 132,288), and the 24,576 expert ones over the expert-data-parallel group of
    dp ranks 0 and 2 (ranks 0, 2 with tp 1): an all_reduce of 24,576 x 4 bytes (fp32
    reduce, megatron-core) without ZeRO; with ZeRO-1 a reduce_scatter of those bytes and
    an all_gather of the 2-byte updated weights. ep = dp: no expert sync at all."""
    cl = load_cluster("dgx-h100")
    res = _engine(tiny, dp=4, ep=2).simulate()
    model = _engine(tiny, dp=4, ep=2).step_model()
    assert model.rank_params([0], synced=True) == DENSE and model.rank_params([0]) == DENSE + EXPERT
    assert expert_dp_group(model.cfg, 0) == [0, 2]
    assert res.rank_tails[0]["expert_sync"] == pytest.approx(cl.collective_time("all_reduce", 4 * EXPERT, [0, 2]))
    z1 = _engine(tiny, dp=4, ep=2, zero=1).simulate().rank_tails[0]["expert_sync"]
    assert z1 == pytest.approx(cl.collective_time("reduce_scatter", 4 * EXPERT, [0, 2])
                               + cl.collective_time("all_gather", 2 * EXPERT, [0, 2]))
    assert "expert_sync" not in _engine(tiny, dp=2, ep=2).simulate().rank_tails[0]


@settings(max_examples=40, deadline=None)
@given(ep=st.sampled_from([1, 2, 4, 8]), mult=st.integers(1, 4), zero=st.integers(0, 1),
       dense=st.integers(0, 10**6), expert=st.integers(0, 10**6))
def test_sharded_elements_is_dense_over_dp_plus_expert_over_dp_over_ep(ep, mult, zero, dense, expert):
    """The optimizer's shard: every element without ZeRO; with ZeRO-1 ceil(dense / dp) +
    ceil(expert / (dp / ep)), never more than all and at least an even share."""
    s = Strategy(dp=ep * mult, ep=ep, zero=zero, global_batch_size=ep * mult)
    cfg = type("Cfg", (), {"dp": s.dp, "ep": s.ep, "zero": s.zero, "fsdp_shard_size": None})()
    got = sharded_elements(cfg, dense + expert, expert)
    if zero == 0:
        assert got == dense + expert
    else:
        assert got == -(-dense // s.dp) + (-(-expert // mult) if expert else 0)
        assert (dense + expert) // s.dp <= got <= dense + expert


def test_bad_ep_layouts_are_refused_naming_the_field(tiny):
    with pytest.raises(StrategyError, match="'ep' = 3 must divide dp = 4"):
        Strategy(dp=4, ep=3, global_batch_size=4)
    with pytest.raises(StrategyError, match="'ep' = 2 with 'zero' = 3"):
        Strategy(dp=4, ep=2, zero=3, global_batch_size=4)
    # ep beside cp folds over dp x cp (issue 42, tests/completion/test_moe_folding.py); one that does not
    # divide dp x cp is refused
    assert Strategy(dp=4, ep=2, cp=2, global_batch_size=4).ep == 2
    with pytest.raises(StrategyError, match="'ep' = 16 must divide dp x cp = 8"):
        Strategy(dp=4, ep=16, cp=2, global_batch_size=4)
    with pytest.raises(PlanProgramError, match="'ep' = 3 does not divide model .* num_experts = 4"):
        build_plan_program(resolve_model(tiny, 32), Strategy(dp=6, ep=3, global_batch_size=6))


def test_the_executor_runs_ep_below_dp_as_copies_of_one_ep_group(tiny):
    """dp 4, ep 2: the whole program is the ep group's (ranks 0, 1; batch 2 of the 4 rows a
    micro-batch has) with 2 copies; world rank 3 runs program rank 1 of copy 1, its
    collectives on world ranks 2, 3, and its gradients are averaged with world rank 1's
    (tests/meshplan/test_moe_verify.py runs it on 4 gloo ranks). With pp 2 the copies are refused,
    naming the fields."""
    from executor.expert_copies import ExpertCopyError, copies_of

    pp = build_plan_program(resolve_model(tiny, 32), Strategy(dp=4, ep=2, micro_batch_size=1, global_batch_size=8))
    meshes = {op.dist_attr.process_mesh.process_ids for op in pp.program.ops if op.dist_attr is not None}
    assert meshes == {(0, 1)} and (pp.replicas, pp.batch, pp.strategy.dp) == (2, 2, 4)
    c = copies_of(pp, 3)
    assert (c.copy, c.program_rank(3), c.copy_group(1)) == (1, 1, (1, 3))
    assert c.world_groups([(0, 1)]) == [(0, 1), (0, 2), (1, 3), (2, 3)]
    pp2 = build_plan_program(resolve_model(tiny, 32), Strategy(dp=4, ep=2, pp=2, micro_batch_size=1,
                                                               global_batch_size=8))
    with pytest.raises(ExpertCopyError, match="'ep' = 2 below dp = 4 with 'pp' = 2"):
        copies_of(pp2, 0)
