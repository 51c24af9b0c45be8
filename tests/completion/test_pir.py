"""PIR text: round trip of the seed programs, value/op mapping, and error reporting."""

from __future__ import annotations

import pathlib

import pytest

from completion import (
    CompletionError,
    OpRole,
    Partial,
    PirParseError,
    Replicate,
    Shard,
    parse_program,
    print_program,
)

PROGRAMS = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data" / "programs"
SEEDS = ["mlp_sgd_before_partition.pir", "mlp_sgd_no_dist_attrs.pir", "mlp_sgd_after_partition.pir"]


def _lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.splitlines()]


@pytest.mark.parametrize("name", SEEDS)
def test_round_trip_reproduces_seed_file(name: str) -> None:
    text = (PROGRAMS / name).read_text()
    out = print_program(parse_program(text))
    assert _lines(out) == _lines(text)


def test_values_flags_names_and_dist_attrs() -> None:
    prog = parse_program((PROGRAMS / "mlp_sgd_before_partition.pir").read_text())
    assert len(prog) == 26
    p0, p1 = prog.value("parameter_0"), prog.value("parameter_1")
    assert p0.id == 2 and p0.shape == (16, 16) and p0.is_parameter and p0.persistable
    assert not p0.stop_gradient
    assert prog.value("%1") is p1 and p1.dist_attr is not None
    assert p1.dist_attr.dims_mapping == (0, -1)
    assert p1.dist_attr.placements == (Shard(0),)
    assert p1.dist_attr.process_mesh.process_ids == (0, 1)  # taken from op_dist_attr's mesh
    x = prog.value("input0")
    assert x.stop_gradient and not x.persistable and x.shape == (4, 16)
    lr = prog.value("learning_rate_1")
    assert lr.shape == () and lr.persistable
    mm = prog.ops[8]
    assert mm.type == "matmul" and mm.dialect == "pd_op" and mm.line == 10
    out = mm.results[0]
    assert out.dist_attr.placements == (Partial("sum"),)
    assert mm.dist_attr.operands[1].dims_mapping == (0, -1)
    assert mm.dist_attr.results[0].partial_dims == {0: "sum"}
    # relu after the partial matmul requires a replicated operand (the reshard's reason)
    assert prog.ops[9].dist_attr.operands[0].placements == (Replicate(),)
    sub_grad = prog.ops[18]
    assert sub_grad.type == "subtract_grad" and sub_grad.results[1] is None
    assert sub_grad.attrs["axis"] == -1 and sub_grad.attr_tags["axis"] == "Int32"
    sgd = prog.ops[-1]
    assert sgd.operands[3] is None and sgd.dist_attr.operands[3] is None
    assert sgd.results[1] is None


def test_roles_inferred() -> None:
    prog = parse_program((PROGRAMS / "mlp_sgd_after_partition.pir").read_text())
    roles = [op.role for op in prog.ops]
    types = [op.type for op in prog.ops]
    assert roles[types.index("mean")] == OpRole.LOSS
    first_bwd = types.index("full")
    assert all(r == OpRole.FORWARD for r in roles[: types.index("mean")])
    assert all(r == OpRole.BACKWARD for r in roles[first_bwd:-2])
    assert roles[-2:] == [OpRole.OPTIMIZE, OpRole.OPTIMIZE]
    # the reshard in the backward region is backward, the one in the forward is forward
    reshards = [op for op in prog.ops if op.type == "reshard"]
    assert [op.role for op in reshards] == [OpRole.FORWARD, OpRole.BACKWARD]
    assert reshards[0].dialect == "dist_op"


def test_opaque_op_and_correct_spelling() -> None:
    text = (
        '{\n    (%0) = "pd_op.data" () {dtype:(pd_op.DataType)bfloat16,name:"x",'
        "place:(pd_op.Place)Place(undefined:0),shape:(pd_op.IntArray)[2,3],stop_gradient:[true]}"
        " : () -> builtin.tensor<2x3xbf16>\n"
        '    (%1, %2) = "custom_op.frobnicate" (%0) {level:(Int32)3,op_dist_attr:{mesh:{shape:[2],'
        "process_ids:[4,5]},operand(0):{dims_mapping:[0,-1]},result(0):{dims_maping:[-1,-1]},"
        "result(1):{null}}} : (builtin.tensor<2x3xbf16>) -> builtin.vec<builtin.tensor<2xf32>>, "
        "builtin.tensor<3xi64>\n}\n"
    )
    prog = parse_program(text)
    op = prog.ops[1]
    assert op.type == "frobnicate" and op.dialect == "custom_op"
    assert op.attrs["level"] == 3
    assert op.dist_attr.operands[0].dims_mapping == (0, -1)
    assert op.dist_attr.process_mesh.process_ids == (4, 5)
    assert op.results[1].shape == (3,) and op.results[1].dtype == "int64"
    assert prog.value("x").dtype == "bfloat16"
    out = print_program(prog)
    assert "builtin.vec<builtin.tensor<2xf32>>" in out
    assert parse_program(out).ops[1].attrs == op.attrs


