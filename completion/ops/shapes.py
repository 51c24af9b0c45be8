"""Shape helpers shared by the op declarations: broadcasting, axis normalisation, matmul.

A dim of -1 is unknown (dynamic) and matches any size. Every helper raises
:class:`OpError` with a message naming the shapes at fault; the caller (``Program.add`` or
the PIR parser) prefixes the op and line.
"""

from __future__ import annotations

from collections.abc import Sequence

from completion.ops.registry import OpError, TensorType


def need(types: Sequence[TensorType | None], i: int, what: str) -> TensorType:
    """Operand ``i`` (named ``what``) or OpError if it is missing / null."""
    if i >= len(types) or types[i] is None:
        raise OpError(f"operand {i} ({what}) is missing")
    return types[i]  # type: ignore[return-value]


def count(types: Sequence[TensorType | None], n: int, names: Sequence[str]) -> None:
    """OpError unless exactly ``n`` operands were given."""
    if len(types) != n:
        raise OpError(f"expects {n} operands ({', '.join(names)}), got {len(types)}")


def broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """numpy broadcasting of two shapes (trailing dims aligned; 1 stretches; -1 unknown)."""
    out = []
    la, lb = len(a), len(b)
    for i in range(max(la, lb)):
        x = a[la - 1 - i] if i < la else 1
        y = b[lb - 1 - i] if i < lb else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        elif x == -1 or y == -1:
            out.append(max(x, y))
        else:
            raise OpError(f"shapes {list(a)} and {list(b)} do not broadcast (dim {x} vs {y})")
    return tuple(reversed(out))


def norm_axis(axis: int, ndim: int, what: str = "axis") -> int:
    """Normalise a possibly negative axis into ``[0, ndim)``; OpError when out of range."""
    a = int(axis)
    if not -max(ndim, 1) <= a < max(ndim, 1):
        raise OpError(f"{what} {axis} out of range for a tensor of rank {ndim}")
    return a % max(ndim, 1)


def norm_axes(axes: int | Sequence[int] | None, ndim: int) -> list[int]:
    """Normalise an axis list; ``None`` or ``[]`` means every axis. Repeats are an error."""
    if axes is None:
        return list(range(ndim))
    if isinstance(axes, int):
        axes = [axes]
    if len(axes) == 0:
        return list(range(ndim))
    out = [norm_axis(a, ndim) for a in axes]
    if len(set(out)) != len(out):
        raise OpError(f"axis {list(axes)} repeats an axis")
    return sorted(out)


def matmul_shape(
    x: Sequence[int], y: Sequence[int], transpose_x: bool = False, transpose_y: bool = False
) -> tuple[int, ...]:
    """Result shape of ``matmul(x, y)`` with numpy ``matmul`` semantics.

    A 1-d x is a row ``[1, K]`` and a 1-d y a column ``[K, 1]`` (the unit dim is dropped
    from the result); ``transpose_*`` swaps the last two dims of an operand of rank >= 2;
    the batch dims (all but the last two) broadcast. Source: ``numpy.matmul`` and Paddle's
    ``MatmulInferMeta``. Raises OpError when an operand is a scalar or the inner dims differ.
    """
    if len(x) == 0 or len(y) == 0:
        raise OpError(f"matmul needs operands of rank >= 1, got x {list(x)} and y {list(y)}")
    xs = [1, x[0]] if len(x) == 1 else list(x)
    ys = [y[0], 1] if len(y) == 1 else list(y)
    if transpose_x and len(x) > 1:
        xs[-2], xs[-1] = xs[-1], xs[-2]
    if transpose_y and len(y) > 1:
        ys[-2], ys[-1] = ys[-1], ys[-2]
    m, k = xs[-2], xs[-1]
    k2, n = ys[-2], ys[-1]
    if k != k2 and k != -1 and k2 != -1:
        raise OpError(
            f"inner dims differ: x {list(x)} (transpose_x={transpose_x}) has K={k} but "
            f"y {list(y)} (transpose_y={transpose_y}) has K={k2}"
        )
    batch = broadcast(xs[:-2], ys[:-2])
    out = list(batch)
    if len(x) > 1:
        out.append(m)
    if len(y) > 1:
        out.append(n)
    return tuple(out)


def same_type(types: Sequence[TensorType | None], what: str = "operands") -> TensorType:
    """The common type of several operands (all equal shape); OpError otherwise."""
    ts = [t for t in types if t is not None]
    if not ts:
        raise OpError(f"{what}: no operands")
    for t in ts[1:]:
        if len(t.shape) != len(ts[0].shape) or any(
            a != b and a != -1 and b != -1 for a, b in zip(t.shape, ts[0].shape, strict=True)
        ):
            raise OpError(f"{what} have different shapes {list(ts[0].shape)} and {list(t.shape)}")
    return ts[0]
