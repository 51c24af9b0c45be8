"""Parse the PIR text Paddle prints into a :class:`Program`.

One op per line::

    (%6) = "pd_op.matmul" (%5, %2) {op_dist_attr:{...},stop_gradient:[false],...}
        : (pd_dist.tensor<4x16xf32, ...>, ...) -> pd_dist.tensor<4x16xf32, ...>

Accepted: ``pd_op.`` / ``builtin.`` / ``dist_op.`` (any) prefixes, ``op_dist_attr`` with
``dims_maping`` (Paddle's historical spelling) or ``dims_mapping``, partial status
``partial(0,SUM)``, ``operand(k):{null}``, ``<<NULL VALUE>>`` / ``<<NULL TYPE>>``, and
programs without dist attrs. Unknown op types become opaque ops typed from the text.

Mapping onto the IR: ``stop_gradient`` / ``persistable`` / ``is_parameter`` lists go to the
result values' flags; a data op's ``name`` and a parameter's ``parameter_name`` become the
value's name; ``op_dist_attr`` becomes ``Operation.dist_attr``; each result's
``pd_dist.tensor`` type becomes ``Value.dist_attr`` (process mesh taken from the op's
``op_dist_attr`` when the shapes agree, since the type carries only the mesh shape). Roles
come from :func:`completion.roles.infer_roles`.
"""

from __future__ import annotations

from typing import Any

from completion.dist_attr import OperatorDistAttr, TensorDistAttr
from completion.errors import DistAttrError
from completion.ir import Operation, Program, Value
from completion.mesh import ProcessMesh
from completion.ops.registry import OpError, TensorType, canonical_type, get_opdef
from completion.pir.lex import Cursor, PirParseError
from completion.pir.types import NULL_VALUE, OpaqueType, ParsedType, at_type, parse_type
from completion.roles import infer_roles

FLAG_ATTRS = ("stop_gradient", "persistable", "is_parameter")
NAME_ATTRS = {"data": "name", "parameter": "parameter_name"}


def parse_program(text: str) -> Program:
    """Parse PIR text (optionally wrapped in ``{ ... }``) into a Program.

    Raises PirParseError (a CompletionError / ValueError) with line and column: syntax
    errors say what was expected; an undefined or doubly defined ``%N``, a type that
    disagrees with the value's definition, a bad ``dims_maping`` or a failed shape
    inference name the op and its line.
    """
    cur = Cursor(text)
    prog = Program()
    env: dict[int, Value | None] = {}
    braced = cur.eat("{")
    while True:
        if braced and cur.eat("}"):
            break
        if cur.at_end():
            if braced:
                raise cur.fail("an operation or '}' closing the program")
            break
        _parse_op(cur, prog, env)
    if not cur.at_end():
        raise cur.fail("end of text after the program")
    prog.renumber()
    infer_roles(prog)
    return prog


def _parse_op(cur: Cursor, prog: Program, env: dict[int, Value | None]) -> None:
    cur.ws()
    op_at = cur.i
    line = cur.where()[0]
    cur.expect("(", "'(' starting an operation, e.g. (%0) = \"pd_op.relu\" ...")
    res_ids: list[int] = []
    if not cur.eat(")"):
        while True:
            cur.expect("%", "a result such as %0")
            res_ids.append(cur.integer("a value number after '%'"))
            if cur.eat(")"):
                break
            cur.expect(",", "',' or ')' in the result list")
    cur.expect("=", "'=' after the result list")
    name = cur.string()
    operands, operand_at = _operands(cur, name, env)
    attrs: dict[str, Any] = {}
    tags: dict[str, str] = {}
    if cur.peek("{"):
        _attr_dict(cur, attrs, tags)
    cur.expect(":", "':' before the op signature")
    in_types = _type_list(cur, "(", ")")
    cur.expect("->", "'->' in the op signature")
    out_types = [parse_type(cur)] if at_type(cur) else []
    while out_types and cur.eat(","):
        out_types.append(parse_type(cur))
    where = f"{name} at line {line}"
    if len(in_types) != len(operands):
        raise cur.error(f"{where}: {len(operands)} operands but {len(in_types)} operand types", op_at)
    if len(out_types) != len(res_ids):
        raise cur.error(f"{where}: {len(res_ids)} results but {len(out_types)} result types", op_at)
    for k, (v, pt) in enumerate(zip(operands, in_types, strict=True)):
        _check_operand(cur, where, k, v, pt, operand_at[k])
    op = _build_op(cur, name, line, op_at, operands, out_types, attrs, tags)
    _check_inference(cur, op, op_at)
    prog.append(op)
    for rid, v in zip(res_ids, op.results, strict=True):
        if rid in env:
            raise cur.error(f"{where}: %{rid} is defined twice", op_at)
        env[rid] = v
        if v is not None:
            v.id = rid


