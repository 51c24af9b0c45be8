"""Plain-data summaries of clusters, shared by ``meshplan clusters`` and the demo."""

from __future__ import annotations

from clusters.catalog import catalog_spec, list_catalog
from clusters.cluster import Cluster
from clusters.collectives import BUSBW_FACTORS, KINDS
from clusters.topology import GroupTopology

KIB = 1024
TABLE_SIZES: tuple[int, ...] = tuple(KIB * 4**i for i in range(11))
"""Message sizes of the collective table: 1 KiB, 4 KiB, ..., 1 GiB (bytes)."""


def catalog_rows() -> list[dict[str, object]]:
    """One row per catalog entry: name, device, devices per node, default nodes, text."""
    rows = []
    for name in list_catalog():
        s = catalog_spec(name)
        rows.append(
            {
                "name": name,
                "device": s.device.name,
                "devices_per_node": s.node.devices_per_node.value,
                "num_nodes": s.cluster.num_nodes.value,
                "description": s.description,
            }
        )
    return rows


def table_group_sizes(cluster: Cluster) -> list[int]:
    """Group sizes of the table: 2, one node, and the whole cluster (deduplicated,
    at most ``world_size``). For a DGX with N nodes: 2, 8, 8*N."""
    sizes = [2, cluster.devices_per_node, cluster.world_size]
    return sorted({g for g in sizes if 1 < g <= cluster.world_size})


def table_ranks(kind: str, group_size: int) -> list[int]:
    """The ranks a table row uses: ``0..g-1``; send_recv goes from rank 0 to rank g-1."""
    return [0, group_size - 1] if kind == "send_recv" else list(range(group_size))


def collective_rows(
    cluster: Cluster, sizes: tuple[int, ...] = TABLE_SIZES, group_sizes: list[int] | None = None
) -> list[dict[str, object]]:
    """Time (s), busbw (B/s) and chosen algorithm of every kind, size and group size."""
    rows = []
    groups: dict[tuple[int, int, int], GroupTopology] = {}
    for g in group_sizes or table_group_sizes(cluster):
        for kind in KINDS:
            ranks = table_ranks(kind, g)
            key = (ranks[0], ranks[-1], len(ranks))  # the table's groups are 0..g-1 or {0, g-1}
            group = groups.get(key) or groups.setdefault(key, cluster.group(ranks))  # once a group
            topo = group.describe()
            for s in sizes:
                algs = cluster.algorithms_on(kind, s, group)
                algo = min(algs, key=algs.__getitem__)
                t = algs[algo]
                rows.append(
                    {
                        "group_size": g,
                        "topology": topo,
                        "kind": kind,
                        "nbytes": s,
                        "algorithm": algo,
                        "time_s": t,
                        "busbw_Bps": s / t * BUSBW_FACTORS[kind](len(ranks)),
                    }
                )
    return rows
