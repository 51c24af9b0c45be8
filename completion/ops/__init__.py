"""Op declarations. Importing this package registers every op type: the basic ops, the nn
ops (``nn``) and the collective / local ops of the reshard pass (``collective``)."""

# importing a module registers its ops (order matters only for grad ops reused by name)
from completion.ops import (  # noqa: F401
    basic,
    collective,
    elementwise,
    linalg,
    nn,
    optim,
    reduce,
    shape_ops,
)
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
