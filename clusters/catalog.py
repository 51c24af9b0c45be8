"""The built-in catalog (``clusters/catalog/*.yaml``) and ``load_cluster``."""

from __future__ import annotations

from pathlib import Path

from clusters.cluster import Cluster
from clusters.errors import UnknownClusterError
from clusters.spec import ClusterSpec, load_spec_file

CATALOG_DIR = Path(__file__).resolve().parent / "catalog"


def list_catalog() -> list[str]:
    """Names of the built-in clusters, sorted."""
    return sorted(p.stem for p in CATALOG_DIR.glob("*.yaml"))


def catalog_spec(name: str) -> ClusterSpec:
    """The validated spec of catalog entry ``name``; ``UnknownClusterError`` if none."""
    path = CATALOG_DIR / f"{name}.yaml"
    if not path.is_file():
        what = "a directory, not a cluster YAML file," if name and Path(name).is_dir() else "not a file"
        raise UnknownClusterError(
            f"unknown cluster {name!r}: {what} and not in the catalog "
            f"({', '.join(list_catalog())})"
        )
    return load_spec_file(path)


def load_cluster(name_or_path: str | Path, num_nodes: int | None = None) -> Cluster:
    """A ``Cluster`` from a catalog name (``dgx-a100-80g``) or a YAML file path.

    ``num_nodes`` overrides the spec's ``cluster.num_nodes``. Raises
    ``UnknownClusterError`` for an unknown name, ``ClusterSpecError`` for a bad file and
    ``ClusterError`` for ``num_nodes < 1`` -- all one-line ``ValueError``s."""
    text = str(name_or_path)
    path = Path(text)
    looks_like_path = path.suffix in (".yaml", ".yml") or "/" in text or path.is_file()
    spec = load_spec_file(path) if looks_like_path else catalog_spec(text)
    nodes = spec.cluster.num_nodes.value if num_nodes is None else num_nodes
    return Cluster(spec, nodes)
