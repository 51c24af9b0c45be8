"""completion: program IR, process meshes, dist attrs, SPMD rules, Completer, partition and
reshard passes. Knows nothing about time or hardware (see DESIGN.md)."""

from completion.dist_attr import (
    OperatorDistAttr,
    Partial,
    Replicate,
    Shard,
    TensorDistAttr,
    local_shape,
    max_local_shape,
    shard_range,
)
from completion.errors import CompletionError, DistAttrError
from completion.mesh import ProcessMesh

__all__ = [
    "CompletionError",
    "DistAttrError",
    "OperatorDistAttr",
    "Partial",
    "ProcessMesh",
    "Replicate",
    "Shard",
    "TensorDistAttr",
    "local_shape",
    "max_local_shape",
    "shard_range",
]
