"""The reshape rule (``reshape``, ``squeeze``, ``unsqueeze`` and their grads).

The input and output shapes are cut into the smallest groups of dims with equal products
(``[12, 8] -> [16, 6]`` is one group; ``[b, s, h] -> [b, s, n, d]`` is ``b|s|h->n,d``).
A group keeps a sharding only on its leading dim: the leading input dim's mesh dim passes
to the leading output dim. For a group of more than one dim this is exact only when both
leading dims divide by the mesh dim size (contiguous row-major blocks then coincide);
otherwise, and for a sharded non-leading dim, the input is required replicated there
(reference case 1: mesh [4], ``[12, 8]`` S(1) reshaped to ``[16, 6]`` -> x replicated; an
all_gather, never a silently wrong S(0)). Partial inputs pass (reshape is linear).

Source: the same rule as torch DTensor's view-op propagation (``_view_ops.py``) and
Paddle's ``ReshapeInferSpmd``; written from their documented behaviour.
"""

from __future__ import annotations

from collections.abc import Sequence

from completion.dist_attr import TensorDistAttr
from completion.mesh import ProcessMesh
from completion.ops.registry import OpDef
from completion.spmd.core import DistTensor, SpmdResult, pick_mesh
from completion.spmd.rule import SpmdRule, register_spmd_rule

Group = tuple[list[int], list[int]]


def reshape_groups(a: Sequence[int], b: Sequence[int]) -> list[Group] | None:
    """Groups of dims of ``a`` and ``b`` with equal products (unit dims alone), or None
    when a dim is unknown (-1) / zero or the products differ."""
    if any(s <= 0 for s in list(a) + list(b)):
        return None
    i = j = 0
    out: list[Group] = []
    while i < len(a) or j < len(b):
        if i < len(a) and a[i] == 1 and (j >= len(b) or b[j] != 1):
            out.append(([i], []))
            i += 1
            continue
        if j < len(b) and b[j] == 1 and (i >= len(a) or a[i] != 1):
            out.append(([], [j]))
            j += 1
            continue
        if i >= len(a) or j >= len(b):
            return None
        gi, gj, pa, pb = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(a):
                gi.append(i)
                pa *= a[i]
                i += 1
            elif pb < pa and j < len(b):
                gj.append(j)
                pb *= b[j]
                j += 1
            else:
                return None
        out.append((gi, gj))
    return out


def reshape_layout(a: Sequence[int], b: Sequence[int], sources: list[tuple[str, tuple[int, ...]]],
                   mesh: ProcessMesh) -> tuple[list[int], list[int], set[int]]:
    """Merge proposals (``("in", dims_mapping)`` / ``("out", dims_mapping)`` in priority
    order) into (required input dims_mapping, output dims_mapping, used mesh dims)."""
    req, res, used = [-1] * len(a), [-1] * len(b), set()
    groups = reshape_groups(a, b) or []
    for gi, gj in groups:
        if not gi or not gj:
            continue
        a0, b0 = gi[0], gj[0]
        if a[a0] == 1 or b[b0] == 1:
            continue
        for side, dm in sources:
            m = dm[a0] if side == "in" else dm[b0]
            if m < 0 or m in used:
                continue
            n = mesh.shape[m]
            if (len(gi) > 1 or len(gj) > 1) and (a[a0] % n or b[b0] % n):
                continue
            req[a0], res[b0] = m, m
            used.add(m)
            break
    return req, res, used


class ReshapeRule(SpmdRule):
    """Rule of the ``reshape`` family (module docstring)."""

    def infer(self, inputs, outputs, attrs, mesh=None):
        mesh = mesh or pick_mesh(inputs, outputs)
        x = inputs[0]
        out = outputs[0] if outputs else None
        if x is None:
            return SpmdResult((None,), (None,))
        out_shape = out.shape if out is not None else self.result_shapes(inputs, attrs)[0]
        return self._solve(x, out, out_shape, mesh, 0)

    @staticmethod
    def _solve(x: DistTensor, out: DistTensor | None, out_shape: tuple[int, ...],
               mesh: ProcessMesh, x_index: int, extra: int = 0) -> SpmdResult:
        srcs = []
        if x.attr is not None:
            srcs.append((-x.priority, 0, "in", x.attr.dims_mapping))
        if out is not None and out.attr is not None:
            srcs.append((-out.priority, 1, "out", out.attr.dims_mapping))
        srcs.sort(key=lambda s: s[:2])
        req, res, used = reshape_layout(x.shape, out_shape, [(s[2], s[3]) for s in srcs], mesh)
        part = {m: r for m, r in (x.attr.partial if x.attr else ()) if m not in used}
        xa = TensorDistAttr(mesh, req, part)
        ra = TensorDistAttr(mesh, res, part)
        ops: list[TensorDistAttr | None] = [None] * extra + [xa]
        return SpmdResult(tuple(ops), (ra,))

    def grad_rule(self, op_type: str, grad_def: OpDef, forward_def: OpDef) -> SpmdRule:
        return ReshapeGradRule(op_type)


class ReshapeGradRule(SpmdRule):
    """``reshape_grad(x, out@GRAD) -> x@GRAD``: a reshape of out@GRAD to x's shape; x is
    read for its shape only (its attr is left as it is)."""

    attrs_for_null_results = True

    def infer(self, inputs, outputs, attrs, mesh=None):
        mesh = mesh or pick_mesh(inputs, outputs)
        x, g = inputs[0], inputs[1] if len(inputs) > 1 else None
        out = outputs[0] if outputs else None
        if g is None or x is None:
            return SpmdResult(tuple(None for _ in inputs), tuple(None for _ in outputs))
        res = ReshapeRule._solve(g, out, x.shape, mesh, 1, extra=1)
        xa = x.attr if x.attr is not None and x.attr.process_mesh == mesh else res.results[0]
        return SpmdResult((xa, res.operands[1]), res.results)


def _factory(op_type: str) -> SpmdRule:
    return ReshapeRule(op_type)


register_spmd_rule("reshape", _factory, einsum=False)

