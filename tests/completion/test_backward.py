"""append_backward + apply_optimizer against the seed MLP and on small hand-built programs."""

from __future__ import annotations

import pathlib

import pytest

from completion import (
    BackwardError,
    OpRole,
    OptimizerError,
    Program,
    append_backward,
    apply_optimizer,
    parse_program,
    print_program,
)

PROGRAMS = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data" / "programs"


def _strip(prog: Program) -> Program:
    for op in reversed(list(prog.ops)):
        if op.role in (OpRole.BACKWARD, OpRole.OPTIMIZE):
            prog.remove(op)
    return prog


def _ref(v):
    return None if v is None else (v.id, v.shape, v.dtype)


@pytest.mark.parametrize("name", ["mlp_sgd_before_partition.pir", "mlp_sgd_no_dist_attrs.pir"])
def test_seed_backward_and_update_ops_match(name: str) -> None:
    text = (PROGRAMS / name).read_text()
    seed = parse_program(text)
    prog = _strip(parse_program(text))
    assert [op.type for op in prog.ops][-2:] == ["mean", "shadow_output"]
    assert len(prog) == 14
    pairs = append_backward(prog)
    assert [(p.name, g.name) for p, g in pairs] == [
        ("parameter_1", "parameter_1@GRAD"), ("parameter_0", "parameter_0@GRAD")]
    apply_optimizer(prog, "sgd", learning_rate=0.1)
    prog.renumber()
    assert len(prog) == len(seed) == 26
    for got, want in zip(prog.ops[14:], seed.ops[14:], strict=True):
        assert got.full_type == want.full_type
        assert got.role == want.role
        assert [_ref(v) for v in got.operands] == [_ref(v) for v in want.operands], want.label()
        assert [_ref(v) for v in got.results] == [_ref(v) for v in want.results], want.label()
        assert got.attrs == want.attrs
        assert [v.stop_gradient for v in got.results if v] == [
            v.stop_gradient for v in want.results if v]


def test_seed_no_dist_attrs_text_is_reproduced_exactly() -> None:
    text = (PROGRAMS / "mlp_sgd_no_dist_attrs.pir").read_text()
    prog = _strip(parse_program(text))
    append_backward(prog)
    apply_optimizer(prog, "sgd", learning_rate=0.1)
    assert print_program(prog) == text


def _tied_program() -> tuple[Program, dict]:
    """x[4,8] -> matmul(x, w[8,8]) -> matmul(., w) -> mean; w is used twice."""
    p = Program()
    x = p.add("data", [], {"shape": [4, 8]}, names=["x"], stop_gradient=True).results[0]
    w = p.add("parameter", [], {"shape": [8, 8]}, names=["w"], is_parameter=True,
              persistable=True).results[0]
    h = p.add("matmul", [x, w]).results[0]
    y = p.add("matmul", [h, w], {"transpose_y": True}).results[0]
    loss = p.add("mean", [y]).results[0]
    p.add("shadow_output", [loss], {"output_name": "loss_0"})
    return p, {"x": x, "w": w, "h": h, "y": y, "loss": loss}


def test_add_n_sums_contributions_of_a_reused_parameter() -> None:
    p, v = _tied_program()
    pairs = append_backward(p)
    types = [op.type for op in p.ops[6:]]
    assert types == ["full", "full_like", "mean_grad", "matmul_grad", "matmul_grad", "add_n"]
    add_n = p.ops[-1]
    (w, g), = pairs
    assert w is v["w"] and g is add_n.results[0] and g.name == "w@GRAD"
    assert g.shape == (8, 8)
    # contributions: from the second matmul (transpose_y) first, then the first matmul
    second, first = p.ops[9], p.ops[10]
    assert add_n.operands == [second.results[1], first.results[1]]
    assert [o.name for o in add_n.operands] == ["w@GRAD@RENAME@0", "w@GRAD@RENAME@1"]
    assert second.attrs == {"transpose_x": False, "transpose_y": True}
    assert first.results[0] is None  # x has stop_gradient: its grad is a null result
    assert second.results[0].shape == (4, 8)
    ops = apply_optimizer(p, "sgd", learning_rate=0.5)
    assert [op.operands[2] for op in ops] == [g]
    lr = ops[0].operands[1]
    assert lr.name == "learning_rate_0" and lr.persistable and lr.shape == ()
    assert lr.op.attrs["init_value"] == 0.5 and p.ops[0] is lr.op
    p.validate()


def test_adam_and_adamw_state_and_operands() -> None:
    for name, op_type in (("adam", "adam_"), ("adamw", "adamw_")):
        p, v = _tied_program()
        append_backward(p)
        (upd,) = apply_optimizer(p, name, learning_rate=1e-4, weight_decay=0.1)
        assert upd.type == op_type and upd.role == OpRole.OPTIMIZE
        names = [o.name if o is not None else None for o in upd.operands]
        assert names == ["w", "w@GRAD", "learning_rate_0", "w_moment1_0", "w_moment2_0",
                         "w_beta1_pow_acc_0", "w_beta2_pow_acc_0", None, None]
        assert [r.shape if r else None for r in upd.results] == [
            (8, 8), (8, 8), (8, 8), (1,), (1,), None]
        assert all(o.persistable for o in upd.operands[3:7])
        assert ("coeff" in upd.attrs) == (name == "adamw")
        p.validate()


def test_unused_split_output_gets_a_zero_gradient() -> None:
    p = Program()
    x = p.add("parameter", [], {"shape": [4, 6]}, names=["x"], is_parameter=True).results[0]
    a, b = p.add("split", [x], {"num_or_sections": [2, 4], "axis": 1}).results
    loss = p.add("sum", [a]).results[0]
    pairs = append_backward(p, loss)
    sg = p.ops[-1]
    assert sg.type == "split_grad" and sg.attrs["axis"] == 1
    zero = sg.operands[1]
    assert zero.op.type == "full" and zero.shape == b.shape == (4, 4)
    assert zero.op.attrs["value"] == 0.0
    assert sg.operands[0].shape == (4, 2) and sg.results[0].shape == (4, 6)
    assert pairs == [(x, sg.results[0])]


def test_loss_by_name_and_errors() -> None:
    p, v = _tied_program()
    with pytest.raises(BackwardError, match=r"loss %\d+ has shape \[4, 8\]"):
        append_backward(p, v["y"])
    empty = Program()
    empty.add("data", [], {"shape": [2]}, names=["z"])
    with pytest.raises(BackwardError, match="no shadow_output"):
        append_backward(empty)
    with pytest.raises(OptimizerError, match="no parameter gradients"):
        apply_optimizer(p, "sgd")
    with pytest.raises(OptimizerError, match="unknown optimizer 'lamb'"):
        apply_optimizer(p, "lamb")
    p2, v2 = _tied_program()
    p2.renumber()
    append_backward(p2, f"%{v2['loss'].id}")
    assert v2["loss"].op.role == OpRole.LOSS


def test_apply_optimizer_on_parsed_program_finds_grads_structurally() -> None:
    """A parsed program's grads have no names: the pairs come from grad op declarations."""
    text = (PROGRAMS / "mlp_sgd_before_partition.pir").read_text()
    prog = parse_program(text)
    for op in [op for op in prog.ops if op.role == OpRole.OPTIMIZE]:
        prog.remove(op)
    ops = apply_optimizer(prog, "sgd")
    prog.renumber()
    assert [(o.operands[0].name, o.operands[2].id) for o in ops] == [
        ("parameter_1", 21), ("parameter_0", 24)]
