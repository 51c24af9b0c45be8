"""A memo of a cluster's cost queries for the step model: ``collective_time`` and
``p2p_time`` are pure functions of their arguments (``clusters.Cluster``), and a step asks
the same ones many times (every bucket, block and virtual stage; every candidate of a
search on the same cluster), at about 80 us each.

:func:`memoised` returns, per cluster object, one :class:`ClusterMemo` that answers those
two queries from a dict and forwards every other attribute to the cluster."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class ClusterMemo:
    """``cluster`` with ``collective_time`` / ``p2p_time`` answered once per distinct
    argument tuple (ranks as a tuple); errors are raised by the cluster as before (they
    are not cached). Other attributes are the cluster's."""

    def __init__(self, cluster: Any) -> None:
        self._cluster = cluster
        self._coll: dict[tuple, float] = {}
        self._p2p: dict[tuple, float] = {}

    def collective_time(self, kind: str, nbytes: float, ranks: Iterable[int]) -> float:
        """``cluster.collective_time(kind, nbytes, ranks)``, memoised."""
        key = (kind, nbytes, tuple(ranks))
        t = self._coll.get(key)
        if t is None:
            if len(self._coll) >= _MAX:
                self._coll.clear()
            t = self._coll[key] = self._cluster.collective_time(kind, nbytes, key[2])
        return t

    def p2p_time(self, nbytes: float, src: int, dst: int) -> float:
        """``cluster.p2p_time(nbytes, src, dst)``, memoised."""
        key = (nbytes, src, dst)
        t = self._p2p.get(key)
        if t is None:
            if len(self._p2p) >= _MAX:
                self._p2p.clear()
            t = self._p2p[key] = self._cluster.p2p_time(nbytes, src, dst)
        return t

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)


_MAX = 1 << 16
_MEMOS: dict[int, tuple[Any, ClusterMemo]] = {}


def memoised(cluster: Any) -> Any:
    """The :class:`ClusterMemo` of ``cluster`` (one per cluster object, kept while the
    process lives, at most 64 clusters); ``cluster`` itself when it is None or already a
    memo."""
    if cluster is None or isinstance(cluster, ClusterMemo):
        return cluster
    hit = _MEMOS.get(id(cluster))
    if hit is not None and hit[0] is cluster:
        return hit[1]
    if len(_MEMOS) >= 64:
        _MEMOS.pop(next(iter(_MEMOS)))
    memo = ClusterMemo(cluster)
    _MEMOS[id(cluster)] = (cluster, memo)
    return memo


__all__ = ["ClusterMemo", "memoised"]
