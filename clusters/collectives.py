"""Alpha-beta cost model of NCCL-style collectives.

Conventions follow NCCL's nccl-tests ``doc/PERFORMANCE.md`` (summarised in
``shared/reference/formulas.md``, "Communication"): ``S`` (``nbytes``) is the buffer size
nccl-tests reports (the whole input of reduce_scatter, the whole output of all_gather, the
per-rank send buffer of all_to_all), ``n`` the group size, and

    algbw = S / t,    busbw = algbw * factor(n)

with factor ``2(n-1)/n`` (all_reduce), ``(n-1)/n`` (reduce_scatter, all_gather,
all_to_all) and ``1`` (broadcast, send_recv). Every algorithm step costs ``alpha`` (the
per-step latency of the slowest link it uses) plus its bytes over the link bandwidth.

Per-rank link parameters (``Links``): ``B_i`` intra-node bus bandwidth, ``a_i`` intra-node
step latency, ``a_n`` inter-node step latency; a node whose group holds ``k`` ranks can
drive ``NIC(k) = nic_bandwidth * min(nic_count, k * nics_per_device)`` bytes/s off the node
(``nics_per_device = max(1, nic_count // devices_per_node)``, rail-aligned NICs), shared by
those ``k`` ranks.

Single-node group of n ranks (``a = a_i``, ``B = B_i``):
  * ring all_reduce: ``2(n-1) (a + S/(n B))``; tree all_reduce (reduce up, broadcast down a
    binary tree of depth ceil(log2 n), pipelined): ``2 ceil(log2 n) a + 2 S / B``; the
    faster is taken (NCCL picks ring or tree by size the same way).
  * reduce_scatter / all_gather (ring): ``(n-1) (a + S/(n B))``.
  * all_to_all (all peers at once): ``(n-1) a + (n-1) S / (n B)``.
  * broadcast (pipelined chain): ``(n-1) a + S / B``; send_recv: ``a + S / B``.

Group spanning N nodes with at most k ranks per node (the faster of two algorithms):
  * hierarchical: intra-node reduce_scatter over k, inter-node all_reduce of ``S/k`` per
    rank over N nodes (ring or tree, each rank getting ``NIC(k)/k``), intra-node all_gather;
    reduce_scatter and all_gather use their own half of that.
  * flat ring over all n ranks with NCCL's channels spread over the node's NICs: per step
    ``a_n + S / (n min(B_i, NIC(k)))``.
  * all_to_all: ``(k-1) a_i + (n-k) a_n + max((k-1) S/(n B_i), (n-k) S / (n NIC(k)/k))``.
  * broadcast: chain with ``N-1`` inter-node hops: ``(n-N) a_i + (N-1) a_n + S/min(B_i, NIC(k))``.
  * send_recv between nodes: ``a_n + S / NIC(1)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from clusters.topology import GroupTopology


@dataclass(frozen=True)
class Links:
    """Per-rank link parameters of a cluster (bytes/s and seconds)."""

    intra_bandwidth: float
    intra_latency: float
    inter_latency: float
    nic_bandwidth: float
    nic_count: int
    devices_per_node: int

    @property
    def nics_per_device(self) -> int:
        """NICs per device, ``max(1, nic_count // devices_per_node)`` (rail-aligned NICs)."""
        return max(1, self.nic_count // self.devices_per_node)

    def node_nic_bandwidth(self, k: int) -> float:
        """Bytes/s that ``k`` group ranks on one node can push off it through its NICs."""
        return self.nic_bandwidth * min(self.nic_count, k * self.nics_per_device)

    def group_nic_bandwidth(self, topo: GroupTopology) -> float:
        """The smallest ``NIC(k_j)`` over the nodes j of a group (its bottleneck node)."""
        return min(self.node_nic_bandwidth(k) for k in topo.node_loads)  # one per distinct load


# --- alpha-beta primitives: n ranks, per-step latency a (s), per-rank bandwidth b (B/s) ---


def ring_all_reduce(s: float, n: int, a: float, b: float) -> float:
    """Ring all_reduce: 2(n-1) steps of S/n bytes each."""
    return 2 * (n - 1) * (a + s / (n * b)) if n > 1 else 0.0


def tree_all_reduce(s: float, n: int, a: float, b: float) -> float:
    """Pipelined binary-tree all_reduce: 2 ceil(log2 n) latencies, S/B up and S/B down."""
    return 2 * math.ceil(math.log2(n)) * a + 2 * s / b if n > 1 else 0.0


def ring_half(s: float, n: int, a: float, b: float) -> float:
    """Ring reduce_scatter or all_gather: (n-1) steps of S/n bytes each."""
    return (n - 1) * (a + s / (n * b)) if n > 1 else 0.0


def _inter_all_reduce(s: float, topo: GroupTopology, ln: Links) -> float:
    nb = ln.group_nic_bandwidth(topo)
    n = topo.num_nodes
    a = ln.inter_latency
    return min(ring_all_reduce(s, n, a, nb), tree_all_reduce(s, n, a, nb))


def _flat_ring_bw(topo: GroupTopology, ln: Links) -> float:
    return min(ln.intra_bandwidth, ln.group_nic_bandwidth(topo))


# --- one function per collective kind: returns {algorithm: seconds} ---

Algorithms = dict[str, float]


def all_reduce(s: float, topo: GroupTopology, ln: Links) -> Algorithms:
    """Seconds of an all_reduce of ``s`` bytes (nccl-tests buffer size) on ``topo``, per
    algorithm: ``ring`` and ``tree`` on one node; ``hierarchical`` and flat ``ring`` across
    nodes (formulas in the module docstring, after nccl-tests ``doc/PERFORMANCE.md``)."""
    n, bi, ai = topo.size, ln.intra_bandwidth, ln.intra_latency
    if topo.single_node:
        return {"ring": ring_all_reduce(s, n, ai, bi), "tree": tree_all_reduce(s, n, ai, bi)}
    k = topo.max_ranks_per_node
    hier = 2 * ring_half(s, k, ai, bi) + _inter_all_reduce(s, topo, ln)
    flat = ring_all_reduce(s, n, max(ai, ln.inter_latency), _flat_ring_bw(topo, ln))
    return {"hierarchical": hier, "ring": flat}


def _half(s: float, topo: GroupTopology, ln: Links) -> Algorithms:
    n, bi, ai = topo.size, ln.intra_bandwidth, ln.intra_latency
    if topo.single_node:
        return {"ring": ring_half(s, n, ai, bi)}
    k, nn = topo.max_ranks_per_node, topo.num_nodes
    inter = ring_half(s, nn, ln.inter_latency, ln.group_nic_bandwidth(topo))
    hier = ring_half(s, k, ai, bi) + inter
    flat = ring_half(s, n, max(ai, ln.inter_latency), _flat_ring_bw(topo, ln))
    return {"hierarchical": hier, "ring": flat}


def reduce_scatter(s: float, topo: GroupTopology, ln: Links) -> Algorithms:
    """Seconds of a reduce_scatter of ``s`` bytes (the whole input) on ``topo``, per
    algorithm: ``ring`` on one node; ``hierarchical`` and flat ``ring`` across nodes
    (module docstring)."""
    return _half(s, topo, ln)


def all_gather(s: float, topo: GroupTopology, ln: Links) -> Algorithms:
    """Seconds of an all_gather of ``s`` bytes (the whole output) on ``topo``, per
    algorithm: ``ring`` on one node; ``hierarchical`` and flat ``ring`` across nodes
    (module docstring); the same cost as reduce_scatter."""
    return _half(s, topo, ln)


def all_to_all(s: float, topo: GroupTopology, ln: Links) -> Algorithms:
    """Seconds of an all_to_all of ``s`` bytes (per-rank send buffer) on ``topo``:
    ``{"pairwise": t}`` with t the slowest node's ``(k-1) a_i + (n-k) a_n +
    max((k-1) S/(n B_i), (n-k) S/(n NIC(k)/k))`` (module docstring)."""
    n, bi, ai = topo.size, ln.intra_bandwidth, ln.intra_latency
    worst = 0.0
    for k in topo.node_loads:  # the worst node depends only on its load k
        per_rank_nic = ln.node_nic_bandwidth(k) / k
        lat = (k - 1) * ai + (n - k) * ln.inter_latency
        bw = max((k - 1) * s / (n * bi), (n - k) * s / (n * per_rank_nic))
        worst = max(worst, lat + bw)
    return {"pairwise": worst}


def broadcast(s: float, topo: GroupTopology, ln: Links) -> Algorithms:
    """Seconds of a broadcast of ``s`` bytes on ``topo``: ``{"chain": t}``, a pipelined
    chain with ``(n-N) a_i + (N-1) a_n`` latency plus ``S / B`` (B = B_i on one node, else
    ``min(B_i, NIC(k))``; module docstring)."""
    n, nn = topo.size, topo.num_nodes
    lat = (n - nn) * ln.intra_latency + (nn - 1) * ln.inter_latency
    bw = ln.intra_bandwidth if topo.single_node else _flat_ring_bw(topo, ln)
    return {"chain": lat + s / bw}


def send_recv(s: float, topo: GroupTopology, ln: Links) -> Algorithms:
    """Seconds of a point-to-point send of ``s`` bytes between the two ranks of ``topo``:
    ``{"p2p": a_i + S/B_i}`` on one node, ``{"p2p": a_n + S/NIC(1)}`` across nodes."""
    if topo.single_node:
        return {"p2p": ln.intra_latency + s / ln.intra_bandwidth}
    return {"p2p": ln.inter_latency + s / ln.node_nic_bandwidth(1)}


COLLECTIVES: dict[str, Callable[[float, GroupTopology, Links], Algorithms]] = {
    "all_reduce": all_reduce,
    "reduce_scatter": reduce_scatter,
    "all_gather": all_gather,
    "all_to_all": all_to_all,
    "broadcast": broadcast,
    "send_recv": send_recv,
}
"""Registry: collective kind -> its candidate algorithms' times (seconds)."""

BUSBW_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}
"""nccl-tests busbw factors (PERFORMANCE.md; formulas.md): busbw = S / t * factor(n)."""

KINDS: tuple[str, ...] = tuple(COLLECTIVES)
