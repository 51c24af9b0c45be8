"""SPMD rules and their registry.

A rule belongs to an op family (``matmul``, ``elementwise_binary``, ``reduce``...) and is
looked up by op type first, then by the op's family, then — for a ``*_grad`` op — derived
from its forward op's rule (:class:`GradRule`). Unknown ops get :class:`FallbackRule`
(replicate everything, with a warning), never an exception.

Every rule offers:

- ``infer_forward(inputs, attrs)``: operands as :class:`DistTensor` -> required operand
  attrs and result attrs.
- ``infer_reverse(outputs, attrs, inputs)``: results' attrs (``inputs`` give the operand
  shapes; their attrs are ignored) -> the operand attrs that produce them.
- ``infer(inputs, outputs, attrs, mesh)``: both at once, as the Completer uses it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from completion.dist_attr import TensorDistAttr
from completion.errors import CompletionError
from completion.mesh import ProcessMesh
from completion.ops.declare import GRAD_SUFFIX, base_name
from completion.ops.registry import OpDef, OpError, TensorType, get_opdef
from completion.spmd.core import DistTensor, LinearGroup, Notation, SpmdResult, pick_mesh, solve

Shapes = Sequence[tuple[int, ...] | None]
NotationFn = Callable[[str, Shapes, Shapes, dict[str, Any]], Notation]


class SpmdRule:
    """Base class. Subclasses implement :meth:`infer`."""

    #: whether results that are null in the program still get an attr (grad ops: yes,
    #: as Paddle prints them; forward ops: no)
    attrs_for_null_results = False
    #: whether the answer depends on the op's attrs; False lets the Completer's rule cache
    #: share one answer between ops that differ only in attrs (e.g. ``parameter`` ops,
    #: whose attrs name each parameter)
    reads_attrs = True

    def __init__(self, op_type: str) -> None:
        self.op_type = op_type

    def infer(self, inputs: Sequence[DistTensor | None], outputs: Sequence[DistTensor | None],
              attrs: dict[str, Any], mesh: ProcessMesh | None = None) -> SpmdResult:
        """Infer the op's layouts from what is known about its operands (``inputs``) and
        results (``outputs``), one DistTensor or None (null value) each, in op order: the attr
        every operand must have and the attr of every result (:class:`SpmdResult`). ``mesh``
        is the mesh to use when no operand has an attr. Raises CompletionError when the
        registry's shape inference fails or no process mesh is known."""
        raise NotImplementedError  # pragma: no cover - abstract

    def result_shapes(self, inputs: Sequence[DistTensor | None], attrs: dict[str, Any]
                      ) -> list[tuple[int, ...] | None]:
        """Result shapes by the op registry's inference (None for a null result)."""
        od = get_opdef(self.op_type)
        if od is None:
            return []
        types = [None if t is None else TensorType(t.shape, t.dtype) for t in inputs]
        try:
            out = od.infer(types, {**od.attrs, **attrs})
        except OpError as e:
            raise CompletionError(f"{self.op_type}: {e}") from None
        return [None if t is None else t.shape for t in out]

    def infer_forward(self, inputs: Sequence[DistTensor | None], attrs: dict[str, Any] | None = None,
                      mesh: ProcessMesh | None = None) -> SpmdResult:
        """Required operand attrs and result attrs from the operands' attrs."""
        attrs = dict(attrs or {})
        outs = [None if s is None else DistTensor(s) for s in self.result_shapes(inputs, attrs)]
        return self.infer(inputs, outs, attrs, mesh)

    def infer_reverse(self, outputs: Sequence[DistTensor | None], attrs: dict[str, Any] | None,
                      inputs: Sequence[DistTensor | tuple[int, ...] | None],
                      mesh: ProcessMesh | None = None) -> SpmdResult:
        """Operand attrs (and result attrs) that give the results' attrs ``outputs``.
        ``inputs`` carry the operand shapes only."""
        ins = [None if t is None else DistTensor(t.shape if isinstance(t, DistTensor) else tuple(t))
               for t in inputs]
        return self.infer(ins, outputs, dict(attrs or {}), mesh)


