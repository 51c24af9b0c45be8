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
``op_dist_attr``, since the type carries only the mesh shape). Roles come from
:func:`completion.roles.infer_roles`.

Consistency (every check raises a PirParseError naming the op and its line):

- types agree with dist attrs: a result type's ``mesh_shape`` must be the shape of the op's
  ``op_dist_attr`` mesh (no mesh is ever invented for it); an operand type must be the
  type its value was defined with (shape, dtype and dist part: mesh shape, dims_mappings,
  partial status);
- a mesh has at most :data:`MAX_MESH_RANKS` ranks (``mesh_shape:[1000000]`` is refused
  before anything is allocated);
- a known op has an operand count its declaration allows, declares as many results as its
  shape inference gives, and each declared (non-null) result type equals the inferred
  one -- source ops included (a ``data`` / ``full`` / ``recv`` whose ``shape`` or
  ``dtype`` attribute disagrees with its result type is refused); a result the inference
  leaves null must be ``<<NULL TYPE>>``;
- ``op_dist_attr`` holds only ``mesh``, ``operand(k)``, ``result(k)`` and ``chunk_id``
  (k in range), each tensor entry only ``dims_maping`` / ``dims_mapping``, ``partial(d,T)``
  and ``chunk_id``; no key is given twice; result ids are >= 0; the flag lists
  (``stop_gradient`` ...) have one entry per result;
