"""Collective cost model on the DGX A100 catalog entry, against values computed by hand
from the alpha-beta formulas of formulas.md ("Communication", after nccl-tests'
PERFORMANCE.md) and the DGX A100 numbers of hardware_and_models.md."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusters import KINDS, CollectiveError, load_cluster

# hardware_and_models.md: DGX A100 achieved busbw ~230 GB/s, 8 x 200 Gb/s HDR NICs.
# formulas.md: Paddle latency constants 3.4 us intra-node, 9.6 us inter-node.
B_I, A_I, A_N = 230e9, 3.4e-6, 9.6e-6
NIC, NICS = 25e9, 8
GIB, KIB, MIB = 1 << 30, 1 << 10, 1 << 20


@pytest.fixture(scope="module")
def c1():
    return load_cluster("dgx-a100-80g")


@pytest.fixture(scope="module")
def c2():
    return load_cluster("dgx-a100-80g", num_nodes=2)


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter"])
def test_1gib_busbw_on_one_node_within_5pct_of_intra_bandwidth(c1, kind):
    bw = c1.busbw(kind, GIB, range(8))
    assert abs(bw / B_I - 1) < 0.05
    # exact ring value: 2(n-1) or (n-1) steps of (alpha + S/(n B))
    steps = 14 if kind == "all_reduce" else 7
    assert c1.collective_time(kind, GIB, range(8)) == pytest.approx(steps * (A_I + GIB / (8 * B_I)))


def test_all_reduce_about_twice_all_gather(c1, c2):
    for c, ranks in ((c1, range(8)), (c2, range(16))):
        ar = c.collective_time("all_reduce", GIB, ranks)
        ag = c.collective_time("all_gather", GIB, ranks)
        assert ar / ag == pytest.approx(2.0, rel=0.05)


def test_two_nodes_slower_and_nic_bound(c1, c2):
    t8 = c1.collective_time("all_reduce", GIB, range(8))
    t16 = c2.collective_time("all_reduce", GIB, range(16))
    assert t16 > 1.2 * t8
    node_nic = NICS * NIC  # 200 GB/s leaves each node
    # flat ring over 16 ranks, channels over all 8 NICs: 30 steps of a_n + S/(16 * 200 GB/s)
    ring = 30 * (A_N + GIB / (16 * min(B_I, node_nic)))
    # hierarchical: intra RS (7 steps) + inter all_reduce of S/8 per rank over 2 nodes at
    # 200/8 GB/s each (ring: 2 steps; tree: 2 log2(2) alphas + 2 S / 200 GB/s) + intra AG
    intra = 7 * (A_I + GIB / (8 * B_I))
    inter = min(2 * (A_N + (GIB / 8) / (2 * NIC)), 2 * A_N + 2 * GIB / node_nic)
    assert t16 == pytest.approx(min(ring, 2 * intra + inter))
    # NIC-bound: the bytes the NICs carry take >= 95% of the time, busbw close to 200 GB/s
    nic_time = 30 * GIB / (16 * node_nic)
    assert nic_time >= 0.95 * t16
    assert 0.95 * node_nic < c2.busbw("all_reduce", GIB, range(16)) <= node_nic


def test_one_rank_per_node_uses_one_nic(c2):
    # ranks 0 and 8: inter-node ring of 2 with one 25 GB/s NIC each
    t = c2.collective_time("all_reduce", 64 * MIB, [0, 8])
    assert t == pytest.approx(min(2 * (A_N + 64 * MIB / (2 * NIC)), 2 * A_N + 2 * 64 * MIB / NIC))


# alpha terms of the algorithm used at 1 KiB on 8 ranks of one node
ALPHA_8 = {
    "all_reduce": 2 * math.ceil(math.log2(8)) * A_I,  # tree beats ring's 14 alphas
    "reduce_scatter": 7 * A_I,
    "all_gather": 7 * A_I,
    "all_to_all": 7 * A_I,
    "broadcast": 7 * A_I,
    "send_recv": A_I,
}


@pytest.mark.parametrize("kind", KINDS)
def test_1kib_latency_dominated(c1, kind):
    ranks = [0, 7] if kind == "send_recv" else range(8)
    t = c1.collective_time(kind, KIB, ranks)
    assert ALPHA_8[kind] <= t <= 2 * ALPHA_8[kind]


def test_1kib_latency_dominated_across_nodes(c2):
    # hierarchical: 2 x 7 intra alphas + 2 inter alphas (ring over 2 nodes = tree)
    alpha = 14 * A_I + 2 * A_N
    t = c2.collective_time("all_reduce", KIB, range(16))
    assert alpha <= t <= 2 * alpha
    assert c2.p2p_time(KIB, 0, 8) <= 2 * A_N


def test_tree_for_small_ring_for_large(c1):
    small = c1.collective_algorithms("all_reduce", KIB, range(8))
    large = c1.collective_algorithms("all_reduce", GIB, range(8))
    assert small["tree"] < small["ring"] and large["ring"] < large["tree"]
    assert small["tree"] == pytest.approx(6 * A_I + 2 * KIB / B_I)
    assert large["tree"] == pytest.approx(6 * A_I + 2 * GIB / B_I)


def test_spanning_all_to_all_and_broadcast(c2):
    s = 64 * MIB
    per_rank_nic = NICS * NIC / 8
    a2a = 7 * A_I + 8 * A_N + max(7 * s / (16 * B_I), 8 * s / (16 * per_rank_nic))
    assert c2.collective_time("all_to_all", s, range(16)) == pytest.approx(a2a)
    bcast = 14 * A_I + 1 * A_N + s / min(B_I, NICS * NIC)
    assert c2.collective_time("broadcast", s, range(16)) == pytest.approx(bcast)


def test_non_uniform_group(c2):
    s = 64 * MIB
    ranks = [0, 1, 2, 8]  # 3 ranks on node 0, 1 on node 1: node 1 drives one NIC
    hier = 2 * 2 * (A_I + s / (3 * B_I)) + min(2 * (A_N + s / (2 * NIC)), 2 * A_N + 2 * s / NIC)
    flat = 6 * (A_N + s / (4 * NIC))
    assert c2.collective_time("all_reduce", s, ranks) == pytest.approx(min(hier, flat))


def test_p2p(c2):
    s = 8 * MIB
    assert c2.p2p_time(s, 0, 5) == pytest.approx(A_I + s / B_I)
    assert c2.p2p_time(s, 3, 12) == pytest.approx(A_N + s / NIC)
    assert c2.p2p_time(s, 4, 4) == 0.0
    assert c2.collective_time("send_recv", s, [3, 12]) == c2.p2p_time(s, 3, 12)
    assert c2.busbw("send_recv", s, [0, 5]) == pytest.approx(s / (A_I + s / B_I))


def test_group_of_one_and_zero_bytes_cost_nothing(c2):
    for kind in KINDS:
        assert c2.collective_time(kind, GIB, [5]) == 0.0
        assert c2.busbw(kind, GIB, [5]) == 0.0
    assert c2.collective_time("all_reduce", 0, range(16)) == 0.0


def test_input_errors(c2):
    with pytest.raises(CollectiveError, match="nbytes must be >= 0, got -1"):
        c2.collective_time("all_reduce", -1, range(4))
    with pytest.raises(CollectiveError, match="nbytes must be >= 0, got -1"):
        c2.p2p_time(-1, 0, 0)
    with pytest.raises(CollectiveError, match="finite number of bytes, got nan"):
        c2.collective_time("all_reduce", float("nan"), range(4))
    with pytest.raises(CollectiveError, match="unknown collective kind 'allreduce'"):
        c2.collective_time("allreduce", 1, range(4))
    with pytest.raises(CollectiveError, match="rank 16 is outside cluster"):
        c2.collective_time("all_gather", 1, range(17))
    with pytest.raises(CollectiveError, match="duplicate rank 2"):
        c2.busbw("all_to_all", 1, [1, 2, 2])
    with pytest.raises(CollectiveError, match="send_recv takes exactly 2 ranks"):
        c2.collective_time("send_recv", 1, [0, 1, 2])


@settings(deadline=None, max_examples=60)
@given(
    kind=st.sampled_from(KINDS),
    group=st.lists(st.integers(0, 31), min_size=1, max_size=12, unique=True),
    sizes=st.tuples(st.integers(0, 1 << 32), st.integers(0, 1 << 32)),
)
def test_time_monotone_in_nbytes(kind, group, sizes):
    c = load_cluster("dgx-a100-80g", num_nodes=4)
    if kind == "send_recv":
        group = group[:2]
    lo, hi = sorted(sizes)
    t_lo, t_hi = c.collective_time(kind, lo, group), c.collective_time(kind, hi, group)
    assert 0.0 <= t_lo <= t_hi
    if len(group) > 1 and hi > lo:
        assert t_hi > t_lo
