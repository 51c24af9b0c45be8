"""Op declarations. Importing this package registers every op type."""

# importing a module registers its ops (order matters only for grad ops reused by name)
from completion.ops import basic, elementwise, linalg, optim, reduce, shape_ops  # noqa: E402,F401
from completion.ops.registry import (
    OP_REGISTRY,
    OpDef,
    OpError,
    TensorType,
    canonical_type,
    get_opdef,
    register_op,
)

__all__ = ["OP_REGISTRY", "OpDef", "OpError", "TensorType", "canonical_type", "get_opdef", "register_op"]
from completion.ops import nn  # noqa: E402,F401  (registers the nn ops)
from completion.ops import collective  # noqa: E402,F401  (registers the reshard pass ops)
