"""SPMD rules: the einsum merge, each op family, the reference failure cases 1, 2, 4, 5 and
the registry (every declared op has a rule; unknown ops replicate with a warning)."""

from __future__ import annotations

import warnings

import pytest

import completion.ops  # noqa: F401  (registers the ops)
from completion.dist_attr import TensorDistAttr
from completion.mesh import ProcessMesh
from completion.ops.registry import OP_REGISTRY
from completion.spmd import DistTensor, FallbackRule, get_spmd_rule

M2 = ProcessMesh.of(2)
M4 = ProcessMesh.of(4)
M22 = ProcessMesh.of(2, 2)


def T(shape, mesh=None, dm=None, partial=None, priority=0, dtype="float32"):
    if mesh is None:
        return DistTensor(tuple(shape), dtype=dtype)
    return DistTensor(tuple(shape), TensorDistAttr(mesh, dm, partial), priority, dtype)


def dims(a):
    return None if a is None else (list(a.dims_mapping), a.partial_dims)


def fwd(op, ins, attrs=None):
    return get_spmd_rule(op).infer_forward(ins, attrs or {})


# -- registry ------------------------------------------------------------------------------
def test_every_declared_op_has_a_rule_except_opaque():
    missing = [t for t in OP_REGISTRY if isinstance(get_spmd_rule(t), FallbackRule)]
    assert missing == ["opaque"]


def test_unknown_op_replicates_with_a_warning():
    rule = get_spmd_rule("pd_op.my_custom_op")
    assert isinstance(rule, FallbackRule)
    with pytest.warns(UserWarning, match="my_custom_op"):
        res = rule.infer([T((4, 6), M2, [0, -1], {})], [T((4,))], {})
    assert dims(res.operands[0]) == ([-1, -1], {})
    assert dims(res.results[0]) == ([-1], {})


def test_prefix_is_accepted():
    assert get_spmd_rule("pd_op.matmul") is get_spmd_rule("matmul")


# -- matmul ----------------------------------------------------------------------------------
def test_matmul_column_and_row_parallel():
    col = fwd("matmul", [T((4, 8, 16), M22, [0, -1, -1]), T((16, 64), M22, [-1, 1])])
    assert dims(col.results[0]) == ([0, -1, 1], {})
    row = fwd("matmul", [T((4, 8, 64), M22, [0, -1, 1]), T((64, 16), M22, [1, -1])])
    assert dims(row.results[0]) == ([0, -1, -1], {1: "sum"})


def test_matmul_transpose_y_and_conflict_first_wins():
    # y^T: y is [n, k]; y's k on mesh 0 contracts -> Partial
    r = fwd("matmul", [T((4, 16), M2, [-1, -1]), T((8, 16), M2, [-1, 0])], {"transpose_y": True})
    assert dims(r.operands[0]) == ([-1, 0], {})
    assert dims(r.results[0]) == ([-1, -1], {0: "sum"})
    # x shards m on mesh 0 and y shards n on mesh 0: mesh 0 may shard one letter -> x wins
    r = fwd("matmul", [T((4, 16), M2, [0, -1]), T((16, 8), M2, [-1, 0])])
    assert dims(r.operands[1]) == ([-1, -1], {})
    assert dims(r.results[0]) == ([0, -1], {})
    # higher priority wins the letter
    r = fwd("matmul", [T((4, 16), M2, [0, -1]), T((16, 8), M2, [-1, 0], priority=2)])
    assert dims(r.operands[0]) == ([-1, -1], {})
    assert dims(r.results[0]) == ([-1, 0], {})


def test_matmul_grad_gives_partial_weight_grad_over_batch():
    g = fwd("matmul_grad", [T((4, 8, 16), M22, [0, -1, -1]), T((16, 64), M22, [-1, 1]),
                            T((4, 8, 64), M22, [0, -1, 1])])
    assert dims(g.results[0]) == ([0, -1, -1], {1: "sum"})  # x@GRAD
    assert dims(g.results[1]) == ([-1, 1], {0: "sum"})  # W@GRAD


def test_matmul_keeps_one_partial_side_only():
    r = fwd("matmul", [T((4, 16), M2, [-1, -1], {0: "sum"}), T((16, 8), M2, [-1, -1])])
    assert dims(r.operands[0]) == ([-1, -1], {0: "sum"})
    assert dims(r.results[0]) == ([-1, -1], {0: "sum"})
    r = fwd("matmul", [T((4, 16), M2, [-1, -1], {0: "sum"}), T((16, 8), M2, [-1, -1], {0: "sum"})])
    assert dims(r.operands[0]) == ([-1, -1], {0: "sum"})
    assert dims(r.operands[1]) == ([-1, -1], {})


