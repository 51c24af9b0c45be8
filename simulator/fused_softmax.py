"""When Megatron's fused softmax kernel runs: its shape rule, from the framework's code.

``FusedScaleMaskSoftmax`` (microsoft/Megatron-DeepSpeed f4157bea
``megatron/model/fused_softmax.py``; Megatron-LM keeps the same rule) runs its CUDA kernel
only for some score shapes and otherwise falls back to PyTorch's softmax
(``forward_torch_softmax``). ``simulator.fusion`` fuses the ``scale_mask_softmax`` group
only where :func:`softmax_kernel_available` holds; the fallback's kernels are the profile's
eager implementation (``simulator.eager_ops``, ``megatron-torch-softmax``).
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.errors import SimulatorError

#: the longest key sequence Megatron's fused softmax kernels take (microsoft/Megatron-DeepSpeed
#: f4157bea ``megatron/model/fused_softmax.py`` ``is_kernel_available``: ``16 < sk <= 4096``;
#: Megatron-LM's is the same at d98e8a64 ``megatron/core/fusions/fused_softmax.py``)
SOFTMAX_MAX_KEYS = 4096
#: threads per block of Megatron's fused softmax kernels (``scaled_masked_softmax.h``
#: ``get_batch_per_block``: ``constexpr int threads_per_block = 128``)
SOFTMAX_BLOCK_THREADS = 128
#: CUDA warp size (``C10_WARP_SIZE``)
WARP = 32


def softmax_batch_per_block(sk: int) -> int:
    """Rows of attention scores one thread block of Megatron's fused softmax handles, for
    key length ``sk`` (Megatron-DeepSpeed f4157bea ``megatron/fused_kernels/
    scaled_masked_softmax.h`` ``get_batch_per_block``): the keys rounded up to a power of
    two ``n``; a warp of ``min(n, 32)`` threads takes 2 rows when ``n <= 128``, else 1; a
    block has 128 threads. E.g. ``sk = 1024``: 4 warps of 32, one row each -> 4. Raises
    ValueError for ``sk < 1``."""
    if sk < 1:
        raise SimulatorError(f"softmax_batch_per_block: key length must be >= 1, got {sk}")
    n = 1 << (sk - 1).bit_length()
    warp = min(n, WARP)
    return (SOFTMAX_BLOCK_THREADS // warp) * (2 if n <= 128 else 1)


def softmax_kernel_available(shape: Sequence[int], dtype: str, causal: bool = True) -> bool:
    """Whether Megatron's ``FusedScaleMaskSoftmax`` runs its fused kernel on scores of local
    shape ``[b, heads, sq, sk]`` in ``dtype`` (Megatron-DeepSpeed f4157bea
    ``megatron/model/fused_softmax.py`` ``is_kernel_available``): 16-bit input,
    ``16 < sk <= 4096``, ``sq`` and ``sk`` multiples of 4, ``b * heads`` a multiple of 4, and
    ``b * heads`` (causal) or ``sq`` (padding mask) a multiple of
    :func:`softmax_batch_per_block`. E.g. one sequence of 1,024 tokens over 2 heads (16
    heads at tp 8): ``b * heads = 2`` -> False, the PyTorch fallback. Other ranks (not 4
    dims) -> False."""
    if len(shape) != 4 or dtype not in ("float16", "bfloat16"):
        return False
    b, heads, sq, sk = (int(d) for d in shape)
    batches = b * heads
    if not (16 < sk <= SOFTMAX_MAX_KEYS and sq % 4 == 0 and sk % 4 == 0 and batches % 4 == 0):
        return False
    return (batches if causal else sq) % softmax_batch_per_block(sk) == 0


__all__ = ["SOFTMAX_BLOCK_THREADS", "SOFTMAX_MAX_KEYS", "WARP", "softmax_batch_per_block",
           "softmax_kernel_available"]