def _operands(cur: Cursor, name: str, env: dict[int, Value | None]) -> tuple[list[Value | None], list[int]]:
    cur.expect("(", f"'(' starting the operands of {name}")
    out: list[Value | None] = []
    at: list[int] = []
    if cur.eat(")"):
        return out, at
    while True:
        cur.ws()
        at.append(cur.i)
        if cur.eat(NULL_VALUE):
            out.append(None)
        else:
            cur.expect("%", f"an operand such as %0 or {NULL_VALUE}")
            n = cur.integer("a value number after '%'")
            if n not in env:
                raise cur.error(f"{name}: operand %{n} is not defined before use", at[-1])
            if env[n] is None:
                raise cur.error(f"{name}: operand %{n} is a null result (<<NULL TYPE>>)", at[-1])
            out.append(env[n])
        if cur.eat(")"):
            return out, at
        cur.expect(",", "',' or ')' in the operand list")


def _attr_dict(cur: Cursor, attrs: dict[str, Any], tags: dict[str, str]) -> None:
    cur.expect("{")
    if cur.eat("}"):
        return
    while True:
        key = cur.ident("an attribute name")
        cur.expect(":", f"':' after attribute {key}")
        val, tag = cur.value()
        attrs[key] = val
        if tag:
            tags[key] = tag
        if cur.eat("}"):
            return
        cur.expect(",", "',' or '}' in the attribute dict")


def _type_list(cur: Cursor, open_: str, close: str) -> list[ParsedType]:
    cur.expect(open_, f"{open_!r} starting the operand types")
    out: list[ParsedType] = []
    if cur.eat(close):
        return out
    while True:
        out.append(parse_type(cur))
        if cur.eat(close):
            return out
        cur.expect(",", f"',' or {close!r} in the type list")


def _same_shape(a: TensorType, b: TensorType) -> bool:
    return a.dtype == b.dtype and len(a.shape) == len(b.shape) and all(
        x == y or -1 in (x, y) for x, y in zip(a.shape, b.shape, strict=True)
    )


def _check_operand(cur: Cursor, where: str, k: int, v: Value | None, pt: ParsedType, at: int) -> None:
    if v is None:
        if pt.type is not None:
            raise cur.error(f"{where}: operand {k} is {NULL_VALUE} but its type is not <<NULL TYPE>>", at)
        return
    if pt.type is None or not _same_shape(v.type, pt.type):
        src = f" (line {v.op.line})" if v.op is not None and v.op.line else ""
        raise cur.error(
            f"{where}: operand {k} (%{v.id}) is typed {_show(pt.type)} in the signature but "
            f"was defined as {_show(v.type)}{src}", at)


def _show(t: TensorType | None) -> str:
    return "<<NULL TYPE>>" if t is None else f"{t.dtype}{list(t.shape)}"


def _build_op(cur: Cursor, name: str, line: int, at: int, operands: list[Value | None],
              out_types: list[ParsedType], attrs: dict[str, Any], tags: dict[str, str]) -> Operation:
    ctype = canonical_type(name)
    flags = {f: attrs.pop(f) for f in FLAG_ATTRS if f in attrs}
    vname = attrs.pop(NAME_ATTRS[ctype], None) if ctype in NAME_ATTRS else None
    for f in (NAME_ATTRS.get(ctype, ""),):
        tags.pop(f, None)
    raw_dist = attrs.pop("op_dist_attr", None)
    tags.pop("op_dist_attr", None)
    where = f"{name} at line {line}"
    op_dist = _op_dist_attr(cur, where, at, raw_dist, operands, out_types) if raw_dist else None
    results: list[Value | None] = []
    for k, pt in enumerate(out_types):
        if pt.type is None:
            results.append(None)
            continue
        v = Value(pt.type, str(vname) if vname is not None and k == 0 else None)
        for f, vals in flags.items():
            if isinstance(vals, list) and k < len(vals):
                setattr(v, f, bool(vals[k]))
        if pt.mesh_shape is not None:
            v.dist_attr = _value_attr(cur, where, at, k, pt, op_dist)
        results.append(v)
    if ctype == "parameter" and results and results[0] is not None:
        attrs.setdefault("shape", list(results[0].shape))
        attrs.setdefault("dtype", results[0].dtype)
    return Operation(name, operands, results, attrs, attr_tags=tags, dist_attr=op_dist,
                     chunk_id=op_dist.chunk_id if op_dist else 0, line=line)


