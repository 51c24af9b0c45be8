"""Op signatures: the hashable, per-rank description of one op that the cost model reads.

Two ops with equal signatures cost the same, so the cost of the identical layers of a
transformer is computed once (``simulator.op_cost.op_cost`` caches by signature).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from completion.dist_attr import local_shape, max_local_shape
from completion.ir import Operation, OpRole, Value
from completion.ops.registry import get_opdef, op_traits
from simulator.types import Phase


@dataclass(frozen=True)
class TensorSig:
    """Local (per-rank) shape and dtype of one operand or result."""

    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class OpSig:
    """Hashable cost-relevant view of one op on one rank.

    Attributes:
        type: canonical op type (``matmul_grad``).
        ins / outs: local operand / result signatures (None for null values).
        attrs: scalar attributes as sorted (name, value) pairs.
        family: the op family from the op registry (fallback key of the cost registry).
        weights: per result of a grad op, True when it is a weight gradient (W phase).
        default_phase: phase of single-kernel ops: F (forward/loss), B or W (backward,
            W when every result is a weight gradient), O (optimizer).
    """

    type: str
    ins: tuple[TensorSig | None, ...]
    outs: tuple[TensorSig | None, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    family: str = ""
    weights: tuple[bool, ...] = ()
    default_phase: Phase = "F"

    def attr(self, name: str, default: Any = None) -> Any:
        """The scalar attribute ``name``, or ``default`` when the op has none."""
        for k, v in self.attrs:
            if k == name:
                return v
        return default

    def phase_of(self, result_index: int) -> Phase:
        """``"W"`` when result ``result_index`` is a weight gradient, else ``"B"``."""
        if result_index < len(self.weights) and self.weights[result_index]:
            return "W"
        return "B"


def _scalar_attrs(attrs: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    out = []
    for k, v in attrs.items():
        if isinstance(v, (bool, int, float, str)):
            out.append((k, v))
        elif isinstance(v, (list, tuple)) and all(isinstance(x, (bool, int, float, str)) for x in v):
            out.append((k, tuple(v)))
    return tuple(sorted(out))


def local_tensor(v: Value | None, rank: int | None) -> TensorSig | None:
    """Per-rank shape of ``v`` (the largest shard when ``rank`` is None or not on the
    value's mesh; the global shape when it has no dist attr)."""
    if v is None:
        return None
    attr = v.dist_attr
    if attr is None or len(attr.dims_mapping) != len(v.shape):
        return TensorSig(tuple(v.shape), v.dtype)
    if rank is not None and rank in attr.process_mesh.process_ids:
        return TensorSig(local_shape(v.shape, attr, rank), v.dtype)
    return TensorSig(max_local_shape(v.shape, attr), v.dtype)


def param_root(v: Value | None, alias_only: bool = False) -> Value | None:
    """The parameter that ``v`` is, or is a chain of up to 6 ops of, each read from its
    first operand, that a parameter passes through: ops whose traits have
    ``weight_passthrough`` (cast, reshard, transpose, reshape, all_gather, assign), or with
    ``alias_only`` only those with ``weight_alias`` (cast, reshard: the result is the
    parameter itself). None when ``v`` is not such a value."""
    for _ in range(6):
        if v is None:
            return None
        if v.is_parameter:
            return v
        op = v.op
        if op is None or not op.operands:
            return None
        t = op_traits(op.type)
        if not (t.weight_alias if alias_only else t.weight_passthrough):
            return None
        v = op.operands[0]
    return None


def is_weight(v: Value | None) -> bool:
    """True when ``v`` is a parameter, or seen through ``weight_passthrough`` ops (a cast,
    reshard, transpose or view of one)."""
    return param_root(v) is not None


def is_weight_grad(v: Value | None, param_names: frozenset[str]) -> bool:
    """True when ``v`` is named ``<parameter>@GRAD`` (optionally ``@RENAME@..``) or feeds
    only optimizer ops."""
    if v is None:
        return False
    if v.name and "@GRAD" in v.name and v.name.split("@GRAD", 1)[0] in param_names:
        return True
    return bool(v.uses) and all(o.role == OpRole.OPTIMIZE for o, _ in v.uses)


def grad_weights(op: Operation, param_names: frozenset[str]) -> tuple[bool, ...]:
    """Per result of backward op ``op``, whether it is a weight gradient: ``op_signature(op,
    ...).weights`` without the shapes (``param_names``: the program's parameter names)."""
    return _grad_weights(op, param_names)


def _grad_weights(op: Operation, param_names: frozenset[str]) -> tuple[bool, ...]:
    fwd = get_opdef(op.type[: -len("_grad")]) if op.type.endswith("_grad") else None
    flags = []
    for j, r in enumerate(op.results):
        w = is_weight_grad(r, param_names)
        if not w and fwd is not None and j < len(fwd.operands) and fwd.grad_inputs:
            name = fwd.operands[j].rstrip("?")
            if name in fwd.grad_inputs:
                idx = fwd.grad_inputs.index(name)
                w = idx < len(op.operands) and is_weight(op.operands[idx])
        flags.append(w)
    return tuple(flags)


def op_signature(op: Operation, rank: int | None = None,
                 param_names: Iterable[str] | None = None, global_shapes: bool = False) -> OpSig:
    """The signature of ``op`` as ``rank`` runs it (largest shard if ``rank`` is None;
    the unsharded shapes if ``global_shapes``).

    ``param_names``: names of the program's parameters (to recognise ``X@GRAD``); taken
    from ``op.program`` when omitted."""
    if param_names is None:
        prog = op.program
        param_names = [p.name for p in prog.parameters() if p.name] if prog is not None else []
    names = param_names if isinstance(param_names, frozenset) else frozenset(param_names)
    od = get_opdef(op.type)
    weights: tuple[bool, ...] = ()
    phase: Phase
    if op.role == OpRole.OPTIMIZE:
        phase = "O"
    elif op.role == OpRole.BACKWARD:
        weights = _grad_weights(op, names)
        res = [r for r in op.results if r is not None]
        phase = "W" if res and all(weights[j] for j, r in enumerate(op.results) if r is not None) else "B"
    else:
        phase = "F"
    def ts(v: Value | None) -> TensorSig | None:
        if v is None:
            return None
        return TensorSig(tuple(v.shape), v.dtype) if global_shapes else local_tensor(v, rank)

    return OpSig(
        type=op.type,
        ins=tuple(ts(v) for v in op.operands),
        outs=tuple(ts(v) for v in op.results),
        attrs=_scalar_attrs(op.attrs),
        family=od.family if od is not None else "",
        weights=weights,
        default_phase=phase,
    )
