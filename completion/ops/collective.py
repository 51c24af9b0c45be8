"""Ops the reshard pass emits (dialect ``dist_op``): collectives, p2p and local steps.

Values keep their global type; what changes is the layout (the result's dist attr, or the
``placements`` attr when the layout nests two mesh dims on one tensor dim). Attributes:
``mesh_dim``, ``groups`` (one rank group per slice of the other mesh dims), ``nbytes``
(per-rank buffer, nccl-tests convention, padded for uneven splits), ``reduce_type``,
``src_dim`` / ``dst_dim`` (tensor dims), ``factor`` (local_scale), ``pairs`` (send/recv
``[src_rank, dst_rank]``) and ``placements`` (the layout after the step, DTensor notation).

``local_slice`` and ``local_scale`` are named apart from ``pd_op.slice`` / ``pd_op.scale``:
they act per rank on the local block (each rank keeps a different range), not on the
global value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.ops.declare import defop
from completion.ops.registry import OpError, TensorType
from completion.ops.shapes import need

T = Sequence[TensorType | None]

COLLECTIVE_OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
LOCAL_OPS = ("local_slice", "zero_fill", "local_scale")
STEP_ATTRS = {"mesh_dim": 0, "groups": [], "nbytes": 0, "placements": ""}


def _same(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    return [need(types, 0, "x")]


def _send(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    need(types, 0, "x")
    return []


def _recv(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    if types:
        raise OpError(f"recv takes no operands, got {len(types)}")
    return [TensorType(tuple(attrs.get("shape") or ()), str(attrs.get("dtype") or "float32"))]


for _name in COLLECTIVE_OPS:
    # a parameter all_gathered (ZeRO-3, sequence-parallel weights) is still that parameter
    defop(_name, ("x",), ("out",), _same, dialect="dist_op", family="collective",
          attrs={**STEP_ATTRS, "reduce_type": "sum", "src_dim": -1, "dst_dim": -1},
          weight_passthrough=_name == "all_gather")
for _name in LOCAL_OPS:
    defop(_name, ("x",), ("out",), _same, dialect="dist_op", family="reshard_local",
          attrs={**STEP_ATTRS, "src_dim": -1, "dst_dim": -1, "factor": 1.0})
defop("send", ("x",), (), _send, dialect="dist_op", family="p2p",
      attrs={"pairs": [], "nbytes": 0, "placements": ""})
defop("recv", (), ("out",), _recv, dialect="dist_op", family="p2p",
      attrs={"pairs": [], "nbytes": 0, "placements": "", "shape": [], "dtype": "float32"})
