"""Kernel fusion of memory-bound ops, as a framework profile says.

A framework profile (``simulator.profiles``) lists the memory-bound op groups its software
runs as one kernel (``kernels.fused``, names in :data:`simulator.profiles.FUSION_GROUPS`)
and whether torch.compile fuses every elementwise chain (``kernels.compile``). This module
finds those groups in a program (forward and backward) and costs each as ONE kernel: it
reads its external inputs once, writes its external outputs once (values produced and
consumed inside the kernel never touch HBM), with one launch overhead. Ops in no group keep
their own cost (``simulator.op_cost``). FLOPs do not change.

Patterns (forward ops linked through the value the next op reads, which no other forward
op reads; backward ops through the gradient the next op reads, which nothing else reads;
all in one block, ``simulator.blocks``):

- ``bias_gelu`` -- Megatron-LM ``megatron/model/fused_bias_gelu.py`` (``bias_gelu`` /
  ``bias_gelu_back``, TorchScript-fused): forward ``add(x, bias) -> gelu``; backward
  ``gelu_grad -> add_grad`` (its input-gradient part). The forward does not write
  ``x + bias``: the backward kernel recomputes it from ``x`` and ``bias`` (it is
  ``GeLUFunction``'s saved input), so it reads those instead (see *recompute* below).
- ``bias_dropout_add`` -- Megatron-LM ``bias_dropout_add_fused_train``
  (``megatron/model/transformer.py``; Megatron-Core ``fusions/fused_bias_dropout.py``):
  forward ``[add(x, bias)] -> [dropout] -> add(., residual)`` (at least two of the three:
  Megatron runs it with p = 0 and with no bias too); backward ``add_grad(residual) ->
  [dropout_grad] -> [add_grad(bias)]``. It writes the sum and the dropout mask.
- ``scale_mask_softmax`` -- Megatron-LM ``FusedScaleMaskSoftmax``
  (``megatron/model/fused_softmax.py``, CUDA ``scaled_upper_triang_masked_softmax``):
  forward ``[scale] -> [add(., mask)] -> softmax`` (at least two); backward ``softmax_grad
  -> [add_grad(mask)] -> [scale_grad]`` (one kernel reading the probabilities and their
  gradient). The attention dropout after it is a separate kernel, as in Megatron. Only
  where Megatron's kernel takes the shape (``simulator.fused_softmax``, the costed
  rank's local ``[b, heads, sq, sk]``): elsewhere ``FusedScaleMaskSoftmax`` falls back to
  PyTorch's scale, mask and softmax, and the ops keep their own kernels.
- ``swiglu`` -- Megatron-Core ``fusions/fused_bias_swiglu.py``: ``silu(a) -> multiply(., b)``
  and ``multiply_grad -> silu_grad`` (a program from the torch frontend; the builders
  already emit the one-op ``swiglu``).
- ``residual_add`` -- the residual add runs in the kernel of the memory-bound op producing
  its branch input (Megatron-Core: "the residual add is fused into bias_dropout_add"), and
  its ``add_grad`` with the grad op reading its branch gradient; a residual add after a
  GEMM (LLaMA's o_proj / down_proj) has nothing to fuse with.
- ``norm``, ``rope``, ``cross_entropy``: the builders emit ``layer_norm`` / ``rms_norm``,
  ``fused_rotary_position_embedding`` and ``cross_entropy_with_softmax`` as single ops, so
  they already cost one kernel each with or without the group; their eager decompositions
  (several kernels) are not modelled.
- ``compile`` (``kernels.compile``: torch.compile, Inductor, ``torch/_inductor/scheduler.py``
  fuses pointwise and reduction nodes that share data; AOTAutograd's min-cut partitioner
  recomputes cheap pointwise intermediates in backward): every connected chain of
  memory-bound ops (op traits ``kernel == "memory"``; embeddings and optimizer updates
  excepted; views are transparent) in one block and one pass (forward, or the
  input-gradient part of backward) is one kernel.

Byte model of a fused kernel (local shapes of the costed rank): external inputs = the
values its members read (``no_need_buffer`` operands are not read) that no member writes;
external outputs = the values members write that an op outside the group reads, or that
nothing reads at all. Weight-gradient (W) kernels of backward members (a bias gradient's
reduction, a norm's weight gradient) stay separate kernels at their own cost.
*Recompute*: a forward group's intermediate that only backward ops read, all of them in
fused backward groups, is not written; each such backward group reads the forward group's
external inputs it is computed from instead (``x`` and ``bias`` for ``bias_gelu``). The
memory model (``simulator.memory``) still counts the intermediate as the saved value (the
same bytes as ``x`` for ``bias_gelu``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from completion.dtypes import DTYPE_BYTES
from completion.ir import Operation, OpRole, Program, Value
from completion.ops.registry import get_opdef, op_traits
from simulator.blocks import assign_blocks
from simulator.fused_softmax import softmax_kernel_available
from simulator.op_cost import KernelCost, op_cost
from simulator.op_signature import is_weight, local_tensor, op_signature
from simulator.types import BlockKey, Phase

#: the patterns this module matches (``simulator.profiles.FUSION_GROUPS`` minus the groups
#: the builders already emit as one op), in the order they claim ops
PATTERN_ORDER = ("scale_mask_softmax", "bias_gelu", "bias_dropout_add", "swiglu")
#: group name of torch.compile's chains
COMPILE = "compile"

_FWD_ROLES = (OpRole.FORWARD, OpRole.LOSS)


@dataclass(eq=False)
class FusedGroup:
    """Ops that run as one kernel.

    Attributes:
        name: the fusion group (``bias_gelu``, ...; :data:`COMPILE` for torch.compile).
        phase: ``"F"`` (forward ops) or ``"B"`` (the input-gradient kernels of backward ops).
        ops: the members in program order.
    """

    name: str
    phase: Phase
    ops: list[Operation] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"FusedGroup({self.name!r}, {self.phase!r}, {[op.type for op in self.ops]})"


def fusion_settings(profile: Any) -> tuple[tuple[str, ...], bool]:
    """``(kernels.fused, kernels.compile)`` of a framework profile (``ProfileSpec``); no
    groups and no compile for None."""
    if profile is None:
        return (), False
    k = profile.kernels
    return tuple(getattr(k.fused, "value", k.fused)), bool(getattr(k.compile, "value", k.compile))


# -- dataflow helpers -----------------------------------------------------------------------
def _alias_operand(op: Operation) -> int | None:
    """The operand whose storage ``op``'s result shares without a kernel: a view's input
    (reshape, squeeze, unsqueeze) or a view grad's incoming gradient (``reshape_grad``
    reads only ``out@GRAD``); None for any other op."""
    t = op_traits(op.type)
    if t.kernel is not None:
        return None
    if t.view:
        return 0
    if op.type.endswith("_grad") and op_traits(op.type[: -len("_grad")]).view and op.operands:
        return len(op.operands) - 1
    return None


def _is_view(op: Operation) -> bool:
    return _alias_operand(op) is not None


def storage_root(v: Value) -> Value:
    """``v`` seen through views and view grads (:func:`_alias_operand`): the value whose
    storage it shares."""
    while v.op is not None:
        j = _alias_operand(v.op)
        if j is None or v.op.operands[j] is None:
            break
        v = v.op.operands[j]  # type: ignore[assignment]
    return v


def reads(op: Operation) -> list[Value]:
    """The operands whose buffers ``op``'s kernel reads (``no_need_buffer`` ones excluded)."""
    skip = op_traits(op.type).no_need_buffer
    return [v for i, v in enumerate(op.operands) if v is not None and i not in skip]


