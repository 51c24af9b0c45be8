"""A numpy reference for reshard plans (used by tests only).

:class:`VirtualMesh` holds the per-rank local arrays of one global array under a layout and
executes a :class:`~completion.reshard.ReshardPlan` step by step. Each collective works on
the local arrays of its group only, with the padded buffers a real NCCL call would move
(ceil-sized blocks for uneven splits); padding never reaches a result. Receivers unpad
with the block sizes ``shard_range`` gives for the real extent, which every rank knows
from the global shape, as a real kernel would.

Partial layouts are built as random splits that reduce exactly to the global value:
``sum`` random integer parts, ``avg`` n times a sum split, ``max`` / ``min`` parts below /
above the value with one part equal to it per element. With integer-valued float64 data
every check is exact equality.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from completion.dist_attr import Partial, Shard, TensorDistAttr, shard_range
from completion.reshard import Layout, ReshardPlan, ReshardStep

REDUCE: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "sum": lambda a: a.sum(axis=0),
    "avg": lambda a: a.sum(axis=0) / a.shape[0],
    "max": lambda a: a.max(axis=0),
    "min": lambda a: a.min(axis=0),
}


class VirtualMesh:
    """Per-rank local arrays of one global array under a layout.

    Args:
        layout: Layout or TensorDistAttr.
        shape: global shape.
        arrays: rank -> local numpy array.
    """

    def __init__(self, layout: Layout | TensorDistAttr, shape: Sequence[int], arrays: dict[int, np.ndarray]):
        self.layout = Layout.of(layout)
        self.shape = tuple(int(s) for s in shape)
        self.arrays = arrays

    @classmethod
    def from_global(cls, glob: np.ndarray, layout, rng: np.random.Generator | None = None) -> VirtualMesh:
        """Distribute ``glob``: each rank gets its block; partial mesh dims get random
        splits (module doc) that reduce exactly to the block."""
        lay = Layout.of(layout)
        rng = rng or np.random.default_rng(0)
        mesh = lay.mesh
        pdims = [(m, p.reduce_type) for m, p in enumerate(lay.placements) if isinstance(p, Partial)]
        shard_dims = [m for m, p in enumerate(lay.placements) if isinstance(p, Shard)]
        pieces: dict[tuple, dict[tuple, np.ndarray]] = {}
        arrays = {}
        for r in mesh.process_ids:
            c = mesh.coord(r)
            key = tuple(c[m] for m in shard_dims)
            if key not in pieces:
                block = glob[tuple(slice(a, b) for a, b in lay.index_range(glob.shape, r))]
                pieces[key] = _split(block, [(mesh.shape[m], rt) for m, rt in pdims], rng)
            arrays[r] = pieces[key][tuple(c[m] for m, _ in pdims)].copy()
        return cls(lay, glob.shape, arrays)

    def to_global(self) -> np.ndarray:
        """Reassemble the global array: check each local shape, reduce partial mesh dims,
        check that replicated copies agree, and place the blocks.

        Raises AssertionError on a wrong local shape or disagreeing replicas."""
        lay, mesh = self.layout, self.layout.mesh
        cur = {}
        for r in mesh.process_ids:
            want = lay.local_shape(self.shape, r)
            got = self.arrays[r].shape
            assert got == want, f"rank {r}: local shape {got}, layout {lay} wants {want}"
            cur[mesh.coord(r)] = self.arrays[r]
        for m, p in enumerate(lay.placements):
            if isinstance(p, Partial):
                cur = _reduce_dim(cur, m, mesh.shape[m], REDUCE[p.reduce_type])
        out = np.full(self.shape, np.nan)
        seen = {}
        for coord, arr in cur.items():
            rng = lay.index_range(self.shape, mesh.rank_at(coord))
            idx = tuple(slice(a, b) for a, b in rng)
            if rng in seen:
                assert np.array_equal(seen[rng], arr), f"replicas of block {rng} disagree"
            seen[rng] = arr
            out[idx] = arr
        return out

    def run(self, plan: ReshardPlan) -> VirtualMesh:
        """Execute ``plan`` step by step; returns the VirtualMesh in ``plan.dst``."""
        assert plan.src == self.layout, f"plan starts at {plan.src}, data is in {self.layout}"
        vm = self
        for step in plan.steps:
            arrays = KERNELS[step.kind](vm, step)
            vm = VirtualMesh(Layout(step.dst_mesh or step.mesh, step.dst), self.shape, arrays)
        return VirtualMesh(plan.dst, self.shape, vm.arrays)


def _split(v: np.ndarray, dims: list[tuple[int, str]], rng) -> dict[tuple, np.ndarray]:
    if not dims:
        return {(): v}
    (n, rt), rest = dims[0], dims[1:]
    out = {}
    for i, part in enumerate(_split_one(v, n, rt, rng)):
        for k, arr in _split(part, rest, rng).items():
            out[(i,) + k] = arr
    return out


def _split_one(v: np.ndarray, n: int, rt: str, rng) -> list[np.ndarray]:
    if rt in ("sum", "avg"):
        parts = list(rng.integers(-5, 6, size=(n - 1,) + v.shape).astype(v.dtype))
        parts.append(v - sum(parts, np.zeros_like(v)))
        return [p * n for p in parts] if rt == "avg" else parts
    sign = -1 if rt == "max" else 1
    parts = [v + sign * rng.integers(0, 4, size=v.shape).astype(v.dtype) for _ in range(n)]
    winner = rng.integers(0, n, size=v.shape)
    for i in range(n):
        parts[i] = np.where(winner == i, v, parts[i])
    return parts


def _reduce_dim(cur: dict, m: int, n: int, fn) -> dict:
    out = {}
    for coord in cur:
        if coord[m] != 0:
            continue
        group = [cur[coord[:m] + (i,) + coord[m + 1 :]] for i in range(n)]
        out[coord] = fn(np.stack(group))
    return out


# --- kernels: one per step kind, each on the local arrays of one group ---------------------


def _groups(vm: VirtualMesh, step: ReshardStep):
    for g in step.groups:
        yield g, [vm.arrays[r] for r in g]


def _pad(a: np.ndarray, dim: int, size: int) -> np.ndarray:
    width = [(0, 0)] * a.ndim
    width[dim] = (0, size - a.shape[dim])
    return np.pad(a, width)


def _chunks(a: np.ndarray, dim: int, n: int) -> list[np.ndarray]:
    """Split along ``dim`` into n padded ceil-sized chunks (what goes on the wire)."""
    c = -(-a.shape[dim] // n)
    return np.split(_pad(a, dim, c * n), n, axis=dim) if c else [a] * n


def _trim(a: np.ndarray, dim: int, size: int) -> np.ndarray:
    return np.take(a, range(size), axis=dim)


def _all_reduce(vm, step):
    out = {}
    for g, arrs in _groups(vm, step):
        red = REDUCE[step.reduce_type](np.stack(arrs))
        out.update({r: red.copy() for r in g})
    return out


def _reduce_scatter(vm, step):
    out, e = {}, step.dst_dim
    for g, arrs in _groups(vm, step):
        n, size = len(g), arrs[0].shape[e]
        red = REDUCE[step.reduce_type](np.stack([np.stack(_chunks(a, e, n)) for a in arrs]))
        for i, r in enumerate(g):
            a, b = shard_range(size, n, i)
            out[r] = _trim(red[i], e, b - a)
    return out


def _all_gather(vm, step):
    out, d = {}, step.src_dim
    for g, arrs in _groups(vm, step):
        n, total = len(g), sum(a.shape[d] for a in arrs)
        c = -(-total // n)
        wire = [_pad(a, d, c) for a in arrs]  # every rank sends c rows
        parts = [_trim(w, d, shard_range(total, n, i)[1] - shard_range(total, n, i)[0]) for i, w in enumerate(wire)]
        full = np.concatenate(parts, axis=d)
        out.update({r: full.copy() for r in g})
    return out


def _all_to_all(vm, step):
    out, d, e = {}, step.src_dim, step.dst_dim
    for g, arrs in _groups(vm, step):
        n, total_d, size_e = len(g), sum(a.shape[d] for a in arrs), arrs[0].shape[e]
        cd = -(-total_d // n)
        sent = [_chunks(_pad(a, d, cd), e, n) for a in arrs]  # sent[i][j]: i -> j
        for j, r in enumerate(g):
            rows = [_trim(sent[i][j], d, _size(total_d, n, i)) for i in range(n)]
            out[r] = _trim(np.concatenate(rows, axis=d), e, _size(size_e, n, j))
    return out


def _size(total: int, n: int, i: int) -> int:
    a, b = shard_range(total, n, i)
    return b - a


def _slice(vm, step):
    out, e = {}, step.dst_dim
    for g, arrs in _groups(vm, step):
        for i, (r, a) in enumerate(zip(g, arrs, strict=True)):
            lo, hi = shard_range(a.shape[e], len(g), i)
            out[r] = np.take(a, range(lo, hi), axis=e).copy()
    return out


def _zero_fill(vm, step):
    out, d = {}, step.src_dim
    for g, arrs in _groups(vm, step):
        if d is None:  # Replicate -> Partial(sum): index 0 keeps the value
            out.update({r: (a.copy() if i == 0 else np.zeros_like(a)) for i, (r, a) in enumerate(zip(g, arrs, strict=True))})
            continue
        total = sum(a.shape[d] for a in arrs)
        for i, (r, a) in enumerate(zip(g, arrs, strict=True)):
            lo, hi = shard_range(total, len(g), i)
            shape = list(a.shape)
            shape[d] = total
            z = np.zeros(shape, a.dtype)
            idx = [slice(None)] * a.ndim
            idx[d] = slice(lo, hi)
            z[tuple(idx)] = a
            out[r] = z
    return out


def _scale(vm, step):
    return {r: a * step.factor for r, a in vm.arrays.items()}


def _send_recv(vm, step):
    return {dst: vm.arrays[src].copy() for src, dst in step.groups}


KERNELS: dict[str, Callable[[VirtualMesh, ReshardStep], dict[int, np.ndarray]]] = {
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "all_gather": _all_gather,
    "all_to_all": _all_to_all,
    "slice": _slice,
    "zero_fill": _zero_fill,
    "scale": _scale,
    "send_recv": _send_recv,
}
