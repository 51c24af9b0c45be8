"""Op declarations. Importing this package registers every op type: the basic ops, the nn
ops (``nn``) and the collective / local ops of the reshard pass (``collective``), and the
traits of the undeclared op types the models must recognise (``foreign``). Ask
:func:`get_opdef` for a declaration and :func:`op_traits` for an op type's traits."""

# importing a module registers its ops (order matters only for grad ops reused by name)
from completion.ops import (  # noqa: F401
    basic,
    collective,
    elementwise,
    foreign,
    linalg,
    moe,
    nn,
    optim,
    reduce,
    shape_ops,
)
from completion.ops.registry import (
    FOREIGN_TRAITS,
    OP_REGISTRY,
    UNKNOWN_TRAITS,
    KernelKind,
    OpDef,
    OpError,
    OpTraits,
    PatternRole,
    TensorType,
    canonical_type,
    get_opdef,
    op_traits,
    register_op,
    register_traits,
)

__all__ = ["FOREIGN_TRAITS", "OP_REGISTRY", "UNKNOWN_TRAITS", "KernelKind", "OpDef", "OpError",
           "OpTraits", "PatternRole", "TensorType", "canonical_type", "get_opdef", "op_traits",
           "register_op", "register_traits"]
