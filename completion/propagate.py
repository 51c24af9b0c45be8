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
from collections.abc import Hashable
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
    same as the plain recursion (tests/test_sched_fastpaths.py compares them)."""
    t = type(x)
    if t in _SCALARS:
        return x
    if t is list or t is tuple:
        for e in x:
            if type(e) not in _SCALARS:
                return tuple(freeze(e) for e in x)
        return tuple(x)
    if t is dict:
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
        self.hints: dict[int, tuple[int, ...]] = {}
        self.cache: dict[Hashable, SpmdResult] = {}
        self.attr_keys: dict[int, Hashable] = {}
        self.hint_attr: dict[tuple, TensorDistAttr] = {}
        self.sweeps = 0

    # -- one op -------------------------------------------------------------------------
    def _inputs(self, op: Operation, mesh: ProcessMesh) -> tuple[tuple, tuple]:
        """Per operand and per result ``(shape, attr, priority)`` (None for a null one): the
        DistTensor fields the rule sees (dtype is always the default here). Plain tuples key
        the rule cache; the DistTensors are built only when the rule runs. A result's hint
        attr is built once per (mesh, hint)."""
        fixed, hints, hint_attr = self.fixed, self.hints, self.hint_attr
        ins = tuple(None if v is None else (v.type.shape, on_mesh(v.dist_attr, mesh), fixed.get(id(v), 0))
                    for v in op.operands)
        outs: list = []
        for r in op.results:
            if r is None:
                outs.append(None)
            elif id(r) in fixed:
                outs.append((r.type.shape, on_mesh(r.dist_attr, mesh), fixed[id(r)]))
            else:
                h = hints.get(id(r))
                if h is None:
                    outs.append((r.type.shape, None, -1))
                else:
                    a = hint_attr.get((mesh, h))
                    if a is None:
                        a = hint_attr[(mesh, h)] = TensorDistAttr(mesh, h)
                    outs.append((r.type.shape, a, -1))
        return ins, tuple(outs)

    def infer(self, op: Operation) -> SpmdResult:
        """The rule's answer for ``op`` in the current state (cached by its inputs: the op
        type, its frozen attrs unless the rule declares it ignores them
        (``SpmdRule.reads_attrs``), the mesh and the operand / result tuples)."""
        mesh = self.op_mesh[id(op)]
        ins, outs = self._inputs(op, mesh)
        akey = self.attr_keys.get(id(op))
        if akey is None:  # a rule that ignores attrs answers alike for all of them
            akey = self.attr_keys[id(op)] = freeze(op.attrs) if get_spmd_rule(op.type).reads_attrs else ()
        key = (op.type, akey, mesh, ins, outs)
        res = self.cache.get(key)
        if res is None:
            tensors = [[None if t is None else DistTensor(*t) for t in side] for side in (ins, outs)]
            try:
                res = get_spmd_rule(op.type).infer(tensors[0], tensors[1], op.attrs, mesh)
            except CompletionError as e:
                raise CompletionError(f"{op.label()}: {e}") from None
            except (ValueError, IndexError, KeyError, TypeError) as e:
                raise CompletionError(f"{op.label()}: SPMD rule failed: {e}") from None
            self.cache[key] = res
        return res

    def process(self, op: Operation, changed: list[Value]) -> list[Operation]:
        """Apply the rule to ``op``; returns the ops to revisit."""
        if id(op) in self.fixed_ops:
            return self._process_fixed(op)
        res = self.infer(op)
        mesh = self.op_mesh[id(op)]
        chunk = op.chunk_id
        fixed, pos = self.fixed, self.pos
        operands = [a if a is None or a.chunk_id == chunk else a.replace(chunk_id=chunk) for a in res.operands]
        if op.type == "reshard":  # a reshard moves data: it takes its operand as it is
            operands = [_chunk(on_mesh(v.dist_attr, mesh) or v.dist_attr, chunk)
                        if v is not None and v.dist_attr is not None else a
                        for v, a in zip(op.operands, operands, strict=False)]
        given_source = not op.operands and gives_annotation(op)
        results: list[TensorDistAttr | None] = []
        todo: list[Operation] = []
        nres = len(res.results)
        for j, r in enumerate(op.results):
            a = _chunk(res.results[j], chunk) if j < nres else None
            if r is not None and id(r) in fixed:
                if a is None or given_source:
                    a = on_mesh(r.dist_attr, mesh) or a
                # else: the op computes ``a``; the value keeps its annotation and the
                # partition pass reshards the result (never a relabel)
            elif r is not None and a is not None and r.dist_attr != a:
                r.dist_attr = a
                changed.append(r)
                todo.extend(u for u, _ in r.uses if id(u) in pos)
            results.append(a)
        results += [None] * (len(op.results) - len(results))
        op.dist_attr = OperatorDistAttr(mesh, tuple(operands), tuple(results), chunk)
        nops = len(res.operands)
        for i, v in enumerate(op.operands):
            if v is None or i >= nops or id(v) in fixed:
                continue
            req = res.operands[i]
            if req is None or v.op is None or id(v.op) not in pos:  # _hint_operand's early outs
                continue
            todo += self._hint_operand(v, req, mesh)
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
        old = self.hints.get(id(v))
        shape = v.type.shape
        if old is None:
            if all(m < 0 for m in dims):
                return False
            new = tuple(-1 if shape[d] == 1 else m for d, m in enumerate(dims))
        else:
            cur = list(old)
            used = {m for m in cur if m >= 0}
            for d, m in enumerate(dims):
                if m >= 0 and cur[d] < 0 and m not in used and shape[d] != 1:
                    cur[d] = m
                    used.add(m)
            new = tuple(cur)
        if new == old:
            return False
        self.hints[id(v)] = new
        return True

    # -- the fixed point ----------------------------------------------------------------
    def run(self) -> int:
        """Propagate to a fixed point; returns the number of sweeps."""
        pending = set(range(len(self.ops)))
        direction = 1
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
                for nxt in self.process(self.ops[i], changed):
                    j = self.pos[id(nxt)]
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
