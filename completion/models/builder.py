"""A small helper that appends typed ops to a :class:`Program` under struct names.

Every op a builder emits carries the struct name of the layer it belongs to; parameters are
named ``<struct name>.<weight|bias>``. See :mod:`completion.models` for the naming scheme.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.errors import CompletionError
from completion.ir import OpRole, Program, Value

DTYPES = ("float32", "bfloat16", "float16")


class ProgramBuilder:
    """Appends ops to ``program`` with inferred result types.

    Args:
        program: the program to extend (a new one when None).
        dtype: dtype of parameters and activations (one of :data:`DTYPES`).
    """

    def __init__(self, program: Program | None = None, dtype: str = "bfloat16") -> None:
        if dtype not in DTYPES:
            raise CompletionError(f"dtype {dtype!r} is not one of {list(DTYPES)}")
        self.program = program if program is not None else Program()
        self.dtype = dtype
        self.role = OpRole.FORWARD

    def op(self, type: str, operands: Sequence[Value | None], attrs: dict[str, Any] | None = None,
           struct: str = "", role: OpRole | None = None) -> list[Value | None]:
        """Append one op; returns its result values (None for a null result)."""
        op = self.program.add(type, operands, attrs, role=self.role if role is None else role,
                              struct_name=struct)
        return op.results

    def op1(self, type: str, operands: Sequence[Value | None], attrs: dict[str, Any] | None = None,
            struct: str = "", role: OpRole | None = None) -> Value:
        """Append one op and return its first result."""
        v = self.op(type, operands, attrs, struct, role)[0]
        assert v is not None
        return v

    def data(self, name: str, shape: Sequence[int], dtype: str, struct: str = "",
             persistable: bool = False) -> Value:
        """A ``pd_op.data`` input (stop_gradient) named ``name``."""
        attrs = {"dtype": dtype, "name": name, "shape": list(shape)}
        op = self.program.add("data", [], attrs, struct_name=struct, names=[name],
                              stop_gradient=True, persistable=persistable)
        v = op.results[0]
        assert v is not None
        return v

    def param(self, struct: str, leaf: str, shape: Sequence[int], dtype: str | None = None) -> Value:
        """A ``builtin.parameter`` named ``<struct>.<leaf>`` (``leaf`` alone if struct is '')."""
        name = f"{struct}.{leaf}" if struct else leaf
        attrs = {"parameter_name": name, "shape": list(shape), "dtype": dtype or self.dtype}
        op = self.program.add("parameter", [], attrs, struct_name=struct, names=[name],
                              is_parameter=True, persistable=True, stop_gradient=False)
        v = op.results[0]
        assert v is not None
        return v

    # -- layers ---------------------------------------------------------------------------
    def linear(self, x: Value, in_features: int, out_features: int, struct: str, bias: bool) -> Value:
        """``x @ W (+ b)`` with W ``[in, out]`` (Paddle's layout) and b ``[out]``."""
        w = self.param(struct, "weight", [in_features, out_features])
        y = self.op1("matmul", [x, w], {"transpose_x": False, "transpose_y": False}, struct)
        if bias:
            b = self.param(struct, "bias", [out_features])
            y = self.op1("add", [y, b], None, struct)
        return y

    def reshape(self, x: Value, shape: Sequence[int], struct: str) -> Value:
        return self.op1("reshape", [x], {"shape": list(shape)}, struct)

    def add(self, x: Value, y: Value, struct: str) -> Value:
        return self.op1("add", [x, y], None, struct)
