"""Time to train (issue 41): each term against a value derived by hand -- the checkpoint's
bytes and stall, the failure rates and the NCCL initialisation, the Young / Daly interval,
a restart's lost work -- and the closed form against the SimPy Monte Carlo."""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy

from clusters.goodput_spec import StorageSpec, load_defaults
from simulator.errors import SimulatorError
from simulator.goodput.checkpoint import Layout, checkpoint_cost, stage_states, write_bytes
from simulator.goodput.failures import FailureModel, nccl_init_s, restart_cost
from simulator.goodput.goodput import (
    Run,
    daly_interval_s,
    expected_time,
    optimal_interval,
    young_interval_s,
)
from simulator.goodput.montecarlo import _State, _trainer, simulate_runs

GB = 1e9


def _q(v: float) -> dict:
    return {"value": v, "provenance": "test"}


def _storage(aggregate_write: float | None = None) -> StorageSpec:
    d = {"node_write_bandwidth": _q(25 * GB), "node_read_bandwidth": _q(25 * GB),
         "host_copy_bandwidth": _q(50 * GB), "save_overhead_s": _q(1.0)}
    if aggregate_write:
        d["aggregate_write_bandwidth"] = _q(aggregate_write)
    return StorageSpec.model_validate(d)


# pp 2 x dp 4 x tp 2 = 16 GPUs on 2 nodes of 8; ZeRO-1: the weights are replicated over dp,
# the optimizer states sharded (each GPU's line is its shard)
MEM = [{"params": 2 * GB, "optimizer": 3 * GB}, {"params": 1 * GB, "optimizer": 1.5 * GB}]
LAYOUT = Layout(dp=4, tp=2, pp=2, shard=4, devices_per_node=8)


def test_checkpoint_bytes_and_stalls_by_hand():
    states = stage_states(MEM, zero=1)
    assert [(s.replicated, s.sharded) for s in states] == [(2 * GB, 3 * GB), (1 * GB, 1.5 * GB)]
    # balanced (fully parallel save): a stage-0 GPU writes 2/4 + 3 = 3.5 GB, stage 1 0.25 + 1.5
    w = write_bytes(states, LAYOUT, "balanced")
    assert w[:8] == pytest.approx([3.5 * GB] * 8) and w[8:] == pytest.approx([1.75 * GB] * 8)
    # first: dp rank 0 (ranks 0, 1 of stage 0) writes the weights too: 5 GB, the others 3
    first = write_bytes(states, LAYOUT, "first")
    assert first[:8] == pytest.approx([5 * GB] * 2 + [3 * GB] * 6)
    assert first.sum() == pytest.approx(w.sum()) == pytest.approx(42 * GB)  # each byte once
    # node 0 (stage 0) writes 28 GB at 25 GB/s after the 1 s overhead: sync stall 2.12 s
    sync = checkpoint_cost(states, LAYOUT, _storage(), "sync", "balanced")
    assert sync.max_node_bytes == pytest.approx(28 * GB)
    assert sync.stall_s == pytest.approx(1 + 28 / 25) and sync.background_s == 0
    # async: the stall is the overhead + the busiest GPU's 3.5 GB copy at 50 GB/s; the write
    # of 1.12 s runs behind it
    asy = checkpoint_cost(states, LAYOUT, _storage(), "async", "balanced")
    assert asy.stall_s == pytest.approx(1 + 3.5 / 50) and asy.background_s == pytest.approx(28 / 25)
    # a shared backend of 30 GB/s takes the 42 GB in 1.4 s, longer than the node's 1.12 s
    agg = checkpoint_cost(states, LAYOUT, _storage(30 * GB), "sync", "balanced")
    assert agg.write_s == pytest.approx(1 + 42 / 30)
    # restore: a stage-0 GPU holds 5 GB: node 0 reads 40 GB at 25 GB/s, then 5 GB to the device
    assert sync.restore_s == pytest.approx(40 / 25 + 5 / 50)


def test_zero_stages_replicate_what_the_zero_paper_says():
    mem = [{"params": 4 * GB, "optimizer": 6 * GB}]
    assert (stage_states(mem, 0)[0].replicated, stage_states(mem, 0)[0].sharded) == (10 * GB, 0)
    assert (stage_states(mem, 2)[0].replicated, stage_states(mem, 2)[0].sharded) == (4 * GB, 6 * GB)
    assert (stage_states(mem, 3)[0].replicated, stage_states(mem, 3)[0].sharded) == (0, 10 * GB)
    # HSDP: ZeRO-3 shards over groups of 2 of the 4 dp ranks, replicated twice: balanced, each
    # GPU writes half its shard; first, only shard group 0 writes
    hsdp = Layout(dp=4, tp=1, pp=1, shard=2, devices_per_node=8)
    st = stage_states(mem, 3)
    assert write_bytes(st, hsdp, "balanced") == pytest.approx([5 * GB] * 4)
    assert write_bytes(st, hsdp, "first") == pytest.approx([10 * GB] * 2 + [0] * 2)
    with pytest.raises(SimulatorError, match="ZeRO stage"):
        stage_states(mem, 4)


