"""Layouts with nested sharding: a process mesh plus one placement per mesh dim.

``TensorDistAttr`` allows one mesh dim per tensor dim. The reshard planner works on the
more general DTensor form: a tuple of ``Shard(d)`` / ``Replicate()`` / ``Partial(r)``, one
per mesh dim, where several mesh dims may shard the same tensor dim. Nesting order follows
torch DTensor: mesh dims sharding the same tensor dim nest in mesh-dim order, the lowest
mesh dim outermost. Tensor dim ``d`` of size ``D`` sharded by mesh dims ``m1 < m2`` is
first split into ``n_m1`` ceil-sized chunks (``shard_range``); the chunk at coordinate
``c[m1]`` is then split into ``n_m2`` ceil-sized chunks. Uneven sizes leave trailing ranks
with fewer (possibly zero) rows, exactly as ``torch.chunk`` does.

Partial mesh dims may mix ``sum`` and ``avg`` (both linear, so their order does not matter)
or repeat one of ``max`` / ``min``; mixing a non-linear type with any other type would make
the value depend on the reduction order and is rejected.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from completion.dist_attr import Partial, Placement, Replicate, Shard, TensorDistAttr, shard_range
from completion.errors import DistAttrError
from completion.mesh import ProcessMesh

LINEAR_REDUCE = frozenset({"sum", "avg"})


def partial_types_ok(placements: Sequence[Placement]) -> bool:
    """True when the partial reduce types can be combined in any order (see module doc)."""
    types = {p.reduce_type for p in placements if isinstance(p, Partial)}
    return types <= LINEAR_REDUCE or len(types) == 1


@dataclass(frozen=True)
class Layout:
    """A process mesh and one placement per mesh dim (nested sharding allowed).

    Args:
        mesh: the process mesh.
        placements: ``Shard(d)`` / ``Replicate()`` / ``Partial(r)`` per mesh dim.

    Raises:
        DistAttrError: wrong number of placements or an unknown placement object.
    """

    mesh: ProcessMesh
    placements: tuple[Placement, ...]

    def __post_init__(self) -> None:
        pl = tuple(self.placements)
        if len(pl) != self.mesh.ndim:
            raise DistAttrError(f"{len(pl)} placements given for a {self.mesh.ndim}-d mesh {list(self.mesh.shape)}")
        for m, p in enumerate(pl):
            if not isinstance(p, (Shard, Replicate, Partial)):
                raise DistAttrError(f"unknown placement {p!r} on mesh dim {m}")
        object.__setattr__(self, "placements", pl)

    @classmethod
    def of(cls, spec: Layout | TensorDistAttr) -> Layout:
        """A Layout from a Layout or a TensorDistAttr (via ``.placements``)."""
        if isinstance(spec, Layout):
            return spec
        if isinstance(spec, TensorDistAttr):
            return cls(spec.process_mesh, spec.placements)
        raise DistAttrError(f"expected a TensorDistAttr or Layout, got {type(spec).__name__}")

    def check(self, shape: Sequence[int]) -> None:
        """Raise DistAttrError when a Shard names a dim outside ``shape`` (negative dims
        must already be normalized) or the partial reduce types cannot be combined."""
        for m, p in enumerate(self.placements):
            if isinstance(p, Shard) and not 0 <= p.dim < len(shape):
                raise DistAttrError(
                    f"placement Shard({p.dim}) on mesh dim {m} but the tensor shape {list(shape)} "
                    f"has rank {len(shape)}"
                )
        if not partial_types_ok(self.placements):
            raise DistAttrError(
                f"placements {list(self.placements)} mix partial reduce types whose order matters"
            )

    def sharders(self, dim: int) -> list[int]:
        """Mesh dims sharding tensor ``dim``, outermost first (mesh-dim order)."""
        return [m for m, p in enumerate(self.placements) if isinstance(p, Shard) and p.dim == dim]

    def index_range(self, shape: Sequence[int], rank: int) -> tuple[tuple[int, int], ...]:
        """Per tensor dim, the ``[start, stop)`` of the global block that ``rank`` holds."""
        coord = self.mesh.coord(rank)
        out = []
        for d, size in enumerate(shape):
            start, length = 0, int(size)
            for m in self.sharders(d):
                a, b = shard_range(length, self.mesh.shape[m], coord[m])
                start, length = start + a, b - a
            out.append((start, start + length))
        return tuple(out)

    def local_shape(self, shape: Sequence[int], rank: int) -> tuple[int, ...]:
        """Shape of the block ``rank`` holds (partial dims do not change it)."""
        return tuple(b - a for a, b in self.index_range(shape, rank))

    def max_local_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """The largest block over ranks (iterated ceil): the padded size used on the wire."""
        return padded_local_shape(shape, self.mesh.shape, self.placements)

    def __repr__(self) -> str:
        return f"Layout(mesh={list(self.mesh.shape)}, placements={list(self.placements)})"


def padded_local_shape(
    shape: Sequence[int], mesh_shape: Sequence[int], placements: Sequence[Placement]
) -> tuple[int, ...]:
    """Iterated ceil split of ``shape`` by every Shard placement (largest local block)."""
    out = [int(s) for s in shape]
    for m, p in enumerate(placements):
        if isinstance(p, Shard):
            out[p.dim] = -(-out[p.dim] // mesh_shape[m])
    return tuple(out)


def numel(shape: Sequence[int]) -> int:
    """Number of elements of a tensor of ``shape`` (1 for a scalar ``()``)."""
    return math.prod(int(s) for s in shape)
