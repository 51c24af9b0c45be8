"""What one rank runs when: its ops (``completion.rank_program``) sorted into units.

Units (the schedule's actions run them per micro-batch):

- ``("F", c)``: forward and loss ops of chunk c;
- ``("B", c)``: backward ops of chunk c that compute input (activation) gradients;
- ``("W", c)``: weight-gradient work (Zero Bubble's W pass, Qi et al. 2024 sec. 2): the
  parameter-gradient results of grad ops, and backward ops that only combine or move
  such gradients (add_n, reshard collectives); a grad op with both kinds of results
  (``matmul_grad``: x@GRAD is B, y@GRAD is W) is split into a B part and a W part;
- ``"pre"``: once per step before the micro-batches: p2p of persistent values (parameters,
  optimizer state) needed by forward work on another stage;
- ``"step"``: once per step after every micro-batch: optimizer-role ops (gradient
  synchronisation collectives the partition pass placed before each update, and the
  updates). Per-micro-batch values they read (gradients) are summed over micro-batches and
  scaled by 1/m first: the loss of a step is the mean of the m micro-batch losses, and
  every op between a gradient and its update is linear.

Sources (data, parameter, full) are not scheduled: a per-micro-batch source (an input, a
constant) is produced on first use in each micro-batch, a persistent one (parameter,
persistable data) lives in the rank's state. A send runs in the unit whose op produced
its operand (so a value leaves as soon as it exists); a recv runs in its own op's unit.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from completion import RankOp, rank_program
from completion.ir import Operation, OpRole, Program, Value
from completion.passes.reshard import value_layout
from executor.errors import ExecutorError

SOURCES = ("data", "parameter", "full")
P2P = ("send", "recv")


def is_source(op: Operation) -> bool:
    return op.type in SOURCES and not op.operands


def is_persistent(v: Value) -> bool:
    """Parameters and persistable data (learning rate, optimizer state)."""
    return v.is_parameter or v.persistable


@dataclass
class Item:
    """One op (or one part of a split grad op) in a unit.

    ``want``: result indices this part produces (None = all). ``index``: the op's position
    in the program (p2p tags). ``offsets``: per operand the global start of its local block."""

    ro: RankOp
    want: tuple[int, ...] | None
    index: int
    offsets: tuple[tuple[int, ...] | None, ...] = ()

    @property
    def op(self) -> Operation:
        return self.ro.op


@dataclass
class RankPlan:
    """The units of one rank (module docstring) and per-micro-batch liveness.

    Attributes:
        units: unit key -> items in program order.
        uses: value id -> how many per-micro-batch items read it (liveness counting).
        accum: ids of per-micro-batch values read by the step phase (summed over
            micro-batches). sources: value id -> source op (produced on demand).
        loss: the loss value when this rank computes it.
    """

    rank: int
    units: dict = field(default_factory=dict)
    uses: Counter = field(default_factory=Counter)
    accum: set = field(default_factory=set)
    sources: dict = field(default_factory=dict)
    loss: Value | None = None
    values: dict = field(default_factory=dict)


def _offsets(ro: RankOp) -> tuple[tuple[int, ...] | None, ...]:
    out = []
    for v in ro.op.operands:
        lay = value_layout(v) if v is not None else None
        if lay is None or ro.rank not in lay.mesh.process_ids or not v.ndim:
            out.append(None)
        else:
            out.append(tuple(a for a, _ in lay.index_range(v.shape, ro.rank)))
    return tuple(out)


def _param_grad_results(op: Operation) -> list[int]:
    """Indices of a grad op's results that are gradients of parameters (following reshard
    ops back from the forward operand to the parameter it reads)."""
    from completion.optimizer import forward_operands_of
    from executor.writeback import root_value

    fwd = forward_operands_of(op)
    return [i for i, r in enumerate(op.results)
            if r is not None and i < len(fwd) and fwd[i] is not None and root_value(fwd[i]).is_parameter]


def _w_split(bwd: list[RankOp]) -> dict[int, tuple[int, ...]]:
    """op id -> indices of its W results, in program order: a grad op's parameter-gradient
    results are W (Zero Bubble's W pass); any other backward op (add_n, casts, reshard-pass
    collectives) whose backward operands are all W values is W as a whole."""
    wd: set[int] = set()
    out: dict[int, tuple[int, ...]] = {}
    for ro in bwd:
        op = ro.op
        if op.type in P2P:
            continue
        if op.type.endswith("_grad"):
            w = _param_grad_results(op)
        else:
            back = [v for v in op.operands if v is not None and v.op is not None
                    and v.op.role == OpRole.BACKWARD and not is_source(v.op)]
            w = [i for i, r in enumerate(op.results) if r is not None] \
                if back and all(id(v) in wd for v in back) else []
        for i in w:
            wd.add(id(op.results[i]))
        if w:
            out[id(op)] = tuple(w)
    return out


def build_rank_plan(program: Program, rank: int) -> RankPlan:
    """Sort rank ``rank``'s ops into units (module docstring)."""
    rops = rank_program(program, rank)
    index = {id(op): i for i, op in enumerate(program.ops)}
    plan = RankPlan(rank)
    step_ops = {id(ro.op) for ro in rops if ro.op.role == OpRole.OPTIMIZE and not is_source(ro.op)}
    bwd = [ro for ro in rops if ro.op.role == OpRole.BACKWARD and id(ro.op) not in step_ops]
    wparts = _w_split(bwd)
    produced_in: dict[int, object] = {}  # value id -> unit key
    for ro in rops:
        op = ro.op
        for v in op.results:
            if v is not None:
                plan.values[id(v)] = v
        if is_source(op):
            for v in op.results:
                if v is not None:
                    plan.sources[id(v)] = ro
            continue
        for key, want in _keys(op, ro, wparts, step_ops, produced_in, program, index):
            plan.units.setdefault(key, []).append(Item(ro, want, index[id(op)], _offsets(ro)))
            for i, v in enumerate(op.results):
                if v is not None and (want is None or i in want):
                    produced_in[id(v)] = key
        if op.type == "shadow_output" and str(op.attrs.get("output_name", "")).startswith("loss"):
            plan.loss = op.operands[0]
    _liveness(plan, step_ops)
    return plan


