"""Distributed attributes: dims_mapping + partial status, and the DTensor placement view.

Notation follows Paddle auto-parallel (``TensorDistAttr``: ``dims_mapping[i]`` is the mesh
dim that splits tensor dim ``i`` or -1) and torch DTensor (``Shard``, ``Replicate``,
``Partial`` per mesh dim).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from completion.errors import DistAttrError
from completion.mesh import ProcessMesh, as_int, as_ints

REDUCE_TYPES = ("sum", "avg", "max", "min")


def _norm_reduce(rt: str) -> str:
    r = str(rt).lower()
    if r == "mean":
        r = "avg"
    if r not in REDUCE_TYPES:
        raise DistAttrError(f"unknown reduce type {rt!r}; expected one of {list(REDUCE_TYPES)}")
    return r


@dataclass(frozen=True)
class Shard:
    """Placement: this mesh dim splits tensor dim ``dim`` (ceil-sized chunks). Prints as
    DTensor does: ``repr`` ``Shard(dim=1)``, ``str`` ``S(1)``; :mod:`completion.dtensor`
    converts to and from ``torch.distributed.tensor`` placements."""

    dim: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "dim", as_int(self.dim, "Shard dim"))

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim})"

    def __str__(self) -> str:
        return f"S({self.dim})"

    def is_shard(self, dim: int | None = None) -> bool:
        """True (for ``dim`` None or this placement's dim), as DTensor's ``is_shard``."""
        return dim is None or dim == self.dim

    def is_replicate(self) -> bool:
        return False

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return False


@dataclass(frozen=True)
class Replicate:
    """Placement: every rank along this mesh dim holds the whole tensor (``Replicate()``,
    ``R``)."""

    def __repr__(self) -> str:
        return "Replicate()"

    def __str__(self) -> str:
        return "R"

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return True

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return False


@dataclass(frozen=True)
class Partial:
    """Placement: ranks along this mesh dim hold partial values combined by ``reduce_type``
    (DTensor's ``reduce_op``; ``Partial(sum)``, ``P(sum)``)."""

    reduce_type: str = "sum"

    def __post_init__(self) -> None:
        object.__setattr__(self, "reduce_type", _norm_reduce(self.reduce_type))

    def __repr__(self) -> str:
        return f"Partial({self.reduce_type})"

    def __str__(self) -> str:
        return f"P({self.reduce_type})"

    @property
    def reduce_op(self) -> str:
        """DTensor's name of :attr:`reduce_type`."""
        return self.reduce_type

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return False

    def is_partial(self, reduce_op: str | None = None) -> bool:
        """True (for ``reduce_op`` None or this placement's reduce type, ``mean`` = ``avg``)."""
        return reduce_op is None or _norm_reduce(reduce_op) == self.reduce_type


Placement = Shard | Replicate | Partial



_SHARD_RE = re.compile(r"(?:S|Shard)\((?:dim\s*=\s*)?(-?\d+)\)")
_PARTIAL_RE = re.compile(r"(?:P|Partial)(?:\((?:reduce_op\s*=\s*)?['\"]?(\w*)['\"]?\))?")


def parse_placement(text: str | Placement) -> Placement:
    """One placement from its text, in DTensor's spelling or the short one.

    Accepted (spaces ignored): ``Shard(1)``, ``Shard(dim=1)``, ``S(1)``; ``Replicate()``,
    ``R``; ``Partial()``, ``Partial(sum)``, ``Partial("sum")``, ``Partial(reduce_op='sum')``,
    ``P``, ``P(sum)`` (reduce types sum, avg/mean, max, min). A placement object is returned
    as it is. Raises DistAttrError naming the text for anything else."""
    if isinstance(text, (Shard, Replicate, Partial)):
        return text
    s = str(text).replace(" ", "")
    if s in ("R", "Replicate()", "Replicate"):
        return Replicate()
    m = _SHARD_RE.fullmatch(s)
    if m:
        return Shard(int(m.group(1)))
    m = _PARTIAL_RE.fullmatch(s)
    if m:
        return Partial(m.group(1) or "sum")
    raise DistAttrError(f"placement {text!r} is not Shard(dim), Replicate() or Partial(reduce_type) "
                        f"(short forms S(dim), R, P(sum) also accepted)")


def parse_placements(text: str | Sequence[str | Placement]) -> tuple[Placement, ...]:
    """Placements from a list of texts, or from one text such as
    ``"[Shard(1), Replicate(), Partial(sum)]"`` (``repr`` of a placements list, as the
    reshard pass writes its ``placements`` attribute). Raises DistAttrError (see
    :func:`parse_placement`)."""
    if isinstance(text, str):
        body = text.strip()
        if body.startswith("[") or body.startswith("("):
            body = body[1:-1]
        items = [x for x in re.split(r",(?![^()]*\))", body) if x.strip()]
        return tuple(parse_placement(x) for x in items)
    return tuple(parse_placement(x) for x in text)


@dataclass(frozen=True)
class TensorDistAttr:
    """How one tensor is laid out on a process mesh. Frozen and hashable.

    Args:
        process_mesh: the mesh the tensor lives on.
        dims_mapping: per tensor dim, the mesh dim that splits it, or -1 (replicated).
            Length equals the tensor rank (checked by :meth:`check_shape`).
        partial: mesh dim -> reduce type ("sum", "avg", "max", "min"); a mapping or pairs.
        chunk_id: the pipeline chunk (virtual stage) the value belongs to.

    Raises:
        DistAttrError: an entry outside ``[-1, mesh.ndim)``, a mesh dim used twice, a
            partial mesh dim that also shards a tensor dim, or an unknown reduce type.
    """

    process_mesh: ProcessMesh
    dims_mapping: tuple[int, ...]
    partial: tuple[tuple[int, str], ...] = field(default=())
    chunk_id: int = 0

    def __init__(
        self,
        process_mesh: ProcessMesh,
        dims_mapping: Sequence[int],
        partial: Mapping[int, str] | Iterable[tuple[int, str]] | None = None,
        chunk_id: int = 0,
    ) -> None:
        if not isinstance(process_mesh, ProcessMesh):
            raise DistAttrError(f"process_mesh must be a ProcessMesh, got {type(process_mesh).__name__}")
        dm = as_ints(dims_mapping, "dims_mapping")
        items = partial.items() if isinstance(partial, Mapping) else (partial or ())
        pmap: dict[int, str] = {}
        for item in items:
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise DistAttrError(f"partial needs (mesh dim, reduce type) pairs, got {item!r}")
            pmap[as_int(item[0], "partial mesh dim")] = _norm_reduce(item[1])
        chunk_id = as_int(chunk_id, "chunk_id")
        if chunk_id < 0:
            raise DistAttrError(f"chunk_id must be >= 0, got {chunk_id}")
        ndim = process_mesh.ndim
        for d in dm:
            if not -1 <= d < ndim:
                raise DistAttrError(
                    f"dims_mapping {list(dm)} names mesh dim {d}, but the mesh "
                    f"{list(process_mesh.shape)} has dims 0..{ndim - 1}"
                )
        used = [d for d in dm if d >= 0]
        if len(used) != len(set(used)):
            raise DistAttrError(f"dims_mapping {list(dm)} uses a mesh dim more than once")
        for d in pmap:
            if not 0 <= d < ndim:
                raise DistAttrError(f"partial mesh dim {d} out of range for mesh {list(process_mesh.shape)}")
            if d in used:
                raise DistAttrError(f"mesh dim {d} is both sharding (dims_mapping {list(dm)}) and partial")
        object.__setattr__(self, "process_mesh", process_mesh)
        object.__setattr__(self, "dims_mapping", dm)
        object.__setattr__(self, "partial", tuple(sorted(pmap.items())))
        object.__setattr__(self, "chunk_id", int(chunk_id))
        object.__setattr__(self, "_hash", hash((process_mesh, dm, self.partial, self.chunk_id)))

    def __hash__(self) -> int:  # computed once: attrs key the cost model's caches
        return self._hash  # type: ignore[attr-defined]

    # -- views -------------------------------------------------------------------------
    @property
    def partial_dims(self) -> dict[int, str]:
        """Mesh dim -> reduce type for every partial mesh dim."""
        return dict(self.partial)

    def is_partial(self) -> bool:
        """True when some mesh dim holds a pending reduction (Partial)."""
        return bool(self.partial)

    def is_replicated(self) -> bool:
        """True when no tensor dim is sharded and nothing is partial (all Replicate)."""
        return not self.partial and all(d == -1 for d in self.dims_mapping)

    @property
    def placements(self) -> tuple[Placement, ...]:
        """The DTensor view: one placement per mesh dim."""
        out: list[Placement] = []
        pd = self.partial_dims
        for m in range(self.process_mesh.ndim):
            if m in self.dims_mapping:
                out.append(Shard(self.dims_mapping.index(m)))
            elif m in pd:
                out.append(Partial(pd[m]))
            else:
                out.append(Replicate())
        return tuple(out)

    @classmethod
    def from_placements(
        cls, process_mesh: ProcessMesh, placements: Sequence[Placement], ndim: int, chunk_id: int = 0
    ) -> TensorDistAttr:
        """Build from one placement per mesh dim for a tensor of rank ``ndim``.

        Raises DistAttrError for a wrong number of placements, a Shard dim outside the
        tensor, or two mesh dims sharding one tensor dim (not expressible as dims_mapping).
        """
        if len(placements) != process_mesh.ndim:
            raise DistAttrError(
                f"{len(placements)} placements given for a {process_mesh.ndim}-d mesh"
            )
        dm = [-1] * ndim
        partial = {}
        for m, p in enumerate(placements):
            if isinstance(p, Shard):
                d = p.dim + ndim if p.dim < 0 else p.dim
                if not 0 <= d < ndim:
                    raise DistAttrError(f"Shard({p.dim}) on mesh dim {m} but the tensor has rank {ndim}")
                if dm[d] != -1:
                    raise DistAttrError(f"tensor dim {d} is sharded by mesh dims {dm[d]} and {m}")
                dm[d] = m
            elif isinstance(p, Partial):
                partial[m] = p.reduce_type
            elif not isinstance(p, Replicate):
                raise DistAttrError(f"unknown placement {p!r} on mesh dim {m}")
        return cls(process_mesh, dm, partial, chunk_id)

    @classmethod
    def replicated(cls, process_mesh: ProcessMesh, ndim: int, chunk_id: int = 0) -> TensorDistAttr:
        """A fully replicated attr for a tensor of rank ``ndim`` on ``process_mesh``."""
        return cls(process_mesh, [-1] * ndim, None, chunk_id)

    def replace(self, **kw: Any) -> TensorDistAttr:
        """A copy with some fields changed (process_mesh, dims_mapping, partial, chunk_id)."""
        args: dict[str, Any] = {
            "process_mesh": self.process_mesh,
            "dims_mapping": self.dims_mapping,
            "partial": self.partial_dims,
            "chunk_id": self.chunk_id,
        }
        unknown = sorted(set(kw) - set(args))
        if unknown:
            raise DistAttrError(f"TensorDistAttr has no field(s) {unknown}; known: {sorted(args)}")
        args.update(kw)
        return TensorDistAttr(**args)

    def check_shape(self, shape: Sequence[int], what: str = "value") -> None:
        """Raise DistAttrError if ``dims_mapping`` does not have one entry per dim of ``shape``."""
        if len(shape) != len(self.dims_mapping):
            raise DistAttrError(
                f"{what}: dims_mapping {list(self.dims_mapping)} has {len(self.dims_mapping)} "
                f"entries but the tensor shape {list(shape)} has rank {len(shape)}"
            )

    def local_shape(self, shape: Sequence[int], rank: int) -> tuple[int, ...]:
        """Per-rank shape of a global ``shape`` on ``rank`` (see :func:`local_shape`)."""
        return local_shape(shape, self, rank)

    def __repr__(self) -> str:
        p = f", partial={self.partial_dims}" if self.partial else ""
        c = f", chunk_id={self.chunk_id}" if self.chunk_id else ""
        return f"TensorDistAttr(mesh={list(self.process_mesh.shape)}, dims_mapping={list(self.dims_mapping)}{p}{c})"


def shard_range(size: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of chunk ``index`` when ``size`` is split in ``parts`` ceil-sized chunks.

    Matches ``torch.chunk`` / DTensor: chunk = ceil(size/parts); trailing ranks may get fewer
    rows or zero rows. E.g. size 5 over 4 parts -> 2, 2, 1, 0.
    """
    size, parts, index = as_int(size, "size"), as_int(parts, "parts"), as_int(index, "index")
    if parts <= 0:
        raise DistAttrError(f"cannot split into {parts} parts")
    if size < 0 or not 0 <= index < parts:
        raise DistAttrError(f"shard_range: size {size} must be >= 0 and index {index} in 0..{parts - 1}")
    chunk = -(-size // parts)
    start = min(size, index * chunk)
    stop = min(size, start + chunk)
    return start, stop


def local_shape(shape: Sequence[int], attr: TensorDistAttr, rank: int) -> tuple[int, ...]:
    """Shape that ``rank`` holds of a tensor with global ``shape`` under ``attr``.

    Uneven splits use ceil-sized chunks (a rank may hold zero rows). Partial dims do not
    change the shape. Raises DistAttrError if the rank is not in the mesh or the ranks differ.
    """
    attr.check_shape(shape)
    return _local_shape(tuple(int(s) for s in shape), attr, rank)


@lru_cache(maxsize=1 << 16)
def _local_shape(shape: tuple[int, ...], attr: TensorDistAttr, rank: int) -> tuple[int, ...]:
    """:func:`local_shape` of a checked shape (cached: the cost model asks for the same
    (shape, layout, rank) for every identical layer and every phase)."""
    mesh = attr.process_mesh
    coord = mesh.coord(rank)
    out = []
    for size, m in zip(shape, attr.dims_mapping, strict=True):
        if m < 0:
            out.append(size)
        else:
            a, b = shard_range(size, mesh.shape[m], coord[m])
            out.append(b - a)
    return tuple(out)


def max_local_shape(shape: Sequence[int], attr: TensorDistAttr) -> tuple[int, ...]:
    """The largest per-rank shape (ceil chunks): what padding on the wire uses."""
    attr.check_shape(shape)
    return tuple(
        int(s) if m < 0 else -(-int(s) // attr.process_mesh.shape[m])
        for s, m in zip(shape, attr.dims_mapping, strict=True)
    )


@dataclass(frozen=True)
class OperatorDistAttr:
    """The layout an op needs for each operand and gives each result.

    ``operands`` / ``results`` hold one ``TensorDistAttr`` or ``None`` (a null value) per
    operand / result, in order.
    """

    process_mesh: ProcessMesh
    operands: tuple[TensorDistAttr | None, ...] = ()
    results: tuple[TensorDistAttr | None, ...] = ()
    chunk_id: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "operands", tuple(self.operands))
        object.__setattr__(self, "results", tuple(self.results))