def _with_line(lines: list[str], k: int, old: str, new: str) -> str:
    assert old in lines[k]
    lines = list(lines)
    lines[k] = lines[k].replace(old, new, 1)
    return "\n".join(lines) + "\n"


SEED = (PROGRAMS / "mlp_sgd_before_partition.pir").read_text().splitlines()


def test_error_undefined_operand_names_op_and_line() -> None:
    text = _with_line(SEED, 7, '"pd_op.matmul" (%5, %2)', '"pd_op.matmul" (%5, %99)')
    with pytest.raises(PirParseError, match=r"line 8, column \d+: pd_op.matmul: operand %99 is not defined") as e:
        parse_program(text)
    assert e.value.line == 8
    assert isinstance(e.value, CompletionError) and isinstance(e.value, ValueError)


def test_error_matmul_shape_mismatch_names_op_and_line() -> None:
    # parameter_1 declared as 12x8: the second matmul (line 10) multiplies 4x16 by 12x8
    lines = [ln.replace("16x8xf32", "12x8xf32") for ln in SEED]
    with pytest.raises(PirParseError, match=r"line 10.*pd_op.matmul at line 10: inner dims differ: "
                       r"x \[4, 16\].*K=16 but y \[12, 8\].*K=12"):
        parse_program("\n".join(lines))


def test_error_dims_mapping_names_missing_mesh_dim() -> None:
    text = _with_line(SEED, 6, "operand(0):{dims_maping:[-1,-1]}", "operand(0):{dims_maping:[-1,1]}")
    with pytest.raises(PirParseError, match=r"line 7.*pd_op.relu at line 7: op_dist_attr: "
                       r"dims_mapping \[-1, 1\] names mesh dim 1"):
        parse_program(text)


def test_error_mesh_dim_used_twice() -> None:
    text = _with_line(SEED, 3, "result(0):{dims_maping:[-1,0]}", "result(0):{dims_maping:[0,0]}")
    with pytest.raises(PirParseError, match=r"line 4.*builtin.parameter at line 4: .*"
                       r"dims_mapping \[0, 0\] uses a mesh dim more than once"):
        parse_program(text)


def test_error_type_dims_mapping_rank() -> None:
    text = _with_line(SEED, 4, "dims_mappings:[-1,-1]>", "dims_mappings:[-1]>")
    with pytest.raises(PirParseError, match=r"line 5.*result 0 type: .*has 1 entries but the tensor shape \[4, 16\]"):
        parse_program(text)


@pytest.mark.parametrize(
    ("cut", "expected"),
    [
        (None, "an operation or '}' closing the program"),  # closing brace missing
        ('"pd_op.relu" (%3) {op_dist', "':' after attribute op_dist"),
        ("stop_gradient:[false]} : (pd_dist.tensor<4x16xf32", "'>' closing the tensor type"),
        ("stop_gradient:[false]} : (pd_dist.tensor<4x16", "a shape and dtype such as 4x16xf32"),
        ('(%5) = "pd_op.re', "a closing '\"'"),
    ],
)
def test_error_truncated_text(cut: str | None, expected: str) -> None:
    full = "\n".join(SEED)
    if cut is None:
        text = "\n".join(SEED[:-1]) + "\n"
        line = len(SEED)
    else:
        text = full[: full.index(cut) + len(cut)]
        line = text.count("\n") + 1
    with pytest.raises(PirParseError) as e:
        parse_program(text)
    assert expected in str(e.value)
    assert e.value.line == line
    assert str(e.value).startswith(f"line {line}, column {e.value.column}: expected ")


def test_error_bad_token_reports_column() -> None:
    text = _with_line(SEED, 6, "(%5) = ", "(%5) := ")
    with pytest.raises(PirParseError) as e:
        parse_program(text)
    assert (e.value.line, e.value.column) == (7, 10)
    assert "expected '=' after the result list, found ':=" in str(e.value)


def test_error_value_defined_twice_and_type_disagreement() -> None:
    text = _with_line(SEED, 6, "(%5) = ", "(%4) = ")
    with pytest.raises(PirParseError, match=r"line 7.*%4 is defined twice"):
        parse_program(text)
    text = _with_line(SEED, 6, ": (pd_dist.tensor<4x16xf32", ": (pd_dist.tensor<4x15xf32")
    with pytest.raises(PirParseError, match=r"line 7.*operand 0 \(%3\) is typed float32\[4, 15\] "
                       r"in the signature but was defined as float32\[4, 16\] \(line 5\)"):
        parse_program(text)
