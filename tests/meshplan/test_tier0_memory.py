"""The tier-0 split memory bound (meshplan.bounds.tier0.Tier0Bound.split_memory_bytes,
simulator.bounds.tier0.least_peak / inflight_counts): never above the simulated peak, its
per-layer activation bound never above a completed layout's, hand values of its parts."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusters import load_cluster
from completion.strategy import Strategy
from meshplan.bounds.tier0 import Tier0Bound
from meshplan.engine import Engine
from meshplan.tuning import make_scorer, search_problem, template_kinds
from simulator.bounds.tier0 import INFLIGHT, inflight_counts, least_peak
from simulator.schedules import build_schedule
from tests._bound_spaces import bound_space
from tuner.space import SearchSpace
from tuner.suggest import enumerate_candidates

# long sequences and few GPUs: activations dominate, so the split bound is the one that prunes
CONFIGS = {
    "llama-megatron": {"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 1, "global_batch_size": 32,
                       "seq_len": 16384, "num_layers": 8},
    "gpt-fsdp2": {"model": "megatron-3.6b", "cluster": "dgx-a100-80g", "nodes": 1, "global_batch_size": 64,
                  "seq_len": 2048, "num_layers": 8, "framework": "fsdp2"},
    "llama-deepspeed": {"model": "llama2-13b", "cluster": "dgx-h100", "nodes": 1, "global_batch_size": 16,
                        "seq_len": 8192, "num_layers": 6, "framework": "deepspeed"},
    "llama-nemo": {"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 1, "global_batch_size": 16,
                   "seq_len": 8192, "num_layers": 8, "framework": "nemo"},
    "mixtral-ep": {"model": "mixtral-8x7b", "cluster": "dgx-h100", "nodes": 2, "global_batch_size": 32,
                   "seq_len": 4096, "num_layers": 8},
    "llama-cp-fp8": {"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 1, "global_batch_size": 16,
                     "seq_len": 16384, "num_layers": 8},
}


@pytest.fixture(scope="module")
def spaces():
    out = {}
    for name, sc in CONFIGS.items():
        extra = {"cp_degrees": (1, 2, 4), "fp8_recipes": (None, "te-delayed")} if name.endswith("cp-fp8") else {}
        out[name] = bound_space(sc, schedules=("FThenB", "1F1B", "VPP", "ZBH1", "ZB", "ZBVPP"), vpp_degrees=(2,),
                                micro_batch_sizes=(1, 2, 4), recompute=("none", "selective", "full"),
                                zero_stages=(0, 1, 2, 3), **extra)
    return out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(CONFIGS)), rnd=st.randoms(use_true_random=False))
def test_split_memory_never_exceeds_the_simulated_peak(spaces, name, rnd):
    """Random candidates (every schedule family, 1-8 stages, VPP, ZeRO 0-3, three
    recompute modes, micro-batches 1-4, Megatron and pattern layouts, four frameworks,
    expert parallelism, cp and FP8):
    the split bound, and the tier-0 bound it enters, stay below the simulated peak."""
    cands, scorer, t0 = spaces[name]
    c = rnd.choice(cands)
    try:
        s = scorer(c)
    except ValueError:
        return
    assert t0.split_memory_bytes(c) <= s.memory_bytes, c
    assert t0(c).memory_bytes <= s.memory_bytes


def test_split_memory_is_the_binding_bound_somewhere(spaces):
    """The split bound is not idle: on most 1F1B candidates of the long-sequence space it
    is above the states-only bound, by more than a factor 2 on some."""
    cands, _, t0 = spaces["llama-megatron"]
    sample = [c for c in cands if c.schedule == "1F1B" and c.pp > 1][:200]
    ratios = [t0.split_memory_bytes(c) / t0.memory_bytes(c) for c in sample]
    assert sum(r > 1 for r in ratios) > 0.9 * len(ratios)
    assert max(ratios) > 2


LAYER_CASES = {
    "megatron-cp-fp8": ({"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 1, "global_batch_size": 8,
                         "seq_len": 8192, "num_layers": 4},
                        {"cp_degrees": (1, 2, 4), "fp8_recipes": (None, "te-delayed")}),
    "fsdp2-cp-fp8": ({"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 1, "global_batch_size": 8,
                      "seq_len": 8192, "num_layers": 4, "framework": "fsdp2"},
                     {"cp_degrees": (1, 2), "fp8_recipes": (None, "tensorwise", "rowwise")}),
    "deepspeed": ({"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 1, "global_batch_size": 8,
                   "seq_len": 4096, "num_layers": 4, "framework": "deepspeed"}, {}),
    "mixtral-ep": ({"model": "mixtral-8x7b", "cluster": "dgx-h100", "nodes": 1, "global_batch_size": 16,
                    "seq_len": 4096, "num_layers": 4}, {}),
    "qwen3-moe-ep": ({"model": "qwen3-30b-a3b", "cluster": "dgx-h100", "nodes": 2, "global_batch_size": 32,
                      "seq_len": 4096, "num_layers": 4}, {}),
}


@pytest.mark.parametrize("case", sorted(LAYER_CASES))
def test_layer_activation_bound_below_every_completed_layer(case):
    """``a``, ``d`` and the logits bound (the unsharded program over tp) against the
    completed representative programs of Megatron and pattern layouts at tp 1-8, with and
    without sequence parallelism, every recompute mode, cp 1-4, FP8 recipes and expert
    parallelism: each layer's saved and recompute-dropped bytes are at least its role's
    bound, the loss's local logits at least the logits bound."""
    sc, kw = LAYER_CASES[case]
    prob = search_problem(sc["model"], sc["cluster"], sc["nodes"], sc["global_batch_size"], sc["seq_len"],
                          num_layers=4)
    space = SearchSpace(prob, micro_batch_sizes=(1, 2), recompute=("none", "selective", "full"), **kw)
    cands = [c for mode in ("pattern-based", "semi-auto")
             for c in enumerate_candidates(space, mode, template_kinds(sc["model"], sc["seq_len"])) if c.pp == 1]
    scorer, t0 = make_scorer(sc), Tier0Bound(sc)
    cl = load_cluster(sc["cluster"], sc["nodes"])
    checked = 0
    for c in random.Random(0).sample(cands, min(30, len(cands))):
        try:
            e = Engine(sc["model"], cl, scorer.bound.strategy_of(c), seq_len=sc["seq_len"], num_layers=4)
            costs = e.program_costs()
        except ValueError:
            continue
        a, d, logits = t0.layer_activation_bytes(c)
        assert a[1] > 0
        keys = costs.layer_keys
        for i, k in enumerate(keys):  # each model layer against the bound of its role
            role = 0 if i == 0 else 2 if i == len(keys) - 1 else 1
            assert costs.activations.by_block.get(k, 0) >= a[role], (c, i)
            assert costs.activations.dropped_by_block.get(k, 0) >= d[role], (c, i)
        assert costs.loss.elements >= logits, c
        checked += 1
    assert checked >= 15