# -- reference cases -----------------------------------------------------------------------
def test_case1_flatten_of_a_non_leading_shard_requires_replicated():
    r = fwd("reshape", [T((12, 8), M4, [-1, 0])], {"shape": [16, 6]})
    assert dims(r.operands[0]) == ([-1, -1], {})
    assert dims(r.results[0]) == ([-1, -1], {})


def test_reshape_keeps_leading_dim_when_divisible():
    r = fwd("reshape", [T((4, 8, 64), M22, [0, -1, 1])], {"shape": [4, 8, 8, 8]})
    assert dims(r.results[0]) == ([0, -1, 1, -1], {})
    r = fwd("reshape", [T((12, 8), M4, [0, -1])], {"shape": [96]})
    assert dims(r.results[0]) == ([0], {})
    # 6 rows over 4 ranks split unevenly: the merged dim cannot stay sharded
    r = fwd("reshape", [T((6, 8), M4, [0, -1])], {"shape": [48]})
    assert dims(r.operands[0]) == ([-1, -1], {})
    # a dim that is its own group keeps an uneven shard
    r = fwd("reshape", [T((5, 4), M4, [0, -1])], {"shape": [5, 2, 2]})
    assert dims(r.results[0]) == ([0, -1, -1], {})


def test_reshape_reverse_and_grad():
    rule = get_spmd_rule("reshape")
    r = rule.infer_reverse([T((4, 8, 8, 8), M22, [0, -1, 1, -1])], {"shape": [4, 8, 8, 8]}, [(4, 8, 64)])
    assert dims(r.operands[0]) == ([0, -1, 1], {})
    g = fwd("reshape_grad", [T((4, 8, 64), M22, [0, -1, 1]), T((4, 8, 8, 8), M22, [0, -1, 1, -1])])
    assert dims(g.results[0]) == ([0, -1, 1], {})


def test_case2_mean_over_an_uneven_split_is_replicated_first():
    r = fwd("mean", [T((3, 4), M2, [0, -1])], {"axis": [], "keepdim": False})
    assert dims(r.operands[0]) == ([-1, -1], {})
    assert dims(r.results[0]) == ([], {})
    even = fwd("mean", [T((4, 4), M2, [0, -1])], {"axis": [], "keepdim": False})
    assert dims(even.results[0]) == ([], {0: "avg"})


def test_reductions_give_partial_with_their_reduce_type():
    for op, rt in (("sum", "sum"), ("max", "max"), ("mean", "avg")):
        r = fwd(op, [T((4, 6), M2, [-1, 0])], {"axis": [1], "keepdim": False})
        assert dims(r.results[0]) == ([-1], {0: rt}), op
    keep = fwd("sum", [T((4, 6), M22, [0, 1])], {"axis": [1], "keepdim": True})
    assert dims(keep.results[0]) == ([0, -1], {1: "sum"})
    # the sum of an uneven split is still exact as Partial(sum)
    r = fwd("sum", [T((3, 4), M2, [0, -1])], {"axis": [], "keepdim": False})
    assert dims(r.results[0]) == ([], {0: "sum"})


@pytest.mark.parametrize("op,attrs", [
    ("relu", {}), ("gelu", {}), ("exp", {}), ("softmax", {"axis": -1}), ("max", {"axis": [1]}),
    ("sum", {"axis": [1]}), ("multiply", None), ("scale", {"scale": 2.0, "bias": 1.0}),
])
def test_case4_nonlinear_ops_require_partial_inputs_reduced(op, attrs):
    ins = [T((4, 6), M2, [-1, -1], {0: "sum"})]
    if attrs is None:
        ins.append(T((4, 6), M2, [-1, -1], {0: "sum"}))
    r = fwd(op, ins, attrs or {})
    for a in r.operands:
        assert a.partial_dims == {}, op
    assert all(a.partial_dims.get(0) != "sum" or op == "sum" for a in r.results)


def test_norms_require_partial_inputs_reduced():
    r = fwd("layer_norm", [T((4, 8, 16), M2, [-1, -1, -1], {0: "sum"}), T((16,)), T((16,))],
            {"begin_norm_axis": 2})
    assert dims(r.operands[0]) == ([-1, -1, -1], {})
    r = fwd("rms_norm", [T((4, 8, 16), M2, [-1, -1, -1], {0: "sum"}), T((16,))], {"begin_norm_axis": 2})
    assert dims(r.operands[0]) == ([-1, -1, -1], {})


