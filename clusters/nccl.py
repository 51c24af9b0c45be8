"""NCCL's protocols (LL, LL128, Simple) as its own cost model states them.

NCCL picks, per collective call, the algorithm and protocol its tuning model predicts
fastest: ``time = latency + bytes / bandwidth`` (NVIDIA/nccl 5067397c
``src/graph/tuning.cc``, ``ncclTopoGetAlgoTime``). A protocol trades latency for bandwidth:

* **LL** (low latency: 8-byte stores carrying a 4-byte flag): the lowest per-hop latency,
  half the link bandwidth (``busBw * .5`` for rings, ``/ 3.8`` for trees);
* **LL128** (128-byte lines with an 8-byte flag): 120/128 of the bandwidth
  (``busBw * 0.92`` for rings, ``7/9`` on one node and ``120/128`` across nodes for
  trees) at a middle latency;
* **Simple** (bulk copies with a flag per chunk): the whole bandwidth at the highest
  latency, so it wins for large messages.

The constants below are NCCL's, at commit 5067397c (``ncclTunerConstantsDefaults``, in
microseconds): ``baseLatencies`` (the fixed cost of one collective call) for the Ring and
Tree algorithms, ``hwLatencies`` per hop over NVLink and over the network (NET) for the
LL and LL128 protocols, and the network post overhead ``getNetOverhead`` (1 us on Intel
x86, 3x for Simple) that bounds an intra-node step of a ring spanning nodes from below.
Simple's per-hop latencies are the cluster YAML's ``node.intra_latency`` and
``cluster.inter_latency`` (NCCL's NVLink ring Simple 3.4 us; its NET ring Simple 9.6 us
in NCCL 2.7-2.17, 14 us from 2.18): the figures a cluster spec states and ``meshplan
calibrate`` measures. Not modelled: NCCL's per-architecture caps (``llMaxBws``,
``perChMax*Bws``: per-channel limits that need the channel count), the ring "plateau"
multiplier of multi-node all_reduce latency, CollNet (SHARP switches) and PAT (NCCL 2.23+
all_gather / reduce_scatter with one GPU per node).

A cluster whose ``node.collective_model`` is ``alpha-beta`` (a calibrated gloo host, or a
spec written before the field) runs only :data:`ALPHA_BETA`: Simple's hops and full
bandwidth with no fixed call latency -- the plain alpha-beta model that ``meshplan
calibrate`` fits.
"""

from __future__ import annotations

from dataclasses import dataclass

US = 1e-6


@dataclass(frozen=True)
class Protocol:
    """One NCCL protocol's latencies (seconds) and bandwidth factors.

    Attributes:
        name: ``LL``, ``LL128``, ``Simple`` (or ``alpha-beta``).
        ring_base / tree_base: fixed latency of one call with the Ring / Tree algorithm.
        nvlink_hop / net_hop: latency of one ring step over NVLink / the network; None:
            the cluster's ``intra_latency`` / ``inter_latency`` (Simple).
        tree_nvlink_hop / tree_net_hop: the same for the Tree algorithm (NCCL also charges
            the Tree network hop to rings with one rank per node); None: the cluster's.
        net_overhead: the network post overhead that bounds an intra-node ring step from
            below once the ring spans nodes (seconds).
        ring_bw: fraction of the link's bus bandwidth a ring moves with this protocol.
        tree_bw: the same for a Tree all_reduce across nodes (NCCL's ``busBw * .92`` and
            the protocol's factor).
    """

    name: str
    ring_base: float
    tree_base: float
    nvlink_hop: float | None
    net_hop: float | None
    tree_nvlink_hop: float | None
    tree_net_hop: float | None
    net_overhead: float
    ring_bw: float
    tree_bw: float

    def intra_hop(self, cluster_intra: float, spans_nodes: bool, tree: bool = False) -> float:
        """Seconds of one intra-node step: the protocol's NVLink hop (the cluster's for
        Simple), at least the network post overhead once the group spans nodes."""
        hop = self.tree_nvlink_hop if tree else self.nvlink_hop
        hop = cluster_intra if hop is None else hop
        return max(hop, self.net_overhead) if spans_nodes else hop

    def inter_hop(self, cluster_inter: float, tree: bool = False) -> float:
        """Seconds of one inter-node step (the cluster's ``inter_latency`` for Simple)."""
        hop = self.tree_net_hop if tree else self.net_hop
        return cluster_inter if hop is None else hop


#: NCCL 5067397c ``src/graph/tuning.cc`` ``ncclTunerConstantsDefaults`` (baseLatencies,
#: hwLatencies NVLINK / NET rows) and ``ncclTopoTuneModel``'s bandwidth refinements.
NCCL_PROTOCOLS: tuple[Protocol, ...] = (
    Protocol("LL", ring_base=6.6 * US, tree_base=6.8 * US, nvlink_hop=0.6 * US, net_hop=2.7 * US,
             tree_nvlink_hop=0.6 * US, tree_net_hop=5.0 * US, net_overhead=1.0 * US,
             ring_bw=0.5, tree_bw=0.92 / 3.8),
    Protocol("LL128", ring_base=14.0 * US, tree_base=14.0 * US, nvlink_hop=1.9 * US, net_hop=4.0 * US,
             tree_nvlink_hop=1.25 * US, tree_net_hop=8.5 * US, net_overhead=1.0 * US,
             ring_bw=0.92, tree_bw=0.92 * 120 / 128),
    Protocol("Simple", ring_base=8.4 * US, tree_base=8.4 * US, nvlink_hop=None, net_hop=None,
             tree_nvlink_hop=None, tree_net_hop=None, net_overhead=3.0 * US,
             ring_bw=1.0, tree_bw=0.92),
)

#: The plain alpha-beta model (``node.collective_model: alpha-beta``): the cluster's hops,
#: the whole bandwidth, no fixed call latency.
ALPHA_BETA: tuple[Protocol, ...] = (
    Protocol("alpha-beta", ring_base=0.0, tree_base=0.0, nvlink_hop=None, net_hop=None,
             tree_nvlink_hop=None, tree_net_hop=None, net_overhead=0.0, ring_bw=1.0, tree_bw=1.0),
)

#: NVLink SHARP (NVLS) all_reduce on one NVSwitch node: NCCL 5067397c hwLatencies NVLINK
#: NVLS Simple, 25 us, with baseLatencies NVLS 0 (``tuning.cc``).
NVLS_LATENCY = 25.0 * US

#: collective model name (``node.collective_model``) -> the protocols it runs
MODELS: dict[str, tuple[Protocol, ...]] = {"nccl": NCCL_PROTOCOLS, "alpha-beta": ALPHA_BETA}
