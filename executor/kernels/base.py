"""Kernel registry: op type -> torch kernel, and the context a kernel receives.

A kernel is ``fn(ins, attrs, ctx) -> list[Tensor | None]``:

- ``ins``: the op's operand tensors in the order its ``OpDef`` declares them
  (``completion/ops/*.py``), ``None`` for a null operand (``<<NULL VALUE>>``);
- ``attrs``: the op's attributes (declaration defaults filled in);
- ``ctx``: :class:`KernelContext` with the *local* result types (shapes after sharding,
  which attributes such as ``reshape``'s ``shape`` still state globally) and the global
  offset of each operand's local block (vocab-parallel embedding needs it).

It returns one entry per declared result (``None`` where a result is not produced). The
executor drops results whose program value is null, so a grad kernel may compute a gradient
nobody reads. Kernels never modify their inputs except the optimizer ops, whose results alias
their ``param``/state operands exactly as Paddle's in-place ``*_`` ops do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from completion.ops.registry import TensorType, canonical_type
from executor.errors import ExecutorError


class KernelError(ExecutorError, ValueError):
    """No kernel for an op type, or a kernel refused its inputs; names the op."""


TORCH_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32,
    "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}  # fmt: skip


def torch_dtype(name: str | None, default: torch.dtype = torch.float32) -> torch.dtype:
    """The torch dtype of a dtype name (``"undefined"``/None -> ``default``).

    Raises KernelError for an unknown name."""
    if name in (None, "", "undefined"):
        return default
    if name not in TORCH_DTYPES:
        raise KernelError(f"unknown dtype {name!r}; expected one of {sorted(TORCH_DTYPES)}")
    return TORCH_DTYPES[str(name)]


@dataclass(frozen=True)
class KernelContext:
    """What a kernel knows besides its operands and attributes.

    Attributes:
        out_types: local type of each result (None for a null result); empty when the
            caller does not know them (kernels then derive shapes from their inputs).
        in_offsets: per operand, the global index where its local block starts on each
            tensor dim (None or empty = starts at 0 everywhere).
        device: where ``full``-like kernels allocate.
        generator: random source for ``dropout`` (None = a generator seeded by ``seed``).
        group: for reshard-pass ops, the rank group (mesh ranks) this rank belongs to.
        rank: this rank's id in the program's mesh (the id ``group`` uses).
        in_global: per operand its global (unsharded) shape, or None; kernels whose result
            depends on a global extent (``mean_grad`` divides by the global count of the
            reduced elements) read it.
        comm: ``comm(tensor, operand, dim, reduce_type) -> tensor`` all-reduces ``tensor``
            over the ranks that shard tensor dim ``dim`` of operand ``operand``, or with
            ``reduce_type="gather"`` all-gathers their blocks along ``dim`` (None: not
            sharded / single process). Kernels whose SPMD rule keeps a reduction inside
            the op (vocab-parallel cross entropy) call it through :meth:`all_reduce_over`.
        want: result indices the caller needs (None = all); a kernel may skip the others
            and return None for them (the executor splits ``matmul_grad`` into its
            input-gradient part B and weight-gradient part W this way).
    """

    out_types: tuple[TensorType | None, ...] = ()
    in_offsets: tuple[tuple[int, ...] | None, ...] = ()
    device: torch.device | str = "cpu"
    generator: torch.Generator | None = None
    group: tuple[int, ...] | None = None
    rank: int | None = None
    want: tuple[int, ...] | None = None
    in_global: tuple[tuple[int, ...] | None, ...] = ()
    comm: Callable[..., Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def out_shape(self, i: int, fallback: Sequence[int] | None = None) -> tuple[int, ...]:
        """Local shape of result ``i``; ``fallback`` when unknown. Raises KernelError if
        neither is available."""
        if i < len(self.out_types) and self.out_types[i] is not None:
            return tuple(self.out_types[i].shape)  # type: ignore[union-attr]
        if fallback is None:
            raise KernelError(f"the local shape of result {i} is needed but not given")
        return tuple(int(s) for s in fallback)

    def global_shape(self, operand: int, local: Sequence[int]) -> tuple[int, ...]:
        """Global shape of operand ``operand`` (its local shape when unknown)."""
        if operand < len(self.in_global) and self.in_global[operand] is not None:
            return tuple(self.in_global[operand])  # type: ignore[arg-type]
        return tuple(int(s) for s in local)

    def all_reduce_over(self, t: Any, operand: int, dim: int, reduce_type: str) -> Any:
        """``t`` reduced over the ranks sharding ``dim`` of ``operand`` (identity when
        there is no communicator)."""
        return t if self.comm is None else self.comm(t, operand, dim, reduce_type)

    def wants(self, i: int) -> bool:
        """Whether result ``i`` is needed."""
        return self.want is None or i in self.want

    def group_index(self, op: str) -> tuple[int, int]:
        """(position of this rank in its group, group size); KernelError if unknown."""
        if self.group is None or self.rank is None or self.rank not in self.group:
            raise KernelError(f"{op}: needs the rank's group (group={self.group}, rank={self.rank})")
        return self.group.index(self.rank), len(self.group)

    def offset(self, operand: int, dim: int) -> int:
        """Global start of operand ``operand``'s local block on tensor dim ``dim``."""
        if operand < len(self.in_offsets):
            off = self.in_offsets[operand]
            if off:
                return int(off[dim])
        return 0


Tensor = torch.Tensor
Ins = Sequence["Tensor | None"]
Kernel = Callable[[Ins, Mapping[str, Any], KernelContext], list["Tensor | None"]]

KERNELS: dict[str, Kernel] = {}


def register_kernel(*names: str) -> Callable[[Kernel], Kernel]:
    """Decorator: register ``fn`` as the kernel of every op type in ``names``.

    Raises KernelError when a type already has a kernel."""

    def deco(fn: Kernel) -> Kernel:
        for n in names:
            if n in KERNELS:
                raise KernelError(f"op type {n!r} has two kernels")
            KERNELS[n] = fn
        return fn

    return deco


def get_kernel(op_type: str) -> Kernel:
    """The kernel of ``op_type`` (dialect prefix allowed). Raises KernelError naming the
    type when none is registered."""
    k = KERNELS.get(canonical_type(op_type))
    if k is None:
        raise KernelError(f"no torch kernel for op type {op_type!r}")
    return k


def need(ins: Ins, i: int, op: str, what: str) -> Tensor:
    """Operand ``i`` or a KernelError naming the op and operand."""
    if i >= len(ins) or ins[i] is None:
        raise KernelError(f"{op}: operand {i} ({what}) is required")
    return ins[i]  # type: ignore[return-value]


def norm_axes(axis: Any, ndim: int) -> list[int]:
    """Axis attribute (int, list, empty = all) -> sorted non-negative axes."""
    if axis is None or (isinstance(axis, (list, tuple)) and len(axis) == 0):
        return list(range(ndim))
    axes = [axis] if isinstance(axis, int) else list(axis)
    return sorted({int(a) + ndim if int(a) < 0 else int(a) for a in axes})


def unbroadcast(g: Tensor, shape: Sequence[int]) -> Tensor:
    """Sum ``g`` over the dims numpy broadcasting added or stretched to reach its shape,
    giving a tensor of ``shape`` (the gradient of a broadcast operand)."""
    shape = tuple(shape)
    lead = g.ndim - len(shape)
    if lead > 0:
        g = g.sum(dim=tuple(range(lead)))
    dims = tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1)
    if dims:
        g = g.sum(dim=dims, keepdim=True)
    return g.reshape(shape)
