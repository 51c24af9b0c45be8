"""A schedule's actions as flat integer arrays: the vectorised checks of ``Schedule.validate``
(per-action placement and completeness, and the p2p message order of ``p2p.check_p2p``)
run on these instead of walking one tuple at a time.

``columns(actions)`` turns a schedule's actions (per rank, ``(kind, stage, microbatch,
chunk)``) into numpy arrays over all actions, rank-major in schedule order: ``rank``,
``kind`` (code 0 F, 1 B, 2 W, 3 BW, the order of ``base.KINDS``), ``stage``,
``microbatch`` and ``chunk`` (int32), and ``offsets`` (int64; rank r's actions are
``offsets[r]:offsets[r + 1]``). It returns None when any action is not a 4-sequence of a
kind name and three integers within int32: the callers then take their plain per-action
path, which names the offending action.

Below :data:`MIN_ACTIONS` actions the callers keep the plain walk (numpy's fixed cost per
call is larger there). The checks here only *accept*: each returns True when the schedule
certainly passes the plain check, False when it may not (the caller then runs the plain
check, which raises the message naming the first bad action). tests/simulator/test_sched_columns.py compares both on
schedules with random defects (hypothesis).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np

#: kind name -> code; the order of ``simulator.schedules.base.KINDS``
KIND_CODE = {"F": 0, "B": 1, "W": 2, "BW": 3}
_FIELDS = (itemgetter(1), itemgetter(2), itemgetter(3))
_KIND = itemgetter(0)
#: the int32 range the columns hold (keys and messages stay below 2**21 within
#: ``base.MAX_ACTIONS``, which ``validate`` checks first)
_LOW, _HIGH = -(2**31), 2**31 - 1


@dataclass(frozen=True)
class ActionColumns:
    """Flat arrays of a schedule's actions (module docstring); all of length n = the number
    of actions, except ``offsets`` (p + 1)."""

    offsets: np.ndarray
    rank: np.ndarray
    kind: np.ndarray
    stage: np.ndarray
    microbatch: np.ndarray
    chunk: np.ndarray


#: Fewest actions for which the vectorised checks and plan pay off (below it numpy's fixed
#: cost per call exceeds the plain walk: about 1 ms each at 1,024 actions here)
MIN_ACTIONS = 1024


def columns(actions: Any) -> ActionColumns | None:
    """The :class:`ActionColumns` of ``actions`` (a sequence per rank of actions), or None
    when there are fewer than :data:`MIN_ACTIONS` (or no) actions or an action is not
    ``(kind in KIND_CODE, int, int, int)`` within int32 (bools count as ints, as they do
    in the plain check). About 0.3 us per action."""
    try:
        lens = [len(row) for row in actions]
        flat = list(itertools.chain.from_iterable(actions))
        if len(flat) < max(1, MIN_ACTIONS) or set(map(len, flat)) != {4}:
            return None
        kinds = list(map(_KIND, flat))
        if not set(kinds) <= KIND_CODE.keys():  # only the four names (str) compare equal
            return None
        ints = [np.array(list(map(g, flat))) for g in _FIELDS]
    except TypeError:  # an action or a row without a length, an unhashable kind
        return None
    if any(a.dtype.kind != "i" or a.min() < _LOW or a.max() > _HIGH for a in ints):
        return None  # a float, a str, an int beyond int32 (the plain check names it)
    kind = np.fromiter(map(KIND_CODE.__getitem__, kinds), dtype=np.int32, count=len(kinds))
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    rank = np.repeat(np.arange(len(lens), dtype=np.int32), lens)
    return ActionColumns(offsets, rank, kind, *(a.astype(np.int32) for a in ints))


def actions_complete(c: ActionColumns, p: int, m: int, v: int) -> bool:
    """True when every action sits on its own rank (``stage == rank``) with ``0 <= chunk <
    v`` and ``0 <= microbatch < m``, no (rank, kind, chunk, micro-batch) repeats, and each
    (rank, chunk, micro-batch) has an F and either a BW or a B and a W (the per-action
    checks of ``Schedule.validate``); False when any of that may fail."""
    if len(c.offsets) != p + 1:
        return False
    if ((c.stage != c.rank).any() or (c.chunk < 0).any() or (c.chunk >= v).any()
            or (c.microbatch < 0).any() or (c.microbatch >= m).any()):
        return False
    key = ((c.rank * 4 + c.kind) * v + c.chunk) * m + c.microbatch
    counts = np.bincount(key, minlength=p * 4 * v * m)
    if counts.max(initial=0) > 1:
        return False
    f, b, w, bw = counts.reshape(p, 4, v * m).astype(bool).transpose(1, 0, 2)
    return bool((f & np.where(bw, ~b & ~w, b & w)).all())


def vstage_of(c: ActionColumns, vstage: Any) -> np.ndarray:
    """The virtual stage of every action: ``vstage[rank][chunk]`` (the columns must have
    passed :func:`actions_complete`)."""
    table = np.asarray(vstage, dtype=np.int64).reshape(len(vstage), -1)
    return table[c.rank, c.chunk]


def owners(vstage: Any, nvs: int) -> np.ndarray:
    """``owner[vs]``: the rank holding virtual stage ``vs``."""
    own = np.zeros(nvs, dtype=np.int64)
    for r, row in enumerate(vstage):
        for vs in row:
            own[vs] = r
    return own


def sends_match_consumption(c: ActionColumns, vstage: Any, nvs: int, m: int) -> bool:
    """Whether every rank's sends to each peer, in its own action order, are exactly the
    messages that peer consumes, in its action order (``p2p._sends_match_consumption``, the
    same messages: an F of virtual stage s sends its activation to the rank of s + 1 and
    consumes that of s - 1; a B or BW sends its gradient to the rank of s - 1 and consumes
    that of s + 1; neighbours on the same rank exchange nothing). A message is the int
    ``(kind * nvs + vstage) * m + microbatch`` (kind 0 activation, 1 gradient)."""
    vs = vstage_of(c, vstage)
    own = owners(vstage, nvs)
    p = len(vstage)
    live = c.kind != 2  # W passes send nothing
    is_f = c.kind == 0
    up = np.where(vs + 1 < nvs, own[np.minimum(vs + 1, nvs - 1)], -1)
    down = np.where(vs > 0, own[np.maximum(vs - 1, 0)], -1)
    up = np.where(up == c.rank, -1, up)
    down = np.where(down == c.rank, -1, down)
    gstride = nvs * m
    msg = vs * m + c.microbatch
    # sends: F -> up (activation of vs), B/BW -> down (gradient of vs)
    s_peer = np.where(is_f, up, down)
    s_msg = np.where(is_f, msg, gstride + msg)
    s_ok = live & (s_peer >= 0)
    # consumption: F <- down (activation of vs - 1), B/BW <- up (gradient of vs + 1)
    r_peer = np.where(is_f, down, up)
    r_msg = np.where(is_f, msg - m, gstride + msg + m)
    r_ok = live & (r_peer >= 0)
    # (sender, receiver) as one int64: rank * p overflows int32 from p = 46,341 ranks
    rank = c.rank.astype(np.int64)
    s_pair = (rank * p + s_peer)[s_ok]
    r_pair = (r_peer.astype(np.int64) * p + rank)[r_ok]
    if len(s_pair) != len(r_pair):
        return False
    so = np.argsort(s_pair, kind="stable")  # each pair's messages in the sender's order
    ro = np.argsort(r_pair, kind="stable")  # ... in the receiver's order
    return bool(np.array_equal(s_pair[so], r_pair[ro]) and np.array_equal(s_msg[s_ok][so], r_msg[r_ok][ro]))
