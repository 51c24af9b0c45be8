"""Conversion between meshplan's placements / process meshes and torch DTensor's.

``to_torch(placement)`` gives a ``torch.distributed.tensor`` placement (``Shard``,
``Replicate``, ``Partial``) and ``from_torch(p)`` the inverse; ``device_mesh_spec(mesh)``
describes the ``DeviceMesh`` a process mesh stands for (the arguments of
``torch.distributed.device_mesh.DeviceMesh(device_type, mesh, mesh_dim_names=...)``; a
DeviceMesh itself needs an initialised process group, so it is not built here).

DTensor's reduce ops (``torch/distributed/tensor/placement_types.py``, ``Partial.reduce_op``)
are ``sum``, ``avg``, ``max``, ``min`` (and ``product``, which meshplan does not model); torch
is imported only when a conversion runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.dist_attr import Partial, Placement, Replicate, Shard
from completion.errors import DistAttrError
from completion.mesh import ProcessMesh


def to_torch(p: Placement) -> Any:
    """The ``torch.distributed.tensor`` placement of ``p`` (``Shard(dim)``, ``Replicate()``,
    ``Partial(reduce_op)``). Raises DistAttrError for anything that is not a placement."""
    from torch.distributed.tensor import Partial as TPartial
    from torch.distributed.tensor import Replicate as TReplicate
    from torch.distributed.tensor import Shard as TShard

    if isinstance(p, Shard):
        return TShard(p.dim)
    if isinstance(p, Replicate):
        return TReplicate()
    if isinstance(p, Partial):
        return TPartial(p.reduce_type)
    raise DistAttrError(f"{p!r} is not a placement (Shard, Replicate or Partial)")


def from_torch(p: Any) -> Placement:
    """meshplan's placement for a ``torch.distributed.tensor`` placement. Raises
    DistAttrError for a kind meshplan does not model (``_StridedShard``, ``_MaskPartial``,
    a ``product`` Partial), naming it."""
    from torch.distributed.tensor import Partial as TPartial
    from torch.distributed.tensor import Replicate as TReplicate
    from torch.distributed.tensor import Shard as TShard

    kind = type(p)
    if kind is TShard:
        return Shard(p.dim)
    if kind is TReplicate:
        return Replicate()
    if kind is TPartial:
        return Partial(p.reduce_op)
    raise DistAttrError(f"DTensor placement {p!r} has no meshplan equivalent "
                        "(Shard, Replicate and Partial sum/avg/max/min are modelled)")


def placements_to_torch(ps: Sequence[Placement]) -> tuple[Any, ...]:
    """:func:`to_torch` of each placement (one per mesh dim)."""
    return tuple(to_torch(p) for p in ps)


def placements_from_torch(ps: Sequence[Any]) -> tuple[Placement, ...]:
    """:func:`from_torch` of each placement (one per mesh dim)."""
    return tuple(from_torch(p) for p in ps)


def device_mesh_spec(mesh: ProcessMesh, device_type: str = "cuda") -> dict[str, Any]:
    """The ``DeviceMesh`` arguments for ``mesh``: ``device_type``, ``mesh`` (the rank array as
    nested lists, shape ``mesh.shape``) and ``mesh_dim_names`` (None when the mesh has none),
    e.g. ``DeviceMesh(**device_mesh_spec(m))`` inside an initialised process group."""
    ranks: Any = list(mesh.process_ids)
    for n in reversed(mesh.shape[1:]):
        ranks = [ranks[i:i + n] for i in range(0, len(ranks), n)]
    return {"device_type": device_type, "mesh": ranks, "mesh_dim_names": tuple(mesh.dim_names)}