def readers(v: Value) -> list[Operation]:
    """Ops that read ``v``'s buffer, directly or through views of it (an operand in a
    ``no_need_buffer`` position is not read)."""
    out: list[Operation] = []
    for u, i in v.uses:
        if i in op_traits(u.type).no_need_buffer:
            continue
        if _alias_operand(u) == i:
            for r in u.results:
                if r is not None:
                    out.extend(readers(r))
            continue
        out.append(u)
    return out


def _nbytes(v: Value, rank: int | None) -> int:
    t = local_tensor(v, rank)
    assert t is not None
    n = 1
    for d in t.shape:
        n *= d
    return n * DTYPE_BYTES.get(t.dtype, 4)


def _forward_type(op: Operation) -> str:
    """The forward op type a grad op differentiates (``add_grad`` -> ``add``), else the op's
    own type."""
    d = get_opdef(op.type)
    return d.forward if d is not None and d.forward else op.type


def _fusable(op: Operation) -> bool:
    """A memory-bound compute kernel: op traits ``kernel == "memory"``, not an optimizer
    update, a gather (``OpTraits.fusable`` False), a collective or local reshard step
    (``dist_op`` dialect) or an opaque frontend op."""
    t = op_traits(op.type)
    return (t.kernel == "memory" and not t.optimizer and t.fusable
            and op.dialect != "dist_op" and op.type != "opaque")


