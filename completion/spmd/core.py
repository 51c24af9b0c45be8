"""The einsum-notation merge shared by every SPMD rule.

Each tensor of an op gets one letter per dim (``matmul``: ``mk,kn->mn``). A rule turns the
op's shapes and attributes into a :class:`Notation`; :func:`solve` then merges the
shardings the tensors propose into one letter -> mesh dim map and reads the required
operand attrs and the result attrs back from it.

Merge (deterministic; the same inputs always give the same answer):

1. Proposals are taken in priority order: higher :attr:`DistTensor.priority` first (the
   Completer gives annotated parameters 2, other annotated values 1, derived values 0 and
   hints from consumers -1), ties broken by position: operands in order, then results.
   A hint does not claim a mesh dim on which the op sums Partial operands alike (an
   ``"all"`` :class:`LinearGroup` of two or more, e.g. ``add_n`` of gradients): the sum
   keeps the Partial and is reduced once downstream, not once per operand.
2. Within a proposal, tensor dims in order. A dim proposes ``letter -> mesh dim`` unless it
   is replicated (-1), has size 1 (size-1 dims are always replicated), or its letter is
   forced replicated by the rule (softmax axis, normalized dims, ...).
3. Conflicts: the first proposal to claim a letter keeps it (a later, different mesh dim on
   the same letter is dropped), and a mesh dim shards at most one letter of the op (a later
   letter that names an already used mesh dim stays replicated). Dropped proposals become
   reshards at the operand.
4. Letters that must split evenly (``Notation.divisible``, and every contracted letter of an
   ``avg`` reduction: Partial(avg) is only exact for even splits, reference case 2) are
   dropped when a tensor dim of that letter does not divide by the mesh dim size.
5. Partial inputs: a mesh dim an operand holds Partial is kept only for operands listed in a
   :class:`LinearGroup` of the rule (add of partials, scale, cast, transpose, reshape, one
   side of a matmul, the out-grad operand of their grads) and only when no letter is
   sharded on that mesh dim; every other operand is required reduced first (reference
   case 4). Operands in ``Notation.shape_only`` (read for their shape only) keep theirs.
6. Results: a letter sharded on mesh dim m that is absent from a result (contracted or
   reduced away) makes the result Partial on m with the notation's reduce type, unless the
   letter is ``internal`` (reduced inside the kernel, e.g. the class dim of the vocab-parallel
   cross entropy). Kept partial mesh dims pass to every result.

Sources: the einsum-notation merge of Paddle's SPMD rules (``ShardingMergeForTensors`` in
``paddle/phi/infermeta/spmd_rules``) and torch DTensor's op strategies; conflict resolution
and the avg/uneven rule are this project's (documented above).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from completion.dist_attr import TensorDistAttr
from completion.errors import CompletionError
from completion.mesh import ProcessMesh


def norm_axis(axis: int, ndim: int) -> int:
    """A possibly negative axis of a rank-``ndim`` tensor as a dim index (no range check)."""
    return axis + ndim if axis < 0 else axis


LINEAR_TYPES = frozenset({"sum", "avg"})
ALL_TYPES = frozenset({"sum", "avg", "max", "min"})

Letters = tuple[str, ...]
"""One entry per tensor dim. An entry ``"a+b"`` is a dim that flattens letters a and b (the
mean/variance of a norm over several batch dims); it takes the mesh dim of its first sharded
letter and never proposes."""


@dataclass(frozen=True)
class DistTensor:
    """A tensor as a rule sees it: global shape, current attr (None: no information), the
    priority of its proposal (see module docstring) and its dtype (used only to infer result
    shapes in ``infer_forward``)."""

    shape: tuple[int, ...]
    attr: TensorDistAttr | None = None
    priority: int = 0
    dtype: str = "float32"


@dataclass(frozen=True)
class SpmdResult:
    """What a rule infers: the attr each operand must have for the op to run (None for a
    null operand) and the attr of each result (None for a null result)."""

    operands: tuple[TensorDistAttr | None, ...]
    results: tuple[TensorDistAttr | None, ...]


@dataclass(frozen=True)
class LinearGroup:
    """Operands that may keep a Partial mesh dim. ``mode="all"``: kept when every operand
    of the group is Partial there with the same reduce type (add of partials); ``"one"``:
    the first Partial operand keeps it, the others are reduced (one side of a matmul)."""

    operands: tuple[int, ...]
    mode: str = "all"
    types: frozenset[str] = LINEAR_TYPES


@dataclass
class Notation:
    """Einsum notation of one op instance (see module docstring).

    Attributes:
        inputs / outputs: letters per operand / result; None: no attr (null value).
        replicated: letters never sharded.
        reduce_type: Partial type of results missing a sharded letter.
        internal: letters reduced inside the kernel (no Partial when absent from a result).
        divisible: letters that must split evenly wherever they appear.
        linear: operand groups that may keep Partial inputs.
        shape_only: operands read for their shape only (their Partial is kept as is).
        keep_all_partial: every Partial input passes through (``reshard``).
        num_operand_attrs: truncate the operand attrs (``full_like`` lists only x).
        aux_outputs: results that never become Partial (a dropout seed / offset).
        result_shapes: shapes to use for results the caller gave as None (a grad op's
            null gradients: their size-1 dims stay replicated).
    """

    inputs: list[Letters | None]
    outputs: list[Letters | None]
    replicated: set[str] = field(default_factory=set)
    reduce_type: str = "sum"
    internal: frozenset[str] = frozenset()
    divisible: frozenset[str] = frozenset()
    linear: tuple[LinearGroup, ...] = ()
    shape_only: frozenset[int] = frozenset()
    keep_all_partial: bool = False
    num_operand_attrs: int | None = None
    aux_outputs: frozenset[int] = frozenset()
    result_shapes: list[tuple[int, ...] | None] | None = None


class LetterPool:
    """Fresh letters for notations (any number; each letter is a short string)."""

    _ALPHA = "abcdefghijklmnopqrstuvwxyz"

    def __init__(self) -> None:
        self.n = 0

    def take(self, k: int = 1) -> Letters:
        out = []
        for _ in range(k):
            i = self.n
            self.n += 1
            s = self._ALPHA[i % 26] + (str(i // 26) if i >= 26 else "")
            out.append(s)
        return tuple(out)

    def one(self) -> str:
        return self.take(1)[0]


def pick_mesh(ins: Sequence[DistTensor | None], outs: Sequence[DistTensor | None]) -> ProcessMesh:
    """The mesh of the first tensor that has an attr. Raises CompletionError if none has."""
    for t in list(ins) + list(outs):
        if t is not None and t.attr is not None:
            return t.attr.process_mesh
    raise CompletionError("SPMD rule needs a process mesh: no operand or result has a dist attr")


def _shape(t: DistTensor | None) -> tuple[int, ...] | None:
    return None if t is None else t.shape


def _summed_partials(nt: Notation, ins: Sequence[DistTensor | None]) -> set[int]:
    """Mesh dims on which the op sums Partial operands: an ``"all"`` :class:`LinearGroup`
    of two or more operands, each Partial there with one reduce type the group allows
    (``add_n`` of partial gradients, ``add`` of two). A consumer's hint does not shard a
    letter on such a dim (module docstring, step 1): the sum stays Partial and is reduced
    once where it is consumed, not once per operand -- Megatron-LM sums the input gradients
    of the q/k/v (and gate/up) projections before the one reduce_scatter of sequence
    parallelism (``ColumnParallelLinear`` on a fused weight; reference/fidelity_notes.md),
    torch autograd accumulates a tensor's gradient before the collective of its
    producer's backward."""
    out: set[int] = set()
    for g in nt.linear:
        if g.mode != "all" or len(g.operands) < 2:
            continue
        attrs = [ins[i].attr if i < len(ins) and ins[i] is not None else None for i in g.operands]
        first = attrs[0]
        if first is None or any(a is None for a in attrs):
            continue
        for m, t in first.partial:
            if t in g.types and all(a.partial_dims.get(m) == t for a in attrs[1:]):  # type: ignore[union-attr]
                out.add(m)
    return out


