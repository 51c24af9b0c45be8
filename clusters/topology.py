"""Rank placement and rank-group classification.

Ranks are placed node-major, as torchrun and Megatron do: rank ``r`` lives on node
``r // devices_per_node`` at local index ``r % devices_per_node``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from numbers import Integral

from clusters.errors import CollectiveError


@dataclass(frozen=True)
class GroupTopology:
    """How a group of ranks sits on the nodes.

    ``ranks``: the group, in the given order; ``per_node``: node -> ranks of the group on
    it (sorted by node); ``single_node``: all on one node; ``spans_nodes``: the opposite;
    ``max_ranks_per_node`` / ``min_ranks_per_node``: the most / fewest group ranks on any
    node that holds at least one; ``uniform``: every such node holds the same number."""

    ranks: tuple[int, ...]
    per_node: tuple[tuple[int, tuple[int, ...]], ...]

    @property
    def size(self) -> int:
        """Ranks in the group."""
        return len(self.ranks)

    @property
    def nodes(self) -> tuple[int, ...]:
        """Node indices the group touches, in ``per_node`` order."""
        return tuple(n for n, _ in self.per_node)

    @property
    def num_nodes(self) -> int:
        """Number of nodes the group touches (N)."""
        return len(self.per_node)

    @property
    def single_node(self) -> bool:
        """True when every rank of the group is on one node."""
        return self.num_nodes == 1

    @property
    def spans_nodes(self) -> bool:
        """True when the group touches more than one node."""
        return self.num_nodes > 1

    @cached_property
    def ranks_per_node(self) -> dict[int, int]:
        """Node index -> number of group ranks on it (computed once: a group of a million
        ranks is asked for it by every collective of a table)."""
        return {n: len(rs) for n, rs in self.per_node}

    @cached_property
    def node_loads(self) -> tuple[int, ...]:
        """The distinct numbers of group ranks on a touched node, ascending: what a cost
        that is the worst over nodes depends on (one entry for a uniform group)."""
        return tuple(sorted(set(self.ranks_per_node.values())))

    @property
    def max_ranks_per_node(self) -> int:
        """k: the most group ranks on any one node."""
        return self.node_loads[-1]

    @property
    def min_ranks_per_node(self) -> int:
        """The fewest group ranks on any node the group touches."""
        return self.node_loads[0]

    @property
    def uniform(self) -> bool:
        """True when every touched node holds the same number of group ranks."""
        return self.max_ranks_per_node == self.min_ranks_per_node

    def describe(self) -> str:
        """One line, e.g. ``16 ranks on 2 nodes, 8 per node``."""
        if self.single_node:
            return f"{self.size} rank{'s' if self.size > 1 else ''} on 1 node"
        per = (
            f"{self.max_ranks_per_node} per node"
            if self.uniform
            else f"{self.min_ranks_per_node}..{self.max_ranks_per_node} per node"
        )
        return f"{self.size} ranks on {self.num_nodes} nodes, {per}"


def check_ranks(ranks: Iterable[int], world_size: int, cluster: str) -> tuple[int, ...]:
    """Validate a rank group: non-empty, ints, inside ``[0, world_size)``, no duplicates.
    Raises ``CollectiveError`` naming the offending rank."""
    try:
        group = tuple(ranks)
    except TypeError:
        raise CollectiveError(f"ranks must be a sequence of ints, got {ranks!r}") from None
    if not group:
        raise CollectiveError("ranks must name at least one rank, got an empty group")
    if all(type(r) is int for r in group) and len(set(group)) == len(group) \
            and 0 <= min(group) and max(group) < world_size:  # the common case, in C loops
        return group
    seen: set[int] = set()
    for r in group:
        if isinstance(r, bool) or not isinstance(r, Integral):
            raise CollectiveError(f"rank {r!r} is not an int")
        if not 0 <= r < world_size:
            raise CollectiveError(
                f"rank {r} is outside cluster {cluster!r} (world_size {world_size}, "
                f"ranks 0..{world_size - 1})"
            )
        if r in seen:
            raise CollectiveError(f"duplicate rank {r} in group {list(group)}")
        seen.add(int(r))
    return tuple(int(r) for r in group)


def classify(ranks: tuple[int, ...], devices_per_node: int) -> GroupTopology:
    """Group already-validated ``ranks`` by node (node = rank // devices_per_node)."""
    per: dict[int, list[int]] = {}
    for r in ranks:
        per.setdefault(r // devices_per_node, []).append(r)
    return GroupTopology(
        ranks=ranks, per_node=tuple((n, tuple(sorted(per[n]))) for n in sorted(per))
    )
