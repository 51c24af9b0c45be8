"""Layout ops: reshape, transpose, split, concat, slice, squeeze, unsqueeze, expand.

Semantics follow Paddle: ``reshape`` shape entries 0 (copy the input dim) and one -1
(inferred); ``split`` ``num_or_sections`` an int (equal parts) or a list with at most one -1;
``slice`` clamps ``starts``/``ends`` like Python slicing; ``squeeze`` with an empty axis
removes every unit dim; ``expand`` broadcasts x to ``shape`` (right-aligned, an entry of
-1 keeps x's dim; x's dims of size 1 stretch, numpy's broadcasting), its grad sums the
gradient over the stretched dims (Paddle ``expand`` / ``expand_grad``, backward.yaml
``no_need_buffer: x``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from completion.ops.declare import defop
from completion.ops.registry import OpError, TensorType
from completion.ops.shapes import need, norm_axes, norm_axis

T = Sequence[TensorType | None]
IA = "pd_op.IntArray"


def _reshape(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    x = need(types, 0, "x")
    spec = [int(s) for s in attrs.get("shape") or []]
    out = [x.shape[i] if s == 0 and i < x.ndim else s for i, s in enumerate(spec)]
    if out.count(-1) > 1:
        raise OpError(f"shape {spec} has more than one -1")
    known = math.prod(s for s in out if s != -1)
    if -1 in out:
        if known == 0 or x.numel % known:
            raise OpError(f"cannot reshape {list(x.shape)} to {spec}")
        out[out.index(-1)] = x.numel // known
    elif math.prod(out) != x.numel:
        raise OpError(f"cannot reshape {list(x.shape)} ({x.numel} elements) to {spec}")
    return [TensorType(tuple(out), x.dtype)]


def _perm(attrs: dict[str, Any], ndim: int) -> list[int]:
    perm = [norm_axis(p, ndim, "perm entry") for p in attrs.get("perm") or []]
    if sorted(perm) != list(range(ndim)):
        raise OpError(f"perm {attrs.get('perm')} is not a permutation of {ndim} dims")
    return perm


def _transpose(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    x = need(types, 0, "x")
    return [TensorType(tuple(x.shape[p] for p in _perm(attrs, x.ndim)), x.dtype)]


def _transpose_grad(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    g = need(types, 0, "out@GRAD")
    perm = _perm(attrs, g.ndim)
    shape = [0] * g.ndim
    for i, p in enumerate(perm):
        shape[p] = g.shape[i]
    return [TensorType(tuple(shape), g.dtype)]


def split_sizes(size: int, sections: int | Sequence[int]) -> list[int]:
    """Part sizes of a dim of ``size`` split by ``num_or_sections``."""
    if isinstance(sections, int):
        if sections <= 0 or size % sections:
            raise OpError(f"cannot split a dim of {size} into {sections} equal parts")
        return [size // sections] * sections
    secs = [int(s) for s in sections]
    if secs.count(-1) > 1:
        raise OpError(f"sections {secs} have more than one -1")
    if -1 in secs:
        secs[secs.index(-1)] = size - sum(s for s in secs if s != -1)
    if sum(secs) != size or any(s < 0 for s in secs):
        raise OpError(f"sections {list(sections)} do not add up to the dim size {size}")
    return secs


def _split(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    x = need(types, 0, "x")
    ax = norm_axis(attrs.get("axis", 0), x.ndim)
    out = []
    for s in split_sizes(x.shape[ax], attrs.get("num_or_sections", 1)):
        shape = list(x.shape)
        shape[ax] = s
        out.append(TensorType(tuple(shape), x.dtype))
    return out


def _concat(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    if not types or any(t is None for t in types):
        raise OpError("needs at least one non-null operand")
    first = types[0]
    assert first is not None
    ax = norm_axis(attrs.get("axis", 0), first.ndim)
    total = 0
    for t in types:
        assert t is not None
        if t.ndim != first.ndim or any(
            a != b for i, (a, b) in enumerate(zip(t.shape, first.shape, strict=True)) if i != ax
        ):
            raise OpError(f"operands {list(first.shape)} and {list(t.shape)} differ off axis {ax}")
        total += t.shape[ax]
    shape = list(first.shape)
    shape[ax] = total
    return [TensorType(tuple(shape), first.dtype)]


def _slice(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    x = need(types, 0, "input")
    axes, starts, ends = (list(attrs.get(k) or []) for k in ("axes", "starts", "ends"))
    if not len(axes) == len(starts) == len(ends):
        raise OpError(f"axes {axes}, starts {starts}, ends {ends} differ in length")
    shape = list(x.shape)
    for a, s, e in zip(axes, starts, ends, strict=True):
        ax = norm_axis(a, x.ndim)
        shape[ax] = len(range(*slice(int(s), int(e)).indices(shape[ax])))
    dec = set(norm_axes(attrs.get("decrease_axis") or None, x.ndim)) if attrs.get("decrease_axis") else set()
    return [TensorType(tuple(s for i, s in enumerate(shape) if i not in dec), x.dtype)]


def _squeeze(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    x = need(types, 0, "x")
    axes = attrs.get("axis") or []
    drop = {i for i, s in enumerate(x.shape) if s == 1} if not axes else {
        a for a in norm_axes(axes, x.ndim) if x.shape[a] == 1
    }
    return [TensorType(tuple(s for i, s in enumerate(x.shape) if i not in drop), x.dtype)]


def _unsqueeze(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    x = need(types, 0, "x")
    shape = list(x.shape)
    for a in attrs.get("axis") or []:
        a = int(a)
        pos = a + len(shape) + 1 if a < 0 else a
        if not 0 <= pos <= len(shape):
            raise OpError(f"unsqueeze axis {a} out of range for rank {len(shape)}")
        shape.insert(pos, 1)
    return [TensorType(tuple(shape), x.dtype)]


def _expand(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    x = need(types, 0, "x")
    spec = [int(d) for d in attrs.get("shape") or []]
    if len(spec) < x.ndim:
        raise OpError(f"shape {spec} has fewer dims than x {list(x.shape)}")
    lead = len(spec) - x.ndim
    out = list(spec)
    for i, n in enumerate(x.shape):
        want = spec[lead + i]
        if want == -1:
            out[lead + i] = n
        elif n not in (1, want) and n != -1:
            raise OpError(f"cannot expand x {list(x.shape)} to {spec}: dim {i} is {n}, not 1 or {want}")
    if any(d < 1 for d in out[:lead]):
        raise OpError(f"shape {spec}: new leading dims must be positive")
    return [TensorType(tuple(out), x.dtype)]


def _split_grad(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    return _concat(types, attrs)


def _concat_grad(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    return list(types[:-1])


# reshape / squeeze / unsqueeze are views (no kernel); their grads reshape out@GRAD and read
# only the shape of x (backward.yaml no_need_buffer: x), as slice_grad reads only input's.
# The grad of a view launches no kernel either.
defop("reshape", ("x",), ("out",), _reshape, family="reshape",
      attrs={"shape": []}, attr_tags={"shape": IA}, kernel=None, view=True,
      weight_passthrough=True, pattern_role="passthrough",
      grad_inputs=("x", "out@GRAD"), no_need_buffer=("x",))
defop("transpose", ("x",), ("out",), _transpose, family="transpose",
      attrs={"perm": []}, weight_passthrough=True, pattern_role="passthrough",
      grad_inputs=("out@GRAD",), grad_infer=_transpose_grad)
defop("split", ("x",), ("out",), _split, family="split", variadic_results=True,
      attrs={"axis": 0, "num_or_sections": 1}, attr_tags={"axis": "Int32"},
      pattern_role="passthrough", grad_inputs=("out@GRAD",), grad_infer=_split_grad)
defop("concat", ("x",), ("out",), _concat, family="concat", variadic=True,
      attrs={"axis": 0}, attr_tags={"axis": "Int32"}, pattern_role="passthrough",
      grad_inputs=("x", "out@GRAD"), grad_infer=_concat_grad)
defop("slice", ("input",), ("out",), _slice, family="slice",
      attrs={"axes": [], "decrease_axis": [], "ends": [], "infer_flags": [], "starts": []},
      attr_tags={"ends": IA, "starts": IA}, grad_inputs=("input", "out@GRAD"),
      no_need_buffer=("input",))
defop("expand", ("x",), ("out",), _expand, family="expand", attrs={"shape": []},
      attr_tags={"shape": IA}, grad_inputs=("x", "out@GRAD"), no_need_buffer=("x",))
defop("squeeze", ("x",), ("out",), _squeeze, family="reshape",
      attrs={"axis": []}, attr_tags={"axis": IA}, kernel=None, view=True,
      grad_inputs=("x", "out@GRAD"), no_need_buffer=("x",))
defop("unsqueeze", ("x",), ("out",), _unsqueeze, family="reshape",
      attrs={"axis": []}, attr_tags={"axis": IA}, kernel=None, view=True,
      grad_inputs=("x", "out@GRAD"), no_need_buffer=("x",))