class EinsumRule(SpmdRule):
    """A rule given by a notation function (see :mod:`completion.spmd.core`)."""

    def __init__(self, op_type: str, notation: NotationFn) -> None:
        super().__init__(op_type)
        self.notation = notation

    def make_notation(self, ins: Shapes, outs: Shapes, attrs: dict[str, Any]) -> Notation:
        od = get_opdef(self.op_type)
        full = {**od.attrs, **attrs} if od else attrs
        return self.notation(self.op_type, ins, outs, full)

    def infer(self, inputs, outputs, attrs, mesh=None):
        mesh = mesh or pick_mesh(inputs, outputs)
        nt = self.make_notation([None if t is None else t.shape for t in inputs],
                                [None if t is None else t.shape for t in outputs], attrs)
        res = solve(nt, inputs, outputs, mesh)
        if not self.attrs_for_null_results:
            results = tuple(r if j < len(outputs) and outputs[j] is not None else None
                            for j, r in enumerate(res.results))
            res = SpmdResult(res.operands, results)
        return res


class FallbackRule(SpmdRule):
    """Unknown op: every operand required replicated (Partial reduced), every result
    replicated. Warns once per op type."""

    _warned: set[str] = set()

    def infer(self, inputs, outputs, attrs, mesh=None):
        mesh = mesh or pick_mesh(inputs, outputs)
        if self.op_type not in self._warned:
            self._warned.add(self.op_type)
            warnings.warn(f"no SPMD rule for op {self.op_type!r}: replicating its operands and "
                          "results", stacklevel=3)
        ops = tuple(None if t is None else TensorDistAttr.replicated(mesh, len(t.shape)) for t in inputs)
        res = tuple(None if t is None else TensorDistAttr.replicated(mesh, len(t.shape)) for t in outputs)
        return SpmdResult(ops, res)


class GradRule(EinsumRule):
    """The rule of a ``*_grad`` op, derived from its forward op's notation.

    Each grad operand names a forward operand, result or result gradient (``OpDef.
    grad_inputs``) and takes its letters; each grad result is the gradient of a forward
    operand and takes that operand's letters. A sharded letter absent from a gradient
    (a broadcast or contracted dim of the forward op: the batch of a weight, the sequence of
    a norm weight) makes it Partial(sum). Letters forced replicated or internal stay so.
    When the forward op keeps Partial inputs (it is linear), its grad keeps them on the
    out-gradient operands. Forward shapes missing from the grad op (a null gradient)
    come from the grad op's shape inference.
    """

    attrs_for_null_results = True

    def __init__(self, op_type: str, grad_def: OpDef, forward_def: OpDef, forward: EinsumRule) -> None:
        super().__init__(op_type, forward.notation)
        self.gdef, self.fdef, self.forward = grad_def, forward_def, forward

    def _slots(self, n_in: int) -> tuple[list[tuple[str, int]], int, int]:
        """Per grad operand: (kind, forward index), kind 'in' | 'out' | 'grad'; and the
        number of forward operands / results (a variadic name stands for all its values)."""
        fops = [base_name(o) for o in self.fdef.operands]
        fres = [base_name(r) for r in self.fdef.results]
        gin = list(self.gdef.operands)
        var = {fops[-1]} if self.fdef.variadic else set()
        var |= {fres[-1]} if self.fdef.variadic_results else set()
        n_var = n_in - (len(gin) - 1) if any(base_name(g) in var for g in gin) else 1
        n_fop = len(fops) - 1 + n_var if self.fdef.variadic else len(fops)
        n_fres = len(fres) - 1 + n_var if self.fdef.variadic_results else len(fres)
        slots: list[tuple[str, int]] = []
        for g in gin:
            nm = base_name(g)
            if g.endswith(GRAD_SUFFIX):
                kind, base = "grad", fres.index(nm)
            elif nm in fops:
                kind, base = "in", fops.index(nm)
            else:
                kind, base = "out", fres.index(nm)
            slots += [(kind, base + r) for r in range(n_var if nm in var else 1)]
        return slots, n_fop, n_fres

    def make_notation(self, ins, outs, attrs):
        od = self.gdef
        full = {**od.attrs, **attrs}
        slots, n_fop, n_fres = self._slots(len(ins))
        if not od.variadic:  # a trailing optional operand the op leaves out (completion.backward)
            slots = slots[:len(ins)]
        f_in: list[tuple[int, ...] | None] = [None] * n_fop
        f_out: list[tuple[int, ...] | None] = [None] * n_fres
        for (kind, k), s in zip(slots, ins, strict=False):
            tgt = f_in if kind == "in" else f_out
            if k < len(tgt) and s is not None:
                tgt[k] = s
        inferred = self._grad_types(ins, full)
        for k in range(n_fop):
            if f_in[k] is None:
                s = outs[k] if k < len(outs) else None
                f_in[k] = s if s is not None else (inferred[k] if k < len(inferred) else None)
        fnt = self.notation(self.fdef.name, f_in, f_out, full)
        inputs = [(fnt.inputs[k] if kind == "in" else fnt.outputs[k]) if k < len(
            fnt.inputs if kind == "in" else fnt.outputs) else None for kind, k in slots]
        outputs = [fnt.inputs[k] if k < len(fnt.inputs) else None for k in range(len(outs))]
        grads = tuple(i for i, (kind, _) in enumerate(slots) if kind == "grad")
        linear = (LinearGroup(grads, "all", frozenset({"sum", "avg"})),) if fnt.linear and grads else ()
        return Notation(inputs, outputs, set(fnt.replicated), "sum", fnt.internal, fnt.divisible,
                        linear, frozenset(self._shape_only_operands(slots)), result_shapes=f_in)

    def _grad_types(self, ins: Shapes, attrs: dict[str, Any]) -> list[tuple[int, ...] | None]:
        try:
            types = self.gdef.infer([None if s is None else TensorType(s) for s in ins], attrs)
        except (OpError, IndexError, TypeError):
            return []
        return [None if t is None else t.shape for t in types]

    def _shape_only_operands(self, slots: list[tuple[str, int]]) -> list[int]:
        """Forward operands the grad kernel reads for their shape only: the grad op's
        ``no_need_buffer`` operands (Paddle's backward.yaml), when every forward operand it
        reads is one (add, subtract, sum, mean, cast: the gradient is the output gradient,
        reduced or broadcast to the operand's shape). A grad kernel that reads some
        operands' values (layer_norm's x, embedding's ids) keeps the forward rule's layouts
        for all of them."""
        ins = [i for i, (kind, _) in enumerate(slots) if kind == "in"]
        if ins and all(i in self.gdef.no_need_buffer for i in ins):
            return ins
        return []