def test_inflight_counts_by_hand():
    """1F1B on 4 stages holds min(4 - r, m) micro-batches on rank r (Narayanan et al.
    2021, sec. 2.2); FThenB holds all m; with 2 micro-batches 1F1B holds at most 2."""
    assert inflight_counts(build_schedule("1F1B", 4, 8)) == [4, 3, 2, 1]
    assert inflight_counts(build_schedule("1F1B", 4, 2)) == [2, 2, 2, 1]
    assert inflight_counts(build_schedule("FThenB", 3, 5)) == [5, 5, 5]


def test_inflight_closed_forms_match_the_builders():
    """Each closed form of INFLIGHT equals inflight_counts of its registered builder on a
    grid of stages, micro-batches and chunks (every (p, m, v) the builder accepts)."""
    checked = 0
    for name, form in INFLIGHT.items():
        for p in range(1, 11):
            for m in range(1, 3 * p + 3):
                for v in ((2, 3, 4) if name == "VPP" else (1,)):
                    try:
                        sched = build_schedule(name, p, m, v)
                    except ValueError:
                        continue
                    assert form(p, m) == inflight_counts(sched), (name, p, m, v)
                    checked += 1
    assert checked > 300


def _brute(rows, layers):
    best = None
    for split in itertools.product(range(layers + 1), repeat=len(rows)):
        if sum(split) == layers:
            v = max(r[n] for r, n in zip(rows, split, strict=True))
            best = v if best is None else min(best, v)
    return best


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4).flatmap(lambda p: st.integers(1, 6).flatmap(lambda L: st.tuples(
    st.just(L), st.lists(st.lists(st.integers(0, 50), min_size=L + 1, max_size=L + 1), min_size=p, max_size=p)))))
def test_least_peak_equals_brute_force(arg):
    """Monotone rows (random increments): least_peak is the brute-force minimum of the
    heaviest rank over every split (so it is a lower bound on any one split's)."""
    layers, incs = arg
    rows = [list(itertools.accumulate(r)) for r in incs]
    assert least_peak(rows, layers) == _brute(rows, layers)


def test_split_memory_by_hand():
    """Llama 2 7B (4 layers), tp 4, dp 1, pp 2, 1F1B, 4 micro-batches, no recompute,
    ZeRO 0 under megatron-core: rank 0 holds 2 micro-batches, rank 1 one; the bound is the
    smaller of the heaviest rank over the splits (0..4 layers on rank 0), each rank's bytes
    = states(n layers + its end block) + k n a (+ the loss's temporaries on rank 1) + the
    fixed lines, recomputed here from the parts."""
    sc = {"model": "llama2-7b", "cluster": "dgx-a100-80g", "nodes": 1, "global_batch_size": 4,
          "seq_len": 4096, "num_layers": 4}
    t0 = Tier0Bound(sc)
    prob = search_problem("llama2-7b", "dgx-a100-80g", 1, 4, 4096, num_layers=4)
    space = SearchSpace(prob, fix={"tp": 4, "dp": 1, "pp": 2, "micro_batch_size": 1, "zero": 0},
                        schedules=("1F1B",), recompute=("none",))
    c = next(c for c in enumerate_candidates(space, "semi-auto") if c.schedule == "1F1B")
    a, d, logits = t0.layer_activation_bytes(c)
    assert d == (0, 0, 0) and t0.inflight(c) == (2.0, 1.0)
    assert a[0] == a[1] == a[2] > 0  # no recompute: the embedding's output is layer 0's saved input
    mem = t0.profile.memory
    pre, post, _ = t0._end_params(c)
    fixed, frac = int(mem.workspace_bytes.value), float(mem.fragmentation.value)
    outside = int(mem.cuda_context_bytes.value) + int(mem.nccl_buffer_bytes.value * 3)  # world, tp, pp
    loss_temp = int(mem.loss_temp_bytes.value * logits)

    def rank(r, n):
        alloc = int(t0._states_table(c, pre if r == 0 else post)[n]) + int((2 - r) * a[1] * n) + fixed
        alloc += loss_temp if r == 1 else 0
        return alloc + int(frac * alloc) + outside

    want = min(max(rank(0, n), rank(1, 4 - n)) for n in range(5))
    assert t0.split_memory_bytes(c) == want
    assert Strategy  # the strategy module is what Engine validates the candidates with
