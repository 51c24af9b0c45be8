"""Cost model of NCCL's collectives: algorithms, protocols and the links they cross.

Conventions follow NCCL's nccl-tests ``doc/PERFORMANCE.md`` (summarised in
``shared/reference/formulas.md``, "Communication"): ``S`` (``nbytes``) is the buffer size
nccl-tests reports (the whole input of reduce_scatter, the whole output of all_gather, the
per-rank send buffer of all_to_all), ``n`` the group size, ``N`` the nodes it touches,
``k`` its most ranks on one node, and

    algbw = S / t,    busbw = algbw * factor(n)

with factor ``2(n-1)/n`` (all_reduce), ``(n-1)/n`` (reduce_scatter, all_gather,
all_to_all) and ``1`` (broadcast, send_recv).

Links (``Links``): ``B_i`` the intra-node ring bus bandwidth per rank, ``a_i`` / ``a_n``
the Simple protocol's latency of one intra- / inter-node ring step; a node whose group
holds ``k`` ranks drives ``NIC(k) = nic_bandwidth * min(nic_count, k * nics_per_device)``
bytes/s off the node (``nics_per_device = max(1, nic_count // devices_per_node)``,
rail-aligned NICs). A ring spanning nodes runs one channel per NIC, so its bus bandwidth
is ``B = min(B_i, NIC(k))`` (the slowest node's), one node's is ``B_i``.

Each collective returns the time of every algorithm x protocol NCCL could run
(``"ring/LL128"``, ...), and the cluster takes the fastest, as NCCL's tuner does
(NVIDIA/nccl 5067397c ``src/graph/tuning.cc``; protocols and their constants:
:mod:`clusters.nccl`). With protocol p (fixed call latency ``base_p``, hop latencies
``h_i``, ``h_n``, bandwidth factor ``f_p``):

* ring (every kind but all_to_all, broadcast, send_recv): ``nsteps`` = 2(n-1) for
  all_reduce, n-1 for reduce_scatter / all_gather, of which ``ninter`` = 2(N-1) resp. N-1
  cross the network (NCCL's ring enters and leaves each node once):
  ``t = base_p + (nsteps - ninter) h_i + ninter h_n + factor(n) S / (f_p B)``.
  NCCL has no hierarchical all_gather or reduce_scatter (its other algorithms for them
  need NVLink SHARP on one node, SHARP switches or one GPU per node), so at large n
  their latency grows with the ring length (n-1): 1,535 steps on 192 DGX nodes.
* tree all_reduce across nodes (NCCL's double binary tree: a chain through the k ranks of
  a node, a binary tree over the N nodes, pipelined up and down):
  ``t = base_p + 2 ((k-1) h_i + floor(log2 N) h_n) + 2 S / (f_tree_p B)``: its bytes
  cost more than the ring's (2 S / 0.92 against 2(n-1)/n S), its latency grows with
  log2 N, so it wins mid-size messages at scale. On two nodes NCCL's tuner lets the tree
  run at the intra-node bandwidth (each node's data crosses the network once each way);
  the published two-node runs stay NIC-bound (NVIDIA/nccl issues 495 and 1048: 75 and 86
  GB/s busbw on 100 GB/s of NICs), so the model keeps ``B`` there too.
* NVLS all_reduce on one NVSwitch node (``node.nvls_algbw``, H100): ``25 us + S / algbw``.
* all_to_all (grouped send/recv, every peer at once):
  ``(k-1) a_i + (n-k) a_n + max((k-1) S/(n B_i), (n-k) S / (n NIC(k)/k))`` on the
  slowest node: across many nodes busbw -> the NIC bandwidth per GPU x N/(N-1) (sjeaugey,
  NVIDIA/nccl-tests issue 130).
* broadcast: a pipelined chain with ``N-1`` inter-node hops:
  ``(n-N) a_i + (N-1) a_n + S / B``; send_recv: ``a_i + S/B_i`` on one node,
  ``a_n + S / NIC(1)`` across nodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from clusters.nccl import MODELS, NVLS_LATENCY, Protocol
from clusters.topology import GroupTopology


@dataclass(frozen=True)
class Links:
    """Per-rank link parameters of a cluster (bytes/s and seconds).

    ``model``: the collective model (``clusters.nccl.MODELS``: ``nccl`` runs NCCL's
    protocols, ``alpha-beta`` the plain model ``meshplan calibrate`` fits);
    ``nvls_algbw``: NVLink SHARP all_reduce algorithm bandwidth on one node (B/s; 0: the
    node has none)."""

    intra_bandwidth: float
    intra_latency: float
    inter_latency: float
    nic_bandwidth: float
    nic_count: int
    devices_per_node: int
    model: str = "alpha-beta"
    nvls_algbw: float = 0.0

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

    @property
    def protocols(self) -> tuple[Protocol, ...]:
        """The protocols the collective model runs (``clusters.nccl.MODELS``)."""
        return MODELS[self.model]


Algorithms = dict[str, float]


def ring_bandwidth(topo: GroupTopology, ln: Links) -> float:
    """Bus bandwidth (B/s) of a ring on ``topo``: ``B_i`` on one node, else
    ``min(B_i, NIC(k))`` of the slowest node (one channel per NIC)."""
    if topo.single_node:
        return ln.intra_bandwidth
    return min(ln.intra_bandwidth, ln.group_nic_bandwidth(topo))


def ring_latency(p: Protocol, nsteps: int, ninter: int, topo: GroupTopology, ln: Links) -> float:
    """Seconds of latency of a ring of ``nsteps`` steps, ``ninter`` of them across the
    network, under protocol ``p``: ``base_p + (nsteps - ninter) h_i + ninter h_n``; with one
    rank per node every step is a network hop at the Tree network latency (NCCL
    5067397c ``tuning.cc``: "With ppn=1 latencies are fully exposed")."""
    spans = topo.spans_nodes
    intra = p.intra_hop(ln.intra_latency, spans)
    inter = p.inter_hop(ln.inter_latency, tree=spans and topo.max_ranks_per_node == 1)
    return p.ring_base + (nsteps - ninter) * intra + ninter * inter


def _ring(s: float, topo: GroupTopology, ln: Links, all_reduce_: bool) -> Algorithms:
    """``ring/<protocol>`` seconds of a ring all_reduce or reduce_scatter / all_gather."""
    n, nn = topo.size, topo.num_nodes
    nsteps, ninter = (2 * (n - 1), 2 * (nn - 1)) if all_reduce_ else (n - 1, nn - 1)
    share = nsteps / n  # busbw factor: 2(n-1)/n or (n-1)/n
    b = ring_bandwidth(topo, ln)
    return {f"ring/{p.name}": ring_latency(p, nsteps, ninter, topo, ln) + share * s / (p.ring_bw * b)
            for p in ln.protocols}


def _tree(s: float, topo: GroupTopology, ln: Links) -> Algorithms:
    """``tree/<protocol>`` seconds of NCCL's Tree all_reduce across nodes (module
    docstring); empty on one node (there NCCL's tree is a chain, never faster than the
    ring)."""
    if topo.single_node:
        return {}
    nn, k = topo.num_nodes, topo.max_ranks_per_node
    b = ring_bandwidth(topo, ln)
    out = {}
    for p in ln.protocols:
        lat = p.tree_base + 2 * ((k - 1) * p.intra_hop(ln.intra_latency, True, tree=True)
                                 + int(math.log2(nn)) * p.inter_hop(ln.inter_latency, tree=True))
        out[f"tree/{p.name}"] = lat + 2 * s / (p.tree_bw * b)
    return out


def _nvls(s: float, topo: GroupTopology, ln: Links) -> Algorithms:
    """``nvls/Simple``: NVLink SHARP all_reduce on one node, ``25 us + S / algbw``
    (NCCL 5067397c ``tuning.cc`` NVLS latency; the algbw a cluster states); empty without
    NVLS, across nodes or under the alpha-beta model."""
    if ln.nvls_algbw <= 0 or not topo.single_node or ln.model != "nccl":
        return {}
    return {"nvls/Simple": NVLS_LATENCY + s / ln.nvls_algbw}


# --- one function per collective kind: returns {algorithm/protocol: seconds} ---


def all_reduce(s: float, topo: GroupTopology, ln: Links) -> Algorithms:
    """Seconds of an all_reduce of ``s`` bytes (nccl-tests buffer size) on ``topo``, per
    algorithm and protocol: ``ring/*`` always, ``tree/*`` across nodes, ``nvls/Simple`` on
    one NVSwitch node (formulas in the module docstring)."""
    return {**_ring(s, topo, ln, True), **_tree(s, topo, ln), **_nvls(s, topo, ln)}


def reduce_scatter(s: float, topo: GroupTopology, ln: Links) -> Algorithms:
    """Seconds of a reduce_scatter of ``s`` bytes (the whole input) on ``topo``: the ring
    under each protocol, over all n ranks also across nodes (module docstring)."""
    return _ring(s, topo, ln, False)


def all_gather(s: float, topo: GroupTopology, ln: Links) -> Algorithms:
    """Seconds of an all_gather of ``s`` bytes (the whole output) on ``topo``: the same
    cost as reduce_scatter."""
    return _ring(s, topo, ln, False)


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
    return {"chain": lat + s / ring_bandwidth(topo, ln)}


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