_RULES: dict[str, Callable[[str], SpmdRule]] = {}
_CACHE: dict[str, SpmdRule] = {}


def register_spmd_rule(key: str, factory: Callable[[str], SpmdRule] | NotationFn,
                       einsum: bool = True, reads_attrs: bool = True) -> None:
    """Register a rule for an op type or an op family. ``factory`` is a notation function
    (``einsum=True``) or a callable ``op_type -> SpmdRule``. ``reads_attrs=False`` (notation
    functions only) declares that the notation ignores the op's attrs
    (:attr:`SpmdRule.reads_attrs`). Raises CompletionError on a duplicate key."""
    if key in _RULES:
        raise CompletionError(f"SPMD rule {key!r} is registered twice")
    if einsum:
        fn = factory

        def make(t: str) -> SpmdRule:
            rule = EinsumRule(t, fn)  # type: ignore[arg-type]
            rule.reads_attrs = reads_attrs
            return rule

        _RULES[key] = make
    else:
        _RULES[key] = factory  # type: ignore[assignment]
    _CACHE.clear()


def get_spmd_rule(op_type: str) -> SpmdRule:
    """The rule for ``op_type`` (dialect prefix allowed): by type, then family, then derived
    from the forward op for a grad op, else :class:`FallbackRule`. Never raises."""
    t = op_type.split(".", 1)[1] if "." in op_type else op_type
    rule = _CACHE.get(t)
    if rule is None:
        rule = _lookup(t)
        _CACHE[t] = rule
    return rule


def _lookup(t: str) -> SpmdRule:
    if t in _RULES:
        return _RULES[t](t)
    od = get_opdef(t)
    if od is not None and od.family in _RULES:
        return _RULES[od.family](t)
    if od is not None and od.forward is not None:
        fdef = get_opdef(od.forward)
        if fdef is not None:
            fwd = _lookup(fdef.name)
            if hasattr(fwd, "grad_rule"):
                return fwd.grad_rule(t, od, fdef)  # type: ignore[attr-defined]
            if isinstance(fwd, EinsumRule) and not isinstance(fwd, GradRule):
                return GradRule(t, od, fdef, fwd)
    return FallbackRule(t)


def registered_keys() -> list[str]:
    """Op types and families that have a rule (for docs and tests)."""
    return sorted(_RULES)
