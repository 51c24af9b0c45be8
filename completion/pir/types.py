"""Value types in PIR text: ``builtin.tensor<4x16xf32>``, ``pd_dist.tensor<4x16xf32,
mesh_shape:[2],dims_mappings:[-1,0], partial(0,SUM)>``, ``<<NULL TYPE>>`` and opaque types
(any other ``dialect.name<...>``, kept as text)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from completion.dist_attr import TensorDistAttr
from completion.ops.registry import TensorType
from completion.pir.lex import Cursor

NULL_TYPE = "<<NULL TYPE>>"
NULL_VALUE = "<<NULL VALUE>>"

# PIR short dtype names (Paddle ``pir::Type`` printers) <-> our dtype names
DTYPE_OF_SHORT = {
    "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
    "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "ui8": "uint8",
    "b": "bool", "c64": "complex64", "c128": "complex128",
}
SHORT_OF_DTYPE = {v: k for k, v in DTYPE_OF_SHORT.items()}
REDUCE_NAME = {"sum": "SUM", "avg": "AVG", "max": "MAX", "min": "MIN"}

_BODY = re.compile(r"((?:-?\d+x)*)([A-Za-z][A-Za-z0-9]*)")
_TYPE_START = re.compile(r"[A-Za-z_<]")


@dataclass(frozen=True)
class OpaqueType(TensorType):
    """A type the parser does not model (``builtin.vec<...>``); printed back as ``text``."""

    text: str = ""


@dataclass
class ParsedType:
    """A parsed type plus the dist part of a ``pd_dist.tensor`` (mesh shape only)."""

    type: TensorType | None
    mesh_shape: tuple[int, ...] | None = None
    dims_mapping: tuple[int, ...] = ()
    partial: dict[int, str] | None = None


def at_type(cur: Cursor) -> bool:
    """Whether a type starts at the cursor (used to end a result-type list)."""
    cur.ws()
    return bool(_TYPE_START.match(cur.s, cur.i))


def parse_type(cur: Cursor) -> ParsedType:
    """One type. Raises PirParseError naming what was expected."""
    if cur.eat(NULL_TYPE):
        return ParsedType(None)
    start = cur.i
    name = cur.ident("a type such as builtin.tensor<4x16xf32> or <<NULL TYPE>>")
    if not name.endswith(".tensor") and not name.endswith(".dense_tensor"):
        if cur.s.startswith("<", cur.i):
            cur.balanced("<", ">")
        return ParsedType(OpaqueType((), "opaque", cur.s[start:cur.i]))
    cur.expect("<", f"'<' after {name}")
    body = cur.regex(_BODY, "a shape and dtype such as 4x16xf32")
    m = _BODY.fullmatch(body)
    assert m is not None
    dims = tuple(int(d) for d in m.group(1).split("x") if d)
    dtype = DTYPE_OF_SHORT.get(m.group(2), m.group(2))
    out = ParsedType(TensorType(dims, dtype))
    while cur.eat(","):
        key = cur.ident("mesh_shape, dims_mappings or partial")
        if key == "mesh_shape":
            cur.expect(":")
            out.mesh_shape = tuple(cur.int_list("the mesh_shape list"))
        elif key == "dims_mappings":
            cur.expect(":")
            out.dims_mapping = tuple(cur.int_list("the dims_mappings list"))
        elif key == "partial":
            cur.expect("(")
            d = cur.integer("a mesh dim")
            cur.expect(",")
            rt = cur.ident("a reduce type such as SUM")
            cur.expect(")")
            out.partial = {**(out.partial or {}), d: rt}
        else:
            raise cur.fail("mesh_shape, dims_mappings or partial", cur.i - len(key))
    cur.expect(">", "'>' closing the tensor type")
    return out


def format_type(t: TensorType | None, attr: TensorDistAttr | None) -> str:
    """PIR text of a value's type: ``builtin.tensor<...>`` without a dist attr, else
    ``pd_dist.tensor<..., mesh_shape:[..],dims_mappings:[..]>`` (plus partial status)."""
    if t is None:
        return NULL_TYPE
    if isinstance(t, OpaqueType):
        return t.text
    short = SHORT_OF_DTYPE.get(t.dtype, t.dtype)
    body = "".join(f"{d}x" for d in t.shape) + short
    if attr is None:
        return f"builtin.tensor<{body}>"
    mesh = ",".join(str(s) for s in attr.process_mesh.shape)
    dm = ",".join(str(d) for d in attr.dims_mapping)
    part = "".join(f", partial({d},{REDUCE_NAME[r]})" for d, r in attr.partial)
    return f"pd_dist.tensor<{body}, mesh_shape:[{mesh}],dims_mappings:[{dm}]{part}>"


def format_tensor_attr(attr: TensorDistAttr | None) -> str:
    """An ``op_dist_attr`` entry: ``{dims_maping:[-1,0]}``, with ``,partial(0,SUM)``, or
    ``{null}``. The historical spelling ``dims_maping`` is what Paddle prints."""
    if attr is None:
        return "{null}"
    dm = ",".join(str(d) for d in attr.dims_mapping)
    part = "".join(f",partial({d},{REDUCE_NAME[r]})" for d, r in attr.partial)
    chunk = f",chunk_id:{attr.chunk_id}" if attr.chunk_id else ""
    return f"{{dims_maping:[{dm}]{part}{chunk}}}"
