"""Point-to-point messages of a pipeline schedule and the order each rank issues them.

A schedule's actions imply its messages (``Schedule.vstage`` places the virtual stages):

* F of virtual stage s, micro-batch i sends its activation to the rank of s+1:
  ``Message("F", s, i)``, consumed by F of (s+1, i);
* B (or fused BW) of s sends its input gradient to the rank of s-1: ``Message("B", s, i)``,
  consumed by B / BW of (s-1, i).

Neighbours on the same rank (the turn of ZB-V's V, VPP with p = 1) exchange nothing.

NCCL matches point-to-point messages by their order per (sender, receiver) pair -- it has
no tags -- so the n-th send of rank a to rank b must be the n-th receive b posts from a, or
the tensors cross (same sizes) or the step hangs (different sizes). gloo matches by tag and
is indifferent. The protocol meshplan runs (``executor.rank_exec``) and checks here:

* a rank posts each receive when the action that consumes it starts, so its receives from
  a peer come in its own action order (:func:`consumption_order`);
* a rank sends to a peer in the order that peer consumes: a message leaves after the
  action that produces it, unless the peer consumes first another message from this rank
  that is not produced yet -- then it waits (is *deferred*) until that one is produced and
  sent (:func:`send_plan`).

For most schedules the two orders agree and nothing is deferred (:func:`action_order_mismatch`
is None): every rank sends in its own action order. ZB-V (``ZBVPP``) cannot have that at its
bubble and memory: on p = 2, m = 4 (and p = 3, m = 6) an exhaustive search finds no order
that is zero-bubble at p * M_B per rank with each pair's sends in the receiver's consumption
order -- the smallest peak is 2.5 M_B (p = 2). The ranks below the top run extra chunk-0
forwards while the V turns, and the rank above them consumes a chunk-1 gradient in between.
Deferring the send instead costs no time: the receiver cannot consume the deferred message
before the one it waits for anyway, which left at the same moment or later; the simulator
(which matches each transfer by virtual stage and micro-batch) plays the same timeline. The
cost is that the sender keeps the deferred activation until it goes out (one boundary
tensor each, counted by :func:`max_deferred`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from simulator.errors import ScheduleError
from simulator.schedules.columns import sends_match_consumption

#: a ``simulator.schedules.base.Schedule`` (read duck-typed: ``actions``, ``vstage``,
#: ``num_vstages``, ``name``; base imports this module, so not the other way round)
Schedule = Any


class P2PError(ScheduleError):
    """A schedule whose messages do not match per (sender, receiver) pair; names the pair
    and the first mismatch."""


class Message(NamedTuple):
    """One p2p message: ``kind`` F (activation of ``vstage`` to vstage + 1) or B (input
    gradient of ``vstage`` to vstage - 1), for ``microbatch``."""

    kind: str
    vstage: int
    microbatch: int

    def __str__(self) -> str:
        arrow = "->" if self.kind == "F" else "<-"
        what = "activation" if self.kind == "F" else "gradient"
        other = self.vstage + 1 if self.kind == "F" else self.vstage - 1
        return f"{what} of micro-batch {self.microbatch} (virtual stage {self.vstage} {arrow} {other})"


Pair = tuple[int, int]


def _owners(s: Schedule) -> dict[int, int]:
    return {vs: r for r, row in enumerate(s.vstage) for vs in row}


def _io(own: dict[int, int], nvs: int, vs: int, rank: int, action: Any
        ) -> tuple[tuple[int, Message] | None, tuple[int, Message] | None]:
    mb = action.microbatch
    sent = consumed = None
    if action.kind == "F":
        if vs + 1 < nvs and own[vs + 1] != rank:
            sent = (own[vs + 1], Message("F", vs, mb))
        if vs > 0 and own[vs - 1] != rank:
            consumed = (own[vs - 1], Message("F", vs - 1, mb))
    elif action.kind in ("B", "BW"):
        if vs > 0 and own[vs - 1] != rank:
            sent = (own[vs - 1], Message("B", vs, mb))
        if vs + 1 < nvs and own[vs + 1] != rank:
            consumed = (own[vs + 1], Message("B", vs + 1, mb))
    return sent, consumed


def _walk(s: Schedule) -> tuple[dict[Pair, list[Message]], dict[Pair, list[Message]],
                                 list[list[tuple[int, Message] | None]]]:
    """(sends per pair in action order, consumption per pair, per rank per action its send).

    The hot path of ``Schedule.validate`` (about 2 us per action): messages are plain
    ``(kind, vstage, microbatch)`` tuples here (equal to the Message they stand for);
    :func:`_messages` turns them into Messages for the public results."""
    nvs = s.num_vstages
    own = [0] * nvs
    for r, row in enumerate(s.vstage):
        for vs in row:
            own[vs] = r
    sends: dict[Pair, list] = {}
    consumes: dict[Pair, list] = {}
    produced: list[list] = []
    for r, row in enumerate(s.actions):
        out: list = []
        append = out.append
        place = s.vstage[r]
        for kind, _, mb, chunk in row:
            vs = place[chunk]
            if kind == "W":
                append(None)
                continue
            if kind == "F":
                nxt, prv, msg_out, msg_in = vs + 1, vs - 1, ("F", vs, mb), ("F", vs - 1, mb)
            else:  # B or BW: the gradient flows down, its input comes from above
                nxt, prv, msg_out, msg_in = vs - 1, vs + 1, ("B", vs, mb), ("B", vs + 1, mb)
            sent = None
            if 0 <= nxt < nvs and own[nxt] != r:
                d = own[nxt]
                sent = (d, msg_out)
                lst = sends.get((r, d))
                if lst is None:
                    sends[(r, d)] = lst = []
                lst.append(msg_out)
            if 0 <= prv < nvs and own[prv] != r:
                key = (own[prv], r)
                lst = consumes.get(key)
                if lst is None:
                    consumes[key] = lst = []
                lst.append(msg_in)
            append(sent)
        produced.append(out)
    return sends, consumes, produced


def _sends_match_consumption(s: Schedule) -> bool:
    """Whether every rank's sends to each peer, in its own action order, are the messages
    that peer consumes in its action order (the common case: nothing deferred). The walk
    of :func:`_walk` with each message one int ``(kind * nvs + vstage) * m + microbatch``
    (kind 0: activation, 1: gradient), so the check allocates no tuple per action: each
    chunk's four message lists (F sends up, F consumes from below, B sends down, B
    consumes from above; None where that neighbour is on the same rank or absent) are
    looked up once per rank, and an action appends to them directly."""
    cols = getattr(s, "__dict__", {}).get("_columns")
    if cols is not None:  # a schedule whose actions passed the vectorised checks
        return sends_match_consumption(cols, s.vstage, s.num_vstages, s.num_microbatches)
    nvs, m = s.num_vstages, s.num_microbatches
    own = [0] * nvs
    for r, row in enumerate(s.vstage):
        for vs in row:
            own[vs] = r
    gstride = nvs * m
    sends: dict[Pair, list[int]] = {}
    consumes: dict[Pair, list[int]] = {}
    for r, row in enumerate(s.actions):
        place = s.vstage[r]
        lists: dict[tuple[int, int], list[int]] = {}
        f_send, f_recv, b_send, b_recv, base = [], [], [], [], []
        for vs in place:
            up = own[vs + 1] if vs + 1 < nvs and own[vs + 1] != r else -1
            down = own[vs - 1] if vs > 0 and own[vs - 1] != r else -1
            f_send.append(lists.setdefault((0, up), []).append if up >= 0 else None)
            f_recv.append(lists.setdefault((1, down), []).append if down >= 0 else None)
            b_send.append(lists.setdefault((0, down), []).append if down >= 0 else None)
            b_recv.append(lists.setdefault((1, up), []).append if up >= 0 else None)
            base.append(vs * m)
        for kind, _, mb, chunk in row:
            if kind == "W":
                continue
            k = base[chunk] + mb
            if kind == "F":
                add = f_send[chunk]
                if add is not None:
                    add(k)
                add = f_recv[chunk]
                if add is not None:
                    add(k - m)
            else:
                add = b_send[chunk]
                if add is not None:
                    add(gstride + k)
                add = b_recv[chunk]
                if add is not None:
                    add(gstride + k + m)
        for (side, peer), lst in lists.items():
            if not lst:  # created for a neighbour this rank never talks to
                continue
            if side == 0:
                sends.setdefault((r, peer), []).extend(lst)
            else:
                consumes.setdefault((peer, r), []).extend(lst)
    return sends == consumes


def _messages(seq) -> tuple[Message, ...]:
    return tuple(Message(*m) for m in seq)


def sends_in_action_order(s: Schedule) -> dict[Pair, tuple[Message, ...]]:
    """Per ordered pair (sender, receiver): the messages in the sender's action order."""
    return {k: _messages(v) for k, v in _walk(s)[0].items()}


