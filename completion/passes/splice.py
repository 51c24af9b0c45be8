"""Batched edits of a program's op list, so a pass that inserts k ops into n costs O(n + k)
rather than O(n * k) (``list.index`` and ``list.insert`` per reshard made the partition
and reshard passes grow super-linearly with the layer count).

An :class:`OpSplicer` links each new op's values at once (``Program.append``: the op's
results point at it, its operands list it as a use) and records where it goes relative to
an op already in the program; :meth:`OpSplicer.commit` rebuilds ``program.ops`` once.
"""

from __future__ import annotations

from completion.ir import Operation, Program


class OpSplicer:
    """Insertions before / after existing ops and removals of ``program``, applied by
    :meth:`commit` in one pass over the op list.

    Order: the ops inserted before an anchor come in the order they were inserted, right
    before it; groups inserted after an anchor come newest first (each group in its own
    order), as repeated ``list.insert(index(anchor) + 1, ...)`` would place them."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self._before: dict[int, list[Operation]] = {}
        self._after: dict[int, list[list[Operation]]] = {}
        self._new: set[int] = set()
        self._dropped: set[int] = set()

    def _link(self, op: Operation) -> None:
        self.program.append(op)  # links the values; the position is fixed by commit()
        self._new.add(id(op))

    def insert_before(self, anchor: Operation, op: Operation) -> None:
        """Place ``op`` right before ``anchor`` (after earlier ops inserted before it)."""
        self._link(op)
        self._before.setdefault(id(anchor), []).append(op)

    def insert_after(self, anchor: Operation, ops: list[Operation]) -> None:
        """Place the group ``ops`` right after ``anchor`` (before earlier groups)."""
        for op in ops:
            self._link(op)
        self._after.setdefault(id(anchor), []).insert(0, list(ops))

    def remove(self, op: Operation) -> None:
        """Drop ``op`` (as ``Program.remove``: its results must have no users left).
        Raises CompletionError naming the op otherwise."""
        Program.detach(op)
        self._dropped.add(id(op))

    def commit(self) -> Program:
        """Rebuild ``program.ops`` with every recorded edit; returns the program."""
        out: list[Operation] = []
        for op in self.program.ops:
            key = id(op)
            if key in self._new:
                continue
            out.extend(self._before.get(key, ()))
            if key not in self._dropped:
                out.append(op)
            for group in self._after.get(key, ()):
                out.extend(group)
        self.program.ops[:] = out
        self._before.clear()
        self._after.clear()
        self._new.clear()
        self._dropped.clear()
        return self.program


__all__ = ["OpSplicer"]