- attributes typed boolean are booleans: an attribute a known op declares with a
  ``true`` / ``false`` default (``transpose_x``, ``transpose_y``, ``keepdim``,
  ``soft_label`` ...) must be the atom ``true`` or ``false`` -- never a string such as
  ``"false"`` (which every truthiness test would read as true), a number or another atom;
  one declared as a list of booleans (a parameter's ``need_clip:[true]``) must be such a
  list (:func:`_check_bool_attrs`);
- value names are unique: a data op's ``name`` and a parameter's ``parameter_name`` may
  not repeat one given earlier (both name values for ``Program.value`` and
  ``--annotate``); the error names the name and both lines.

An op's result entry in ``op_dist_attr`` (the layout the op produces) may differ from its
result type's dims_mappings (the layout the value is annotated with): the partition pass
reshards such a result (:mod:`completion.passes.partition`).
"""

from __future__ import annotations

import math
from typing import Any

from completion.dist_attr import OperatorDistAttr, TensorDistAttr
from completion.errors import DistAttrError
from completion.ir import Operation, Program, Value
from completion.mesh import ProcessMesh
from completion.ops.registry import OpError, TensorType, canonical_type, get_opdef
from completion.pir.lex import Cursor, PirParseError, RawAttr
from completion.pir.types import NULL_VALUE, OpaqueType, ParsedType, at_type, parse_type
from completion.roles import infer_roles

FLAG_ATTRS = ("stop_gradient", "persistable", "is_parameter")
#: the largest mesh a program text may declare (ranks)
MAX_MESH_RANKS = 65536
NAME_ATTRS = {"data": "name", "parameter": "parameter_name"}


def parse_program(text: str) -> Program:
    """Parse PIR text (optionally wrapped in ``{ ... }``) into a Program.

    Raises PirParseError (a CompletionError / ValueError) with line and column: syntax
    errors say what was expected; an undefined or doubly defined ``%N``, a type that
    disagrees with the value's definition or with the op's dist attr, a mesh of more than
    MAX_MESH_RANKS ranks, a bad ``dims_maping``, a known op with the wrong number of
    operands or results, a declared result type that its shape inference does not give
    (source ops' ``shape`` / ``dtype`` attributes included), a boolean attribute that is
    not ``true`` / ``false`` (``transpose_y:"false"``) and a data ``name`` or
    ``parameter_name`` given twice name the op and its line (module docstring,
    "Consistency").
    """
    cur = Cursor(text)
    prog = Program()
    env: dict[int, Value | None] = {}
    names: dict[str, Operation] = {}
    braced = cur.eat("{")
    while True:
        if braced and cur.eat("}"):
            break
        if cur.at_end():
            if braced:
                raise cur.fail("an operation or '}' closing the program")
            break
        _parse_op(cur, prog, env, names)
    if not cur.at_end():
        raise cur.fail("end of text after the program")
    prog.renumber()
    infer_roles(prog)
    return prog


def _parse_op(cur: Cursor, prog: Program, env: dict[int, Value | None],
              names: dict[str, Operation]) -> None:
    cur.ws()
    op_at = cur.i
    line = cur.where()[0]
    cur.expect("(", "'(' starting an operation, e.g. (%0) = \"pd_op.relu\" ...")
    res_ids: list[int] = []
    res_at: list[int] = []
    if not cur.eat(")"):
        while True:
            cur.expect("%", "a result such as %0")
            res_at.append(cur.i)
            res_ids.append(cur.integer("a value number after '%'"))
            if cur.eat(")"):
                break
            cur.expect(",", "',' or ')' in the result list")
    cur.expect("=", "'=' after the result list")
    name = cur.string()
    cur.context = f"{name} at line {line}"
    for rid, at in zip(res_ids, res_at, strict=True):
        if rid < 0:
            raise cur.error(f"{cur.context}: result %{rid}: value numbers are >= 0", at)
    operands, operand_at = _operands(cur, name, env)
    attrs: dict[str, Any] = {}
    tags: dict[str, str] = {}
    attr_at: dict[str, int] = {}
    if cur.peek("{"):
        _attr_dict(cur, attrs, tags, attr_at)
    _check_bool_attrs(cur, name, attrs, attr_at, op_at)
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
    for k, pt in enumerate(out_types):
        _check_mesh_size(cur, where, f"result {k} type", pt.mesh_shape, op_at)
    op = _build_op(cur, name, line, op_at, operands, out_types, attrs, tags)
    _check_unique_name(cur, op, names, attr_at.get(NAME_ATTRS.get(op.type, ""), op_at))
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


def _attr_dict(cur: Cursor, attrs: dict[str, Any], tags: dict[str, str],
               attr_at: dict[str, int]) -> None:
    """The op's ``{key:value,...}`` into ``attrs`` (type tags into ``tags``, the offset
    of each value into ``attr_at``, for errors that point at it)."""
    cur.expect("{")
    if cur.eat("}"):
        return
    while True:
        cur.ws()
        at = cur.i
        key = cur.ident("an attribute name")
        if key in attrs:
            raise cur.error(f"{cur.context}: attribute {key} is given twice", at)
        cur.expect(":", f"':' after attribute {key}")
        cur.ws()
        attr_at[key] = cur.i
        val, tag = cur.value()
        attrs[key] = val
        if tag:
            tags[key] = tag
        if cur.eat("}"):
            return
        cur.expect(",", "',' or '}' in the attribute dict")


def _is_bool_list(x: Any) -> bool:
    """A non-empty list of booleans (a declared default such as ``need_clip: [True]``)."""
    return isinstance(x, list) and bool(x) and all(isinstance(b, bool) for b in x)


def _show_value(x: Any) -> str:
    """An attribute value as the text wrote it, saying what it is when that is not plain."""
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, RawAttr):
        return str(x)
    if isinstance(x, str):
        return f'"{x}" (a string)'
    if isinstance(x, (int, float)):
        return f"{x} (a number)"
    if isinstance(x, list):
        return "[" + ",".join(_show_value(e) for e in x) + "]"
    return repr(x)


def _check_bool_attrs(cur: Cursor, name: str, attrs: dict[str, Any], attr_at: dict[str, int],
                     op_at: int) -> None:
    """Refuse a non-boolean value for a boolean attribute of op ``name``.

    An attribute is boolean when the op's declaration (:func:`get_opdef`) gives it a
    ``True`` / ``False`` default; it must then be the atom ``true`` or ``false``. One
    declared with a list of booleans (``need_clip: [True]``) must be a list of ``true`` /
    ``false``. Unknown ops are not checked (their attributes are kept as text). Raises a
    PirParseError naming the attribute, the op and its line, at the value's column
    (``attr_at``, else ``op_at``)."""
    od = get_opdef(name)
    if od is None:
        return
    line = cur.where(op_at)[0]
    for key, default in od.attrs.items():
        if key not in attrs:
            continue
        val = attrs[key]
        if isinstance(default, bool) and not isinstance(val, bool):
            raise cur.error(f"{name} at line {line}: attribute {key} must be true or false, "
                            f"got {_show_value(val)}", attr_at.get(key, op_at))
        if _is_bool_list(default) and not (
                isinstance(val, list) and all(isinstance(b, bool) for b in val)):
            raise cur.error(f"{name} at line {line}: attribute {key} must be a list of true / "
                            f"false, got {_show_value(val)}", attr_at.get(key, op_at))


def _check_unique_name(cur: Cursor, op: Operation, names: dict[str, Operation], at: int) -> None:
    """A data op's ``name`` / a parameter's ``parameter_name`` names one value only
    (``Program.value`` and ``--annotate`` look values up by it): a name given before is a
    PirParseError naming it and both ops' lines."""
    key = NAME_ATTRS.get(op.type)
    v = op.results[0] if key is not None and op.results else None
    if v is None or v.name is None:
        return
    first = names.get(v.name)
    if first is not None:
        what = NAME_ATTRS.get(first.type, "name")
        raise cur.error(f'{op.full_type} at line {op.line}: {key} "{v.name}" is given twice: it is '
                        f"already the {what} of {first.full_type} at line {first.line}", at)
    names[v.name] = op


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


def _agrees(declared: TensorType, inferred: TensorType) -> bool:
    """A declared result type agrees with the inferred one: same dtype and rank, and each
    dim equal unless inference leaves it unknown (-1, a dynamic dim of an input)."""
    return declared.dtype == inferred.dtype and len(declared.shape) == len(inferred.shape) and all(
        x == y or y == -1 for x, y in zip(declared.shape, inferred.shape, strict=True)
    )


def _check_operand(cur: Cursor, where: str, k: int, v: Value | None, pt: ParsedType, at: int) -> None:
    """An operand's type must be the type its value was defined with: shape and dtype
    exactly, and the dist part (mesh shape, dims_mappings, partial status)."""
    if v is None:
        if pt.type is not None:
            raise cur.error(f"{where}: operand {k} is {NULL_VALUE} but its type is not <<NULL TYPE>>", at)
        return
    src = f" (line {v.op.line})" if v.op is not None and v.op.line else ""
    if pt.type is None or pt.type != v.type:
        raise cur.error(
            f"{where}: operand {k} (%{v.id}) is typed {_show(pt.type)} in the signature but "
            f"was defined as {_show(v.type)}{src}", at)
    have = _show_dist(v.dist_attr)
    if pt.mesh_shape is None:
        said = "none"
    else:
        try:
            said = _show_dist(TensorDistAttr(_shape_mesh(v, pt.mesh_shape), pt.dims_mapping, pt.partial))
        except DistAttrError as e:
            raise cur.error(f"{where}: operand {k} (%{v.id}) type: {e}", at) from None
    if said != have:
        raise cur.error(
            f"{where}: operand {k} (%{v.id}) is typed with dist attr {said} in the signature but "
            f"was defined with {have}{src}", at)


def _shape_mesh(v: Value, mesh_shape: tuple[int, ...]) -> ProcessMesh:
    """A mesh of ``mesh_shape`` to read a type's dist part with (the value's own mesh when
    the shapes agree; the comparison is by mesh shape only, as the type carries no ranks)."""
    if v.dist_attr is not None and v.dist_attr.process_mesh.shape == tuple(mesh_shape):
        return v.dist_attr.process_mesh
    if math.prod(mesh_shape) > MAX_MESH_RANKS or any(s <= 0 for s in mesh_shape):
        raise DistAttrError(f"mesh_shape {list(mesh_shape)} is not a mesh of 1..{MAX_MESH_RANKS} ranks")
    return ProcessMesh.of(*mesh_shape)


def _show_dist(a: TensorDistAttr | None) -> str:
    """A dist attr as a type states it: mesh shape, dims_mappings, partial."""
    if a is None:
        return "none"
    part = "".join(f", partial({d},{r})" for d, r in a.partial)
    return f"mesh_shape:{list(a.process_mesh.shape)},dims_mappings:{list(a.dims_mapping)}{part}"


def _check_mesh_size(cur: Cursor, where: str, what: str, shape: Any, at: int) -> None:
    """Refuse a mesh of more than MAX_MESH_RANKS ranks (before it is built)."""
    if shape is None or not isinstance(shape, (list, tuple)):
        return
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in shape):
        return  # ProcessMesh reports non-integer entries
    if any(s <= 0 for s in shape):
        raise cur.error(f"{where}: {what}: mesh shape {list(shape)} must be non-empty and positive", at)
    n = math.prod(shape)
    if n > MAX_MESH_RANKS:
        raise cur.error(f"{where}: {what}: mesh shape {list(shape)} has {n} ranks; at most "
                        f"{MAX_MESH_RANKS} are supported", at)


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
    for f, vals in flags.items():
        n = len(out_types)
        if not isinstance(vals, list) or len(vals) != n or not all(isinstance(b, bool) for b in vals):
            raise cur.error(f"{where}: {f} must list one true/false per result ({n}), got "
                            f"{vals!r}", at)
    op_dist = _op_dist_attr(cur, where, at, raw_dist, operands, out_types) if raw_dist else None
    results: list[Value | None] = []
    for k, pt in enumerate(out_types):
        if pt.type is None:
            results.append(None)
            continue
        v = Value(pt.type, str(vname) if vname is not None and k == 0 else None)
        for f, vals in flags.items():
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
    if op_dist is not None and op_dist.process_mesh.shape != pt.mesh_shape:
        raise cur.error(f"{where}: result {k} type has mesh_shape {list(pt.mesh_shape)} but the "
                        f"op's op_dist_attr mesh has shape {list(op_dist.process_mesh.shape)}", at)
    try:
        mesh = op_dist.process_mesh if op_dist is not None else ProcessMesh.of(*pt.mesh_shape)
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
    unknown = [key for key in raw if key not in ("mesh", "chunk_id") and not _indexed(key)]
    unknown += [f"mesh.{key}" for key in m if key not in ("shape", "process_ids", "dim_names")]
    if unknown:
        raise cur.error(f"{where}: op_dist_attr has unknown entries {unknown} (expected mesh, "
                        f"operand(k), result(k), chunk_id)", at)
    _check_mesh_size(cur, where, "op_dist_attr", m.get("shape"), at)
    if isinstance(m.get("process_ids"), list) and len(m["process_ids"]) > MAX_MESH_RANKS:
        raise cur.error(f"{where}: op_dist_attr: {len(m['process_ids'])} process_ids; at most "
                        f"{MAX_MESH_RANKS} ranks are supported", at)
    try:
        mesh = ProcessMesh(tuple(m.get("shape") or ()), tuple(m.get("process_ids") or ()),
                           tuple(str(d) for d in m.get("dim_names") or ()))
        n_in = _entries(cur, where, at, raw, "operand", len(operands))
        n_out = _entries(cur, where, at, raw, "result", len(out_types))
        ins = [_tensor_attr(mesh, raw.get(f"operand({k})"), v.type if v else None, f"operand({k})")
               for k, v in enumerate(operands[:n_in])]
        outs = [_tensor_attr(mesh, raw.get(f"result({k})"), pt.type, f"result({k})")
                for k, pt in enumerate(out_types[:n_out])]
        chunk = _int_entry(raw.get("chunk_id", 0) or 0, "op_dist_attr chunk_id")
    except DistAttrError as e:
        raise cur.error(f"{where}: op_dist_attr: {e}", at) from None
    return OperatorDistAttr(mesh, tuple(ins), tuple(outs), chunk)


