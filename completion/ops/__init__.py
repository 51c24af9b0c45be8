"""Op declarations. Importing this package registers every op type."""

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
