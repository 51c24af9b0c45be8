"""Partition pass (reshard insertion), reshard pass (resolution into collectives) and the
per-rank view, on the seed golden programs and hand-built programs (case 1, cross-mesh)."""

from __future__ import annotations

import numpy as np
import pytest

from completion import (
    OperatorDistAttr,
    ProcessMesh,
    Program,
    ReshardError,
    TensorDistAttr,
    apply_partition_pass,
    apply_reshard_pass,
    parse_program,
    plan_reshard,
    print_program,
    rank_program,
)
from completion.spmd import DistTensor, get_spmd_rule
from completion.testing import VirtualMesh


def _read(shared_dir, name):
    return (shared_dir / "data" / "programs" / name).read_text()


def test_seed_golden_partition(shared_dir):
    prog = parse_program(_read(shared_dir, "mlp_sgd_before_partition.pir"))
    apply_partition_pass(prog)
    assert print_program(prog) == _read(shared_dir, "mlp_sgd_after_partition.pir")


def test_reshard_pass_on_seed_gives_two_all_reduces(shared_dir):
    prog = parse_program(_read(shared_dir, "mlp_sgd_after_partition.pir"))
    apply_reshard_pass(prog)
    assert not [op for op in prog.ops if op.type == "reshard"]
    ars = [op for op in prog.ops if op.type == "all_reduce"]
    assert len(ars) == 2 and len(prog.ops) == 28
    # [4, 8] and [4, 16] float32 partial sums, one group of both ranks
    assert [op.attrs["nbytes"] for op in ars] == [4 * 8 * 4, 4 * 16 * 4]
    assert all(op.attrs["groups"] == [[0, 1]] and op.attrs["reduce_type"] == "sum" for op in ars)
    assert ars[0].results[0].uses[0][0].type == "relu"  # users rewired
    assert ars[1].results[0].uses[0][0].type == "relu_grad"
    text = print_program(prog)
    assert print_program(parse_program(text)) == text  # the resolved program round-trips
    # per-rank view: parameter_0 [16, 16] column split -> [16, 8] on each rank
    ops = rank_program(prog, 1)
    assert len(ops) == len(prog.ops)
    mm = next(r for r in ops if r.op.type == "matmul")
    assert mm.operand_shapes == ((4, 16), (16, 8)) and mm.result_shapes == ((4, 8),)
    ar = next(r for r in ops if r.op.type == "all_reduce")
    assert ar.group == (0, 1) and ar.operand_shapes == ((4, 8),)
    assert rank_program(prog, 5) == []


def _program(mesh, x_attr, shape=(12, 8)):
    prog = Program()
    x = prog.add("data", [], {"shape": list(shape), "dtype": "float32", "name": "x"}, names=["x"]).results[0]
    x.dist_attr = x_attr
    prog.ops[0].dist_attr = OperatorDistAttr(mesh, (), (x_attr,))
    return prog, x


def _consume(prog, op_type, x, need, res, attrs=None):
    op = prog.add(op_type, [x], attrs or {})
    op.dist_attr = OperatorDistAttr(need.process_mesh, (need,), (res,))
    op.results[0].dist_attr = res
    return op