def _written(op: Operation, phase: Phase, names: frozenset[str]) -> list[Value]:
    """Results ``op`` writes in ``phase``: all of a forward op's; a backward op's
    input-gradient (B) results."""
    if phase == "F":
        return [r for r in op.results if r is not None]
    w = op_signature(op, None, names).weights
    return [r for j, r in enumerate(op.results) if r is not None and not (j < len(w) and w[j])]


# -- pattern predicates ---------------------------------------------------------------------
def _bias_operand(op: Operation) -> bool:
    """``op`` (add / add_grad) adds a 1-D weight (a bias) to an activation."""
    x, y = (op.operands + [None, None])[:2]
    if x is None or y is None:
        return False
    return (is_weight(y) and y.ndim == 1 and not is_weight(x)) or (
        is_weight(x) and x.ndim == 1 and not is_weight(y))


def _two_activations(op: Operation) -> bool:
    """``op`` (add / add_grad) adds two activations of one shape (a residual add)."""
    x, y = (op.operands + [None, None])[:2]
    return (x is not None and y is not None and not is_weight(x) and not is_weight(y)
            and tuple(x.shape) == tuple(y.shape))


def _non_weight_operand(op: Operation) -> bool:
    """No operand of ``op`` is a weight (a mask add, a gate multiply)."""
    return not any(v is not None and is_weight(v) for v in op.operands)


def _type(*names: str) -> Callable[[Operation], bool]:
    return lambda op: op.type in names


def _and(*preds: Callable[[Operation], bool]) -> Callable[[Operation], bool]:
    return lambda op: all(p(op) for p in preds)


Step = tuple[Callable[[Operation], bool], bool]  # (predicate, optional)

#: name -> (forward chain, backward chain, least members); a chain is a list of steps
PATTERNS: dict[str, tuple[list[Step], list[Step], int]] = {
    "bias_gelu": (
        [(_and(_type("add"), _bias_operand), False), (_type("gelu"), False)],
        [(_type("gelu_grad"), False), (_and(_type("add_grad"), _bias_operand), False)], 2),
    "bias_dropout_add": (
        [(_and(_type("add"), _bias_operand), True), (_type("dropout"), True),
         (_and(_type("add"), _two_activations), False)],
        [(_and(_type("add_grad"), _two_activations), False), (_type("dropout_grad"), True),
         (_and(_type("add_grad"), _bias_operand), True)], 2),
    "scale_mask_softmax": (
        [(_type("scale"), True), (_and(_type("add"), _non_weight_operand), True),
         (_type("softmax"), False)],
        [(_type("softmax_grad"), False), (_and(_type("add_grad"), _non_weight_operand), True),
         (_type("scale_grad"), True)], 2),
    "swiglu": (
        [(_type("silu"), False), (_and(_type("multiply"), _non_weight_operand), False)],
        [(_and(_type("multiply_grad"), _non_weight_operand), False), (_type("silu_grad"), False)], 2),
}


