"""Stragglers and jitter on the SimPy engine (issue 41): the jittered play without
slowdowns is the engine's step, a hand-computed P90, and what one slow GPU costs a 1F1B
pipeline and a ZeRO-3 data-parallel step of 2 ranks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from clusters.goodput_spec import JitterSpec
from meshplan import Engine, Strategy
from simulator.errors import SimulatorError
from simulator.goodput.jitter import (
    StepShape,
    deterministic_step,
    percentiles,
    sample_steps,
    sensitivity,
)
from simulator.schedules import build_schedule

UNIT = {"F": 1.0, "B": 1.0, "W": 0.0}


def _jitter(rank: dict, kernel: dict | None = None, collective: dict | None = None) -> JitterSpec:
    none = {"dist": "none", "provenance": "test"}
    return JitterSpec.model_validate({"rank": {**rank, "provenance": "test"}, "kernel": kernel or none,
                                      "collective": collective or none})


@pytest.mark.parametrize("strategy", [
    Strategy(dp=2, tp=2, pp=2, global_batch_size=16, zero=1),
    Strategy(dp=1, tp=2, pp=4, vpp=2, schedule="VPP", global_batch_size=16, zero=1),
    Strategy(dp=8, global_batch_size=16, zero=3, framework="fsdp2"),
    Strategy(dp=2, pp=4, schedule="ZB-2p", global_batch_size=16, zero=1, framework="eager"),
])
def test_the_jittered_play_without_slowdowns_is_the_engines_step(strategy):
    eng = Engine("llama2-7b", "dgx-h100", strategy, num_layers=8)
    model = eng.step_model()
    res = model.run()
    shape = StepShape.of(model, res)
    assert deterministic_step(shape) == pytest.approx(res.step_time, rel=1e-12)
    off = _jitter({"dist": "none"})
    assert sample_steps(shape, off, 3) == pytest.approx([res.step_time] * 3, rel=1e-12)


def test_p90_of_two_data_parallel_ranks_by_hand():
    # one stage, one micro-batch of F + B = 1 s on each of 2 dp ranks, a per-GPU slowdown
    # X ~ exponential(mean a): the step is 1 + max(X1, X2), whose CDF is (1 - e^{-x/a})^2, so
    # P90 = 1 + a (-ln(1 - sqrt(0.9)))
    a = 0.05
    shape = StepShape(schedule=build_schedule("1F1B", 1, 1, 1, None), stage_times={"F": 0.5, "B": 0.5, "W": 0.0},
                      comm_s=0.0, sync_s=[0.0], optimizer_s=[0.0], dp=2)
    steps = sample_steps(shape, _jitter({"dist": "exponential", "a": a}), samples=8000, seed=1)
    want = 1 + a * -math.log(1 - math.sqrt(0.9))
    assert percentiles(steps)["p90"] == pytest.approx(want, rel=0.005)
    assert steps.min() >= 1.0  # slowdowns only
    # median of the max: (1 - e^{-x/a})^2 = 0.5
    assert percentiles(steps)["p50"] == pytest.approx(1 + a * -math.log(1 - math.sqrt(0.5)), rel=0.005)


def test_a_straggler_costs_1f1b_less_than_a_zero3_step():
    # 1F1B, 2 stages, 4 micro-batches, F = B = 1 s, no hop: the step is 2 (m + 1) = 10 s.
    # The last stage 10% slower runs its 8 passes back to back after the first forward and
    # before the last backward: 1 + 8 x 1.1 + 1 = 10.8 s, +8% = m (s - 1) / (m + 1)
    pipe = StepShape(schedule=build_schedule("1F1B", 2, 4, 1, None), stage_times=UNIT, comm_s=0.0,
                     sync_s=[0.0, 0.0], optimizer_s=[0.0, 0.0])
    assert deterministic_step(pipe) == pytest.approx(10.0)
    s = sensitivity(pipe, factor=1.1)
    assert s.slow_rank == pytest.approx(0.08) and s.rank_stage == 1
    # ZeRO-3 over 2 dp ranks, one stage of the same 4 micro-batches (8 s): each layer's
    # all-gather waits for the slow rank, so the whole step runs at it: +10%; with 0.5 s of
    # gradient sync after it, 0.8 / 8.5
    z3 = StepShape(schedule=build_schedule("1F1B", 1, 4, 1, None), stage_times=UNIT, comm_s=0.0,
                   sync_s=[0.0], optimizer_s=[0.0], dp=2, gather_every_layer=True)
    assert sensitivity(z3, factor=1.1).slow_rank == pytest.approx(0.10)
    z3s = StepShape(schedule=build_schedule("1F1B", 1, 4, 1, None), stage_times=UNIT, comm_s=0.0,
                    sync_s=[0.5], optimizer_s=[0.0], dp=2, gather_every_layer=True)
    sz = sensitivity(z3s, factor=1.1, link_factor=2.0)
    assert sz.slow_rank == pytest.approx(0.8 / 8.5)
    assert sz.slow_link == pytest.approx(0.5 / 8.5)  # the ring all-reduce at its slowest link


def test_a_slow_p2p_link_costs_the_pipeline_its_hops_on_the_critical_path():
    # 1F1B 2 stages x 4 micro-batches, F = B = 1 s, a hop of h = 0.1 s. By hand: stage 1 runs
    # F0 1.1-2.1, B0 -3.1, F1 3.1-4.1 (F1 left stage 0 at 2), B1 -5.1; stage 0's B0 waits
    # for 3.2 (3.2-4.2), F2 -5.2, B1 5.2-6.2, F3 -7.2; stage 1's F2 waits for 5.3 (-6.3), B2
    # -7.3, F3 7.3-8.3, B3 -9.3; stage 0's B2 7.4-8.4 and B3 9.4-10.4: the hop is on the
    # critical path 4 times, 10 + 4 h = 10.4 s; twice as slow, 10.8 s
    pipe = StepShape(schedule=build_schedule("1F1B", 2, 4, 1, None), stage_times=UNIT, comm_s=0.1,
                     sync_s=[0.0, 0.0], optimizer_s=[0.0, 0.0])
    assert deterministic_step(pipe) == pytest.approx(10.4)
    assert sensitivity(pipe, link_factor=2.0).slow_link == pytest.approx(0.4 / 10.4)


def test_sampling_is_seeded_and_bounded():
    shape = StepShape(schedule=build_schedule("1F1B", 2, 2, 1, None), stage_times=UNIT, comm_s=0.01,
                      sync_s=[0.1, 0.1], optimizer_s=[0.05, 0.05], dp=2, tp=2)
    j = _jitter({"dist": "uniform", "a": 0.0, "b": 0.1}, {"dist": "lognormal", "a": 0.01, "b": 0.5, "provenance": "t"},
                {"dist": "exponential", "a": 0.05, "provenance": "t"})
    a, b = sample_steps(shape, j, 30, seed=5), sample_steps(shape, j, 30, seed=5)
    assert np.array_equal(a, b) and (a >= deterministic_step(shape) - 1e-12).all()
    with pytest.raises(SimulatorError, match="jitter samples"):
        sample_steps(shape, j, 0)
    with pytest.raises(SimulatorError, match="pipeline ranks need"):
        StepShape(schedule=build_schedule("1F1B", 2, 2, 1, None), stage_times=UNIT, comm_s=0.0,
                  sync_s=[0.0], optimizer_s=[0.0, 0.0])
