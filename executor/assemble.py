"""Reassemble a global array from per-rank local blocks under a layout (numpy), as the
parent process does for losses and parameters after a run.

Partial mesh dims are reduced (sum, avg, max, min); of several replicas of one block the
first (lowest rank) is taken and the largest absolute disagreement between replicas is
returned alongside, so a run whose replicas drifted apart is visible."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from completion.dist_attr import Partial
from completion.reshard import Layout
from executor.errors import ExecutorError

_REDUCE = {"sum": np.sum, "avg": np.mean, "max": np.max, "min": np.min}


def assemble(layout: Layout | None, shape: Sequence[int], blocks: Mapping[int, np.ndarray]
             ) -> tuple[np.ndarray, float]:
    """(global array, max replica disagreement). ``blocks``: rank -> local block; with no
    layout, any block is the value. Raises ValueError when a block is missing or has the
    wrong shape."""
    shape = tuple(int(s) for s in shape)
    if layout is None:
        r = min(blocks)
        return np.asarray(blocks[r]).reshape(shape), 0.0
    mesh = layout.mesh
    cur: dict[tuple[int, ...], np.ndarray] = {}
    for r in mesh.process_ids:
        if r not in blocks:
            raise ExecutorError(f"assemble: rank {r} of mesh {list(mesh.shape)} sent no block")
        want = layout.local_shape(shape, r)
        b = np.asarray(blocks[r])
        if tuple(b.shape) != tuple(want):
            raise ExecutorError(f"assemble: rank {r} block {b.shape} but layout wants {want}")
        cur[mesh.coord(r)] = b
    for m, p in enumerate(layout.placements):
        if isinstance(p, Partial):
            out = {}
            for c in cur:
                if c[m] == 0:
                    grp = [cur[c[:m] + (i,) + c[m + 1:]] for i in range(mesh.shape[m])]
                    out[c] = _REDUCE[p.reduce_type](np.stack(grp), axis=0)
            cur = out
    glob = np.zeros(shape, dtype=next(iter(cur.values())).dtype)
    seen: dict[tuple, np.ndarray] = {}
    drift = 0.0
    for c, arr in sorted(cur.items()):
        rng = layout.index_range(shape, mesh.rank_at(c))
        if rng in seen:
            if arr.size:
                drift = max(drift, float(np.max(np.abs(seen[rng] - arr))))
            continue
        seen[rng] = arr
        glob[tuple(slice(a, b) for a, b in rng)] = arr
    return glob, drift