@pytest.mark.parametrize("op,attrs", [
    ("scale", {"scale": 3.0, "bias": 0.0}), ("cast", {"dtype": "float16"}),
    ("transpose", {"perm": [1, 0]}), ("reshape", {"shape": [24]}),
])
def test_case4_linear_ops_keep_partial(op, attrs):
    r = fwd(op, [T((4, 6), M2, [-1, -1], {0: "sum"})], attrs)
    assert r.operands[0].partial_dims == {0: "sum"}
    assert r.results[0].partial_dims == {0: "sum"}


def test_case4_add_keeps_partial_only_for_two_partials():
    both = fwd("add", [T((4, 6), M2, [-1, -1], {0: "sum"}), T((4, 6), M2, [-1, -1], {0: "sum"})])
    assert dims(both.results[0]) == ([-1, -1], {0: "sum"})
    one = fwd("add", [T((4, 6), M2, [-1, -1], {0: "sum"}), T((4, 6), M2, [-1, -1])])
    assert dims(one.operands[0]) == ([-1, -1], {})
    assert dims(one.results[0]) == ([-1, -1], {})
    # P(max) + P(max) is not a P(max)
    mx = fwd("add", [T((4, 6), M2, [-1, -1], {0: "max"}), T((4, 6), M2, [-1, -1], {0: "max"})])
    assert dims(mx.results[0]) == ([-1, -1], {})


def test_case5_broadcast_aligns_right():
    r = fwd("add", [T((20, 6), M2, [-1, 0]), T((6,), M2, [0])])
    assert dims(r.operands[0]) == ([-1, 0], {})
    assert dims(r.operands[1]) == ([0], {})  # no reshard needed
    assert dims(r.results[0]) == ([-1, 0], {})
    # and the bias gradient sums over the broadcast rows
    g = fwd("add_grad", [T((20, 6), M22, [1, 0]), T((6,), M22, [0]), T((20, 6), M22, [1, 0])])
    assert dims(g.results[1]) == ([0], {1: "sum"})


def test_size_one_dims_are_replicated():
    r = fwd("add", [T((4, 1), M2, [-1, 0]), T((4, 6), M2, [-1, 0])])
    assert dims(r.operands[0]) == ([-1, -1], {})
    assert dims(r.results[0]) == ([-1, 0], {})


# -- nn ops --------------------------------------------------------------------------------
def test_softmax_axis_is_replicated():
    r = fwd("softmax", [T((4, 8), M22, [0, 1])], {"axis": -1})
    assert dims(r.operands[0]) == ([0, -1], {})
    assert dims(r.results[0]) == ([0, -1], {})


def test_split_and_concat_axes_are_replicated():
    r = fwd("split", [T((4, 8), M22, [0, 1])], {"axis": 1, "num_or_sections": 2})
    assert [dims(a) for a in r.results] == [([0, -1], {})] * 2
    r = fwd("concat", [T((4, 8), M22, [0, 1]), T((4, 8), M22, [0, 1])], {"axis": 0})
    assert dims(r.results[0]) == ([-1, 1], {})


def test_embedding_vocab_parallel_gives_partial_sum():
    r = fwd("embedding", [T((4, 8), M22, [0, -1], dtype="int64"), T((100, 16), M22, [1, -1])])
    assert dims(r.results[0]) == ([0, -1, -1], {1: "sum"})
    g = fwd("embedding_grad", [T((4, 8), M22, [0, -1]), T((100, 16), M22, [1, -1]),
                               T((4, 8, 16), M22, [0, -1, -1])])
    assert dims(g.results[1]) == ([1, -1], {0: "sum"})


def test_flash_attention_shards_batch_and_heads_not_sequence():
    q = T((2, 16, 8, 4), M22, [0, 1, -1, -1])
    k = T((2, 16, 8, 4), M22, [0, -1, 1, -1])
    r = fwd("flash_attention", [q, k, k], {"causal": True})
    assert dims(r.operands[0]) == ([0, -1, 1, -1], {})
    assert dims(r.results[0]) == ([0, -1, 1, -1], {})
    assert dims(r.results[2]) == ([0, 1, -1], {})  # softmax_lse [b, h, s]
    assert r.results[3].partial_dims == {}  # seed_offset is never partial


