"""The tier-0 bound (simulator.bounds.tier0, meshplan.bounds.tier0) and the two-tier search
(tuner.exhaustive_tiered): never above the simulated step time or peak memory, hand values
of its formula, and the same proven optimum as brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.bounds.tier0 import (
    BlockWork,
    compute_peak,
    max_efficiency,
    max_memory_efficiency,
    tier0_step_time,
)
from simulator.errors import SimulatorError
from simulator.roofline import Roofline
from tests._bound_spaces import bound_space
from tuner.exhaustive_tiered import prove_tiered

CONFIGS = {
    "megatron-a100": {"model": "llama2-7b", "cluster": "dgx-a100-80g", "nodes": 1, "global_batch_size": 32,
                      "seq_len": 4096, "num_layers": 4},
    "fsdp2-h100": {"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 1, "global_batch_size": 32,
                   "seq_len": 4096, "num_layers": 4, "framework": "fsdp2"},
    "deepspeed-h100-cp": {"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 1, "global_batch_size": 32,
                          "seq_len": 8192, "num_layers": 4, "framework": "deepspeed"},
    # a short sequence, so that model states dominate the peak: the bf16 gradient buffer
    # of nemo / megatron-bridge (the bound once charged fp32 gradients there, 9% above)
    "nemo-h100": {"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 1, "global_batch_size": 8,
                  "seq_len": 256, "num_layers": 4, "framework": "nemo"},
    "bridge-h100": {"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 1, "global_batch_size": 8,
                    "seq_len": 256, "num_layers": 4, "framework": "megatron-bridge"},
}


@pytest.fixture(scope="module")
def spaces():
    out = {}
    for name, sc in CONFIGS.items():
        out[name] = bound_space(sc, ("pattern-based",), cp_degrees=(1, 2) if name.endswith("-cp") else (1,),
                                fp8_recipes=(None, "te-delayed") if "h100" in name else (None,))
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(CONFIGS)), rnd=st.randoms(use_true_random=False))
def test_tier0_never_exceeds_the_simulated_step(spaces, name, rnd):
    cands, scorer, t0 = spaces[name]
    c = rnd.choice(cands)
    try:
        s = scorer(c)
    except ValueError:
        return
    b = t0(c)
    assert 0.0 < b.time_s <= s.time_s
    assert 0 < b.memory_bytes <= s.memory_bytes
    assert b.memory_limit_bytes == s.memory_limit_bytes


def test_tier0_is_cheap_and_covers_every_candidate(spaces):
    cands, _, t0 = spaces["megatron-a100"]
    times = np.array([t0(c).time_s for c in cands])
    assert np.isfinite(times).all() and (times > 0).all()


def _rf(**kw) -> Roofline:
    base = dict(peak_flops={"bf16": 1e15, "fp32": 1e14, "fp8": 2e15}, gemm_efficiency=0.6,
                gemm_half_flops=1e8, mem_bandwidth=3e12, mem_efficiency=0.9, kernel_overhead=0.0)
    return Roofline(**(base | kw))


def test_efficiencies_and_peaks_by_hand():
    rf = _rf(attention_efficiency=0.5, by_op={"flash_attention:F": 0.7})
    assert max_efficiency(rf, "gemm") == 0.6  # gemm_time reads no by_op
    assert max_efficiency(rf, "attention") == 0.7
    assert max_efficiency(rf, "memory") == 1.0
    assert max_efficiency(_rf(), "attention") == 0.6  # no attention value: gemm's
    assert compute_peak(rf, fp8=False) == 1e15 and compute_peak(rf, fp8=True) == 2e15
    assert max_memory_efficiency(rf) == 0.9  # mem_efficiency beats by_op's 0.7
    assert max_memory_efficiency(_rf(memory_kernel_efficiency=0.95)) == 0.95


def _work(f, b, w, sel=0.0):
    return BlockWork(phase={"F": f, "B": b, "W": w}, recompute={"selective": sel})


def test_tier0_step_time_by_hand():
    # 4 layers of F = 1, B = 1, W = 1 peak-seconds (P = 1e15 FLOP/s -> 1e-15 s per unit):
    # pp = 2, m = 8, tp = 2, full recompute: total = 4 * (3 + 1) + pre (F 0.5) + post (3)
    # = 19.5; chains = rank 1: 1 layer's F + pre's F = 1.5; (8 * 19.5 + 1.5) / (2 * 1e15) / 2
    layers = [_work(1.0, 1.0, 1.0, 0.25)] * 4
    pre, post = _work(0.5, 0.0, 0.0), _work(1.0, 1.0, 1.0)
    got = tier0_step_time(layers, pre, post, peak=1.0, tp=2, pp=2, vpp=1, num_microbatches=8,
                          recompute="full", fused_backward=True)
    actions = 8 * 2 * 2 + 2 * 2
    assert got == pytest.approx(max(0.0, (8 * 19.5 + 1.5) / 2 / 2 - actions * 1e-9))
    sel = tier0_step_time(layers, pre, post, peak=1.0, tp=1, pp=1, vpp=1, num_microbatches=1,
                          recompute="selective", fused_backward=False)
    assert sel == pytest.approx(4 * 3.25 + 0.5 + 3 - (3 + 2) * 1e-9)


def test_tier0_step_time_refuses_bad_degrees():
    with pytest.raises(SimulatorError, match="tp must be >= 1"):
        tier0_step_time([_work(1, 1, 1)], None, None, peak=1.0, tp=0, pp=1, vpp=1, num_microbatches=1,
                        recompute="none")
    with pytest.raises(SimulatorError, match="2 layers cannot fill 4 virtual stages"):
        tier0_step_time([_work(1, 1, 1)] * 2, None, None, peak=1.0, tp=1, pp=2, vpp=2,
                        num_microbatches=1, recompute="none")


point = st.tuples(st.floats(0.5, 10.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0),
                  st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(point, min_size=1, max_size=40), st.floats(0.2, 1.0))
def test_prove_tiered_equals_brute_force(points, limit):
    """Random candidates (time, cheap share, tight share, memory, cheap memory share,
    refused): the two-tier search finds the brute-force optimum and its counts add up."""
    time_s = [p[0] for p in points]
    tight_t = [p[0] * (p[1] + (1 - p[1]) * p[2]) for p in points]  # cheap <= tight <= time
    cheap_t = [p[0] * p[1] for p in points]
    mem = [p[3] for p in points]
    tight_m = [p[3] * 0.9 for p in points]
    cheap_m = [p[3] * p[4] for p in points]
    refused = [p[5] and i % 3 == 0 for i, p in enumerate(points)]
    calls = {"tight": 0}

    def tight(i):
        calls["tight"] += 1
        return tight_t[i], tight_m[i], limit

    def evaluate(i):
        return None if refused[i] else (time_s[i], mem[i], limit)

    rep = prove_tiered(cheap_t, cheap_m, [limit] * len(points), tight, evaluate)
    feasible = [t for t, m, r in zip(time_s, mem, refused, strict=True) if m <= limit and not r]
    assert rep.proven
    assert rep.simulated + rep.pruned_memory + rep.pruned_time + rep.pruned_cheap == len(points)
    assert rep.best_time_s == (min(feasible) if feasible else None)
    assert calls["tight"] == len(points) - rep.pruned_cheap  # every other one was tight-bounded


def test_prove_tiered_prunes_without_the_tight_bound():
    # candidate 0: the optimum (cheap 1, tight 2, time 2); 1: cheap 3 >= 2 -> never
    # tight-bounded; 2: cheap memory over the limit
    def tight(i):
        assert i == 0
        return 2.0, 0.0, 1.0

    rep = prove_tiered([1.0, 3.0, 0.0], [0.0, 0.0, 2.0], [1.0] * 3, tight, lambda i: (2.0, 0, 1))
    assert (rep.simulated, rep.pruned_cheap, rep.pruned_memory, rep.pruned_time) == (1, 2, 0, 0)
    assert rep.best_index == 0 and rep.best_time_s == 2.0


def test_prove_tiered_refuses_nan_and_stops_at_a_deadline():
    from tuner.errors import TunerError

    with pytest.raises(TunerError, match="NaN"):
        prove_tiered([math.nan], [0.0], [1.0], lambda i: (0, 0, 1), lambda i: None)
    rep = prove_tiered([1.0], [0.0], [1.0], lambda i: (1, 0, 1), lambda i: (1, 0, 1), deadline=0.0)
    assert not rep.proven and rep.open_bound_s == 1.0


def test_rank_params_by_hand(spaces):
    """llama2-7b with 4 layers (h 4096, ffn 11008, vocab 32000, untied head): 2 x 131,072,000
    embedding + head, 4096 final norm, per layer 4 x 4096^2 attention + 3 x 4096 x 11008 MLP
    + 2 x 4096 norms = 1,071,681,536 elements. tp = 2 with the MLP and norms replicated:
    4 x 135,266,304 + 4 x 8192 + 4096 whole, the other 530,579,456 halved."""
    cands, _, t0 = spaces["megatron-a100"]
    assert t0.params == 1_071_681_536
    mlp_rep = [c for c in cands if c.tp == 2 and c.annotation == "templates"
               and c.template_dict().get("mlp") == "replicated"
               and c.template_dict().get("norm") == "replicated"
               and all(c.template_dict().get(k) != "replicated" for k in ("attention", "embedding", "lm_head"))]
    assert mlp_rep
    whole = 4 * 135_266_304 + 4 * 8192 + 4096
    assert t0.rank_params(mlp_rep[0]) == whole + (1_071_681_536 - whole) // 2
    one = next(c for c in cands if c.tp == 1)
    assert t0.rank_params(one) == 1_071_681_536



def test_prove_tiered_dives_and_reports_the_best_when_stopped():
    """No feasible plan known: the first tight-bounded candidate is simulated at once (a
    dive) before any other is tight-bounded; a search stopped right after reports it."""
    import time as _time

    calls = []
    tights = {0: (1.5, 0, 1), 1: (6.0, 0, 1)}

    def tight(i):
        calls.append(("tight", i))
        return tights[i]

    def evaluate(i):
        calls.append(("sim", i))
        return (5.0, 0, 1)

    rep = prove_tiered([1.0, 1.2], [0.0, 0.0], [1.0, 1.0], tight, evaluate)
    assert calls == [("tight", 0), ("sim", 0), ("tight", 1)]
    assert (rep.simulated, rep.pruned_time, rep.best_index, rep.best_time_s) == (1, 1, 0, 5.0)

    def slow(i):
        _time.sleep(0.05)
        return (5.0, 0, 1)

    # a third candidate over the memory limit by its cheap bound stays pruned when stopped
    rep = prove_tiered([1.0, 1.2, 0.0], [0.0, 0.0, 2.0], [1.0] * 3, tight, slow,
                       deadline=_time.monotonic() + 0.01)
    assert not rep.proven and rep.best_time_s == 5.0 and rep.open_bound_s == 1.2
    assert (rep.simulated, rep.pruned_cheap, rep.pruned_time) == (1, 1, 0)


def test_prove_tiered_simulates_the_smallest_tight_bound_once_ready_every_went_unsimulated():
    """A poor first incumbent (candidate 0: cheap 1.0, tight 2.0, simulated 10.0) leaves
    candidates 1..12 below it by their cheap bounds 1.1..2.2. Best-first order would
    tight-bound all twelve before it simulates anything; instead, after READY_EVERY = 8
    tight bounds (candidates 1..8, all keyed 5.0 but candidate 1 at 3.0) without a
    simulation, the plan of the smallest key -- candidate 1, 3.0 -- is simulated at once
    and becomes the incumbent: candidates 9..12 are then tight-bounded (their cheap bounds
    2.0-2.2 are below 3.0) and pruned by time (5.0 >= 3.0)."""
    from tuner.exhaustive_tiered import READY_EVERY

    assert READY_EVERY == 8
    calls = []
    tights = {0: 2.0, 1: 3.0}
    sims = {0: 10.0, 1: 3.0}

    def tight(i):
        calls.append(("tight", i))
        return tights.get(i, 5.0), 0.0, 1.0

    def evaluate(i):
        calls.append(("sim", i))
        return sims.get(i, 5.0), 0, 1

    cheap = [1.0] + [1.0 + 0.1 * k for k in range(1, 13)]
    rep = prove_tiered(cheap, [0.0] * 13, [1.0] * 13, tight, evaluate)
    assert calls == ([("tight", 0), ("sim", 0)] + [("tight", i) for i in range(1, 9)] + [("sim", 1)]
                     + [("tight", i) for i in range(9, 13)])
    assert rep.proven and (rep.best_index, rep.best_time_s) == (1, 3.0)
    assert (rep.simulated, rep.pruned_time, rep.pruned_cheap, rep.pruned_memory) == (2, 11, 0, 0)
    # stopped right after that dive (two plans scored): the answer is already the optimum
    calls.clear()
    rep = prove_tiered(cheap, [0.0] * 13, [1.0] * 13, tight, evaluate,
                       stop=lambda: sum(c[0] == "sim" for c in calls) >= 2)
    assert not rep.proven and rep.best_time_s == 3.0 and rep.open_bound_s == pytest.approx(1.9)


@settings(max_examples=150, deadline=None)
@given(st.lists(point, min_size=1, max_size=40), st.floats(0.2, 1.0), st.integers(1, 3))
def test_prove_tiered_with_frequent_ready_dives_equals_brute_force(points, limit, every):
    """As test_prove_tiered_equals_brute_force with a dive after every 1-3 tight bounds
    (READY_EVERY patched): the dives change the order of simulation, never the optimum,
    and the counts still add up."""
    from unittest import mock

    import tuner.exhaustive_tiered as et

    time_s = [p[0] for p in points]
    tight_t = [p[0] * (p[1] + (1 - p[1]) * p[2]) for p in points]
    cheap_t = [p[0] * p[1] for p in points]
    mem = [p[3] for p in points]
    cheap_m = [p[3] * p[4] for p in points]
    with mock.patch.object(et, "READY_EVERY", every):
        rep = prove_tiered(cheap_t, cheap_m, [limit] * len(points),
                           lambda i: (tight_t[i], mem[i] * 0.9, limit), lambda i: (time_s[i], mem[i], limit))
    feasible = [t for t, m in zip(time_s, mem, strict=True) if m <= limit]
    assert rep.proven and rep.best_time_s == (min(feasible) if feasible else None)
    assert rep.simulated + rep.pruned_memory + rep.pruned_time + rep.pruned_cheap == len(points)