def _merge(nt: Notation, ins: Sequence[DistTensor | None], outs: Sequence[DistTensor | None]
           ) -> tuple[dict[str, int], set[int]]:
    summed = _summed_partials(nt, ins) if nt.linear else set()
    props = []
    for kind, lts, ts in ((0, nt.inputs, ins), (1, nt.outputs, outs)):
        for i, lt in enumerate(lts):
            t = ts[i] if i < len(ts) else None
            if lt is None or t is None or t.attr is None:
                continue
            dm = t.attr.dims_mapping
            if kind == 1 and t.priority < 0 and summed:  # a hint: not on a summed Partial dim
                dm = tuple(-1 if m in summed else m for m in dm)
            props.append((-t.priority, kind, i, lt, dm, t.shape))
    props.sort(key=lambda p: p[:3])
    lmap: dict[str, int] = {}
    used: set[int] = set()
    rep = nt.replicated
    for _, _, _, lt, dm, shape in props:
        for d, m in enumerate(dm):
            if m < 0 or d >= len(lt):
                continue
            L = lt[d]
            if L in lmap or m in used or L in rep or "+" in L or shape[d] == 1:
                continue
            lmap[L] = m
            used.add(m)
    return lmap, used


def _check_even(nt: Notation, lmap: dict[str, int], used: set[int], mesh: ProcessMesh,
                ins: Sequence[DistTensor | None], outs: Sequence[DistTensor | None]) -> None:
    """Drop letters that must split evenly but do not (module docstring, step 4)."""
    need = set(nt.divisible)
    if nt.reduce_type == "avg":
        present = {x for lt in nt.outputs if lt for e in lt for x in e.split("+")}
        need |= {L for L in lmap if L not in present and L not in nt.internal}
    if not need:
        return
    for lts, ts in ((nt.inputs, ins), (nt.outputs, outs)):
        for lt, t in zip(lts, ts, strict=False):
            if lt is None or t is None:
                continue
            for L, s in zip(lt, t.shape, strict=False):
                m = lmap.get(L)
                if m is not None and L in need and s != 1 and s % mesh.shape[m] != 0:
                    del lmap[L]
                    used.discard(m)


