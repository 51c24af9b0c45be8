"""Collective cost model on the DGX A100 catalog entry, against values computed by hand
from the alpha-beta formulas of formulas.md ("Communication", after nccl-tests'
PERFORMANCE.md) and the DGX A100 numbers of hardware_and_models.md."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusters import KINDS, CollectiveError, load_cluster

# hardware_and_models.md: DGX A100 achieved busbw ~230 GB/s, 8 x 200 Gb/s HDR NICs, each
# achieving 24 GB/s in NCCL (192 GB/s all_reduce busbw over 8 NICs: NVIDIA/nccl issue 812).
# formulas.md: Paddle latency constants 3.4 us intra-node, 9.6 us inter-node (= NCCL 2.7's
# Ring / Simple NVLink and NET hop latencies, NVIDIA/nccl 5949d96f src/graph/tuning.cc).
B_I, A_I, A_N = 230e9, 3.4e-6, 9.6e-6
NIC, NICS = 24e9, 8
GIB, KIB, MIB = 1 << 30, 1 << 10, 1 << 20
US = 1e-6
# NCCL 5067397c src/graph/tuning.cc: base latencies (Ring LL / LL128 / Simple 6.6, 14.0,
# 8.4 us; Tree 6.8, 14.0, 8.4), NVLink ring hops LL 0.6 / LL128 1.9 us, NET ring hops 2.7 /
# 4.0 us, Tree NET hops 5.0 / 8.5 us, net post overhead 1 us (x3 for Simple), ring
# bandwidth x0.5 (LL) / x0.92 (LL128), Tree all_reduce x0.92 (Simple).
BASE_SIMPLE, BASE_LL, BASE_LL128 = 8.4 * US, 6.6 * US, 14.0 * US


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
    # ring / Simple: base latency + 2(n-1) or (n-1) steps of alpha + share S / B
    steps = 14 if kind == "all_reduce" else 7
    t = BASE_SIMPLE + steps * A_I + steps / 8 * GIB / B_I
    assert c1.collective_time(kind, GIB, range(8)) == pytest.approx(t)
    assert c1.collective_algorithms(kind, GIB, range(8))["ring/Simple"] == pytest.approx(t)


def test_all_reduce_about_twice_all_gather(c1, c2):
    for c, ranks in ((c1, range(8)), (c2, range(16))):
        ar = c.collective_time("all_reduce", GIB, ranks)
        ag = c.collective_time("all_gather", GIB, ranks)
        assert ar / ag == pytest.approx(2.0, rel=0.05)


def test_two_nodes_slower_and_nic_bound(c1, c2):
    t8 = c1.collective_time("all_reduce", GIB, range(8))
    t16 = c2.collective_time("all_reduce", GIB, range(16))
    assert t16 > 1.2 * t8
    node_nic = NICS * NIC  # 192 GB/s leaves each node
    algs = c2.collective_algorithms("all_reduce", GIB, range(16))
    # ring over 16 ranks, one channel per NIC: 30 steps, 2 of them across the network
    ring = BASE_SIMPLE + 28 * A_I + 2 * A_N + 30 / 16 * GIB / min(B_I, node_nic)
    # tree on 2 nodes: a chain of 8 ranks per node, log2(2) = 1 network hop, up and down,
    # bound by the NICs as the ring (the published two-node runs: clusters.collectives)
    tree = BASE_SIMPLE + 2 * (7 * A_I + A_N) + 2 * GIB / (0.92 * min(B_I, node_nic))
    assert algs["ring/Simple"] == pytest.approx(ring)
    assert algs["tree/Simple"] == pytest.approx(tree)
    assert t16 == pytest.approx(min(ring, tree)) == pytest.approx(ring)
    # NIC-bound: the bytes the NICs carry take >= 95% of the time, busbw close to 192 GB/s
    nic_time = 30 * GIB / (16 * node_nic)
    assert nic_time >= 0.95 * t16
    assert 0.95 * node_nic < c2.busbw("all_reduce", GIB, range(16)) <= node_nic


def test_one_rank_per_node_uses_one_nic(c2):
    # ranks 0 and 8: a ring of 2 with one 24 GB/s NIC each; with one rank per node NCCL
    # charges every step the Tree network hop (Simple: the cluster's 9.6 us)
    s = 64 * MIB
    algs = c2.collective_algorithms("all_reduce", s, [0, 8])
    assert algs["ring/Simple"] == pytest.approx(BASE_SIMPLE + 2 * A_N + s / NIC)
    assert algs["ring/LL"] == pytest.approx(BASE_LL + 2 * 5.0 * US + s / (0.5 * NIC))
    tree = BASE_SIMPLE + 2 * A_N + 2 * s / (0.92 * NIC)
    assert algs["tree/Simple"] == pytest.approx(tree)
    assert c2.collective_time("all_reduce", s, [0, 8]) == pytest.approx(BASE_SIMPLE + 2 * A_N + s / NIC)


# latency of the protocol NCCL picks at 1 KiB on 8 ranks of one node: LL, whose NVLink hop
# is 0.6 us (ring steps: 14 for all_reduce, 7 for reduce_scatter / all_gather)
ALPHA_8 = {
    "all_reduce": BASE_LL + 14 * 0.6 * US,
    "reduce_scatter": BASE_LL + 7 * 0.6 * US,
    "all_gather": BASE_LL + 7 * 0.6 * US,
    "all_to_all": 7 * A_I,
    "broadcast": 7 * A_I,
    "send_recv": A_I,
}


@pytest.mark.parametrize("kind", KINDS)
def test_1kib_latency_dominated(c1, kind):
    ranks = [0, 7] if kind == "send_recv" else range(8)
    t = c1.collective_time(kind, KIB, ranks)
    assert ALPHA_8[kind] <= t <= 1.05 * ALPHA_8[kind]


def test_1kib_latency_dominated_across_nodes(c2):
    # tree / LL across 2 nodes: 2 (7 NVLink hops of max(0.6, 1.0 us net overhead) + 1 Tree
    # NET hop of 5.0 us) + the 6.8 us Tree base; the ring pays 28 + 2 hops
    alpha = 6.8 * US + 2 * (7 * 1.0 * US + 5.0 * US)
    t = c2.collective_time("all_reduce", KIB, range(16))
    assert alpha <= t <= 1.05 * alpha
    assert min(c2.collective_algorithms("all_reduce", KIB, range(16)),
               key=c2.collective_algorithms("all_reduce", KIB, range(16)).get) == "tree/LL"
    assert c2.p2p_time(KIB, 0, 8) <= 2 * A_N


def test_protocol_by_message_size(c1):
    # one node, 8 ranks: LL's 25.6 us lower latency than LL128 costs 2 - 1/0.92 of the byte
    # term 1.75 S / B_i: LL up to 25.6 us x 230 GB/s / (1.75 x 0.913) = 3.7 MB; LL128's
    # 15.4 us over Simple costs 1/0.92 - 1: Simple from 15.4 us x 230 GB/s / (1.75 x 0.087)
    # = 23 MB (the three ring protocols of NCCL's tuner, tuning.cc)
    def best(s):
        algs = c1.collective_algorithms("all_reduce", s, range(8))
        return min(algs, key=algs.get)
    assert best(64 * KIB) == "ring/LL"
    assert best(3 * MIB) == "ring/LL"
    assert best(5 * MIB) == "ring/LL128"
    assert best(20 * MIB) == "ring/LL128"
    assert best(26 * MIB) == "ring/Simple"
    assert best(GIB) == "ring/Simple"


def test_nvls_all_reduce_on_h100():
    # NVLink SHARP on one DGX H100: 25 us + S / 275 GB/s (algbw; busbw 1.75 x 275 = 481
    # GB/s, sjeaugey in NVIDIA/nccl-tests issue 212: ~480 GB/s busbw, ~275 GB/s algbw)
    h = load_cluster("dgx-h100", num_nodes=2)
    algs = h.collective_algorithms("all_reduce", GIB, range(8))
    assert algs["nvls/Simple"] == pytest.approx(25 * US + GIB / 275e9)
    assert h.busbw("all_reduce", GIB, range(8)) == pytest.approx(1.75 * GIB / (25 * US + GIB / 275e9))
    assert "nvls/Simple" not in h.collective_algorithms("all_reduce", GIB, range(16))
    assert "nvls/Simple" not in h.collective_algorithms("all_gather", GIB, range(8))
    # 2 ranks: the ring moves S once (1 x S / B_i) and beats NVLS's S / algbw
    two = h.collective_algorithms("all_reduce", GIB, [0, 1])
    assert min(two, key=two.get) == "ring/Simple"


def test_all_gather_is_one_flat_ring_across_nodes():
    # NCCL has no hierarchical all_gather: on 192 DGX nodes the ring has 1535 steps, 1344
    # of them over NVLink and 191 across the network (NCCL 5067397c tuning.cc nInterSteps)
    c = load_cluster("selene", num_nodes=192)
    s = 256 * MIB
    algs = c.collective_algorithms("all_gather", s, range(1536))
    b = min(B_I, NICS * NIC)
    assert algs["ring/Simple"] == pytest.approx(BASE_SIMPLE + 1344 * A_I + 191 * A_N + 1535 / 1536 * s / b)
    ll128 = BASE_LL128 + 1344 * 1.9 * US + 191 * 4.0 * US + 1535 / 1536 * s / (0.92 * b)
    assert algs["ring/LL128"] == pytest.approx(ll128)
    assert set(algs) == {"ring/LL", "ring/LL128", "ring/Simple"}
    # latency alone is 3.4 ms: an all_gather of 1 MiB takes >= 1.87 ms (ring / LL: 6.6 us +
    # 1344 x max(0.6, 1.0) us + 191 x 2.7 us) where 8 nodes of 8 take 0.1 ms
    assert c.collective_time("all_gather", MIB, range(1536)) >= 6.6 * US + 1344 * US + 191 * 2.7 * US
    assert c.collective_time("all_gather", MIB, range(64)) < 0.15e-3


def test_alpha_beta_model_has_no_call_latency(tmp_path):
    import yaml

    from clusters import CATALOG_DIR, Cluster, load_spec_file
    data = yaml.safe_load((CATALOG_DIR / "dgx-a100-80g.yaml").read_text())
    data["node"]["collective_model"]["value"] = "alpha-beta"
    p = tmp_path / "ab.yaml"
    p.write_text(yaml.safe_dump(data))
    c = Cluster(load_spec_file(p), 2)
    algs = c.collective_algorithms("all_gather", GIB, range(8))
    assert algs == {"ring/alpha-beta": pytest.approx(7 * (A_I + GIB / (8 * B_I)))}
    del data["node"]["collective_model"]  # a spec written before the field: alpha-beta
    p.write_text(yaml.safe_dump(data))
    assert Cluster(load_spec_file(p), 1).links.model == "alpha-beta"


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
    # ring / Simple: 6 steps, 2 across the network, bound by node 1's one NIC
    ring = BASE_SIMPLE + 4 * A_I + 2 * A_N + 6 / 4 * s / NIC
    # tree on 2 nodes: chain of the 3 ranks of node 0, one network hop, node 1's one NIC
    tree = BASE_SIMPLE + 2 * (2 * A_I + A_N) + 2 * s / (0.92 * NIC)
    assert c2.collective_time("all_reduce", s, ranks) == pytest.approx(min(ring, tree)) == pytest.approx(ring)


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
