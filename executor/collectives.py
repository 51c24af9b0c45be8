"""The reshard pass's collectives on torch.distributed, with padding for uneven splits.

Each function takes this rank's local block and returns its local result, moving the same
padded buffers as the numpy reference ``completion.testing.VirtualMesh`` (and as the
``nbytes`` the reshard pass records): blocks are padded to the ceil size
``ceil(extent / n)`` on the wire and trimmed to ``shard_range`` sizes on arrival, so padding
never reaches a result. Receivers know every block size from the global extent, as a real
kernel would (``shard_range(total, n, i)``).

Groups are given as global ranks; :class:`Groups` creates every process group once, in the
same order on every rank (``torch.distributed.new_group`` must be called collectively), with
a timeout so that a collective whose peer died raises instead of hanging.

Mapping (reduce types: sum, avg, max, min):

- all_reduce: ``dist.all_reduce`` (AVG as SUM / n on backends without AVG);
- reduce_scatter along dim e: pad to n * ceil(size_e / n), ``reduce_scatter_tensor`` of
  the n stacked chunks, trim own chunk;
- all_gather along dim d: pad own block to ceil(total / n), ``all_gather_into_tensor``,
  trim each block, concatenate;
- all_to_all (split dim e, concat dim d): pad d to ceil(total_d / n) and e to
  n * ceil(size_e / n), ``all_to_all_single`` of the n chunks, trim, concatenate;
- send / recv: ``batch_isend_irecv`` of a list of P2P operations.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from completion.dist_attr import shard_range
from executor.errors import ExecutorError

# torch >= 2.10 renamed the tensor-in/tensor-out collectives; use whichever exists
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class CollectiveRunError(ExecutorError, ValueError):
    """A collective called with an inconsistent group, dim or reduce type; names it."""


def _reduce_op(reduce_type: str):
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
           "avg": dist.ReduceOp.SUM}
    if reduce_type not in ops:
        raise CollectiveRunError(f"unknown reduce_type {reduce_type!r}; expected sum, avg, max or min")
    return ops[reduce_type]


class Groups:
    """Process groups by their (sorted) global ranks.

    Args:
        groups: every group any rank will use (the same iterable on every rank).
        timeout: seconds a collective on these groups may wait before raising.

    Groups of one rank need no process group (the collectives return their input)."""

    def __init__(self, groups: Iterable[Sequence[int]], timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._pg: dict[tuple[int, ...], object] = {}
        world = dist.get_world_size() if dist.is_initialized() else 1
        for g in sorted({tuple(sorted(int(r) for r in g)) for g in groups}):
            if len(g) < 2:
                continue
            if any(r >= world for r in g):
                raise CollectiveRunError(f"group {list(g)} names a rank outside world size {world}")
            if len(g) == world:
                self._pg[g] = dist.group.WORLD
            else:
                self._pg[g] = dist.new_group(list(g), timeout=timedelta(seconds=timeout))

    def get(self, ranks: Sequence[int]):
        """The process group of ``ranks``; CollectiveRunError if it was not created."""
        key = tuple(sorted(int(r) for r in ranks))
        if len(key) < 2:
            return None
        if key not in self._pg:
            raise CollectiveRunError(f"no process group was created for ranks {list(key)}")
        return self._pg[key]


def _pad(x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    if x.shape[dim] == size:
        return x
    shape = list(x.shape)
    shape[dim] = size - x.shape[dim]
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def _size(total: int, n: int, i: int) -> int:
    a, b = shard_range(total, n, i)
    return b - a


def all_reduce(x: torch.Tensor, group, n: int, reduce_type: str = "sum") -> torch.Tensor:
    """Reduce ``x`` over the group of ``n`` ranks (a new tensor; ``x`` is unchanged)."""
    op = _reduce_op(reduce_type)
    out = x.clone()
    if n > 1:
        dist.all_reduce(out, op=op, group=group)
    if reduce_type == "avg":
        out /= n
    return out


def reduce_scatter(x: torch.Tensor, dim: int, index: int, n: int, group,
                   reduce_type: str = "sum") -> torch.Tensor:
    """Reduce over the group and keep block ``index`` of dim ``dim`` (shard_range sizes)."""
    op = _reduce_op(reduce_type)
    size = x.shape[dim]
    c = -(-size // n)
    if n == 1 or c == 0:
        out = x.clone()
    else:
        chunks = _pad(x, dim, c * n).split(c, dim=dim)
        inp = torch.stack([ch.contiguous() for ch in chunks]).contiguous()
        out = torch.empty_like(inp[0])
        _REDUCE_SCATTER(out.view(-1), inp.view(-1), op=op, group=group)
    if reduce_type == "avg":
        out = out / n
    return out.narrow(dim, 0, _size(size, n, index)).contiguous()


def all_gather(x: torch.Tensor, dim: int, n: int, group, total: int) -> torch.Tensor:
    """Concatenate the group's blocks along ``dim`` into the extent ``total``."""
    c = -(-total // n)
    if n == 1 or c == 0:
        return x.clone()
    mine = _pad(x, dim, c).contiguous()
    out = torch.empty((n, *mine.shape), dtype=x.dtype, device=x.device)
    _ALL_GATHER(out.view(-1), mine.view(-1), group=group)
    parts = [out[i].narrow(dim, 0, _size(total, n, i)) for i in range(n)]
    return torch.cat(parts, dim=dim).contiguous()


def all_to_all(x: torch.Tensor, src_dim: int, dst_dim: int, index: int, n: int, group,
               total_src: int) -> torch.Tensor:
    """Shard(src_dim) -> Shard(dst_dim) within the group: split ``dst_dim`` into n blocks,
    block j goes to group position j, received blocks concatenate along ``src_dim`` into
    the extent ``total_src``."""
    if src_dim == dst_dim:
        raise CollectiveRunError(f"all_to_all: src_dim and dst_dim are both {src_dim}")
    size_e = x.shape[dst_dim]
    cd, ce = -(-total_src // n), -(-size_e // n)
    if n == 1:
        return x.clone()
    xp = _pad(_pad(x, src_dim, cd), dst_dim, ce * n)
    inp = torch.stack([ch.contiguous() for ch in xp.split(ce, dim=dst_dim)]).contiguous()
    out = torch.empty_like(inp)
    if inp.numel():
        dist.all_to_all_single(out.view(-1), inp.view(-1), group=group)
    parts = [out[i].narrow(src_dim, 0, _size(total_src, n, i)) for i in range(n)]
    full = torch.cat(parts, dim=src_dim)
    return full.narrow(dst_dim, 0, _size(size_e, n, index)).contiguous()


def p2p(ops: Sequence[tuple], tag: int = 0) -> list:
    """Issue sends/receives as one ``batch_isend_irecv``: ``ops`` are
    ``("send" | "recv", tensor, peer global rank[, tag])`` (``tag`` default for all).
    Returns the work handles in order (wait on them before reading a received tensor or
    reusing a sent one)."""
    p2p_ops = []
    for entry in ops:
        kind, t, peer = entry[:3]
        if kind not in ("send", "recv"):
            raise CollectiveRunError(f"p2p op kind must be 'send' or 'recv', got {kind!r}")
        fn = dist.isend if kind == "send" else dist.irecv
        p2p_ops.append(dist.P2POp(fn, t, int(peer), tag=int(entry[3]) if len(entry) > 3 else tag))
    if not p2p_ops:
        return []
    return dist.batch_isend_irecv(p2p_ops)


def _dim(attrs, key: str) -> int:
    d = attrs.get(key)
    if d is None or int(d) < 0:
        raise CollectiveRunError(f"attribute {key!r} is missing (got {d!r})")
    return int(d)


def run_collective(op_type: str, x: torch.Tensor, attrs, rank: int, group: Sequence[int],
                   groups: Groups, out_shape: Sequence[int]) -> torch.Tensor:
    """Execute one reshard-pass collective op (``all_reduce``, ``reduce_scatter``,
    ``all_gather``, ``all_to_all``) on this rank's block ``x``.

    Args:
        attrs: the op's attributes (``reduce_type``, ``src_dim``, ``dst_dim``).
        rank, group: this rank and its group, both as global ranks (group in mesh order).
        groups: the created process groups; out_shape: this rank's local result shape.
    Raises CollectiveRunError for an unknown op type or a rank outside its group."""
    group = tuple(int(r) for r in group)
    if rank not in group:
        raise CollectiveRunError(f"{op_type}: rank {rank} is not in its group {list(group)}")
    fn = COLLECTIVES.get(op_type)
    if fn is None:
        raise CollectiveRunError(f"{op_type!r} is not a collective op; expected one of {sorted(COLLECTIVES)}")
    n, index, pg = len(group), group.index(rank), groups.get(group)
    return fn(x, attrs, index, n, pg, tuple(int(s) for s in out_shape))


def _rt(attrs) -> str:
    return str(attrs.get("reduce_type") or "sum")


# op type -> fn(x, attrs, index in group, group size, process group, local result shape)
COLLECTIVES = {
    "all_reduce": lambda x, a, i, n, pg, out: all_reduce(x, pg, n, _rt(a)),
    "reduce_scatter": lambda x, a, i, n, pg, out: reduce_scatter(x, _dim(a, "dst_dim"), i, n, pg, _rt(a)),
    "all_gather": lambda x, a, i, n, pg, out: all_gather(
        x, _dim(a, "src_dim"), n, pg, out[_dim(a, "src_dim")]),
    "all_to_all": lambda x, a, i, n, pg, out: all_to_all(
        x, _dim(a, "src_dim"), _dim(a, "dst_dim"), i, n, pg, out[_dim(a, "src_dim")]),
}


def wait_work(work: Any) -> Any:
    """``work.wait()`` of an asynchronous collective or p2p op. Every wait of the executor
    goes through this function, so ``executor.watchdog`` can tell from a rank's stack that
    it waits for its peers (its frame is named here) rather than computes."""
    return work.wait()