def _indexed(key: str) -> bool:
    """``operand(k)`` / ``result(k)`` with k a non-negative integer."""
    for kind in ("operand", "result"):
        if key.startswith(kind + "(") and key.endswith(")") and key[len(kind) + 1:-1].isdigit():
            return True
    return False


def _entries(cur: Cursor, where: str, at: int, raw: dict[str, Any], kind: str, n: int) -> int:
    """How many ``kind(k)`` entries the op_dist_attr lists (Paddle may omit trailing ones,
    e.g. ``full_like``'s fill-value operand); an index past the op's arity is an error."""
    ks = [int(k[len(kind) + 1:-1]) for k in raw if k.startswith(kind + "(") and k[len(kind) + 1:-1].isdigit()]
    if ks and max(ks) >= n:
        raise cur.error(f"{where}: op_dist_attr has {kind}({max(ks)}) but the op has {n} {kind}s", at)
    return max(ks) + 1 if ks else 0


def _int_entry(x: Any, what: str) -> int:
    """``x`` as an int (an int, or the text of one); DistAttrError naming ``what`` otherwise."""
    if isinstance(x, bool) or not isinstance(x, (int, str)):
        raise DistAttrError(f"{what} must be an integer, got {x!r}")
    try:
        return int(x)
    except ValueError:
        raise DistAttrError(f"{what} must be an integer, got {x!r}") from None


