"""The tier-0 ZeRO-3 time bound (meshplan.bounds.tier0.Tier0Bound.zero3_time_s) and the FP8 weight
state in the split memory bound: never above the simulated step / peak, a hand value."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusters import load_cluster
from meshplan.bounds.tier0 import Tier0Bound
from meshplan.tuning import search_problem
from simulator import dp_groups
from tests._bound_spaces import bound_space
from tuner.space import SearchSpace
from tuner.suggest import enumerate_candidates

CONFIGS = {
    # FSDP2: prefetched gathers, resharded after forward, HSDP groups, cp, torchao FP8
    "fsdp2": ({"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 2, "global_batch_size": 32,
               "seq_len": 8192, "num_layers": 6, "framework": "fsdp2"},
              {"cp_degrees": (1, 2), "fp8_recipes": (None, "tensorwise"), "hsdp": True}),
    # Megatron-Core ZeRO-3 with cp and TE FP8; NeMo keeps FP8 parameters (1-byte gathers)
    "megatron": ({"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 2, "global_batch_size": 32,
                  "seq_len": 8192, "num_layers": 6}, {"cp_degrees": (1, 2, 4), "fp8_recipes": (None, "te-delayed")}),
    "nemo": ({"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 1, "global_batch_size": 32,
              "seq_len": 4096, "num_layers": 6, "framework": "nemo"}, {"fp8_recipes": (None, "te-delayed")}),
    "mixtral": ({"model": "mixtral-8x7b", "cluster": "dgx-h100", "nodes": 2, "global_batch_size": 64,
                 "seq_len": 4096, "num_layers": 4}, {"fp8_recipes": (None, "te-delayed")}),
}


@pytest.fixture(scope="module")
def spaces():
    out = {}
    for name, (sc, kw) in CONFIGS.items():
        out[name] = bound_space(sc, schedules=("1F1B", "VPP", "ZBH1"), vpp_degrees=(2,), micro_batch_sizes=(1, 2),
                                recompute=("none", "full"), zero_stages=(3,), **kw)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(CONFIGS)), rnd=st.randoms(use_true_random=False))
def test_zero3_bound_never_exceeds_the_simulated_step(spaces, name, rnd):
    """Random ZeRO-3 candidates (FSDP2 with HSDP, Megatron-Core, NeMo, Mixtral; cp, FP8,
    pipelines with 1F1B / VPP / ZB-H1): the ZeRO-3 time bound and the tier-0 bound stay
    below the simulated step, the split memory bound (with FP8 weight state) below the peak."""
    cands, scorer, t0 = spaces[name]
    c = rnd.choice(cands)
    try:
        s = scorer(c)
    except ValueError:
        return
    assert t0.zero3_time_s(c) <= s.time_s, c
    assert t0(c).time_s <= s.time_s
    assert t0.split_memory_bytes(c) <= s.memory_bytes, c


def test_zero3_bound_is_the_binding_bound_somewhere(spaces):
    """On the FSDP2 space the gathers bound some candidates above the compute bound."""
    cands, _, t0 = spaces["fsdp2"]
    assert any(t0.zero3_time_s(c) > t0.time_s(c) for c in cands)


def test_fp8_state_counts_in_the_split_bound(spaces):
    """An FP8 candidate's split memory bound exceeds its BF16 twin's by at least the layers'
    FP8 weight state (the only term that differs besides FP8 activations)."""
    cands, _, t0 = spaces["megatron"]
    c = next(c for c in cands if c.fp8 == "te-delayed" and c.pp == 1 and c.cp == 1)
    assert t0.fp8_state_bytes(c) > 0
    assert t0.fp8_state_bytes(c.replace(fp8=None)) == 0


def test_zero3_time_by_hand():
    """FSDP2, Llama 2 7B (6 layers), dp 8, tp 1, pp 1, ZeRO-3, 4 micro-batches of 1: each
    layer gathers its weights in F and again in B (resharded after forward) and reduce-
    scatters its fp32 gradients in B, on one stream: 4 x 6 x (2 g + r) seconds, less 1 ns
    per action, with g and r the dp-group collectives of the layer's elements."""
    sc = {"model": "llama2-7b", "cluster": "dgx-h100", "nodes": 1, "global_batch_size": 32,
          "seq_len": 4096, "num_layers": 6, "framework": "fsdp2"}
    t0 = Tier0Bound(sc)
    prob = search_problem("llama2-7b", "dgx-h100", 1, 32, 4096, num_layers=6)
    space = SearchSpace(prob, fix={"dp": 8, "tp": 1, "pp": 1, "micro_batch_size": 1, "zero": 3},
                        recompute=("none",))
    c = next(c for c in enumerate_candidates(space, "semi-auto"))
    assert t0.profile.overlap.fsdp_reshard_after_forward.value and t0.profile.overlap.fsdp_prefetch.value >= 1
    cl, p = load_cluster("dgx-h100", 1), t0.layer_params(c)
    group = list(range(8))
    g = cl.collective_time("all_gather", 2 * p, group)
    r = cl.collective_time("reduce_scatter", 4 * p, group)
    assert dp_groups.shard_degree(type("C", (), {"dp": 8, "fsdp_shard_size": None})()) == 8
    assert t0.zero3_time_s(c) == pytest.approx(4 * 6 * (2 * g + r) - (4 * 2 + 2) * 1e-9, rel=1e-12)