def test_llama3_rates_reproduce_its_interruption_counts():
    rel = load_defaults().reliability
    f = FailureModel.of(rel, gpus=16384, nodes=2048)
    days54 = 54 * 86400
    assert f.rate * days54 == pytest.approx(419, rel=1e-5)  # unexpected (Table 5)
    assert f.planned_rate * days54 == pytest.approx(47, rel=1e-5)
    # Table 5: faulty GPU 148 of the 419
    assert f.by_cause["faulty_gpu"] * days54 == pytest.approx(148, rel=1e-5)
    # GPU causes scale with GPUs: half the GPUs in the same nodes, half their interruptions
    half = FailureModel.of(rel, gpus=8192, nodes=2048)
    assert half.by_cause["gpu_hbm3_memory"] == pytest.approx(f.by_cause["gpu_hbm3_memory"] / 2)
    assert half.by_cause["nic"] == pytest.approx(f.by_cause["nic"])


def test_restart_parts_by_hand():
    rel = load_defaults().reliability
    r = rel.restart
    a, b = r.nccl_init_per_rank_s.value, r.nccl_init_per_pair_s.value
    # world 16, tp 2, dp 4, pp 2: one communicator of each, one after another
    assert nccl_init_s(r, (16, 2, 4, 2)) == pytest.approx(a * 24 + b * (256 + 4 + 16 + 4))
    f = FailureModel.of(rel, 16, 2)
    no_spare = restart_cost(r, f, (16, 2, 4, 2), restore_s=7.0)
    assert no_spare.replace == pytest.approx(f.replace_share * r.replace_node_s.value)
    assert no_spare.unplanned_s == pytest.approx(r.relaunch_s.value + nccl_init_s(r, (16, 2, 4, 2)) + 7.0
                                                 + no_spare.replace)
    assert restart_cost(r, f, (16,), 7.0, spares=1).replace == 0  # a hot spare: no wait
    # the Llama 3 causes that take a node away: every unexpected one but software bugs (54),
    # NCCL watchdog timeouts (7) and dependencies (2): 356 of 419
    big = FailureModel.of(rel, 16384, 2048)
    assert big.replace_share == pytest.approx(356 / 419, rel=1e-5)


def test_young_and_daly_intervals_by_hand():
    # Young: sqrt(2 delta M); delta 5 min, M 24 h: sqrt(2 x 5 x 1440) = 120 min
    assert young_interval_s(300, 86400) == pytest.approx(7200)
    # Daly (2006), fig. 3-5: delta 5 min and M = 24 h, 6 h, 15 min give 117, 57 and 9.1 min;
    # by hand, 120 (1 + 1/72 + 1/5184) - 5 = 116.690 min
    assert daly_interval_s(300, 86400) / 60 == pytest.approx(120 * (1 + 1 / 72 + 1 / 5184) - 5)
    assert [round(daly_interval_s(300, m * 60) / 60, 1) for m in (1440, 360, 15)] == [116.7, 56.7, 9.1]
    assert daly_interval_s(300, 100) == 100  # delta >= 2M: M
    # the exact expected time's optimum (whole 1 s steps) sits on Daly's interval
    run = Run(steps=1_000_000, step_s=1.0, stall_s=300.0, rate=1 / 86400, restart_s=600.0)
    assert optimal_interval(run) == pytest.approx(daly_interval_s(300, 86400), rel=0.01)


def test_expected_time_without_failures_is_the_work_and_the_saves():
    run = Run(steps=100, step_s=2.0, stall_s=3.0, background_s=5.0, startup_s=10.0)
    b = expected_time(run, 30)  # saves after steps 30, 60, 90 and the last, 100
    assert b.total_s == pytest.approx(10 + 200 + 4 * 3 + 5)  # + the final write
    assert b.checkpoint_s == pytest.approx(17) and b.lost_s == pytest.approx(0) and b.goodput == pytest.approx(200 / 227)
    assert optimal_interval(run) == 100  # nothing to lose: save once, at the end


def test_lost_work_per_interruption_is_half_the_piece_plus_the_write():
    # first order in lambda: each interruption costs R and L1 / 2 (+ w when the save is
    # asynchronous: the last checkpoint is durable w later)
    lam = 1e-9
    for w in (0.0, 40.0):
        run = Run(steps=1000, step_s=10.0, stall_s=5.0, background_s=w, rate=lam, restart_s=600.0)
        b = expected_time(run, 10)
        assert b.restart_s / b.failures == pytest.approx(600.0, rel=1e-5)
        # 100 pieces: the first has no earlier write running (L1 = L2 = 105 + w: loses half
        # of it), the 99 others lose 105 / 2 + w; failures fall on them in proportion to L1
        first, rest = 105 + w, 105
        want = (first * first / 2 + 99 * rest * (rest / 2 + w)) / (first + 99 * rest)
        assert b.lost_s / b.failures == pytest.approx(want, rel=1e-4)