class _Matcher:
    """Pattern matching over one program (module docstring)."""

    def __init__(self, program: Program, blocks: dict[int, BlockKey]) -> None:
        self.program, self.blocks = program, blocks
        self.names = frozenset(p.name for p in program.parameters() if p.name)
        self.group_of: dict[int, FusedGroup] = {}
        self.pos = {id(op): i for i, op in enumerate(program.ops)}
        self._written: dict[tuple[int, str], list[Value]] = {}

    def written(self, op: Operation, phase: Phase) -> list[Value]:
        """:func:`_written`, cached per op."""
        key = (id(op), phase)
        if key not in self._written:
            self._written[key] = _written(op, phase, self.names)
        return self._written[key]

    def order(self, ops: Iterable[Operation]) -> list[Operation]:
        """``ops`` in program order."""
        return sorted(ops, key=lambda op: self.pos[id(op)])

    def phase(self, op: Operation) -> Phase | None:
        """F for a fusable forward op, B for a fusable backward op with an input-gradient
        kernel, else None (not fusable)."""
        if id(op) not in self.blocks or not _fusable(op):
            return None
        if op.role in _FWD_ROLES:
            return "F"
        if op.role == OpRole.BACKWARD and self.written(op, "B"):
            return "B"
        return None

    def successors(self, op: Operation, phase: Phase) -> list[Operation]:
        """Ops of the same pass and block that are the only reader (forward: the only
        forward reader) of one of ``op``'s results."""
        out = []
        for r in self.written(op, phase):
            rd = readers(r)
            same = [u for u in rd if (u.role in _FWD_ROLES) == (phase == "F")]
            if phase == "B" and len(rd) != 1:
                continue
            if len(same) == 1 and self.phase(same[0]) == phase and \
                    self.blocks.get(id(same[0])) == self.blocks.get(id(op)):
                out.append(same[0])
        return out

    def chain(self, op: Operation | None, steps: Sequence[Step], phase: Phase) -> list[Operation] | None:
        """The longest run of ``steps`` starting at ``op`` (optional steps may be skipped)."""
        if not steps:
            return []
        pred, optional = steps[0]
        if op is not None and id(op) not in self.group_of and self.phase(op) == phase and pred(op):
            if len(steps) == 1:
                return [op]
            for nxt in self.successors(op, phase):
                rest = self.chain(nxt, steps[1:], phase)
                if rest:
                    return [op, *rest]
            if all(opt for _, opt in steps[1:]):
                return [op]
        if optional:
            return self.chain(op, steps[1:], phase)
        return None

    def softmax_fusable(self, ops: list[Operation]) -> bool:
        """A ``scale_mask_softmax`` match runs fused: :func:`softmax_kernel_available` on
        the local scores (rank 0, the costed rank) its softmax (or softmax_grad) reads."""
        for op in ops:
            if _forward_type(op) != "softmax":
                continue
            for v in op.operands:
                if v is not None and len(v.shape) == 4:
                    t = local_tensor(v, 0)
                    return softmax_kernel_available(t.shape, t.dtype)
        return True

    def add(self, name: str, phase: Phase, ops: list[Operation]) -> None:
        g = FusedGroup(name, phase, self.order(ops))
        for op in ops:
            self.group_of[id(op)] = g

    def patterns(self, names: Iterable[str]) -> None:
        enabled = [n for n in PATTERN_ORDER if n in set(names)]
        for op in self.program.ops:
            ph = self.phase(op)
            if ph is None or id(op) in self.group_of:
                continue
            for name in enabled:
                fwd, bwd, least = PATTERNS[name]
                found = self.chain(op, fwd if ph == "F" else bwd, ph)
                if name == "scale_mask_softmax" and found and not self.softmax_fusable(found):
                    continue
                if found and len(found) >= least and found[0] is op:
                    self.add(name, ph, found)
                    break

    def residual_adds(self) -> None:
        """``residual_add``: a residual add joins the memory-bound op producing its branch
        input (forward; the add must be that value's only forward reader), its add_grad the
        grad op that alone reads the branch's gradient (backward)."""
        for op in self.program.ops:
            ph = self.phase(op)
            if ph is None or _forward_type(op) != "add" or not _two_activations(op):
                continue
            partners: list[Operation] = []
            for j, v in enumerate(op.operands[:2]):
                p = v.op if v is not None else None
                if p is None or p.role not in _FWD_ROLES or self.phase(p) != "F":
                    continue  # the branch input must come from a fusable forward op ...
                if sum(u.role in _FWD_ROLES for u in readers(v)) != 1:
                    continue  # ... that only the residual add reads (not the residual stream)
                if ph == "F" and op.type == "add" and op in self.successors(p, "F"):
                    partners.append(p)
                elif ph == "B" and op.type == "add_grad" and j < len(op.results):
                    g = op.results[j]
                    rd = readers(g) if g is not None else []
                    if len(rd) == 1 and rd[0] in self.successors(op, "B"):
                        partners.append(rd[0])
            for p in partners:
                g, mine = self.group_of.get(id(p)), self.group_of.get(id(op))
                if g is not None and g is mine:
                    break
                if g is not None and mine is None:
                    g.ops = self.order([*g.ops, op])
                    self.group_of[id(op)] = g
                    break
                if g is None and mine is None:
                    self.add("residual_add", ph, [p, op])
                    break

    def depths(self) -> dict[int, int]:
        """Per op, the most barrier kernels (GEMM, attention, collectives, sends: any op
        that runs but cannot fuse) on a dataflow path to it. Two fusable ops linked by a
        value at equal depth have no barrier between them, so fusing them keeps the group
        convex (no member waits on a non-member that waits on a member)."""
        depth: dict[int, int] = {}
        for op in self.program.ops:
            d = 0
            for v in op.operands:
                if v is None or v.op is None or id(v.op) not in depth:
                    continue
                p = v.op
                t = op_traits(p.type)
                # kernel-free ops (inputs, views, constants, sinks) never end a chain
                barrier = not (_fusable(p) or _is_view(p) or (t.kernel is None and p.dialect != "dist_op"))
                d = max(d, depth[id(p)] + (1 if barrier else 0))
            depth[id(op)] = d
        return depth

    def compile(self) -> None:
        """torch.compile: connected chains of fusable ops per block and pass."""
        members = [op for op in self.program.ops if self.phase(op) is not None]
        depth = self.depths()
        parent = {id(op): id(op) for op in members}
        by_id = {id(op): op for op in members}

        def find(a: int) -> int:
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a

        for op in members:
            ph = self.phase(op)
            for v in reads(op):
                p = storage_root(v).op
                if p is None or id(p) not in parent or self.phase(p) != ph:
                    continue
                if self.blocks.get(id(p)) != self.blocks.get(id(op)) or depth[id(p)] != depth[id(op)]:
                    continue
                if not any(storage_root(v) is r for r in self.written(p, ph)):
                    continue  # a weight gradient of p (its separate W kernel)
                parent[find(id(op))] = find(id(p))
        comps: dict[int, list[Operation]] = {}
        for op in members:
            comps.setdefault(find(id(op)), []).append(op)
        for root, ops in comps.items():
            if len(ops) > 1:
                ph = self.phase(by_id[root])
                assert ph is not None
                self.add(COMPILE, ph, ops)


