"""The order in which a rank issues its point-to-point sends: the order each peer receives.

NCCL matches point-to-point messages by their order per (sender, receiver) pair (no tags):
the n-th send of rank a to rank b must be the n-th receive b posts from a. The executor
posts a receive when the unit that consumes it runs (its own action order, ops in program
order), so a rank must send to each peer in that peer's receive order -- which is not
always its own action order: in ZB-V a rank may run a chunk-0 forward (activation to the
rank above) before a chunk-1 backward (gradient to the same rank) that the rank above
consumes first (``simulator.schedules.p2p`` explains why the schedule cannot avoid it).
The executor then holds the earlier-produced tensor back until the peer's earlier message
has gone (``RankExecutor.send_order``); gloo, which matches by tag, runs the same order.

This module derives that order from the partitioned program and the schedule rows, on the
sending rank alone: a send op at program index i pairs with the recv op at i + 1, whose
unit on the receiver (``executor.rank_plan``) says which of the receiver's actions posts
it. Messages of the ``pre`` and ``step`` units (once per step, before / after every
action) are in program order on both sides and keep it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from completion.ir import OpRole, Program
from executor.errors import ExecutorError
from executor.rank_plan import RankPlan, unit_of_op

#: unit keys run once per step (not per micro-batch)
ONCE = ("pre", "step")

Order = dict[int, tuple[tuple[int, int], ...]]


def _expand(row: Sequence[Any]) -> list[tuple[tuple[str, int], int]]:
    """(unit key, micro-batch) of every unit a schedule row runs, in order (BW = B then W)."""
    out = []
    for a in row:
        for kind in (("B", "W") if a.kind == "BW" else (a.kind,)):
            out.append(((kind, a.chunk), a.microbatch))
    return out


def recv_unit(program: Program, send_index: int) -> Any:
    """The receiver's unit key of the recv op paired with the send op at ``send_index``
    (the op after it). Raises ValueError when that op is not a recv."""
    if send_index + 1 >= len(program.ops) or program.ops[send_index + 1].type != "recv":
        raise ExecutorError(f"send op at index {send_index} has no recv op after it")
    op = program.ops[send_index + 1]
    return unit_of_op(program, send_index + 1, step=op.role == OpRole.OPTIMIZE)


def send_orders(program: Program, plan: RankPlan, rows: Sequence[Sequence[Any]],
                stage_of: Callable[[int], int]) -> Order:
    """For each peer rank that ``plan``'s rank sends per-micro-batch messages to: the
    ``(send op index, micro-batch)`` sequence in the order that peer receives them (its
    schedule row ``rows[stage_of(peer)]``, each unit's recv ops in program order).

    Raises ValueError when a send has no matching recv."""
    by_key: dict[int, dict[Any, list[int]]] = {}
    for key, items in plan.units.items():
        if key in ONCE:
            continue
        for it in items:
            if it.op.type != "send":
                continue
            for a, b in it.op.attrs.get("pairs", ()):
                if a == plan.rank:
                    rk = recv_unit(program, it.index)
                    if rk not in ONCE:
                        by_key.setdefault(b, {}).setdefault(rk, []).append(it.index)
    out: Order = {}
    for peer, keys in by_key.items():
        for idx in keys.values():
            idx.sort()
        order = [(i, mb) for key, mb in _expand(rows[stage_of(peer)]) for i in keys.get(key, ())]
        out[peer] = tuple(order)
    return out


def receive_orders(plan: RankPlan, row: Sequence[Any]) -> Order:
    """For each peer ``plan``'s rank receives per-micro-batch messages from: the ``(send op
    index, micro-batch)`` sequence in the order this rank posts the receives (its row,
    each unit's recv items in program order)."""
    out: dict[int, list[tuple[int, int]]] = {}
    for key, mb in _expand(row):
        for it in plan.units.get(key, ()):
            if it.op.type == "recv" and it.ro.group:
                out.setdefault(it.ro.group[0], []).append((it.index - 1, mb))
    return {k: tuple(v) for k, v in out.items()}


def action_order_sends(plan: RankPlan, row: Sequence[Any]) -> Order:
    """For each peer: the ``(send op index, micro-batch)`` sequence in this rank's own
    action order (what the executor issued before it followed :func:`send_orders`)."""
    out: dict[int, list[tuple[int, int]]] = {}
    for key, mb in _expand(row):
        for it in plan.units.get(key, ()):
            if it.op.type == "send":
                for a, b in it.op.attrs.get("pairs", ()):
                    if a == plan.rank:
                        out.setdefault(b, []).append((it.index, mb))
    return {k: tuple(v) for k, v in out.items()}