def test_a_restart_loses_the_work_since_the_last_durable_save():
    # 10 steps of 1 s, a save every 4 steps (0.5 s stall), restart 2 s, one failure at t = 6:
    # steps 0-4 end at 4, saved at 4.5; the failure at 6 loses the 1.5 s since; restart 6-8,
    # steps 4-8 again 8-12, save 12.5, steps 8-10 12.5-14.5, final save 15.0
    run = Run(steps=10, step_s=1.0, stall_s=0.5, restart_s=2.0)
    env, st = simpy.Environment(), _State()
    proc = env.process(_trainer(env, run, 4, st))

    def fail_at(t: float):
        yield env.timeout(t)
        proc.interrupt("failure")

    env.process(fail_at(6.0))
    env.run(until=proc)
    assert env.now == pytest.approx(15.0) and st.failures == 1
    assert env.now - expected_time(run, 4).total_s == pytest.approx(2.0 + 1.5)  # R + lost work


@pytest.mark.parametrize("background", [0.0, 40.0])
def test_monte_carlo_on_simpy_matches_the_closed_form(background):
    # M = 3 h, R = 10 min, 2000 steps of 10 s: about 2 interruptions a run
    run = Run(steps=2000, step_s=10.0, stall_s=30.0 if background == 0 else 3.0, background_s=background,
              rate=1 / (3 * 3600), restart_s=600.0, startup_s=100.0)
    k = optimal_interval(run)
    closed = expected_time(run, k).total_s
    mc = simulate_runs(run, k, replicas=300, seed=7)
    assert abs(mc.mean_s / closed - 1) < 0.02
    assert abs(mc.mean_s - closed) < 4 * mc.stderr_s
    assert mc.failures.mean() == pytest.approx(run.rate * (closed - run.startup_s), rel=0.15)


def test_planned_interruptions_add_a_save_and_a_restart_each():
    run = Run(steps=1000, step_s=1.0, stall_s=0.0, planned_rate=1 / 3600, planned_restart_s=60.0, write_s=30.0)
    b = expected_time(run, 1000)
    # T = T_u / (1 - nu C_p): 1000 / (1 - 90 / 3600)
    assert b.total_s == pytest.approx(1000 / (1 - 90 / 3600))
    assert b.planned == pytest.approx(b.total_s / 3600)
    with pytest.raises(SimulatorError, match="leave no time to train"):
        expected_time(Run(steps=10, step_s=1.0, stall_s=0, planned_rate=1.0, write_s=1.0), 1)


@pytest.mark.parametrize("bad", [{"steps": 0}, {"step_s": 0.0}, {"stall_s": -1.0}, {"rate": math.inf},
                                 {"steps": 2.5}])
def test_a_bad_run_is_refused_naming_the_field(bad):
    args = {"steps": 10, "step_s": 1.0, "stall_s": 0.0, **bad}
    with pytest.raises(SimulatorError, match=next(iter(bad))):
        Run(**args)


def test_monte_carlo_is_seeded():
    run = Run(steps=200, step_s=10.0, stall_s=5.0, rate=1 / 3600, restart_s=60.0)
    a, b = simulate_runs(run, 20, 20, seed=3), simulate_runs(run, 20, 20, seed=3)
    assert np.array_equal(a.times, b.times)


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=30, deadline=None)
@given(step=st.floats(0.1, 100), stall=st.floats(0, 600), background=st.floats(0, 600),
       restart=st.floats(0, 7200), mtbf_h=st.floats(0.5, 1000), grow=st.floats(1.0, 3.0),
       which=st.sampled_from(["step_s", "stall_s", "background_s", "restart_s"]))
def test_the_optimal_expected_time_grows_with_each_cost(step, stall, background, restart, mtbf_h, grow, which):
    # the objective's lower bound (simulator.goodput.objectives) rests on this: at its best
    # interval, the expected time never falls when a step, a save or a restart takes longer
    from dataclasses import replace

    from simulator.goodput.goodput import time_to_train

    run = Run(steps=200, step_s=step, stall_s=stall, background_s=background, rate=1 / (mtbf_h * 3600),
              restart_s=restart)
    worse = replace(run, **{which: getattr(run, which) * grow + (1e-3 if which != "step_s" else 0)})
    try:
        base = time_to_train(run).total_s
    except SimulatorError:  # beyond a float's range: nothing to compare
        return
    try:
        assert time_to_train(worse).total_s >= base * (1 - 1e-12)
    except SimulatorError:  # the worse run never finishes: worse still
        pass