def _value_attr(cur: Cursor, where: str, at: int, k: int, pt: ParsedType,
                op_dist: OperatorDistAttr | None) -> TensorDistAttr:
    assert pt.mesh_shape is not None and pt.type is not None
    mesh = op_dist.process_mesh if op_dist and op_dist.process_mesh.shape == pt.mesh_shape else None
    try:
        mesh = mesh or ProcessMesh.of(*pt.mesh_shape)
        attr = TensorDistAttr(mesh, pt.dims_mapping, pt.partial)
        attr.check_shape(pt.type.shape, f"result {k}")
    except DistAttrError as e:
        raise cur.error(f"{where}: result {k} type: {e}", at) from None
    return attr


def _op_dist_attr(cur: Cursor, where: str, at: int, raw: Any, operands: list[Value | None],
                  out_types: list[ParsedType]) -> OperatorDistAttr:
    if not isinstance(raw, dict) or not isinstance(raw.get("mesh"), dict):
        raise cur.error(f"{where}: op_dist_attr needs a mesh:{{shape:[..],process_ids:[..]}}", at)
    m = raw["mesh"]
    try:
        mesh = ProcessMesh(tuple(m.get("shape") or ()), tuple(m.get("process_ids") or ()),
                           tuple(str(d) for d in m.get("dim_names") or ()))
        n_in = _entries(cur, where, at, raw, "operand", len(operands))
        n_out = _entries(cur, where, at, raw, "result", len(out_types))
        ins = [_tensor_attr(mesh, raw.get(f"operand({k})"), v.type if v else None, f"operand({k})")
               for k, v in enumerate(operands[:n_in])]
        outs = [_tensor_attr(mesh, raw.get(f"result({k})"), pt.type, f"result({k})")
                for k, pt in enumerate(out_types[:n_out])]
    except DistAttrError as e:
        raise cur.error(f"{where}: op_dist_attr: {e}", at) from None
    return OperatorDistAttr(mesh, tuple(ins), tuple(outs), int(raw.get("chunk_id", 0) or 0))


def _entries(cur: Cursor, where: str, at: int, raw: dict[str, Any], kind: str, n: int) -> int:
    """How many ``kind(k)`` entries the op_dist_attr lists (Paddle may omit trailing ones,
    e.g. ``full_like``'s fill-value operand); an index past the op's arity is an error."""
    ks = [int(k[len(kind) + 1:-1]) for k in raw if k.startswith(kind + "(") and k[len(kind) + 1:-1].isdigit()]
    if ks and max(ks) >= n:
        raise cur.error(f"{where}: op_dist_attr has {kind}({max(ks)}) but the op has {n} {kind}s", at)
    return max(ks) + 1 if ks else 0


def _tensor_attr(mesh: ProcessMesh, raw: Any, t: TensorType | None, what: str) -> TensorDistAttr | None:
    if not isinstance(raw, dict) or "null" in raw:
        return None
    dm = raw.get("dims_maping", raw.get("dims_mapping"))
    if not isinstance(dm, list):
        raise DistAttrError(f"{what} has no dims_maping list")
    partial = {}
    for key in raw:
        if key.startswith("partial(") and key.endswith(")"):
            d, _, rt = key[len("partial("):-1].partition(",")
            partial[int(d)] = rt.strip()
    attr = TensorDistAttr(mesh, dm, partial, int(raw.get("chunk_id", 0) or 0))
    if t is not None and not isinstance(t, OpaqueType):
        attr.check_shape(t.shape, what)
    return attr


def _check_inference(cur: Cursor, op: Operation, at: int) -> None:
    """Re-run the registry's inference on a known op and compare with the text's types."""
    od = get_opdef(op.type)
    if od is None or not op.operands:
        return
    n_req = sum(1 for o in od.operands if not o.endswith("?"))
    if not od.variadic and not n_req <= len(op.operands) <= len(od.operands):
        return  # a different operand convention than ours: keep the text's types
    types = [v.type if v is not None else None for v in op.operands]
    try:
        got = od.infer(types, {**od.attrs, **op.attrs})
    except OpError as e:
        raise cur.error(f"{op.full_type} at line {op.line}: {e}", at) from None
    for k, (v, t) in enumerate(zip(op.results, got, strict=False)):
        if v is not None and t is not None and not _same_shape(v.type, t):
            raise cur.error(
                f"{op.full_type} at line {op.line}: result {k} is typed {_show(v.type)} but "
                f"the operands give {_show(t)}", at)


__all__ = ["PirParseError", "parse_program"]