def _kept_partials(nt: Notation, ins: Sequence[DistTensor | None], used: set[int]
                   ) -> tuple[dict[int, dict[int, str]], dict[int, str]]:
    """Partial mesh dims kept per operand and overall (module docstring, step 5)."""
    per: dict[int, dict[int, str]] = {}
    overall: dict[int, str] = {}
    groups = nt.linear
    if nt.keep_all_partial:
        groups = (LinearGroup(tuple(range(len(ins))), "one", ALL_TYPES),)
    for g in groups:
        attrs = {i: ins[i].attr for i in g.operands if i < len(ins) and ins[i] is not None}
        dims = sorted({m for a in attrs.values() if a is not None for m, _ in a.partial})
        for m in dims:
            if m in used or m in overall:
                continue
            types = {i: (a.partial_dims.get(m) if a is not None else None) for i, a in attrs.items()}
            if g.mode == "all":
                vals = set(types.values())
                t = next(iter(vals)) if len(vals) == 1 else None
                if t is None or t not in g.types:
                    continue
                for i in attrs:
                    per.setdefault(i, {})[m] = t
                overall[m] = t
            else:
                first = next((i for i in g.operands if types.get(i) in g.types), None)
                if first is None:
                    continue
                per.setdefault(first, {})[m] = types[first]
                overall[m] = types[first]
    return per, overall


def _dims(lt: Letters, shape: tuple[int, ...] | None, lmap: dict[str, int]) -> tuple[int, ...]:
    out = []
    for d, L in enumerate(lt):
        if shape is not None and d < len(shape) and shape[d] == 1:
            out.append(-1)
        elif "+" in L:
            out.append(next((lmap[x] for x in L.split("+") if x in lmap), -1))
        else:
            out.append(lmap.get(L, -1))
    return tuple(out)


def solve(nt: Notation, ins: Sequence[DistTensor | None], outs: Sequence[DistTensor | None],
          mesh: ProcessMesh) -> SpmdResult:
    """Merge the proposals of ``ins`` / ``outs`` under ``nt`` (module docstring) and return
    the required operand attrs and the result attrs on ``mesh``."""
    lmap, used = _merge(nt, ins, outs)
    _check_even(nt, lmap, used, mesh, ins, outs)
    per, overall = _kept_partials(nt, ins, used)
    operands: list[TensorDistAttr | None] = []
    for i, lt in enumerate(nt.inputs):
        t = ins[i] if i < len(ins) else None
        if lt is None or t is None:
            operands.append(None)
            continue
        part = per.get(i)
        if i in nt.shape_only and t.attr is not None:
            part = {m: r for m, r in t.attr.partial if m not in used}
        operands.append(TensorDistAttr(mesh, _dims(lt, t.shape, lmap), part))
    if nt.num_operand_attrs is not None:
        operands = operands[: nt.num_operand_attrs]
    results: list[TensorDistAttr | None] = []
    for j, lt in enumerate(nt.outputs):
        if lt is None:
            results.append(None)
            continue
        present = {x for e in lt for x in e.split("+")}
        part = dict(overall)
        if j not in nt.aux_outputs:
            for L, m in lmap.items():
                if L not in present and L not in nt.internal:
                    part[m] = nt.reduce_type
        shape = _shape(outs[j]) if j < len(outs) else None
        if shape is None and nt.result_shapes is not None and j < len(nt.result_shapes):
            shape = nt.result_shapes[j]
        results.append(TensorDistAttr(mesh, _dims(lt, shape, lmap), part))
    return SpmdResult(tuple(operands), tuple(results))