def _tensor_attr(mesh: ProcessMesh, raw: Any, t: TensorType | None, what: str) -> TensorDistAttr | None:
    if not isinstance(raw, dict):
        raise DistAttrError(f"{what} must be {{dims_maping:[..]}} or {{null}}, got {raw!r}")
    if "null" in raw:
        if len(raw) != 1:
            raise DistAttrError(f"{what} is {{null}} but lists more: {sorted(raw)}")
        return None
    unknown = [k for k in raw if k not in ("dims_maping", "dims_mapping", "chunk_id")
               and not (k.startswith("partial(") and k.endswith(")"))]
    if unknown or ("dims_maping" in raw and "dims_mapping" in raw):
        raise DistAttrError(f"{what} has unknown or repeated entries {sorted(raw)}")
    dm = raw.get("dims_maping", raw.get("dims_mapping"))
    if not isinstance(dm, list):
        raise DistAttrError(f"{what} has no dims_maping list")
    partial = {}
    for key in raw:
        if key.startswith("partial(") and key.endswith(")"):
            d, _, rt = key[len("partial("):-1].partition(",")
            partial[_int_entry(d.strip(), f"{what} {key} mesh dim")] = rt.strip()
    attr = TensorDistAttr(mesh, dm, partial, _int_entry(raw.get("chunk_id", 0) or 0, f"{what} chunk_id"))
    if t is not None and not isinstance(t, OpaqueType):
        attr.check_shape(t.shape, what)
    return attr