def test_case1_flatten_of_non_leading_shard_inserts_all_gather():
    """Case 1: mesh [4], x [12, 8] S(1) reshaped to [16, 6]: the reshape rule requires x
    replicated, so the pass inserts one all_gather; reshaping local shards is wrong."""
    mesh = ProcessMesh.of(4)
    prog, x = _program(mesh, TensorDistAttr(mesh, [-1, 0]))
    rule = get_spmd_rule("reshape").infer_forward([DistTensor((12, 8), x.dist_attr)], {"shape": [16, 6]})
    assert rule.operands[0].dims_mapping == (-1, -1)
    reshape = _consume(prog, "reshape", x, rule.operands[0], rule.results[0], {"shape": [16, 6]})
    apply_partition_pass(prog)
    assert [op.type for op in prog.ops] == ["data", "reshard", "reshape"]
    apply_reshard_pass(prog)
    assert [op.type for op in prog.ops] == ["data", "all_gather", "reshape"]
    ag = prog.ops[1]
    assert ag.attrs["nbytes"] == 4 * (12 * 2) * 4 and ag.attrs["src_dim"] == 1
    assert reshape.operands[0] is ag.results[0]
    # numerics: the all_gather then reshape gives the true result on every rank
    glob = np.arange(96, dtype=np.float64).reshape(12, 8)
    plan = plan_reshard(x.dist_attr, rule.operands[0], (12, 8))
    out = VirtualMesh.from_global(glob, x.dist_attr).run(plan)
    for r in range(4):
        assert np.array_equal(out.arrays[r].reshape(16, 6), glob.reshape(16, 6))
    # ...whereas keeping the shard (reshaping [12, 2] locals into [4, 6] rows) is wrong
    local = VirtualMesh.from_global(glob, x.dist_attr).arrays
    wrong = np.concatenate([local[r].reshape(4, 6) for r in range(4)])
    assert not np.array_equal(wrong, glob.reshape(16, 6))


def test_one_reshard_per_value_and_target():
    mesh = ProcessMesh.of(2)
    s0, rep, s1 = (TensorDistAttr(mesh, dm) for dm in ([0, -1], [-1, -1], [-1, 0]))
    prog, x = _program(mesh, s0, (4, 6))
    _consume(prog, "relu", x, rep, rep)
    _consume(prog, "exp", x, rep, rep)
    _consume(prog, "tanh", x, s1, s1)
    _consume(prog, "sigmoid", x, s0, s0)  # already in place: no reshard
    apply_partition_pass(prog)
    types = [op.type for op in prog.ops]
    assert types == ["data", "reshard", "relu", "exp", "reshard", "tanh", "sigmoid"]
    assert prog.ops[2].operands[0] is prog.ops[3].operands[0] is prog.ops[1].results[0]
    assert prog.ops[6].operands[0] is x
    apply_reshard_pass(prog)
    assert [op.type for op in prog.ops] == ["data", "all_gather", "relu", "exp", "all_to_all", "tanh", "sigmoid"]


def test_cross_mesh_inserts_a_pair_and_resolves_to_send_recv():
    a, b = ProcessMesh.of(2), ProcessMesh.of(2, start=2)
    prog, x = _program(a, TensorDistAttr(a, [0, -1]), (6, 4))
    need = TensorDistAttr(b, [-1, -1])
    relu = _consume(prog, "relu", x, need, need)
    relu.role = 1  # a backward consumer: the reshard ops take its role
    apply_partition_pass(prog)
    first, second = prog.ops[1], prog.ops[2]
    assert [first.type, second.type] == ["reshard", "reshard"]
    assert first.dist_attr.process_mesh == a and second.dist_attr.process_mesh == b
    assert first.role == second.role == 1
    # cheapest crossing: send the S(0) halves, gather on the destination mesh
    mid = first.dist_attr.results[0]
    assert mid.process_mesh == b and mid.dims_mapping == (0, -1)
    apply_reshard_pass(prog)
    assert [op.type for op in prog.ops] == ["data", "send", "recv", "all_gather", "relu"]
    assert [r.op.type for r in rank_program(prog, 0)] == ["data", "send"]
    r2 = rank_program(prog, 2)
    assert [r.op.type for r in r2] == ["recv", "all_gather", "relu"]
    assert r2[0].result_shapes == ((3, 4),) and r2[0].group == (0, 2)
    assert r2[1].operand_shapes == ((3, 4),) and r2[1].result_shapes == ((6, 4),)


def test_bad_required_attr_is_a_clear_error():
    mesh = ProcessMesh.of(2)
    prog, x = _program(mesh, TensorDistAttr(mesh, [0, -1]), (4, 6))
    bad = TensorDistAttr(mesh, [-1, -1, -1])
    _consume(prog, "relu", x, bad, TensorDistAttr(mesh, [-1, -1]))
    with pytest.raises(ReshardError, match=r"%0 \(x\).*dims_mapping=\[0, -1\].*dims_mapping=\[-1, -1, -1\]"):
        apply_partition_pass(prog)