def _keys(op, ro, wparts, step_ops, produced_in, program, index):
    if id(op) in step_ops:
        return [("step", None)]
    if op.type == "send":
        v = op.operands[0]
        if v is not None and id(v) in produced_in:
            return [(produced_in[id(v)], None)]
        src = v.op if v is not None else None
        if v is not None and is_persistent(v):
            return [("pre", None)]
        kind = "B" if src is not None and src.role == OpRole.BACKWARD else "F"
        return [((kind, src.chunk_id if src is not None else op.chunk_id), None)]
    if op.type == "recv":
        pair = program.ops[index[id(op)] - 1]
        v = pair.operands[0] if pair.type == "send" else None
        if v is not None and is_persistent(v) and v.op is not None and is_source(v.op):
            return [("pre", None)]
    c = op.chunk_id
    if op.role in (OpRole.FORWARD, OpRole.LOSS):
        return [(("F", c), None)]
    w = wparts.get(id(op))
    if w is None:
        return [(("B", c), None)]
    rest = tuple(i for i, r in enumerate(op.results) if r is not None and i not in w)
    keys = [(("B", c), rest)] if rest else []
    return keys + [(("W", c), w)]


def unit_of_op(program: Program, index: int, step: bool = False) -> Any:
    """The unit key of the recv op at ``index`` of ``program`` on its receiving rank (what
    :func:`build_rank_plan` assigns it): ``"pre"``, ``"step"`` (``step``: the op is an
    optimizer-role op), ``("F", chunk)`` or ``("B", chunk)``. Raises ValueError for an op
    that is not a recv."""
    op = program.ops[index]
    if op.type != "recv":
        raise ExecutorError(f"op {index} of the program is {op.type!r}, not a recv")
    keys = _keys(op, None, {}, {id(op)} if step else set(), {}, program, {id(op): index})
    return keys[0][0]


def _liveness(plan: RankPlan, step_ops: set[int]) -> None:
    for key, items in plan.units.items():
        for it in items:
            for v in it.op.operands:
                if v is None:
                    continue
                if key in ("step", "pre"):
                    src = v.op
                    per_mb = not (is_persistent(v) or (src is not None and id(src) in step_ops))
                    if key == "step" and per_mb and id(v) not in plan.sources:
                        plan.accum.add(id(v))
                else:
                    plan.uses[id(v)] += 1
