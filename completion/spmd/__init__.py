"""SPMD rules: sharding propagation through one op, in einsum notation.

``get_spmd_rule(op_type)`` returns the rule of any op type (by type, family, derived from
the forward op for a ``*_grad`` op, or the replicate-everything fallback with a warning).
A rule's ``infer_forward(inputs, attrs)`` / ``infer_reverse(outputs, attrs, inputs)`` take
:class:`DistTensor` values and return an :class:`SpmdResult` (required operand attrs,
result attrs). The merge itself is documented in :mod:`completion.spmd.core`.
"""

# importing the rule modules registers their rules
from completion.spmd import (  # noqa: E402,F401
    basic,
    collective,
    elementwise,
    linalg,
    moe,
    nn,
    optim,
    reduce,
    reshape,
    shape_ops,
)
from completion.spmd.core import (
    DistTensor,
    LetterPool,
    LinearGroup,
    Notation,
    SpmdResult,
    solve,
)
from completion.spmd.rule import (
    EinsumRule,
    FallbackRule,
    GradRule,
    SpmdRule,
    get_spmd_rule,
    register_spmd_rule,
    registered_keys,
)

__all__ = [
    "DistTensor",
    "EinsumRule",
    "FallbackRule",
    "GradRule",
    "LetterPool",
    "LinearGroup",
    "Notation",
    "SpmdResult",
    "SpmdRule",
    "get_spmd_rule",
    "register_spmd_rule",
    "registered_keys",
    "solve",
]
