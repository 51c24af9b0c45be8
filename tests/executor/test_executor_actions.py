"""The executor takes pipeline schedules as data (executor.actions): rows are checked
against the plan before launch, a pipeline plan without one is refused, and the
simulator's schedule passes through unchanged."""

from __future__ import annotations

import pytest

from executor import PlanScheduleError, run_plan
from executor.actions import ActionOrderError, StepAction, schedule_rows, single_stage_order
from meshplan.plan import Plan
from meshplan.strategy import Strategy
from meshplan.validation import plain_schedule
from simulator.schedules import build_schedule


def test_single_stage_order_is_f_then_bw_per_microbatch():
    assert single_stage_order(2) == ((StepAction("F", 0, 0), StepAction("BW", 0, 0),
                                      StepAction("F", 0, 1), StepAction("BW", 0, 1)),)


def test_simulator_schedules_are_read_duck_typed():
    sched = build_schedule("ZBVPP", 2, 4, 2)
    rows = schedule_rows(sched, 2, 4, 2)
    assert [[tuple(a) for a in r] for r in rows] == [[tuple(a) for a in r] for r in sched.actions]
    assert all(type(a) is StepAction for r in rows for a in r)


@pytest.mark.parametrize("bad, msg", [
    ((("F", 0, 0, 0),), "not an action"),
    (((StepAction("X", 0, 0),),), "kind 'X'"),
    (((StepAction("F", 0, 4),),), "micro-batch 4 outside 0..3"),
    (((StepAction("F", 0, 0, 1),),), "chunk 1 outside 0..0"),
    (((), ()), "2 rows but the plan has 1"),
])
def test_bad_rows_are_refused(bad, msg):
    with pytest.raises(ActionOrderError, match=msg):
        schedule_rows(bad, 1, 4, 1)


def test_a_pipeline_plan_needs_a_fitting_schedule_before_launch():
    plan = Plan("llama2-7b", "cpu-local", Strategy(pp=2, micro_batch_size=1, global_batch_size=4))
    with pytest.raises(PlanScheduleError, match="pp=2 needs a pipeline schedule"):
        run_plan(plan, 2)
    with pytest.raises(PlanScheduleError, match="row 0: micro-batch 2 outside 0..1"):
        run_plan(plan.__class__(plan.model, plan.cluster, plan.strategy.replace(global_batch_size=2)),
                 2, schedule=plain_schedule(plan))


LLAMA4 = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
          "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 100,
          "max_position_embeddings": 64, "num_hidden_layers": 4}


@pytest.fixture(scope="module")
def llama4(tmp_path_factory):
    import json

    p = tmp_path_factory.mktemp("llama4") / "llama4.json"
    p.write_text(json.dumps(LLAMA4))
    return str(p)


def _pipeline_plan(model, **kw):
    return Plan(model, "cpu-local", Strategy(dtype="float32", optimizer="sgd", micro_batch_size=1,
                                             global_batch_size=4, **kw), seq_len=16)


@pytest.mark.parametrize("kw, crosses", [
    ({"pp": 2, "vpp": 2, "schedule": "ZBVPP"}, True),
    ({"pp": 2, "tp": 2, "vpp": 2, "schedule": "ZBVPP"}, True),
    ({"pp": 2, "vpp": 2, "schedule": "VPP"}, False),
    ({"pp": 2, "schedule": "ZBH1"}, False),
])
def test_sends_follow_each_peers_receive_order(llama4, kw, crosses):
    """Issue 16 item 4: the executor sends to each peer in the order that peer posts its
    receives (NCCL matches p2p by order per pair). In ZB-V its own action order would
    cross on the pair (stage 0 -> stage 1): that is the fault this order fixes."""
    from executor.p2p_order import action_order_sends, receive_orders, send_orders
    from executor.program import build_program
    from executor.rank_plan import build_rank_plan

    plan = _pipeline_plan(llama4, **kw)
    s = plan.strategy
    pp = build_program(plan)
    rows = plain_schedule(plan).actions
    plans = {r: build_rank_plan(pp.program, r) for r in range(s.world_size)}

    def stage(r):
        return r // (s.dp * s.tp)

    crossed = False
    for a, rp in plans.items():
        orders = send_orders(pp.program, rp, rows, stage)
        assert orders, a
        for b, seq in orders.items():
            assert seq == receive_orders(plans[b], rows[stage(b)])[a], (a, b)
            crossed |= action_order_sends(rp, rows[stage(a)])[b] != seq
    assert crossed == crosses


@pytest.mark.distributed
def test_executor_issues_p2p_in_matching_order(llama4):
    """On 2 gloo ranks running ZB-V, the log of issued p2p ops has, per ordered pair, the
    sender's sends in exactly the order of the receiver's receives (tag-blind matching,
    as NCCL's, would pair the same tensors)."""
    from meshplan.validation import run_plan as run

    meas = run(_pipeline_plan(llama4, pp=2, vpp=2, schedule="ZBVPP"), 2,
               with_prediction=False, steps=1, warmup=0)
    for a, b in ((0, 1), (1, 0)):
        sends = [(i, mb) for kind, peer, i, mb in meas.p2p_log[a] if kind == "send" and peer == b]
        recvs = [(i, mb) for kind, peer, i, mb in meas.p2p_log[b] if kind == "recv" and peer == a]
        assert sends and sends == recvs, (a, b)
