"""SPMD rules checked against an independent numpy execution.

For random layouts, each rank runs the op with numpy on its local block of every operand
(laid out as the rule requires; a kept Partial operand gets a random split that reduces to
the true value), then the per-rank results are combined as the rule's result attr says
(Partial mesh dims reduced by their type, Shard dims compared block by block) and must equal
numpy's result on the global arrays. Integer-valued data makes sum/max exact."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import completion.ops  # noqa: F401
from completion.dist_attr import TensorDistAttr, shard_range
from completion.mesh import ProcessMesh
from completion.spmd import DistTensor, get_spmd_rule

MESHES = [ProcessMesh.of(2), ProcessMesh.of(4), ProcessMesh.of(3), ProcessMesh.of(2, 2)]
REDUCE = {"sum": np.sum, "avg": np.mean, "max": np.max, "min": np.min}


def block(arr: np.ndarray, attr: TensorDistAttr, rank: int) -> np.ndarray:
    mesh, c = attr.process_mesh, attr.process_mesh.coord(rank)
    idx = tuple(slice(None) if m < 0 else slice(*shard_range(n, mesh.shape[m], c[m]))
                for n, m in zip(arr.shape, attr.dims_mapping, strict=True))
    return arr[idx]


def split(g: np.ndarray, n: int, t: str, rng: np.random.Generator) -> list[np.ndarray]:
    """``n`` arrays that reduce by ``t`` to ``g``."""
    if t in ("sum", "avg"):
        total = g * (n if t == "avg" else 1)
        parts = [rng.integers(-5, 6, g.shape).astype(float) for _ in range(n - 1)]
        return parts + [total - sum(parts, np.zeros_like(g))]
    sign = -1 if t == "max" else 1
    parts = [g + sign * rng.integers(0, 4, g.shape) for _ in range(n)]
    parts[int(rng.integers(0, n))] = g.copy()
    return parts


def distribute(arr: np.ndarray, attr: TensorDistAttr, rng: np.random.Generator) -> dict[int, np.ndarray]:
    """Per-rank local arrays. Each Partial mesh dim splits the global value into parts
    (nested for several); a rank holds its block of the part its coordinates select, so
    ranks along a Replicate mesh dim hold identical data."""
    mesh = attr.process_mesh
    parts = {(): arr.astype(float)}
    for m, t in attr.partial:
        parts = {key + (k,): piece for key, g in parts.items()
                 for k, piece in enumerate(split(g, mesh.shape[m], t, rng))}
    pdims = [m for m, _ in attr.partial]
    plain = TensorDistAttr(mesh, attr.dims_mapping)
    return {r: block(parts[tuple(mesh.coord(r)[m] for m in pdims)], plain, r) for r in mesh.process_ids}


def check(attr: TensorDistAttr, local: dict[int, np.ndarray], expected: np.ndarray) -> None:
    mesh = attr.process_mesh
    vals = dict(local)
    for m, t in reversed(attr.partial):  # innermost split first (see distribute)
        vals = {r: REDUCE[t](np.stack([vals[g] for g in mesh.group_of(r, m)]), axis=0)
                for r in mesh.process_ids}
    plain = TensorDistAttr(mesh, attr.dims_mapping)
    for r in mesh.process_ids:
        np.testing.assert_allclose(vals[r], block(np.asarray(expected, float), plain, r), rtol=1e-9, atol=1e-9)


def run_op(op: str, arrays: list[np.ndarray], attrs_in: list[TensorDistAttr], attrs: dict,
           fn, rng: np.random.Generator, local_fn=None) -> TensorDistAttr:
    """Run ``op`` per rank (``local_fn(rank, result_attr, *locals)`` when the local kernel
    differs from the global one, e.g. a reshape to the local shape) and check."""
    ins = [DistTensor(a.shape, t) for a, t in zip(arrays, attrs_in, strict=True)]
    res = get_spmd_rule(op).infer_forward(ins, attrs)
    for a, req in zip(arrays, res.operands, strict=True):
        req.check_shape(a.shape)
    mesh = res.results[0].process_mesh
    locs = [distribute(a, req, rng) for a, req in zip(arrays, res.operands, strict=True)]
    expected = fn(*arrays)
    if local_fn is None:
        out = {r: fn(*[lc[r] for lc in locs]) for r in mesh.process_ids}
    else:
        out = {r: local_fn(r, res.results[0], expected, *[lc[r] for lc in locs]) for r in mesh.process_ids}
    check(res.results[0], out, expected)
    return res.results[0]


@st.composite
def layout(draw, ndim: int, mesh: ProcessMesh, allow_partial: bool = True) -> TensorDistAttr:
    dims = list(range(mesh.ndim))
    dm = []
    for _ in range(ndim):
        m = draw(st.sampled_from([-1] + dims))
        dm.append(m)
        if m >= 0:
            dims.remove(m)
    part = {}
    if allow_partial:
        for m in dims:
            if draw(st.booleans()):
                part[m] = draw(st.sampled_from(["sum", "avg", "max"]))
    return TensorDistAttr(mesh, dm, part)


SIZES = st.sampled_from([1, 2, 3, 4, 6])


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_matmul_numeric(data):
    mesh = data.draw(st.sampled_from(MESHES))
    b, m, k, n = (data.draw(SIZES) for _ in range(4))
    tx, ty = data.draw(st.booleans()), data.draw(st.booleans())
    rng = np.random.default_rng(0)
    xs = (b, k, m) if tx else (b, m, k)
    ys = (n, k) if ty else (k, n)
    x, y = rng.integers(-3, 4, xs).astype(float), rng.integers(-3, 4, ys).astype(float)

    def fn(a, c):
        return np.matmul(np.swapaxes(a, -1, -2) if tx else a, c.T if ty else c)

    run_op("matmul", [x, y], [data.draw(layout(3, mesh)), data.draw(layout(2, mesh))],
           {"transpose_x": tx, "transpose_y": ty}, fn, rng)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), op=st.sampled_from(["add", "subtract", "multiply"]))
def test_elementwise_broadcast_numeric(data, op):
    mesh = data.draw(st.sampled_from(MESHES))
    shape = tuple(data.draw(SIZES) for _ in range(3))
    yshape = tuple(1 if data.draw(st.booleans()) else s for s in shape[data.draw(st.integers(0, 2)):])
    rng = np.random.default_rng(1)
    x, y = rng.integers(-3, 4, shape).astype(float), rng.integers(-3, 4, yshape).astype(float)
    fn = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply}[op]
    run_op(op, [x, y], [data.draw(layout(3, mesh)), data.draw(layout(len(yshape), mesh))], {}, fn, rng)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), op=st.sampled_from(["sum", "mean", "max"]), keep=st.booleans())
def test_reduce_numeric(data, op, keep):
    mesh = data.draw(st.sampled_from(MESHES))
    shape = tuple(data.draw(SIZES) for _ in range(3))
    axes = data.draw(st.lists(st.integers(0, 2), unique=True, max_size=3))
    rng = np.random.default_rng(2)
    x = rng.integers(-3, 4, shape).astype(float)
    ax = tuple(axes) if axes else None

    def fn(a):
        if op == "max":
            return np.max(a, axis=ax, keepdims=keep, initial=-np.inf)
        return (np.sum if op == "sum" else np.mean)(a, axis=ax, keepdims=keep)

    run_op(op, [x], [data.draw(layout(3, mesh))], {"axis": axes, "keepdim": keep}, fn, rng)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_reshape_numeric(data):
    mesh = data.draw(st.sampled_from(MESHES))
    shape = tuple(data.draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12])) for _ in range(data.draw(st.integers(1, 3))))
    n = int(np.prod(shape))
    divs = [d for d in range(1, n + 1) if n % d == 0]
    a = data.draw(st.sampled_from(divs))
    b = data.draw(st.sampled_from([d for d in divs if (n // a) % d == 0]))
    target = [a, b, n // a // b]
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, shape).astype(float)
    def local(r, attr, expected, v):
        return np.reshape(v, block(expected, attr, r).shape)

    run_op("reshape", [x], [data.draw(layout(len(shape), mesh))], {"shape": target},
           lambda v: np.reshape(v, target), rng, local)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), op=st.sampled_from(["transpose", "softmax", "relu", "cast"]))
def test_unary_numeric(data, op):
    mesh = data.draw(st.sampled_from(MESHES))
    shape = tuple(data.draw(SIZES) for _ in range(3))
    rng = np.random.default_rng(4)
    x = rng.integers(-3, 4, shape).astype(float)
    perm = data.draw(st.permutations([0, 1, 2]))
    fns = {
        "transpose": (lambda v: np.transpose(v, perm), {"perm": perm}),
        "softmax": (lambda v: np.exp(v) / np.exp(v).sum(axis=1, keepdims=True), {"axis": 1}),
        "relu": (lambda v: np.maximum(v, 0), {}),
        "cast": (lambda v: v, {"dtype": "float64"}),
    }
    fn, attrs = fns[op]
    run_op(op, [x], [data.draw(layout(3, mesh))], attrs, fn, rng)


def test_case2_mean_of_uneven_shard_is_5_5():
    """Reference case 2: mesh [2], 12 values as [3, 4] with S(0): the result is 5.5."""
    mesh = ProcessMesh.of(2)
    x = np.arange(12, dtype=float).reshape(3, 4)
    out = run_op("mean", [x], [TensorDistAttr(mesh, [0, -1])], {"axis": [], "keepdim": False},
                 np.mean, np.random.default_rng(0))
    assert out.partial_dims == {}
    assert np.mean(x) == pytest.approx(5.5)