# -- the plan -------------------------------------------------------------------------------
class FusionPlan:
    """The fused groups of one program and their kernels.

    Args:
        program: forward + backward program (optimizer ops are never fused).
        groups: enabled fusion group names (``kernels.fused`` of a profile).
        compile: torch.compile chains (``kernels.compile``); they subsume the patterns.
        blocks: the program's blocks (``simulator.blocks.assign_blocks``; computed when
            None).
    """

    def __init__(self, program: Program, groups: Iterable[str] = (), compile: bool = False,
                 blocks: dict[int, BlockKey] | None = None) -> None:
        self.program = program
        self.blocks = assign_blocks(program) if blocks is None else blocks
        m = _Matcher(program, self.blocks)
        names = set(groups)
        if compile:
            m.compile()
        else:
            m.patterns(names)
            if "residual_add" in names:
                m.residual_adds()
        self.names = m.names
        self.group_of = m.group_of
        self._m = m
        seen: dict[int, FusedGroup] = {}
        for g in m.group_of.values():
            seen.setdefault(id(g), g)
        self.groups: list[FusedGroup] = sorted(seen.values(), key=lambda g: m.pos[id(g.ops[0])])
        self._recompute()

    @classmethod
    def of(cls, program: Program, profile: Any, blocks: dict[int, BlockKey] | None = None) -> FusionPlan:
        """The plan a framework profile gives (:func:`fusion_settings`; None: no fusion)."""
        groups, comp = fusion_settings(profile)
        return cls(program, groups, comp, blocks)

    def _recompute(self) -> None:
        """Forward intermediates that only fused backward groups read: not written; those
        groups read the forward group's external inputs they come from."""
        self.unwritten: dict[int, list[Value]] = {}  # id(value) -> its recompute sources
        for g in self.groups:
            if g.phase != "F":
                continue
            mem = {id(op) for op in g.ops}
            for op in g.ops:
                for r in self._m.written(op, "F"):
                    rd = readers(r)
                    outside = [u for u in rd if id(u) not in mem]
                    if not outside or any(u.role in _FWD_ROLES for u in rd if id(u) not in mem):
                        continue
                    if all(u.role == OpRole.BACKWARD and id(u) in self.group_of
                           and self.group_of[id(u)].phase == "B" for u in outside):
                        src = self._sources(r, g)
                        if src is not None:
                            self.unwritten[id(r)] = src

    def _sources(self, v: Value, g: FusedGroup) -> list[Value] | None:
        """The external inputs of ``g`` that ``v`` is computed from; None when its
        computation draws random numbers (a dropout mask is kept, never recomputed)."""
        mem = {id(op) for op in g.ops}
        out: dict[int, Value] = {}
        stack = [v]
        while stack:
            x = storage_root(stack.pop())
            if x.op is not None and id(x.op) in mem:
                if op_traits(x.op.type).random:
                    return None
                stack.extend(reads(x.op))
            else:
                out.setdefault(id(x), x)
        return list(out.values())

    def is_fused(self, op: Operation) -> bool:
        """True when ``op`` runs (its forward or input-gradient kernel) inside a group."""
        return id(op) in self.group_of

    def group(self, op: Operation) -> FusedGroup | None:
        """The group ``op`` belongs to, or None."""
        return self.group_of.get(id(op))

    def io(self, g: FusedGroup, rank: int | None = 0) -> tuple[dict[int, int], dict[int, int]]:
        """(external input bytes, external output bytes) of group ``g``'s kernel, each by
        id of the value (local shapes of ``rank``; largest shard when None)."""
        mem = {id(op) for op in g.ops}
        made: set[int] = set()
        for op in g.ops:
            made.update(id(r) for r in self._m.written(op, g.phase))
        ins: dict[int, int] = {}
        for op in g.ops:
            for v in reads(op):
                r = storage_root(v)
                if id(r) in made:
                    continue
                for src in self.unwritten.get(id(r), [r]):
                    ins.setdefault(id(src), _nbytes(src, rank))
        outs: dict[int, int] = {}
        for op in g.ops:
            for r in self._m.written(op, g.phase):
                if id(r) in self.unwritten:
                    continue
                rd = readers(r)
                if not rd or any(id(u) not in mem for u in rd):
                    outs.setdefault(id(r), _nbytes(r, rank))
        return ins, outs

    def kernel(self, g: FusedGroup, rank: int | None = 0) -> KernelCost:
        """The one kernel of group ``g``: FLOPs of its members' kernels in its phase, bytes
        of its external inputs and outputs (:meth:`io`), kind ``memory``, tagged with the
        group name as its op."""
        ins, outs = self.io(g, rank)
        flops = exec_flops = 0.0
        dtype = ""
        for op in g.ops:
            for k in op_cost(op_signature(op, rank, self.names)):
                if k.phase == g.phase:
                    flops += k.flops
                    exec_flops += k.exec_flops
                    dtype = dtype or k.dtype
        return KernelCost(g.phase, flops, exec_flops, float(sum(ins.values()) + sum(outs.values())),
                          "memory", dtype or "float32", op=g.name)

    def remaining(self, op: Operation, kernels: Sequence[KernelCost]) -> list[KernelCost]:
        """The kernels of ``op`` that still run on their own: all of them for an op in no
        group; for a member, those outside its group's phase (a backward member's
        weight-gradient kernel)."""
        g = self.group_of.get(id(op))
        if g is None:
            return list(kernels)
        return [k for k in kernels if k.phase != g.phase]
