"""The op registry: every op type declares its operands, results, attributes and its
shape/dtype inference. Frontends, rules, cost models and kernels look ops up here by their
canonical type (``"matmul"``, ``"relu_grad"``, ``"sgd_"``, ``"reshard"``) instead of
branching on names."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from completion.errors import CompletionError


class OpError(CompletionError):
    """Bad op: unknown type, wrong operand count, or inconsistent shapes. Names the op."""


@dataclass(frozen=True)
class TensorType:
    """Static type of a value: global shape (ints, () for a scalar) and dtype name
    (``float32``, ``bfloat16``, ``float16``, ``int64``, ``int32``, ``bool``)."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))

    @property
    def ndim(self) -> int:
        """Number of dims."""
        return len(self.shape)

    @property
    def numel(self) -> int:
        """Number of elements (1 for a scalar)."""
        n = 1
        for s in self.shape:
            n *= s
        return n


# inference: (operand types (None for a null operand), attrs) -> result types (None = null)
InferFn = Callable[[Sequence[TensorType | None], dict[str, Any]], list[TensorType | None]]


@dataclass(frozen=True)
class OpDef:
    """Declaration of one op type.

    Attributes:
        name: canonical type without dialect prefix, e.g. ``"matmul"``.
        dialect: prefix used in PIR text: ``"pd_op"``, ``"builtin"`` or ``"dist_op"``.
        operands: operand names in order; a trailing ``"?"`` marks an optional operand that
            may be a null value (``<<NULL VALUE>>``).
        results: result names in order.
        attrs: attribute name -> default value (documentational and for builders).
        infer: shape/dtype inference; raises OpError naming the problem.
        family: a tag shared by ops handled alike (``"elementwise_unary"``, ``"matmul"``...),
            used by SPMD rules, cost and kernels when a per-type entry is absent.
        grad: the ``*_grad`` op type, if the op has one.
        variadic: operands may repeat (``concat``, ``add_n``).
        grad_inputs: operands of the ``grad`` op, each naming a forward operand
            (``"x"``), a forward result (``"out"``) or a result's gradient (``"out@GRAD"``),
            in Paddle's order, e.g. matmul: ``("x", "y", "out@GRAD")``, relu:
            ``("out", "out@GRAD")``. The grad op's results are the gradients of the forward
            operands, in operand order (null where no gradient is needed).
        attr_tags: attribute name -> PIR type tag printed before the value
            (``{"axis": "pd_op.IntArray"}`` prints ``axis:(pd_op.IntArray)[]``).
        internal_attrs: attributes used by inference/builders but not printed in PIR text
            (e.g. a parameter's ``shape``/``dtype``, which the text carries in its type).
        forward: for a ``*_grad`` op, the forward op type it differentiates.
        variadic_results: the last result repeats (``split``).
    """

    name: str
    dialect: str
    operands: tuple[str, ...]
    results: tuple[str, ...]
    infer: InferFn
    attrs: dict[str, Any] = field(default_factory=dict)
    family: str = ""
    grad: str | None = None
    variadic: bool = False
    grad_inputs: tuple[str, ...] = ()
    attr_tags: dict[str, str] = field(default_factory=dict)
    internal_attrs: tuple[str, ...] = ()
    forward: str | None = None
    variadic_results: bool = False


OP_REGISTRY: dict[str, OpDef] = {}


def register_op(opdef: OpDef) -> OpDef:
    """Add an op type to the registry. Raises OpError on a duplicate name."""
    if opdef.name in OP_REGISTRY:
        raise OpError(f"op type {opdef.name!r} is registered twice")
    OP_REGISTRY[opdef.name] = opdef
    return opdef


def get_opdef(name: str) -> OpDef | None:
    """The declaration of ``name`` (prefix such as ``pd_op.`` allowed), or None if unknown."""
    return OP_REGISTRY.get(canonical_type(name))


def canonical_type(name: str) -> str:
    """Strip a dialect prefix: ``pd_op.matmul`` -> ``matmul``."""
    return name.split(".", 1)[1] if "." in name else name