def _check_inference(cur: Cursor, op: Operation, at: int) -> None:
    """Re-run the registry's inference on a known op and compare with the text's types:
    operand count, result count and every declared result type (source ops too: their
    ``shape`` / ``dtype`` attributes against their result type). Unknown ops (opaque) keep
    the text's types."""
    od = get_opdef(op.type)
    if od is None:
        return
    where = f"{op.full_type} at line {op.line}"
    n_req = sum(1 for o in od.operands if not o.endswith("?"))
    n = len(op.operands)
    if od.variadic and n < max(n_req, 1):
        raise cur.error(f"{where}: takes at least {max(n_req, 1)} operand(s) "
                        f"({', '.join(od.operands)}), got {n}", at)
    if not od.variadic and not n_req <= n <= len(od.operands):
        want = str(n_req) if n_req == len(od.operands) else f"{n_req} to {len(od.operands)}"
        raise cur.error(f"{where}: takes {want} operand(s) ({', '.join(od.operands) or 'none'}), "
                        f"got {n}", at)
    for i, v in enumerate(op.operands):
        if v is None and i < len(od.operands) and not od.operands[i].endswith("?") and not od.variadic \
                and not op.type.endswith("_grad"):
            raise cur.error(f"{where}: operand {i} ({od.operands[i]}) is required but is "
                            f"{NULL_VALUE}", at)
    types = [v.type if v is not None else None for v in op.operands]
    try:
        got = od.infer(types, {**od.attrs, **op.attrs})
    except OpError as e:
        raise cur.error(f"{where}: {e}", at) from None
    except (TypeError, ValueError, IndexError, KeyError, OverflowError) as e:
        raise cur.error(f"{where}: cannot infer its result types: {e}", at) from None
    if len(got) != len(op.results):
        raise cur.error(f"{where}: declares {len(op.results)} results but the op gives "
                        f"{len(got)}", at)
    src = "its attributes give" if not op.operands else "the operands give"
    for k, (v, t) in enumerate(zip(op.results, got, strict=True)):
        if v is not None and t is None:
            raise cur.error(f"{where}: result {k} is typed {_show(v.type)} but the op gives no "
                            f"value there (<<NULL TYPE>>)", at)
        if v is not None and t is not None and not _agrees(v.type, t):
            raise cur.error(
                f"{where}: result {k} is typed {_show(v.type)} but {src} {_show(t)}", at)


__all__ = ["PirParseError", "parse_program"]
