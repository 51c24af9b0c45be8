"""Torch kernels of every op of the program layer, in a registry keyed by op type.

``get_kernel("matmul_grad")(ins, attrs, ctx) -> results``; see :mod:`executor.kernels.base`
for the calling convention. Importing this package registers every kernel.
"""

from executor.kernels import (  # noqa: E402,F401
    attention,
    elementwise,
    linalg,
    moe,
    nn,
    optim,
    reshard_local,
    shape,
)
from executor.kernels.base import (
    KERNELS,
    Kernel,
    KernelContext,
    KernelError,
    get_kernel,
    register_kernel,
    torch_dtype,
)

__all__ = ["KERNELS", "Kernel", "KernelContext", "KernelError", "get_kernel", "register_kernel",
           "torch_dtype"]