def test_context_parallel_attention_keeps_the_sequence_sharded():
    """With context_parallel > 1 the kernel exchanges K/V itself: q, k, v sharded on the
    sequence (mesh dim 0, the cp ranks) stay so, heads on mesh dim 1; out and softmax_lse
    come out sequence-sharded, nothing Partial. Without the attribute the same inputs are
    gathered on the sequence. The grad keeps dq, dk, dv sequence-sharded too."""
    q = T((2, 16, 8, 4), M22, [-1, 0, 1, -1])
    kv = T((2, 16, 4, 4), M22, [-1, 0, 1, -1])
    cp = {"causal": True, "context_parallel": 2, "cp_comm": "p2p", "cp_stride": 2}
    r = fwd("flash_attention", [q, kv, kv], cp)
    assert [dims(a) for a in r.operands] == [([-1, 0, 1, -1], {})] * 3
    assert dims(r.results[0]) == ([-1, 0, 1, -1], {})
    assert dims(r.results[2]) == ([-1, 1, 0], {})  # softmax_lse [b, h, s]
    plain = fwd("flash_attention", [q, kv, kv], {"causal": True})
    assert dims(plain.operands[0]) == ([-1, -1, 1, -1], {})
    g = fwd("flash_attention_grad", [q, kv, kv, q, T((2, 8, 16), M22, [-1, 1, 0]),
                                     T((2,), M22, [-1], dtype="int64"), q], cp)
    assert [dims(a) for a in g.results] == [([-1, 0, 1, -1], {})] * 3
    # an odd split of the sequence is not taken (2cp chunks must be equal)
    odd, odd_kv = T((2, 15, 8, 4), M22, [-1, 0, 1, -1]), T((2, 15, 4, 4), M22, [-1, 0, 1, -1])
    r = fwd("flash_attention", [odd, odd_kv, odd_kv], cp)
    assert dims(r.results[0]) == ([-1, -1, 1, -1], {})


def test_flash_attention_gqa_heads_must_divide():
    # 4 query heads, 2 kv heads on a mesh dim of 4: the kv heads cannot split -> replicated
    q, kv = T((2, 16, 4, 8), M4, [-1, -1, 0, -1]), T((2, 16, 2, 8), M4, [-1, -1, -1, -1])
    r = fwd("flash_attention", [q, kv, kv])
    assert dims(r.results[0]) == ([-1, -1, -1, -1], {})
    # a single kv head (MQA) stays replicated while the query heads split
    kv1 = T((2, 16, 1, 8), M4, [-1, -1, -1, -1])
    r = fwd("flash_attention", [q, kv1, kv1])
    assert dims(r.operands[1]) == ([-1, -1, -1, -1], {})
    assert dims(r.results[0]) == ([-1, -1, 0, -1], {})


def test_cross_entropy_keeps_the_class_dim_sharded():
    r = fwd("cross_entropy_with_softmax", [T((4, 8, 100), M22, [0, -1, 1]), T((4, 8, 1), M22, [0, -1, -1], dtype="int64")])
    assert dims(r.operands[0]) == ([0, -1, 1], {})
    assert dims(r.results[0]) == ([0, -1, 1], {})
    assert dims(r.results[1]) == ([0, -1, -1], {})  # loss: not partial (reduced in-kernel)


def test_norm_weight_grad_partial_over_sequence_parallel_dim():
    # case 8 at the rule level: x [b, s, h] with s sharded over tp, weight replicated
    g = fwd("rms_norm_grad", [T((4, 8, 16), M22, [0, 1, -1]), T((16,), M22, [-1]),
                              T((32,), M22, [0]), T((4, 8, 16), M22, [0, 1, -1])],
            {"begin_norm_axis": 2})
    assert dims(g.results[0]) == ([0, 1, -1], {})
    assert dims(g.results[1]) == ([-1], {0: "sum", 1: "sum"})


def test_optimizer_requires_reduced_grad():
    r = fwd("sgd_", [T((16, 8), M22, [0, -1]), T((), M22, []), T((16, 8), M22, [0, -1], {1: "sum"}), None])
    assert dims(r.operands[2]) == ([0, -1], {})
    assert dims(r.results[0]) == ([0, -1], {})
    assert r.operands[3] is None and r.results[1] is None


def test_reshard_is_identity_with_partial():
    r = fwd("reshard", [T((4, 8), M2, [-1, -1], {0: "sum"})])
    assert dims(r.results[0]) == ([-1, -1], {0: "sum"})


def test_infer_reverse_pushes_result_layout_to_operands():
    r = get_spmd_rule("relu").infer_reverse([T((4, 8), M2, [0, -1])], {}, [(4, 8)])
    assert dims(r.operands[0]) == ([0, -1], {})
    r = get_spmd_rule("matmul").infer_reverse([T((4, 8), M22, [0, 1])], {}, [(4, 16), (16, 8)])
    assert dims(r.operands[0]) == ([0, -1], {})
    assert dims(r.operands[1]) == ([-1, 1], {})


def test_rules_never_warn_for_declared_ops():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = fwd("gelu", [T((4, 8), M2, [0, -1])])
    # elementwise unary (x -> x): the row sharding passes through unchanged
    assert dims(r.operands[0]) == ([0, -1], {})
    assert dims(r.results[0]) == ([0, -1], {})
