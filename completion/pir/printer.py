"""Print a :class:`Program` as PIR text (the inverse of :mod:`completion.pir.parse`).

Format as Paddle prints it: ``{``, one op per line indented by four spaces, ``}``. Per op:
results ``(%N, ...)``, the quoted ``dialect.type``, operands (``<<NULL VALUE>>`` for a null
one), the attributes sorted by name, then ``: (operand types) -> result types``.

Attributes printed besides ``op.attrs`` (minus the op's ``internal_attrs``):
``stop_gradient`` (one entry per result, false for a null result) on every op with results
except ``dist_op`` ops; ``persistable`` / ``is_parameter`` when a result has the flag;
``name`` (data) / ``parameter_name`` (parameter) from the result's name; ``op_dist_attr``
from ``Operation.dist_attr`` with ``dims_maping`` spelled as Paddle does.
"""

from __future__ import annotations

import json
import math
from typing import Any

from completion.ir import Operation, Program
from completion.ops.registry import get_opdef
from completion.pir.lex import RawAttr
from completion.pir.parse import NAME_ATTRS
from completion.pir.types import NULL_VALUE, format_tensor_attr, format_type


def print_program(program: Program) -> str:
    """The PIR text of ``program`` (renumbers its values first). Ends with a newline."""
    program.renumber()
    lines = ["{"]
    n = 0
    for op in program.ops:
        ids = list(range(n, n + len(op.results)))
        n += len(op.results)
        lines.append("    " + format_op(op, ids))
    lines.append("}")
    return "\n".join(lines) + "\n"


def format_op(op: Operation, ids: list[int] | None = None) -> str:
    """One op line (without indentation). ``ids`` are the result numbers (default: the
    values' ids, a null result taking the id after its predecessor)."""
    if ids is None:
        ids, last = [], -1
        for v in op.results:
            last = v.id if v is not None else last + 1
            ids.append(last)
    res = ", ".join(f"%{i}" for i in ids)
    opnds = ", ".join(NULL_VALUE if v is None else f"%{v.id}" for v in op.operands)
    in_t = ", ".join(format_type(v.type if v else None, v.dist_attr if v else None) for v in op.operands)
    out_t = ", ".join(format_type(v.type if v else None, v.dist_attr if v else None) for v in op.results)
    return f'({res}) = "{op.full_type}" ({opnds}) {format_attrs(op)} : ({in_t}) -> {out_t}'


def format_attrs(op: Operation) -> str:
    """The ``{...}`` attribute dict of an op, keys sorted."""
    od = get_opdef(op.type)
    hidden = set(od.internal_attrs) if od else set()
    items: dict[str, str] = {}
    for k, v in op.attrs.items():
        if k not in hidden:
            items[k] = format_value(v, op.attr_tags.get(k))
    name_key = NAME_ATTRS.get(op.type)
    first = op.results[0] if op.results else None
    if name_key and first is not None and first.name is not None:
        items[name_key] = format_value(first.name, None)
    res = op.results
    for flag in ("persistable", "is_parameter"):
        if any(v is not None and getattr(v, flag) for v in res):
            items[flag] = format_value([bool(v is not None and getattr(v, flag)) for v in res], None)
    if res and op.dialect != "dist_op":
        items["stop_gradient"] = format_value([bool(v is not None and v.stop_gradient) for v in res], None)
    if op.dist_attr is not None:
        items["op_dist_attr"] = format_op_dist_attr(op)
    return "{" + ",".join(f"{k}:{items[k]}" for k in sorted(items)) + "}"


def format_op_dist_attr(op: Operation) -> str:
    """``{mesh:{shape:[..],process_ids:[..]},operand(k):{..},...,result(k):{..}}``."""
    d = op.dist_attr
    assert d is not None
    mesh = d.process_mesh
    parts = [f"mesh:{{shape:{_ints(mesh.shape)},process_ids:{_ints(mesh.process_ids)}}}"]
    parts += [f"operand({k}):{format_tensor_attr(a)}" for k, a in enumerate(d.operands)]
    parts += [f"result({k}):{format_tensor_attr(a)}" for k, a in enumerate(d.results)]
    if d.chunk_id:
        parts.append(f"chunk_id:{d.chunk_id}")
    return "{" + ",".join(parts) + "}"


def _ints(xs: Any) -> str:
    return "[" + ",".join(str(int(x)) for x in xs) + "]"


def _float(v: float) -> str:
    """C++ ``ostream`` style (6 significant digits, Paddle's printer) when that reads back
    as the same float, else the shortest exact form: printing never changes a value."""
    if not math.isfinite(v):
        return str(v)
    s = format(v, "g")
    return s if float(s) == v else repr(v)


def format_value(v: Any, tag: str | None) -> str:
    """One attribute value; ``(tag)`` prefix when tagged. Tagged strings print raw
    (``(pd_op.DataType)float32``); floats print like C++ ``ostream`` (6 significant
    digits) unless that would round them (then exactly, see :func:`_float`)."""
    pre = f"({tag})" if tag else ""
    if isinstance(v, bool):
        s = "true" if v else "false"
    elif isinstance(v, RawAttr) or (isinstance(v, str) and tag):
        s = str(v)
    elif isinstance(v, str):
        s = json.dumps(v)
    elif isinstance(v, float):
        s = _float(v)
    elif isinstance(v, int):
        s = str(v)
    elif isinstance(v, (list, tuple)):
        s = "[" + ",".join(format_value(x, None) for x in v) + "]"
    elif isinstance(v, dict):
        s = "{" + ",".join(k if x is None else f"{k}:{format_value(x, None)}" for k, x in v.items()) + "}"
    else:
        s = str(v)
    return pre + s
