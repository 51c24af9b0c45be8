"""Process meshes: N-d arrays of ranks (Paddle ``ProcessMesh``, torch ``DeviceMesh``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from numbers import Integral

from completion.errors import DistAttrError


def as_int(x: object, what: str) -> int:
    """``x`` as an int; DistAttrError naming ``what`` for a bool, a float (even 2.0), NaN,
    a string or None, rather than truncating it silently."""
    if type(x) is int:  # the common case, without the (slow) ABC check
        return x
    if isinstance(x, bool) or not isinstance(x, Integral):
        raise DistAttrError(f"{what} must be an integer, got {x!r}")
    return int(x)


def as_ints(xs: object, what: str) -> tuple[int, ...]:
    """A sequence of ints (see :func:`as_int`); DistAttrError naming ``what`` otherwise."""
    if type(xs) is tuple and all(type(x) is int for x in xs):
        return xs
    if isinstance(xs, (str, bytes)) or not isinstance(xs, Iterable):
        raise DistAttrError(f"{what} must be a sequence of integers, got {xs!r}")
    return tuple(as_int(x, f"{what} entry") for x in xs)


#: Most ranks a process mesh may have: 2**20, a cluster's rank limit
#: (``clusters.spec.MAX_WORLD_SIZE``); larger meshes are refused before any rank table is
#: built (``--dp 1000000000`` used to allocate until the kernel killed the process).
MAX_MESH_SIZE = 2**20


@dataclass(frozen=True)
class ProcessMesh:
    """An N-d array of ranks, stored row-major.

    Args:
        shape: mesh extent per mesh dim, e.g. ``(2, 4)`` for dp=2, tp=4.
        process_ids: the ranks in row-major order; ``len == prod(shape)``, no repeats.
        dim_names: optional names per mesh dim (default ``d0, d1, ...``). Names do not take
            part in equality: two meshes are equal when shape and ranks are.

    Raises:
        DistAttrError: empty or non-positive shape, wrong number of ranks, repeated or
            negative ranks, a rank of :data:`MAX_MESH_SIZE` or more, or a dim_names length
            that differs from the shape.
    """

    shape: tuple[int, ...]
    process_ids: tuple[int, ...]
    dim_names: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        shape = as_ints(self.shape, "process mesh shape")
        ids = as_ints(self.process_ids, "process mesh process_ids")
        if not shape or any(s <= 0 for s in shape):
            raise DistAttrError(f"process mesh shape {list(shape)} must be non-empty and positive")
        if len(ids) != math.prod(shape):
            raise DistAttrError(
                f"process mesh shape {list(shape)} needs {math.prod(shape)} process_ids, got {len(ids)}"
            )
        if len(set(ids)) != len(ids) or min(ids, default=0) < 0:
            raise DistAttrError(f"process mesh process_ids {list(ids)} must be distinct and >= 0")
        if max(ids, default=0) >= MAX_MESH_SIZE:  # no cluster has that rank
            raise DistAttrError(f"process mesh process id {max(ids)} is above the largest rank "
                                f"{MAX_MESH_SIZE - 1} (a cluster has at most {MAX_MESH_SIZE} ranks, "
                                f"completion.mesh.MAX_MESH_SIZE)")
        names = tuple(self.dim_names) or tuple(f"d{i}" for i in range(len(shape)))
        if len(names) != len(shape):
            raise DistAttrError(f"process mesh dim_names {list(names)} do not match shape {list(shape)}")
        if len(set(names)) != len(names):
            raise DistAttrError(f"process mesh dim_names {list(names)} repeat a name")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "process_ids", ids)
        object.__setattr__(self, "dim_names", names)
        object.__setattr__(self, "_hash", hash((shape, ids)))

    def __hash__(self) -> int:  # computed once: meshes key the cost model's caches
        return self._hash  # type: ignore[attr-defined]

    @classmethod
    def of(cls, *shape: int, start: int = 0, dim_names: tuple[str, ...] = ()) -> ProcessMesh:
        """A mesh of consecutive ranks ``start .. start+prod(shape)-1``. Raises
        DistAttrError for more than :data:`MAX_MESH_SIZE` ranks (before building them)."""
        n = math.prod(shape)
        if n > MAX_MESH_SIZE:
            raise DistAttrError(f"process mesh shape {list(shape)} has {n} ranks, above the limit "
                                f"of {MAX_MESH_SIZE} (completion.mesh.MAX_MESH_SIZE)")
        return cls(tuple(shape), tuple(range(start, start + n)), dim_names)

    @property
    def ndim(self) -> int:
        """Number of mesh dims."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of ranks in the mesh."""
        return len(self.process_ids)

    def dim_index(self, dim: int | str) -> int:
        """Mesh dim by index or name. Raises DistAttrError for a missing dim."""
        if isinstance(dim, str):
            if dim not in self.dim_names:
                raise DistAttrError(f"mesh has no dim named {dim!r} (dims: {list(self.dim_names)})")
            return self.dim_names.index(dim)
        if not -self.ndim <= dim < self.ndim:
            raise DistAttrError(f"mesh dim {dim} out of range for a {self.ndim}-d mesh")
        return dim % self.ndim

    def coord(self, rank: int) -> tuple[int, ...]:
        """Row-major coordinate of ``rank`` in the mesh. Raises DistAttrError if absent."""
        try:
            flat = self.process_ids.index(rank)
        except ValueError:
            raise DistAttrError(f"rank {rank} is not in mesh {list(self.process_ids)}") from None
        out = []
        for s in reversed(self.shape):
            out.append(flat % s)
            flat //= s
        return tuple(reversed(out))

    def rank_at(self, coord: tuple[int, ...]) -> int:
        """The rank at a mesh coordinate. Raises DistAttrError for a coordinate of the
        wrong length or outside the mesh."""
        coord = as_ints(coord, "mesh coordinate")
        if len(coord) != self.ndim or not all(
                0 <= c < s for c, s in zip(coord, self.shape, strict=True)):
            raise DistAttrError(f"coordinate {list(coord)} is outside mesh shape {list(self.shape)}")
        flat = 0
        for c, s in zip(coord, self.shape, strict=True):
            flat = flat * s + c
        return self.process_ids[flat]

    def groups(self, mesh_dim: int) -> list[tuple[int, ...]]:
        """The rank groups along ``mesh_dim``: one group per slice of the other mesh dims.

        E.g. mesh [[0,1],[2,3]]: dim 0 -> [(0,2),(1,3)], dim 1 -> [(0,1),(2,3)].
        """
        d = self.dim_index(mesh_dim)
        seen: dict[tuple[int, ...], list[int]] = {}
        for r in self.process_ids:
            c = self.coord(r)
            key = c[:d] + c[d + 1 :]
            seen.setdefault(key, []).append(r)
        return [tuple(g) for g in seen.values()]

    def group_of(self, rank: int, mesh_dim: int) -> tuple[int, ...]:
        """The group along ``mesh_dim`` that holds ``rank``."""
        c = list(self.coord(rank))
        d = self.dim_index(mesh_dim)
        out = []
        for i in range(self.shape[d]):
            c[d] = i
            out.append(self.rank_at(tuple(c)))
        return tuple(out)

    def submesh(self, mesh_dim: int, index: int) -> ProcessMesh:
        """The (N-1)-d mesh at ``index`` along ``mesh_dim`` (a pipeline stage's mesh)."""
        d = self.dim_index(mesh_dim)
        if not 0 <= index < self.shape[d]:
            raise DistAttrError(f"index {index} out of range for mesh dim {d} of size {self.shape[d]}")
        ranks = [r for r in self.process_ids if self.coord(r)[d] == index]
        shape = self.shape[:d] + self.shape[d + 1 :]
        names = self.dim_names[:d] + self.dim_names[d + 1 :]
        if not shape:
            shape, names = (1,), ("d0",)
        return ProcessMesh(shape, tuple(ranks), names)

    def __repr__(self) -> str:
        return f"ProcessMesh(shape={list(self.shape)}, process_ids={list(self.process_ids)})"
