"""Strategy validation and the Plan JSON round trip."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.plan import Plan, PlanError
from meshplan.strategy import Strategy, StrategyError


@settings(deadline=None, max_examples=50)
@given(dp=st.integers(1, 8), mp=st.integers(1, 8), pp=st.integers(1, 8), mbs=st.integers(1, 4),
       k=st.integers(1, 4), rc=st.sampled_from(["none", "selective", "full"]),
       zero=st.integers(0, 3), sched=st.sampled_from(["1F1B", "ZBH1", "ZB-2p", "FThenB"]))
def test_plan_json_round_trip(dp, mp, pp, mbs, k, rc, zero, sched):
    strat = Strategy(dp=dp, mp=mp, pp=pp, micro_batch_size=mbs, global_batch_size=dp * mbs * k,
                     recompute=rc, sharding_stage=zero, schedule_mode=sched,
                     sequence_parallel=mp > 1)
    plan = Plan("llama2-7b", "dgx-h100", strat, nodes=4,
                annotations={"lm_head.weight": ["Replicate()", "Shard(1)"]},
                num_layers=None if k % 2 else 4)
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert again.strategy.num_microbatches == k


def test_strategy_errors_name_the_field():
    cases = [({"mp": -1}, "'mp'"), ({"schedule_mode": "GPipe"}, "schedule_mode"),
             ({"recompute": "half"}, "recompute"), ({"sharding_stage": 4}, "sharding_stage"),
             ({"dp": 2, "global_batch_size": 3}, "global_batch_size"),
             ({"schedule_mode": "ZBVPP", "vpp": 3}, "'vpp'"),
             ({"sequence_parallel": True}, "sequence_parallel"),
             ({"annotation": {"w": "Shard(0)"}}, "annotation"), ({"dtype": "int8"}, "dtype")]
    for kw, needle in cases:
        with pytest.raises(StrategyError, match=needle):
            Strategy(**kw)
    assert Strategy(pp=4, schedule_mode="ZB-1p").schedule() == ("ZB", 4.0)
    assert Strategy(pp=4, schedule_mode="ZB-2p").schedule() == ("ZB", 8.0)


def test_plan_errors():
    with pytest.raises(PlanError, match="missing field 'strategy'"):
        Plan.from_dict({"model": "llama2-7b", "cluster": "dgx-h100"})
    with pytest.raises(PlanError, match="strategy"):
        Plan.from_dict({"model": "m", "cluster": "c", "strategy": {"dp": 0}})
    with pytest.raises(PlanError, match="line 1"):
        Plan.from_json("{not json")


def test_num_layers_overrides_the_configs_layer_count():
    """A 4-layer llama2-7b costs 4 decoder layers: model FLOPs differ from the 32-layer model
    by exactly 28 layers' worth (one layer = (32-layer total - 4-layer total) / 28, and the
    2-layer model sits on the same line)."""
    from meshplan.engine import Engine

    strat = Strategy(dp=1, mp=1, pp=1, micro_batch_size=1, global_batch_size=1)
    flops = {n: Engine("llama2-7b", "dgx-a100-80g", strat, seq_len=256,
                       num_layers=n).simulate().model_flops for n in (2, 4, 32)}
    per_layer = (flops[32] - flops[4]) / 28
    assert flops[4] - flops[2] == pytest.approx(2 * per_layer, rel=1e-9)
    with pytest.raises(ValueError, match="num_layers"):
        Plan("llama2-7b", "dgx-h100", strat, num_layers=0)
