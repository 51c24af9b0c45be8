"""Sharding propagation to a fixed point: the worklist engine behind the Completer.

State: each value's dist attr (``Value.dist_attr``), each op's mesh, and per value a
*hint*: the dims_mapping its consumers would like (merged first-wins, only ever refined
from -1 to a mesh dim, so hints are monotone and propagation terminates).

Processing an op calls its SPMD rule with the operands' attrs and the results' hints (or
annotations), stores the op's ``OperatorDistAttr``, sets each result's attr (unless it is
fixed: annotated, or completed in an earlier phase) and merges each required operand
dims_mapping into that operand's hint. A changed result re-queues its consumers; a changed
hint re-queues the producer. Sweeps alternate direction (forward, reverse, forward...) over
the queued ops only, so an unchanged region is never revisited; after ``max_sweeps`` a
CompletionError names the values still changing.

Facts are never relabelled (the layout a value is said to have is the layout its data has):

- an op's result attr is always what its rule computes from the operand layouts it
  requires. An annotated (fixed) result keeps its annotation as the *value's* attr even
  when the op computes another layout (e.g. a matmul whose contracted dim is sharded gives
  a Partial): the op's result attr then differs from the value's attr and the partition
  pass reshards the result. Only sources that are given their data (``data``,
  ``parameter``, ``recv``: no operands) produce their annotation as it is; a ``full``
  computes its constant locally, so it gets its rule's layout (never Partial).
- a ``reshard`` op moves data: it requires its operand exactly as the operand value is
  laid out (so nothing is inserted before it) and gives its result the annotated target
  (else its rule's). A reshard op whose op dist attr was given (``fixed_ops``) keeps its
  source and target verbatim; if its operand value is laid out otherwise, the partition
  pass inserts a reshard to the given source first.

Invariant at the fixed point: a value that is not annotated has its producer's result attr;
an op's operand attr may differ from the operand value's attr, and an annotated result may
differ from its producer's result attr (the partition pass inserts a reshard at both).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from typing import Any

from completion.dist_attr import OperatorDistAttr, TensorDistAttr
from completion.errors import CompletionError
from completion.ir import Operation, Value
from completion.mesh import ProcessMesh
from completion.ops.registry import get_opdef, op_traits
from completion.spmd import DistTensor, SpmdResult, get_spmd_rule

MAX_SWEEPS = 500


_SCALARS = frozenset({int, float, str, bool, type(None)})


def freeze(x: Any) -> Hashable:
    """A hashable stand-in for an attribute value (lists -> tuples, dicts -> sorted items
    with str keys; an unhashable leaf -> its repr). Scalars of the exact built-in types
    (the common leaves: op attrs are ints, floats, strings and lists of them) are taken as
    they are, without the generic hash probe or a generator per level; the result is the
    same as the plain recursion (tests/completion/test_sched_fastpaths.py compares them)."""
    t = type(x)
    if t in _SCALARS:
        return x
    if t is list or t is tuple:
        for e in x:
            if type(e) not in _SCALARS:
                return tuple(freeze(e) for e in x)
        return tuple(x)
    if t is dict:
        if not x:
            return ()
        items = []
        for k, v in x.items():
            items.append((k if type(k) is str else str(k), v if type(v) in _SCALARS else freeze(v)))
        items.sort()
        return tuple(items)
    if isinstance(x, (list, tuple)):
        return tuple(freeze(e) for e in x)
    if isinstance(x, dict):
        return tuple(sorted((str(k), freeze(v)) for k, v in x.items()))
    try:
        hash(x)
        return x
    except TypeError:
        return repr(x)


def on_mesh(attr: TensorDistAttr | None, mesh: ProcessMesh) -> TensorDistAttr | None:
    """``attr`` seen from an op on ``mesh``: itself; moved to ``mesh`` when the meshes have
    the same shape (a pipeline stage boundary keeps its layout); else None (no info)."""
    if attr is None or attr.process_mesh is mesh or attr.process_mesh == mesh:
        return attr
    if attr.process_mesh.shape == mesh.shape:
        return TensorDistAttr(mesh, attr.dims_mapping, attr.partial_dims, attr.chunk_id)
    return None


class _Site:
    """What visiting one op needs that stays fixed for a run (built on the op's first
    visit by :meth:`Propagator._site`): the op, its mesh, chunk and rule, its signature
    (the static part of its rule-cache key, interned to an int), per operand and per result
    the static fields the rule sees (``ins`` / ``outs``), the operands whose attr may change
    during the run (produced by an op of the phase, not fixed), the free (non-null, not
    fixed) results with the positions of their users in the phase, and per operand position
    the position of the producer that takes its hints (-1: none)."""

    __slots__ = ("op", "mesh", "chunk", "rule", "sig", "ins", "outs", "dynamic", "free", "users",
                 "hint_from", "reshard")

    def __init__(self, op: Operation, mesh: ProcessMesh, rule: Any, sig: int, ins: tuple, outs: tuple,
                 dynamic: list, free: list, users: list, hint_from: list) -> None:
        self.op, self.mesh, self.chunk, self.rule, self.sig = op, mesh, op.chunk_id, rule, sig
        self.ins, self.outs, self.dynamic = ins, outs, dynamic
        self.free, self.users, self.hint_from = free, users, hint_from
        self.reshard = op.type == "reshard"


class _Outcome:
    """What the rule's answer means for one op signature and chunk (memoised beside the
    answer in the rule cache): the op dist attr to store, per free result the attr it gets
    (None: unchanged), and the ``(operand position, dims_mapping)`` hints for operands
    (only those that can refine a hint: of the operand's rank, some dim sharded)."""

    __slots__ = ("op_attr", "free_attrs", "hints")

    def __init__(self, op_attr: OperatorDistAttr, free_attrs: tuple, hints: tuple) -> None:
        self.op_attr, self.free_attrs, self.hints = op_attr, free_attrs, hints


class _Entry:
    """A rule-cache entry: the rule's answer and its outcomes by chunk id."""

    __slots__ = ("res", "outcomes")

    def __init__(self, res: SpmdResult) -> None:
        self.res = res
        self.outcomes: dict[int, _Outcome] = {}


class Propagator:
    """Propagates over ``ops`` (a phase of the program) to a fixed point.

    Args:
        ops: the ops to complete, in program order.
        op_mesh: id(op) -> process mesh (every op of ``ops``).
        fixed: id(value) -> priority for values whose attr must not change (annotations:
            2 for a parameter, 1 otherwise; values of earlier phases: 0).
        max_sweeps: bound on sweeps (CompletionError beyond it).
        fixed_ops: ids of ops whose ``dist_attr`` is a given fact (``reshard`` ops with a
            given source and target): never re-inferred or changed.

    The rule cache (``cache``) is keyed by an op's signature (op type, frozen attrs unless
    the rule declares it ignores them (``SpmdRule.reads_attrs``), mesh, per operand its
    shape, priority and, when it cannot change during the run (fixed, or produced outside
    the phase), its attr seen from the op's mesh; per result its shape and, when fixed, its
    attr and priority) and the attrs that do change (each other operand's attr seen from
    the op's mesh, each free result's hint attr): the same information as the ``(shape,
    attr, priority)`` tuples the rule sees, so ops of identical layers share one answer.
    The outcome of an answer (the op dist attr, result attrs and operand hints it implies)
    is a function of the key and the op's chunk, memoised in the same entry. The result
    attrs it gives are canonical (one object per equal attr and mesh object, ``canon``) and
    hint attrs are shared per (mesh, hint), so keys mostly compare by identity rather than
    by the dataclass ``__eq__``. ``fixed`` and the program's values must not change while
    :meth:`run` runs, except through it; the caches live and die with the Propagator.
    """

    def __init__(self, ops: list[Operation], op_mesh: dict[int, ProcessMesh],
                 fixed: dict[int, int], max_sweeps: int = MAX_SWEEPS,
                 fixed_ops: set[int] | frozenset[int] = frozenset()) -> None:
        self.ops = ops
        self.pos = {id(op): i for i, op in enumerate(ops)}
        self.op_mesh = op_mesh
        self.fixed = fixed
        self.fixed_ops = fixed_ops
        self.max_sweeps = max_sweeps
        self.hints: dict[Value, tuple[int, ...]] = {}  # by the value itself: no id() call
        self.cache: dict[Hashable, _Entry] = {}
        self.hint_attr: dict[tuple, TensorDistAttr] = {}
        self.sigs: dict[Hashable, int] = {}
        self.merged: dict[tuple, tuple[int, ...] | None] = {}
        self.canon: dict[tuple, TensorDistAttr] = {}
        self.rules: dict[str, Any] = {}  # op type -> SPMD rule
        self.sites: list[_Site | None] = [None] * len(ops)
        self.sweeps = 0

    # -- one op -------------------------------------------------------------------------
    def _site(self, i: int) -> _Site:
        """The :class:`_Site` of ``ops[i]`` (built on its first visit). An operand whose
        producer is outside the phase, or that is fixed, keeps its attr for the whole run:
        its attr goes into the signature, the others into each visit's key."""
        site = self.sites[i]
        if site is not None:
            return site
        op = self.ops[i]
        fixed, pos = self.fixed, self.pos
        mesh = self.op_mesh[id(op)]
        rule = self.rules.get(op.type)
        if rule is None:
            rule = self.rules[op.type] = get_spmd_rule(op.type)
        ins: list = []
        dynamic: list[Value] = []
        hint_from: list[int] = []
        for v in op.operands:  # plain loops: this runs once per op of the phase
            if v is None:
                ins.append(None)
                hint_from.append(-1)
                continue
            prio = fixed.get(id(v))
            src = v.op
            j = -1 if prio is not None or src is None else pos.get(id(src), -1)
            hint_from.append(j)
            if j < 0:  # static for the run
                ins.append((v.type.shape, 0 if prio is None else prio, on_mesh(v.dist_attr, mesh)))
            else:
                ins.append((v.type.shape, 0))
                dynamic.append(v)
        outs: list = []
        free: list[Value] = []
        users: list[list[int]] = []
        for r in op.results:
            if r is None:
                outs.append(None)
                continue
            prio = fixed.get(id(r))
            if prio is not None:
                outs.append((r.type.shape, prio, on_mesh(r.dist_attr, mesh)))
                continue
            outs.append((r.type.shape, -1))
            free.append(r)
            us = []
            for u, _ in r.uses:
                k = pos.get(id(u))
                if k is not None:
                    us.append(k)
            users.append(us)
        akey = freeze(op.attrs) if rule.reads_attrs else ()
        ins_t, outs_t = tuple(ins), tuple(outs)
        sig = self.sigs.setdefault((op.type, akey, mesh, ins_t, outs_t), len(self.sigs))
        site = self.sites[i] = _Site(op, mesh, rule, sig, ins_t, outs_t, dynamic, free, users, hint_from)
        return site

    def _entry(self, site: _Site) -> _Entry:
        """The cache entry for ``site`` in the current state (its key: the signature, each
        dynamic operand's attr seen from the op's mesh, each free result's hint attr); runs
        the rule on a miss."""
        mesh, hints, hint_attr = site.mesh, self.hints, self.hint_attr
        parts: list = [site.sig]
        for v in site.dynamic:
            a = v.dist_attr
            if a is not None and a.process_mesh is not mesh:
                a = on_mesh(a, mesh)
            parts.append(a)
        for r in site.free:
            h = hints.get(r)
            if h is None:
                parts.append(None)
            else:
                a = hint_attr.get((mesh, h))
                if a is None:
                    a = hint_attr[(mesh, h)] = TensorDistAttr(mesh, h)
                parts.append(a)
        key = tuple(parts)
        entry = self.cache.get(key)
        if entry is None:
            op, mesh = site.op, site.mesh
            it = iter(key[1:])  # the dynamic operand attrs, then the free results' hints
            ins = [None if t is None else DistTensor(t[0], t[2] if len(t) == 3 else next(it), t[1])
                   for t in site.ins]
            outs = [None if t is None else DistTensor(t[0], t[2] if len(t) == 3 else next(it), t[1])
                    for t in site.outs]
            try:
                res = site.rule.infer(ins, outs, op.attrs, mesh)
            except CompletionError as e:
                raise CompletionError(f"{op.label()}: {e}") from None
            except (ValueError, IndexError, KeyError, TypeError) as e:
                raise CompletionError(f"{op.label()}: SPMD rule failed: {e}") from None
            entry = _Entry(res)
            self.cache[key] = entry
        return entry

    def infer(self, op: Operation) -> SpmdResult:
        """The rule's answer for ``op`` (one of ``ops``) in the current state (cached:
        class docstring)."""
        return self._entry(self._site(self.pos[id(op)])).res

    def _outcome(self, site: _Site, res: SpmdResult) -> _Outcome:
        """What ``res`` means for ``site`` (:class:`_Outcome`). Operand attrs take the op's
        chunk; a reshard op takes its operand as it is laid out (it moves data); a fixed
        result keeps its annotation as the op's result attr when the rule gives none or
        the op is a source given its data, else the op's result attr is what it computes
        (the partition pass reshards it: never a relabel)."""
        op, mesh, chunk, fixed = site.op, site.mesh, site.chunk, self.fixed
        operands = [_chunk(a, chunk) for a in res.operands]
        if site.reshard:  # a reshard moves data: it takes its operand as it is
            operands = [_chunk(on_mesh(v.dist_attr, mesh) or v.dist_attr, chunk)
                        if v is not None and v.dist_attr is not None else a
                        for v, a in zip(op.operands, operands, strict=False)]
        given_source = not op.operands and gives_annotation(op)
        results: list[TensorDistAttr | None] = []
        free: list[TensorDistAttr | None] = []
        nres = len(res.results)
        canon = self.canon
        for j, r in enumerate(op.results):
            a = _chunk(res.results[j], chunk) if j < nres else None
            if r is not None and id(r) in fixed:
                if a is None or given_source:
                    a = on_mesh(r.dist_attr, mesh) or a
            elif r is not None:
                if a is not None:  # one object per equal attr (and mesh object): the
                    a = canon.setdefault((id(a.process_mesh), a), a)  # keys compare by identity
                free.append(a)
            results.append(a)
        hints = []
        for i, (v, req) in enumerate(zip(op.operands, res.operands, strict=False)):
            if v is not None and req is not None and len(req.dims_mapping) == v.ndim \
                    and any(m >= 0 for m in req.dims_mapping):  # else no hint can change
                hints.append((i, req.dims_mapping))
        return _Outcome(OperatorDistAttr(mesh, tuple(operands), tuple(results), chunk), tuple(free), tuple(hints))

    def process(self, op: Operation, changed: list[Value]) -> list[Operation]:
        """Apply the rule to ``op``; returns the ops to revisit."""
        return [self.ops[j] for j in self._visit(self.pos[id(op)], changed)]

    def _visit(self, i: int, changed: list[Value]) -> list[int]:
        """:meth:`process`, returning positions in ``ops``: store the op dist attr, set each
        free result's attr (queueing its users when it changes) and merge the required
        operand dims_mappings into their producers' hints (queueing a producer whose hint
        changes)."""
        op = self.ops[i]
        if id(op) in self.fixed_ops:
            return [self.pos[id(o)] for o in self._process_fixed(op)]
        site = self.sites[i] or self._site(i)
        entry = self._entry(site)
        out = None if site.reshard else entry.outcomes.get(site.chunk)
        if out is None or out.op_attr.process_mesh is not site.mesh:
            # a reshard's outcome reads its operand's layout; an equal mesh of other dim
            # names shares the rule's answer but keeps its own op dist attr
            out = self._outcome(site, entry.res)
            if not site.reshard and site.chunk not in entry.outcomes:
                entry.outcomes[site.chunk] = out
        op.dist_attr = out.op_attr
        todo: list[int] = []
        free_attrs, users = out.free_attrs, site.users
        k = 0  # (a counter, not a zip per visit)
        for r in site.free:
            a = free_attrs[k]
            if a is not None:
                ra = r.dist_attr
                if ra is None or (ra is not a and ra != a):
                    r.dist_attr = a
                    changed.append(r)
                    todo += users[k]
            k += 1
        if out.hints:
            shape = site.mesh.shape
            for i, dims in out.hints:
                j = site.hint_from[i]
                if j < 0:
                    continue
                v = op.operands[i]
                a = v.dist_attr
                if a is not None and a.process_mesh.shape != shape:
                    continue
                if self._hint(v, dims):
                    todo.append(j)
        return todo

    def _process_fixed(self, op: Operation) -> list[Operation]:
        """A given op dist attr: nothing changes; its source layouts become hints."""
        da = op.dist_attr
        todo: list[Operation] = []
        if da is None:
            return todo
        for i, v in enumerate(op.operands):
            if v is not None and i < len(da.operands) and id(v) not in self.fixed:
                todo += self._hint_operand(v, da.operands[i], da.process_mesh)
        return todo

    def _hint_operand(self, v: Value, req: TensorDistAttr | None, mesh: ProcessMesh) -> list[Operation]:
        if req is None or v.op is None or id(v.op) not in self.pos:
            return []
        if v.dist_attr is not None and v.dist_attr.process_mesh.shape != mesh.shape:
            return []
        if len(req.dims_mapping) != v.ndim:
            return []
        return [v.op] if self._hint(v, req.dims_mapping) else []

    def _hint(self, v: Value, dims: tuple[int, ...]) -> bool:
        """Merge ``dims`` into ``v``'s hint; True when the hint changed (:func:`merge_hint`,
        memoised per (hint, dims, shape): identical layers merge the same hints)."""
        old = self.hints.get(v)
        key = (old, dims, v.type.shape)
        new = self.merged.get(key)
        if new is None:
            new = self.merged[key] = merge_hint(old, dims, v.type.shape)
        if new == old:
            return False
        self.hints[v] = new
        return True

    # -- the fixed point ----------------------------------------------------------------
    def run(self) -> int:
        """Propagate to a fixed point; returns the number of sweeps."""
        pending = set(range(len(self.ops)))
        direction = 1
        visit = self._visit
        while pending:
            self.sweeps += 1
            changed: list[Value] = []
            if self.sweeps > self.max_sweeps:
                raise self._no_fixed_point(pending)
            heap = [direction * i for i in pending]
            heapq.heapify(heap)
            queued = set(pending)
            pending = set()
            while heap:
                i = direction * heapq.heappop(heap)
                queued.discard(i)
                for j in visit(i, changed):
                    if (j - i) * direction > 0:
                        if j not in queued:
                            queued.add(j)
                            heapq.heappush(heap, direction * j)
                    else:
                        pending.add(j)
            self.last_changed = changed
            direction = -direction
        return self.sweeps

    def _no_fixed_point(self, pending: set[int]) -> CompletionError:
        vals = [v.label() for v in getattr(self, "last_changed", [])][:10]
        ops = [self.ops[i].label() for i in sorted(pending)][:5]
        return CompletionError(
            f"sharding propagation did not reach a fixed point after {self.max_sweeps} sweeps; "
            f"values still changing: {', '.join(vals) or 'none'}; ops still queued: {', '.join(ops)}"
        )


def merge_hint(old: tuple[int, ...] | None, dims: Sequence[int], shape: Sequence[int]) -> tuple[int, ...] | None:
    """A value's hint after a consumer asks for ``dims``: with no hint yet, ``dims`` (None
    when it shards nothing); else ``old`` with each -1 entry taken from ``dims`` when that
    mesh dim is not used yet (first wins, entries only go from -1 to a mesh dim). Size-1
    tensor dims stay -1. Hints only grow, so propagation terminates (module docstring)."""
    if old is None:
        if all(m < 0 for m in dims):
            return None
        return tuple(-1 if shape[d] == 1 else m for d, m in enumerate(dims))
    cur = list(old)
    used = {m for m in cur if m >= 0}
    for d, m in enumerate(dims):
        if m >= 0 and cur[d] < 0 and m not in used and shape[d] != 1:
            cur[d] = m
            used.add(m)
    return tuple(cur)


def gives_annotation(op: Operation) -> bool:
    """Whether ``op``'s annotated results are facts about its data (a source op whose
    values are supplied in their annotated layout: ``data``, ``parameter``, ``recv``) rather
    than layouts its kernel must be made to produce (every other op, ``full`` included)."""
    if op.operands:
        return False
    d = get_opdef(op.type)
    return op_traits(op.type).input or (d is not None and d.family == "p2p")


def _chunk(a: TensorDistAttr | None, chunk: int) -> TensorDistAttr | None:
    if a is None or a.chunk_id == chunk:
        return a
    return a.replace(chunk_id=chunk)
