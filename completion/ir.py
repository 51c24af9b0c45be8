"""The program IR: an SSA program in PIR style.

A :class:`Program` is an ordered list of :class:`Operation`; each op reads operand
:class:`Value` objects (or ``None`` for a null value) and defines result values (or ``None``
for a null result). Values carry a static :class:`TensorType`, flags and an optional
:class:`TensorDistAttr`; ops carry a role, a struct name (``decoder.layers.3.mlp.up_proj``)
and an optional :class:`OperatorDistAttr`. Value ids (``%N``) are assigned in definition
order by :meth:`Program.renumber`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from typing import Any

from completion.dist_attr import OperatorDistAttr, TensorDistAttr
from completion.errors import CompletionError
from completion.ops.registry import OpError, TensorType, canonical_type, get_opdef


class OpRole(enum.IntEnum):
    """Role of an op in a training program (values as in Paddle's ``OpRole``)."""

    FORWARD = 0
    BACKWARD = 1
    OPTIMIZE = 2
    LOSS = 256


class Value:
    """An SSA value.

    Attributes:
        type: global shape and dtype.
        name: ``parameter_name`` / data ``name`` when it has one, else None.
        is_parameter, persistable, stop_gradient: flags as in Paddle.
        dist_attr: layout, or None before completion.
        op: the defining operation (set by Program.append); index: result index in it.
        id: SSA number (``%id``) after :meth:`Program.renumber`.
    """

    __slots__ = ("type", "name", "is_parameter", "persistable", "stop_gradient", "dist_attr", "op", "index", "id", "uses")

    def __init__(
        self,
        type: TensorType,
        name: str | None = None,
        *,
        is_parameter: bool = False,
        persistable: bool = False,
        stop_gradient: bool = False,
        dist_attr: TensorDistAttr | None = None,
    ) -> None:
        self.type = type
        self.name = name
        self.is_parameter = is_parameter
        self.persistable = persistable
        self.stop_gradient = stop_gradient
        self.dist_attr = dist_attr
        self.op: Operation | None = None
        self.index = 0
        self.id = -1
        self.uses: list[tuple[Operation, int]] = []

    @property
    def shape(self) -> tuple[int, ...]:
        """Global (unsharded) shape."""
        return self.type.shape

    @property
    def dtype(self) -> str:
        """Element type name, e.g. ``float32``."""
        return self.type.dtype

    @property
    def ndim(self) -> int:
        """Number of tensor dims."""
        return len(self.type.shape)

    def label(self) -> str:
        """How errors name this value: ``%7 (parameter_0)``."""
        return f"%{self.id}" + (f" ({self.name})" if self.name else "")

    def __repr__(self) -> str:
        return f"Value({self.label()}, shape={list(self.shape)}, dtype={self.dtype})"


class Operation:
    """One op of a program.

    Attributes:
        type: canonical op type without prefix (``"matmul"``).
        dialect: PIR prefix (``pd_op``, ``builtin``, ``dist_op``).
        operands: operand values, ``None`` for a null value.
        results: result values, ``None`` for a null result.
        attrs: attributes (insertion-ordered); ``attr_tags`` keeps PIR type tags for
            printing (``{"dtype": "pd_op.DataType"}``).
        role: :class:`OpRole`; struct_name: module path of the layer the op came from.
        dist_attr: :class:`OperatorDistAttr` or None; chunk_id: pipeline chunk.
        line: source line when parsed from text (for error messages), else None.
    """

    __slots__ = ("type", "dialect", "operands", "results", "attrs", "attr_tags", "role", "struct_name", "dist_attr", "chunk_id", "line", "program")

    def __init__(
        self,
        type: str,
        operands: Sequence[Value | None] = (),
        results: Sequence[Value | None] = (),
        attrs: dict[str, Any] | None = None,
        *,
        role: OpRole = OpRole.FORWARD,
        struct_name: str = "",
        dialect: str | None = None,
        attr_tags: dict[str, str] | None = None,
        dist_attr: OperatorDistAttr | None = None,
        chunk_id: int = 0,
        line: int | None = None,
    ) -> None:
        self.type = canonical_type(type)
        od = get_opdef(self.type)
        if dialect is None:
            dialect = type.split(".", 1)[0] if "." in type else (od.dialect if od else "pd_op")
        self.dialect = dialect
        self.operands: list[Value | None] = list(operands)
        self.results: list[Value | None] = list(results)
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.attr_tags: dict[str, str] = dict(attr_tags or {})
        self.role = OpRole(role)
        self.struct_name = struct_name
        self.dist_attr = dist_attr
        self.chunk_id = chunk_id
        self.line = line
        self.program: Program | None = None

    @property
    def full_type(self) -> str:
        """Type with its dialect prefix, e.g. ``pd_op.matmul``."""
        return f"{self.dialect}.{self.type}"

    def label(self) -> str:
        """How errors name this op: ``pd_op.matmul (%6) at line 7``."""
        res = ", ".join(v.label() for v in self.results if v is not None)
        where = f" at line {self.line}" if self.line is not None else ""
        sn = f" [{self.struct_name}]" if self.struct_name else ""
        return f"{self.full_type}" + (f" ({res})" if res else "") + sn + where

    def __repr__(self) -> str:
        return f"Operation({self.label()})"


class Program:
    """An SSA program: ops in execution order.

    Use :meth:`add` to build (runs shape/dtype inference from the op registry) and
    :meth:`append` to insert an op whose results are already typed (parsers, passes).
    """

    def __init__(self) -> None:
        self.ops: list[Operation] = []

    # -- building -----------------------------------------------------------------------
    def append(self, op: Operation, index: int | None = None) -> Operation:
        """Insert ``op`` (at the end, or before position ``index``) and link its values."""
        op.program = self
        for i, v in enumerate(op.results):
            if v is not None:
                v.op, v.index = op, i
        for i, v in enumerate(op.operands):
            if v is not None:
                v.uses.append((op, i))
        if index is None:
            self.ops.append(op)
        else:
            self.ops.insert(index, op)
        return op

    def add(
        self,
        type: str,
        operands: Sequence[Value | None] = (),
        attrs: dict[str, Any] | None = None,
        *,
        role: OpRole = OpRole.FORWARD,
        struct_name: str = "",
        names: Sequence[str | None] | None = None,
        index: int | None = None,
        **flags: Any,
    ) -> Operation:
        """Create an op, infer its result types from the registry, and append it.

        ``names`` gives result value names; ``flags`` (is_parameter, persistable,
        stop_gradient) apply to every result. Raises OpError for an unknown type or a shape
        inconsistency, naming the op.
        """
        od = get_opdef(type)
        if od is None:
            raise OpError(f"unknown op type {type!r}")
        attrs = {**od.attrs, **(attrs or {})}
        in_types = [v.type if v is not None else None for v in operands]
        try:
            out_types = od.infer(in_types, attrs)
        except OpError as e:
            sn = f" [{struct_name}]" if struct_name else ""
            raise OpError(f"{od.dialect}.{od.name}{sn}: {e}") from None
        results = []
        for i, t in enumerate(out_types):
            if t is None:
                results.append(None)
            else:
                nm = names[i] if names and i < len(names) else None
                results.append(Value(t, nm, **flags))
        op = Operation(
            type, operands, results, attrs, role=role, struct_name=struct_name,
            attr_tags={k: t for k, t in od.attr_tags.items() if k in attrs},
        )
        return self.append(op, index)

    def remove(self, op: Operation) -> None:
        """Remove ``op``; its results must have no remaining uses."""
        self.detach(op)
        self.ops.remove(op)

    @staticmethod
    def detach(op: Operation) -> None:
        """Unlink ``op`` from its operands' uses and its program, leaving ``program.ops``
        as it is (``remove`` and batched editors drop it from the list). Raises
        CompletionError naming the op when one of its results still has users."""
        for v in op.results:
            if v is not None and v.uses:
                raise CompletionError(f"cannot remove {op.label()}: {v.label()} still has users")
        for i, v in enumerate(op.operands):
            if v is not None:
                v.uses = [(o, j) for (o, j) in v.uses if not (o is op and j == i)]
        op.program = None

    def set_operand(self, op: Operation, index: int, value: Value | None) -> None:
        """Rewire operand ``index`` of ``op`` to ``value``, keeping use lists right."""
        old = op.operands[index]
        if old is not None:
            old.uses = [(o, j) for (o, j) in old.uses if not (o is op and j == index)]
        op.operands[index] = value
        if value is not None:
            value.uses.append((op, index))

    # -- queries ------------------------------------------------------------------------
    def values(self) -> Iterator[Value]:
        """Every defined value, in definition order."""
        for op in self.ops:
            for v in op.results:
                if v is not None:
                    yield v

    def renumber(self) -> None:
        """Assign SSA ids ``%0, %1, ...`` in definition order.

        A null result (``<<NULL TYPE>>``) still occupies an id slot, as in Paddle's PIR
        printer (``(%17, %18) = "pd_op.subtract_grad" ... -> ..., <<NULL TYPE>>``), so ids
        match the printed text."""
        n = 0
        for op in self.ops:
            for v in op.results:
                if v is not None:
                    v.id = n
                n += 1

    def value(self, ref: str | int) -> Value:
        """A value by ``%N`` / N or by name (``parameter_name`` / data ``name``).

        Raises CompletionError naming the reference when absent."""
        if isinstance(ref, int) or (isinstance(ref, str) and ref.startswith("%")):
            idx = int(str(ref).lstrip("%"))
            for v in self.values():
                if v.id == idx:
                    return v
            raise CompletionError(f"no value %{idx} in the program")
        for v in self.values():
            if v.name == ref:
                return v
        raise CompletionError(f"no value named {ref!r} in the program")

    def parameters(self) -> list[Value]:
        """Parameter values in program order."""
        return [v for v in self.values() if v.is_parameter]

    def num_parameters(self) -> int:
        """Total parameter elements (global, unsharded)."""
        return sum(v.type.numel for v in self.parameters())

    def validate(self) -> None:
        """Check SSA form: every operand defined earlier in the program, defined once.

        Raises CompletionError naming the op, the value and the line (when parsed)."""
        defined: set[int] = set()
        for op in self.ops:
            for v in op.operands:
                if v is not None and id(v) not in defined:
                    raise CompletionError(f"{op.label()}: operand {v.label()} is used before it is defined")
            for v in op.results:
                if v is not None:
                    if id(v) in defined:
                        raise CompletionError(f"{op.label()}: {v.label()} is defined twice")
                    defined.add(id(v))

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[Operation]:
        return iter(self.ops)
