"""``Cluster``: a validated spec plus a node count; rank topology and collective costs."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from numbers import Real

from clusters.collectives import BUSBW_FACTORS, COLLECTIVES, KINDS, Links
from clusters.errors import ClusterError, CollectiveError
from clusters.spec import MAX_WORLD_SIZE, ClusterSpec, DeviceSpec, NodeSpec
from clusters.topology import GroupTopology, check_ranks, classify


def _check_nbytes(nbytes: float) -> float:
    if isinstance(nbytes, bool) or not isinstance(nbytes, Real) or not math.isfinite(nbytes):
        raise CollectiveError(f"nbytes must be a finite number of bytes, got {nbytes!r}")
    if nbytes < 0:
        raise CollectiveError(f"nbytes must be >= 0, got {nbytes}")
    return float(nbytes)


def _check_kind(kind: str) -> str:
    if kind not in COLLECTIVES:
        raise CollectiveError(
            f"unknown collective kind {kind!r}; expected one of {', '.join(KINDS)}"
        )
    return kind


@dataclass(frozen=True)
class Cluster:
    """``num_nodes`` nodes of ``spec.node`` (each ``devices_per_node`` ranks of
    ``spec.device``). Ranks are node-major: rank r is on node ``r // devices_per_node``.

    All times are seconds, all sizes bytes, bandwidths bytes/second. Formulas and their
    sources are in ``clusters.collectives``."""

    spec: ClusterSpec
    num_nodes: int

    def __post_init__(self) -> None:
        if (
            isinstance(self.num_nodes, bool)
            or not isinstance(self.num_nodes, int)
            or self.num_nodes < 1
        ):
            raise ClusterError(f"num_nodes must be an int >= 1, got {self.num_nodes!r}")
        if self.world_size > MAX_WORLD_SIZE:
            raise ClusterError(
                f"num_nodes {self.num_nodes} x {self.devices_per_node} devices per node = "
                f"{self.world_size} ranks exceeds the limit of {MAX_WORLD_SIZE}")

    # --- shape ---
    @property
    def name(self) -> str:
        """The spec's name (catalog entry or YAML ``name``)."""
        return self.spec.name

    @property
    def device(self) -> DeviceSpec:
        """The device spec (peak FLOP/s, memory bytes, memory bandwidth, efficiencies)."""
        return self.spec.device

    @property
    def node(self) -> NodeSpec:
        """The node spec (devices per node, intra-node bandwidth/latency, NICs)."""
        return self.spec.node

    @property
    def devices_per_node(self) -> int:
        """Devices (ranks) per node."""
        return self.spec.node.devices_per_node.value

    @property
    def world_size(self) -> int:
        """Total ranks: num_nodes * devices_per_node."""
        return self.num_nodes * self.devices_per_node

    @property
    def links(self) -> Links:
        """The per-rank link parameters (bytes/s, seconds) the collective cost model uses."""
        n = self.spec.node
        return Links(
            intra_bandwidth=n.intra_bandwidth.value,
            intra_latency=n.intra_latency.value,
            inter_latency=self.spec.cluster.inter_latency.value,
            nic_bandwidth=n.nic_bandwidth.value,
            nic_count=n.nic_count.value,
            devices_per_node=n.devices_per_node.value,
            model=n.collective_model.value if n.collective_model is not None else "alpha-beta",
            nvls_algbw=n.nvls_algbw.value if n.nvls_algbw is not None else 0.0,
        )

    # --- topology ---
    def _rank(self, rank: int) -> int:
        return check_ranks([rank], self.world_size, self.name)[0]

    def node_of(self, rank: int) -> int:
        """Node index of ``rank``; ``CollectiveError`` if it is outside the cluster."""
        return self._rank(rank) // self.devices_per_node

    def local_index(self, rank: int) -> int:
        """Index of ``rank`` within its node (0..devices_per_node-1)."""
        return self._rank(rank) % self.devices_per_node

    def group(self, ranks: Iterable[int]) -> GroupTopology:
        """Validate ``ranks`` (in the cluster, no duplicates, non-empty) and classify them:
        single node or spanning nodes, and how many ranks per node."""
        return classify(check_ranks(ranks, self.world_size, self.name), self.devices_per_node)

    # --- collective cost model ---
    def collective_algorithms(
        self, kind: str, nbytes: float, ranks: Iterable[int]
    ) -> dict[str, float]:
        """Time (s) of every candidate algorithm for ``kind`` on ``ranks`` (see
        ``clusters.collectives``). Empty for a group of one rank or ``nbytes == 0``.
        Raises ``CollectiveError`` for an unknown kind, bad ranks or ``nbytes < 0``."""
        _check_kind(kind)
        s = _check_nbytes(nbytes)
        return self.algorithms_on(kind, s, self.group(ranks))

    def algorithms_on(self, kind: str, nbytes: float, topo: GroupTopology) -> dict[str, float]:
        """:meth:`collective_algorithms` on a group already validated and classified
        (:meth:`group`): a table of many sizes on one group (``clusters.report``) checks
        its ranks once, not once per size (``clusters show --nodes 131072`` checked a
        million ranks 216 times). Raises CollectiveError for an unknown kind or a
        send_recv group of more than 2 ranks."""
        _check_kind(kind)
        s = _check_nbytes(nbytes)
        if kind == "send_recv" and topo.size > 2:
            raise CollectiveError(
                f"send_recv takes exactly 2 ranks (src, dst), got {topo.size}: {list(topo.ranks)}"
            )
        if topo.size == 1 or s == 0:
            return {}
        return COLLECTIVES[kind](s, topo, self.links)

    def collective_time(self, kind: str, nbytes: float, ranks: Iterable[int]) -> float:
        """Seconds for collective ``kind`` of an ``nbytes`` buffer (nccl-tests convention)
        over ``ranks``: the fastest candidate algorithm. 0 for one rank or 0 bytes.
        Raises ``CollectiveError`` (a ``ValueError``) naming a bad kind, rank or nbytes."""
        return min(self.collective_algorithms(kind, nbytes, ranks).values(), default=0.0)

    def busbw(self, kind: str, nbytes: float, ranks: Iterable[int]) -> float:
        """nccl-tests bus bandwidth in B/s: ``nbytes / collective_time * factor(n)``
        (factors in ``clusters.collectives.BUSBW_FACTORS``). 0.0 when the time is 0."""
        group = list(ranks)
        t = self.collective_time(kind, nbytes, group)
        return 0.0 if t == 0 else nbytes / t * BUSBW_FACTORS[kind](len(group))

    def p2p_time(self, nbytes: float, src: int, dst: int) -> float:
        """Seconds to send ``nbytes`` from rank ``src`` to rank ``dst``: ``a_i + S/B_i`` on
        one node, ``a_n + S/NIC(1)`` across nodes, 0 if ``src == dst``."""
        if self._rank(src) == self._rank(dst):
            _check_nbytes(nbytes)
            return 0.0
        return self.collective_time("send_recv", nbytes, (src, dst))

    def describe(self) -> dict[str, object]:
        """Topology summary as plain data (for ``meshplan clusters show --json``)."""
        n = self.spec.node
        return {
            "name": self.name,
            "num_nodes": self.num_nodes,
            "devices_per_node": self.devices_per_node,
            "world_size": self.world_size,
            "intra_bandwidth_Bps": n.intra_bandwidth.value,
            "intra_latency_s": n.intra_latency.value,
            "nic_count": n.nic_count.value,
            "nic_bandwidth_Bps": n.nic_bandwidth.value,
            "inter_latency_s": self.spec.cluster.inter_latency.value,
            "collective_model": self.links.model,
            "nvls_algbw_Bps": self.links.nvls_algbw,
        }
