"""Conversion between meshplan's placements / process meshes and torch DTensor's.

``to_torch(placement)`` gives a ``torch.distributed.tensor`` placement (``Shard``,
``Replicate``, ``Partial``) and ``from_torch(p)`` the inverse; ``device_mesh_spec(mesh)``
describes the ``DeviceMesh`` a process mesh stands for (the arguments of
``torch.distributed.device_mesh.DeviceMesh(device_type, mesh, mesh_dim_names=...)``; a
DeviceMesh itself needs an initialised process group, so it is not built here);
``process_mesh_of(device_mesh)`` reads a real DeviceMesh back. A whole layout converts too:
``dist_attr_to_torch(attr)`` gives (DeviceMesh arguments, placements) and
``dist_attr_from_torch(device_mesh, placements, ndim)`` the TensorDistAttr, e.g. of a
``DTensor``'s ``device_mesh`` and ``placements``.

DTensor's reduce ops (``torch/distributed/tensor/placement_types.py``, ``Partial.reduce_op``)
are ``sum``, ``avg``, ``max``, ``min`` (and ``product``, which meshplan does not model); torch
is imported only when a conversion runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.dist_attr import Partial, Placement, Replicate, Shard, TensorDistAttr
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


def process_mesh_of(device_mesh: Any) -> ProcessMesh:
    """The ProcessMesh of a ``torch.distributed.device_mesh.DeviceMesh`` (or any object with
    its ``mesh`` rank tensor and ``mesh_dim_names``): shape ``tuple(mesh.shape)``, the ranks
    row-major, the dim names (``d0, d1, ...`` when it has none). The inverse of
    :func:`device_mesh_spec`. Raises DistAttrError for a rank array ProcessMesh refuses."""
    ranks = device_mesh.mesh
    names = getattr(device_mesh, "mesh_dim_names", None)
    return ProcessMesh(tuple(int(n) for n in ranks.shape),
                       tuple(int(r) for r in ranks.flatten().tolist()),
                       tuple(names) if names else ())


def dist_attr_to_torch(attr: TensorDistAttr, device_type: str = "cuda") -> tuple[dict[str, Any],
                                                                                tuple[Any, ...]]:
    """``(device_mesh_spec(attr.process_mesh), placements)``: what ``distribute_tensor(t,
    DeviceMesh(**spec), placements)`` needs to lay a tensor out as ``attr`` says (one
    placement per mesh dim, :attr:`TensorDistAttr.placements`)."""
    return device_mesh_spec(attr.process_mesh, device_type), placements_to_torch(attr.placements)


def dist_attr_from_torch(device_mesh: Any, placements: Sequence[Any], ndim: int,
                         chunk_id: int = 0) -> TensorDistAttr:
    """The TensorDistAttr of a DTensor layout: its DeviceMesh, its placements (one per mesh
    dim) and the tensor's rank ``ndim``. Raises DistAttrError for a placement meshplan does
    not model (:func:`from_torch`) or one it cannot express as a dims_mapping (two mesh dims
    sharding one tensor dim, a Shard dim outside the tensor)."""
    mesh = process_mesh_of(device_mesh)
    return TensorDistAttr.from_placements(mesh, placements_from_torch(placements), ndim, chunk_id)
