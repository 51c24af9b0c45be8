"""Bad attribute values in PIR program text are refused at load time, naming the op and line.

- A boolean op attribute (``transpose_y``, ``keepdim``, ...) written as anything but the atom
  ``true`` / ``false`` -- the string ``"false"``, which every truthiness test reads as true,
  ``"yes"``, a number -- was accepted: the matmul was completed as if transposed.
- A ``parameter_name`` (or data ``name``) given twice was accepted, and ``--annotate NAME``
  silently applied to the first of the two values.

Both are now a PirParseError naming the attribute / name, the op and its line, and the CLI
prints it as one ``error: ...`` line with exit code 2.
"""

from __future__ import annotations

import pytest

from completion.pir import PirParseError, parse_program, print_program
from tests._cli import one_line_error, run_main
from tests.conftest import SHARED

PROGRAMS = SHARED / "data" / "programs"
SEEDS = ["mlp_sgd_before_partition.pir", "mlp_sgd_no_dist_attrs.pir", "mlp_sgd_after_partition.pir"]
PLAIN = (PROGRAMS / "mlp_sgd_no_dist_attrs.pir").read_text()
LINES = PLAIN.split("\n")


def _with_line(line: int, old: str, new: str) -> str:
    """The plain seed program with ``old`` replaced by ``new`` once on (1-based) ``line``."""
    lines = list(LINES)
    assert old in lines[line - 1], (old, lines[line - 1])
    lines[line - 1] = lines[line - 1].replace(old, new, 1)
    return "\n".join(lines)


def _refused(text: str, op: str, line: int, *fragments: str) -> str:
    with pytest.raises(PirParseError) as e:
        parse_program(text)
    msg = str(e.value)
    assert e.value.line == line, msg
    assert f"{op} at line {line}" in msg, msg
    for f in fragments:
        assert f in msg, msg
    return msg


# -- boolean attributes -------------------------------------------------------------------
@pytest.mark.parametrize("bad, shown", [
    ('"false"', '"false" (a string)'),
    ('"true"', '"true" (a string)'),
    ('"yes"', '"yes" (a string)'),
    ("yes", "got yes"),
    ("0", "0 (a number)"),
    ("1", "1 (a number)"),
    ("[false]", "[false]"),
])
def test_matmul_transpose_y_must_be_a_boolean(bad, shown):
    text = _with_line(8, "transpose_y:false}", f"transpose_y:{bad}}}")
    msg = _refused(text, "pd_op.matmul", 8, "attribute transpose_y must be true or false", shown)
    # the column points at the value
    assert msg.startswith(f"line 8, column {LINES[7].index('transpose_y:') + len('transpose_y:') + 1}: ")


@pytest.mark.parametrize("line, op, old, new", [
    (8, "pd_op.matmul", "transpose_x:false", 'transpose_x:"false"'),
    (14, "pd_op.mean", "keepdim:false", 'keepdim:"false"'),
    (18, "pd_op.mean_grad", "keepdim:false", "keepdim:no"),
    (18, "pd_op.mean_grad", "reduce_all:false", 'reduce_all:"false"'),
    (22, "pd_op.matmul_grad", "transpose_y:false", 'transpose_y:"false"'),
    (24, "pd_op.matmul_grad", "transpose_x:false", "transpose_x:1"),
    (26, "pd_op.sgd_", "multi_precision:false", 'multi_precision:"false"'),
])
def test_every_declared_boolean_attribute_is_checked(line, op, old, new):
    key = old.split(":")[0]
    _refused(_with_line(line, old, new), op, line, f"attribute {key} must be true or false")


def test_boolean_list_attribute_must_list_booleans():
    text = _with_line(3, "need_clip:[true]", 'need_clip:["true"]')
    _refused(text, "builtin.parameter", 3, "attribute need_clip must be a list of true / false",
             '"true" (a string)')


def test_real_booleans_are_read_as_booleans():
    text = _with_line(8, "transpose_y:false}", "transpose_y:true}")
    prog = parse_program(text)  # 16x16 weight: a transposed matmul still type-checks
    mm = [op for op in prog.ops if op.type == "matmul"]
    assert mm[0].attrs["transpose_y"] is True and mm[1].attrs["transpose_y"] is False
    for op in parse_program(PLAIN).ops:
        for key in ("transpose_x", "transpose_y", "keepdim", "reduce_all", "multi_precision"):
            if key in op.attrs:
                assert op.attrs[key] is False, (op.label(), key)


@pytest.mark.parametrize("name", SEEDS)
def test_seed_programs_still_parse_and_print_back(name):
    text = (PROGRAMS / name).read_text()
    assert print_program(parse_program(text)) == text


# -- value names --------------------------------------------------------------------------
def test_duplicate_parameter_name_is_refused_naming_both_lines():
    text = PLAIN.replace('parameter_name:"parameter_0"', 'parameter_name:"parameter_1"')
    msg = _refused(text, "builtin.parameter", 4, 'parameter_name "parameter_1" is given twice',
                   "builtin.parameter at line 3")
    assert msg.startswith(f"line 4, column {LINES[3].index('parameter_name:') + len('parameter_name:') + 1}: ")


def test_duplicate_data_name_is_refused():
    text = _with_line(6, 'name:"label0"', 'name:"input0"')
    _refused(text, "pd_op.data", 6, 'name "input0" is given twice', "pd_op.data at line 5")


def test_data_name_may_not_repeat_a_parameter_name():
    text = _with_line(5, 'name:"input0"', 'name:"parameter_0"')
    _refused(text, "pd_op.data", 5, 'name "parameter_0" is given twice',
             "parameter_name of builtin.parameter at line 4")


# -- the CLI: one error line, exit code 2 -------------------------------------------------
def test_cli_string_boolean_is_a_one_line_error(capsys, tmp_path):
    path = tmp_path / "m14.pir"
    path.write_text(_with_line(8, "transpose_y:false}", 'transpose_y:"false"}'))
    line = one_line_error(*run_main(capsys, "complete", "--program", str(path), "--mesh", "d0=2",
                                    "--annotate", "parameter_0=-1,0", "--annotate", "parameter_1=0,-1"))
    assert "line 8" in line and "pd_op.matmul at line 8" in line and "transpose_y" in line, line


def test_cli_yes_boolean_is_a_one_line_error(capsys, tmp_path):
    path = tmp_path / "m15.pir"
    path.write_text(_with_line(8, "transpose_y:false}", 'transpose_y:"yes"}'))
    line = one_line_error(*run_main(capsys, "complete", "--program", str(path), "--mesh", "d0=2"))
    assert "pd_op.matmul at line 8" in line and "transpose_y" in line and '"yes"' in line, line


def test_cli_duplicate_parameter_name_is_a_one_line_error(capsys, tmp_path):
    path = tmp_path / "m6.pir"
    path.write_text(PLAIN.replace('parameter_name:"parameter_0"', 'parameter_name:"parameter_1"'))
    line = one_line_error(*run_main(capsys, "complete", "--program", str(path), "--mesh", "d0=2",
                                    "--annotate", "parameter_1=0,-1"))
    assert "parameter_1" in line and "line 4" in line and "line 3" in line, line


def test_cli_good_program_still_completes(capsys):
    rc, out, err = run_main(capsys, "complete", "--program", str(PROGRAMS / "mlp_sgd_no_dist_attrs.pir"),
                            "--mesh", "d0=2", "--annotate", "parameter_0=-1,0",
                            "--annotate", "parameter_1=0,-1")
    assert rc == 0, err
    assert "transpose_y:false" in out
