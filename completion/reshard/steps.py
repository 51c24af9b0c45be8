"""Reshard steps and plans, and the single-mesh-dim transitions the planner may use.

Every transition changes the placement of one mesh dim ``m`` (``n`` ranks along it) and
runs on the groups of ``ProcessMesh.groups(m)`` (one group per slice of the other mesh
dims), so a change on one mesh dim touches only that dim's groups. Table (DTensor's
``redistribute`` and Paddle's reshard functions behave the same way):

=================  ================  ==========================================
from               to                step
=================  ================  ==========================================
Partial(r)         Replicate         all_reduce(r)
Partial(r)         Shard(e)          reduce_scatter(r) along e
Partial(sum/avg)   Partial(avg/sum)  scale (local): sum->avg x n, avg->sum x 1/n
Shard(d)           Replicate         all_gather along d
Shard(d)           Shard(e)          all_to_all (split e, concat d)
Shard(d)           Partial(sum)      zero_fill (local): the block at its offset, zeros around
Replicate          Shard(e)          slice (local)
Replicate          Partial(sum)      zero_fill (local): group index 0 keeps, others zeros
Replicate          Partial(avg/max/min)  relabel: the data already reduces to the value
any (mesh dim of size 1)  any        relabel
=================  ================  ==========================================

Nesting legality (see ``layout``): a Shard(d) can leave mesh dim m only when m is the
innermost (largest) mesh dim sharding d, and a Shard(e) can arrive at m only when every
other mesh dim sharding e is smaller than m. Relabels move no data and are not emitted.

Byte counts (``ReshardStep.nbytes``) follow the nccl-tests buffer-size convention so they
feed ``Cluster.collective_time`` directly, using padded (ceil) block sizes for uneven
splits: all_reduce = the local buffer; reduce_scatter = the whole input (n x padded output
block); all_gather = the whole output (n x padded input block); all_to_all = n x the padded
block sent to each peer; send_recv = the padded local buffer. Local steps carry the bytes
of memory traffic per rank (slice: read + write of the output; scale: read + write;
zero_fill: write of the output plus read of the input block).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from completion.dist_attr import Partial, Placement, Replicate, Shard
from completion.mesh import ProcessMesh
from completion.reshard.layout import LINEAR_REDUCE, Layout, numel, padded_local_shape

COLLECTIVE_KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv")
LOCAL_KINDS = ("slice", "zero_fill", "scale")




@dataclass(frozen=True)
class ReshardStep:
    """One step of a reshard plan.

    Attributes:
        kind: one of COLLECTIVE_KINDS or LOCAL_KINDS.
        mesh: the mesh the step runs on (the source mesh for send_recv).
        mesh_dim: the mesh dim whose placement changes (None for send_recv).
        groups: rank groups, one per slice of the other mesh dims; for send_recv the
            ``(src_rank, dst_rank)`` pairs.
        nbytes: per-rank bytes, nccl-tests buffer size for collectives, memory traffic for
            local steps (module doc).
        src, dst: placements before and after (on ``mesh``, or ``dst_mesh`` after send_recv).
        global_shape: the logical (global) shape, unchanged by every step.
        local_shape: padded (largest) local block after the step.
        src_dim, dst_dim: tensor dim sharded before / after on ``mesh_dim`` (or None).
        reduce_type: reduction of all_reduce / reduce_scatter, else None.
        factor: scale factor of a ``scale`` step, else 1.0.
        dst_mesh: the receiving mesh of a send_recv, else None.
    """

    kind: str
    mesh: ProcessMesh
    mesh_dim: int | None
    groups: tuple[tuple[int, ...], ...]
    nbytes: int
    src: tuple[Placement, ...]
    dst: tuple[Placement, ...]
    global_shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    src_dim: int | None = None
    dst_dim: int | None = None
    reduce_type: str | None = None
    factor: float = 1.0
    dst_mesh: ProcessMesh | None = None

    @property
    def is_collective(self) -> bool:
        """True for a communication step (``COLLECTIVE_KINDS``), False for a local one."""
        return self.kind in COLLECTIVE_KINDS

    @property
    def group_size(self) -> int:
        """Ranks per communication group (1 when the step has no groups)."""
        return len(self.groups[0]) if self.groups else 1

    def __repr__(self) -> str:
        where = "" if self.mesh_dim is None else f" mesh_dim={self.mesh_dim}"
        return f"{self.kind}({list(self.src)} -> {list(self.dst)}{where}, nbytes={self.nbytes})"


@dataclass(frozen=True)
class ReshardPlan:
    """The steps that take a value from layout ``src`` to layout ``dst``, in order.

    ``steps`` holds only the steps a run really emits (no relabels); an identity reshard
    has no steps. ``cost`` is the planner's objective for the chosen path.
    """

    src: Layout
    dst: Layout
    global_shape: tuple[int, ...]
    dtype: str
    steps: tuple[ReshardStep, ...] = field(default=())
    cost: float = 0.0

    def __iter__(self):
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def kinds(self) -> list[str]:
        """Step kinds in order, e.g. ``["all_to_all"]``."""
        return [s.kind for s in self.steps]


# --- transitions on one mesh dim ------------------------------------------------------


@dataclass(frozen=True)
class Ctx:
    """What a transition builder needs besides the placements. ``blocks`` memoises
    :func:`_block` for this mesh and shape (a search asks for the same placements from
    many states); it takes no part in equality."""

    mesh: ProcessMesh
    shape: tuple[int, ...]
    itemsize: int
    groups: tuple[tuple[tuple[int, ...], ...], ...]  # per mesh dim
    blocks: dict = field(default_factory=dict, compare=False, repr=False)


def _block(ctx: Ctx, placements: tuple[Placement, ...]) -> tuple[tuple[int, ...], int]:
    """The padded local block of ``ctx.shape`` under ``placements`` and its bytes."""
    hit = ctx.blocks.get(placements)
    if hit is None:
        shape = padded_local_shape(ctx.shape, ctx.mesh.shape, placements)
        hit = ctx.blocks[placements] = (shape, numel(shape) * ctx.itemsize)
    return hit


def _block_bytes(ctx: Ctx, placements: tuple[Placement, ...]) -> int:
    return _block(ctx, placements)[1]


def _step(ctx: Ctx, kind: str, m: int, src, dst, nbytes: int, **kw) -> ReshardStep:
    return ReshardStep(
        kind, ctx.mesh, m, ctx.groups[m], int(nbytes), src, dst, ctx.shape, _block(ctx, dst)[0], **kw,
    )  # fmt: skip


def _all_reduce(ctx, m, src, dst):
    return _step(ctx, "all_reduce", m, src, dst, _block_bytes(ctx, src), reduce_type=src[m].reduce_type)


def _reduce_scatter(ctx, m, src, dst):
    n = ctx.mesh.shape[m]
    return _step(ctx, "reduce_scatter", m, src, dst, n * _block_bytes(ctx, dst),
                 reduce_type=src[m].reduce_type, dst_dim=dst[m].dim)  # fmt: skip


def _partial_to_partial(ctx, m, src, dst):
    a, b = src[m].reduce_type, dst[m].reduce_type
    if not {a, b} <= LINEAR_REDUCE:
        return None
    n = ctx.mesh.shape[m]
    factor = float(n) if (a, b) == ("sum", "avg") else 1.0 / n
    return _step(ctx, "scale", m, src, dst, 2 * _block_bytes(ctx, src), factor=factor)


def _all_gather(ctx, m, src, dst):
    n = ctx.mesh.shape[m]
    return _step(ctx, "all_gather", m, src, dst, n * _block_bytes(ctx, src), src_dim=src[m].dim)


def _all_to_all(ctx, m, src, dst):
    d, e = src[m].dim, dst[m].dim
    if d == e:
        return None
    n = ctx.mesh.shape[m]
    block = list(_block(ctx, src)[0])
    block[e] = -(-block[e] // n)
    return _step(ctx, "all_to_all", m, src, dst, n * numel(block) * ctx.itemsize, src_dim=d, dst_dim=e)


def _shard_to_partial(ctx, m, src, dst):
    if dst[m].reduce_type != "sum":
        return None
    nbytes = _block_bytes(ctx, dst) + _block_bytes(ctx, src)
    return _step(ctx, "zero_fill", m, src, dst, nbytes, src_dim=src[m].dim)


def _slice(ctx, m, src, dst):
    return _step(ctx, "slice", m, src, dst, 2 * _block_bytes(ctx, dst), dst_dim=dst[m].dim)


def _replicate_to_partial(ctx, m, src, dst):
    if dst[m].reduce_type == "sum":
        return _step(ctx, "zero_fill", m, src, dst, _block_bytes(ctx, dst))
    return "relabel"


Builder = Callable[[Ctx, int, tuple, tuple], "ReshardStep | str | None"]

# (type of the source placement, type of the target placement) -> builder; a builder
# returns a step, "relabel" (no data moves), or None (no direct transition).
TRANSITIONS: dict[tuple[type, type], Builder] = {
    (Partial, Replicate): _all_reduce,
    (Partial, Shard): _reduce_scatter,
    (Partial, Partial): _partial_to_partial,
    (Shard, Replicate): _all_gather,
    (Shard, Shard): _all_to_all,
    (Shard, Partial): _shard_to_partial,
    (Replicate, Shard): _slice,
    (Replicate, Partial): _replicate_to_partial,
}


def cross_mesh_step(src: Layout, dst_mesh: ProcessMesh, shape, itemsize: int) -> ReshardStep:
    """send_recv moving every block of ``src`` to ``dst_mesh`` unchanged in layout.

    Same mesh shape: the rank at coordinate c of the source mesh sends to the rank at c of
    the destination. Otherwise ``src`` must be fully replicated, and destination rank i
    receives from source rank ``i mod src.size``.
    """
    shape = tuple(shape)
    if dst_mesh.shape == src.mesh.shape:
        pairs = tuple((a, b) for a, b in zip(src.mesh.process_ids, dst_mesh.process_ids, strict=True))
        placements = src.placements
    else:
        ids = src.mesh.process_ids
        pairs = tuple((ids[i % len(ids)], b) for i, b in enumerate(dst_mesh.process_ids))
        placements = tuple(Replicate() for _ in dst_mesh.shape)
    local = src.max_local_shape(shape)
    return ReshardStep(
        "send_recv", src.mesh, None, pairs, numel(local) * itemsize, src.placements, placements,
        shape, local, dst_mesh=dst_mesh,
    )  # fmt: skip
