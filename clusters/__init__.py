"""Cluster specs (a YAML catalog validated by pydantic), rank topology and an alpha-beta
collective cost model following nccl-tests' busbw conventions.

    >>> from clusters import load_cluster
    >>> c = load_cluster("dgx-a100-80g", num_nodes=2)
    >>> c.world_size
    16
"""

from __future__ import annotations

from clusters.catalog import CATALOG_DIR, catalog_spec, list_catalog, load_cluster
from clusters.cluster import Cluster
from clusters.collectives import BUSBW_FACTORS, COLLECTIVES, KINDS, Links
from clusters.errors import ClusterError, ClusterSpecError, CollectiveError, UnknownClusterError
from clusters.spec import ClusterSpec, DeviceSpec, NodeSpec, load_spec_file, parse_spec
from clusters.topology import GroupTopology

__all__ = [
    "BUSBW_FACTORS",
    "CATALOG_DIR",
    "COLLECTIVES",
    "KINDS",
    "Cluster",
    "ClusterError",
    "ClusterSpec",
    "ClusterSpecError",
    "CollectiveError",
    "DeviceSpec",
    "GroupTopology",
    "Links",
    "NodeSpec",
    "UnknownClusterError",
    "catalog_spec",
    "list_catalog",
    "load_cluster",
    "load_spec_file",
    "parse_spec",
]