def consumption_order(s: Schedule) -> dict[Pair, tuple[Message, ...]]:
    """Per ordered pair (sender, receiver): the messages in the order the receiver's actions
    consume them (the order it posts its receives)."""
    return {k: _messages(v) for k, v in _walk(s)[1].items()}


def _first_difference(a: tuple[Message, ...], b: tuple[Message, ...]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def action_order_mismatch(s: Schedule) -> tuple[Pair, int, Message | None, Message | None] | None:
    """The first pair whose sends, in the sender's action order, differ from the receiver's
    consumption order: ``((sender, receiver), index, sent, consumed)`` (None for a side
    that has no message at that index); None when every rank can send in its own action
    order (no deferred send). Pairs in (sender, receiver) order."""
    sends, consumes, _ = _walk(s)
    for pair in sorted(set(sends) | set(consumes)):
        a, b = _messages(sends.get(pair, ())), _messages(consumes.get(pair, ()))
        i = _first_difference(a, b)
        if i is not None:
            return pair, i, a[i] if i < len(a) else None, b[i] if i < len(b) else None
    return None


def _plan(s: Schedule, sends: dict[Pair, list[Message]], consumes: dict[Pair, list[Message]],
          produced: list[list[tuple[int, Message] | None]]
          ) -> tuple[tuple[tuple[tuple[int, Message], ...], ...], ...]:
    plan: list[tuple[tuple[tuple[int, Message], ...], ...]] = []
    for r, row in enumerate(produced):
        expected = {d: lst for (src, d), lst in consumes.items() if src == r}
        wanted = {d: set(lst) for d, lst in expected.items()}
        ptr = dict.fromkeys(expected, 0)
        ready: dict[int, set[Message]] = {d: set() for d in expected}
        out = []
        for i, sent in enumerate(row):
            after: list[tuple[int, Message]] = []
            if sent is not None:
                d, msg = sent
                if msg not in wanted.get(d, ()):
                    raise P2PError(
                        f"{s.name}: pair (rank {r} -> rank {d}): rank {r} sends the {Message(*msg)} "
                        f"(action {s.actions[r][i]}) but rank {d} never consumes it")
                ready[d].add(msg)
                want = expected[d]
                while ptr[d] < len(want) and want[ptr[d]] in ready[d]:
                    ready[d].discard(want[ptr[d]])
                    after.append((d, Message(*want[ptr[d]])))
                    ptr[d] += 1
            out.append(tuple(after))
        for d, want in expected.items():
            if ptr[d] < len(want):
                got = sends.get((r, d), [])
                raise P2PError(
                    f"{s.name}: pair (rank {r} -> rank {d}): receive {ptr[d]} of rank {d}, the "
                    f"{Message(*want[ptr[d]])}, is never sent by rank {r} ({len(got)} sends, "
                    f"{len(want)} receives)")
        plan.append(tuple(out))
    return tuple(plan)


def send_plan(s: Schedule) -> tuple[tuple[tuple[tuple[int, Message], ...], ...], ...]:
    """``plan[rank][i]``: the ``(receiver, Message)`` sends ``rank`` issues right after its
    i-th action under the protocol of the module docstring (each peer's messages in the
    order it consumes them; a message that peer needs later than one not yet produced waits).

    Raises P2PError naming the pair and the first mismatch when a rank consumes a message
    its peer never sends it, or a rank sends a message its peer never consumes."""
    return _produced_and_plan(s)[1]


def _produced_and_plan(s: Schedule) -> tuple[list[list[tuple[int, Message] | None]],
                                             tuple[tuple[tuple[tuple[int, Message], ...], ...], ...]]:
    """(``_walk``'s per-action sends, :func:`send_plan`) of ``s``, computed once per
    schedule object and kept in its ``__dict__`` beside ``_validated`` (a frozen
    schedule's actions never change; ``check_p2p`` of a schedule that does not send in
    action order computes both already)."""
    got = s.__dict__.get("_p2p_plan")
    if got is None:
        sends, consumes, produced = _walk(s)
        got = (produced, _plan(s, sends, consumes, produced))
        s.__dict__["_p2p_plan"] = got
    return got


def _issued(plan: tuple[tuple[tuple[tuple[int, Message], ...], ...], ...]) -> dict[Pair, tuple[Message, ...]]:
    out: dict[Pair, list[Message]] = {}
    for r, row in enumerate(plan):
        for after in row:
            for d, msg in after:
                out.setdefault((r, d), []).append(msg)
    return {k: tuple(v) for k, v in out.items()}


def issued_sends(s: Schedule) -> dict[Pair, tuple[Message, ...]]:
    """Per ordered pair: the sends in the order the sender issues them under
    :func:`send_plan` (equal to :func:`consumption_order` for a valid schedule)."""
    return _issued(send_plan(s))


def check_p2p(s: Schedule) -> None:
    """Check that, for every ordered pair of ranks, the sequence of sends the sender issues
    (:func:`send_plan`) equals the sequence of receives the receiver posts
    (:func:`consumption_order`): the same messages, in the same order. Raises P2PError
    naming the pair and the first mismatch."""
    if _sends_match_consumption(s):  # every rank can send in its own action order
        s.__dict__["_p2p_in_order"] = True
        return
    sends, consumes, produced = _walk(s)
    plan = _plan(s, sends, consumes, produced)
    s.__dict__["_p2p_plan"] = (produced, plan)
    issued = _issued(plan)
    for pair in sorted(set(issued) | set(consumes)):
        a, b = issued.get(pair, ()), _messages(consumes.get(pair, ()))
        i = _first_difference(a, b)
        if i is not None:
            sa = f"the {a[i]}" if i < len(a) else "nothing"
            sb = f"the {b[i]}" if i < len(b) else "nothing"
            raise P2PError(f"{s.name}: pair (rank {pair[0]} -> rank {pair[1]}): send {i} is "
                           f"{sa} but receive {i} expects {sb}")


def max_deferred(s: Schedule) -> int:
    """The most messages any rank holds back at once under :func:`send_plan` (produced, not
    yet sent because its peer consumes another one first); 0 when every rank sends in its
    own action order."""
    if s.__dict__.get("_p2p_in_order"):  # check_p2p found every rank sending in action order
        return 0
    produced, plan = _produced_and_plan(s)
    worst = 0
    for r, row in enumerate(produced):
        held = 0
        for i, sent in enumerate(row):
            held += (sent is not None) - len(plan[r][i])
            worst = max(worst, held)
    return worst
