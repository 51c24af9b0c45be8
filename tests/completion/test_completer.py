"""The Completer: the seed golden, the Megatron MLP golden, reference case 8, the
annotation API, shard_megatron, ZeRO stages and error messages."""

from __future__ import annotations

import pytest

from completion.annotate import annotate, shard_megatron
from completion.backward import append_backward
from completion.completer import Completer
from completion.dist_attr import Partial, Replicate, Shard
from completion.errors import CompletionError, DistAttrError
from completion.ir import OpRole
from completion.mesh import ProcessMesh
from completion.models import build_model
from completion.models.builder import ProgramBuilder
from completion.optimizer import apply_optimizer
from completion.pir import parse_program, print_program

MESH22 = ProcessMesh.of(2, 2, dim_names=("dp", "mp"))


def attr(v):
    return list(v.dist_attr.dims_mapping), v.dist_attr.partial_dims


# -- seed goldens ----------------------------------------------------------------------------
def test_seed_golden_from_the_two_parameter_annotations(shared_dir):
    text = (shared_dir / "data/programs/mlp_sgd_before_partition.pir").read_text()
    p = parse_program(text)
    for op in p.ops:
        op.dist_attr = None
        for r in op.results:
            if r is not None and not r.is_parameter:
                r.dist_attr = None
    Completer(p).complete()
    assert print_program(p) == text


def test_seed_golden_from_the_file_without_dist_attrs(shared_dir):
    progs = shared_dir / "data/programs"
    p = parse_program((progs / "mlp_sgd_no_dist_attrs.pir").read_text())
    mesh = ProcessMesh.of(2)
    annotate(p, "parameter_0", mesh, [-1, 0])
    annotate(p, "parameter_1", mesh, placements=[Shard(0)])
    Completer(p).complete()
    assert print_program(p) == (progs / "mlp_sgd_before_partition.pir").read_text()


# -- Megatron MLP golden ----------------------------------------------------------------------
def megatron_mlp(b=4, s=8, h=16):
    pb = ProgramBuilder(dtype="float32")
    x = pb.data("x", [b, s, h], "float32")
    x.stop_gradient = False
    w1, w2 = pb.param("", "W1", [h, 4 * h]), pb.param("", "W2", [4 * h, h])
    y1 = pb.op1("matmul", [x, w1])
    y2 = pb.op1("matmul", [pb.op1("gelu", [y1]), w2])
    loss = pb.op1("mean", [y2], {"axis": [], "keepdim": False}, role=OpRole.LOSS)
    pb.op("shadow_output", [loss], {"output_name": "loss_0"}, role=OpRole.LOSS)
    append_backward(pb.program)
    return pb.program, y1, y2


def test_megatron_mlp_golden():
    p, y1, y2 = megatron_mlp()
    annotate(p, "x", MESH22, [0, -1, -1])
    annotate(p, "W1", MESH22, [-1, 1])
    annotate(p, "W2", MESH22, [1, -1])
    Completer(p).complete()
    assert attr(y1) == ([0, -1, 1], {})
    assert attr(y2) == ([0, -1, -1], {1: "sum"})
    assert attr(p.value("W1@GRAD")) == ([-1, 1], {0: "sum"})
    assert attr(p.value("W2@GRAD")) == ([1, -1], {0: "sum"})
    assert attr(p.value("x@GRAD")) == ([0, -1, -1], {1: "sum"})
    # the mean needs its input reduced over mp first: operand attr differs from the value
    mean = next(op for op in p.ops if op.type == "mean")
    assert mean.dist_attr.operands[0].partial_dims == {}
    assert mean.dist_attr.results[0].partial_dims == {0: "avg"}


# -- reference case 8 --------------------------------------------------------------------------
@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
def test_case8_sequence_parallel_norm_weight_grad_is_partial_over_tp(norm):
    pb = ProgramBuilder(dtype="float32")
    x = pb.data("x", [4, 8, 16], "float32")
    w = pb.param("norm", "weight", [16])
    operands = [x, w] if norm == "rms_norm" else [x, w, pb.param("norm", "bias", [16])]
    y = pb.op1(norm, operands, {"begin_norm_axis": 2})
    z = pb.op1("matmul", [y, pb.param("proj", "weight", [16, 32])])
    loss = pb.op1("mean", [z], {"axis": [], "keepdim": False}, role=OpRole.LOSS)
    pb.op("shadow_output", [loss], {"output_name": "loss_0"}, role=OpRole.LOSS)
    p = pb.program
    append_backward(p)
    apply_optimizer(p, "sgd")
    mesh = ProcessMesh.of(1, 2, dim_names=("dp", "tp"))
    annotate(p, "x", mesh, [-1, 1, -1])  # sequence dim over tp
    annotate(p, "norm.weight", mesh, [-1])
    annotate(p, "proj.weight", mesh)
    Completer(p).complete()
    assert attr(y) == ([-1, 1, -1], {})
    assert attr(p.value("norm.weight@GRAD")) == ([-1], {1: "sum"})
    # and the optimizer needs it all-reduced
    sgd = next(op for op in p.ops if op.type == "sgd_" and op.operands[0].name == "norm.weight")
    assert sgd.dist_attr.operands[2].partial_dims == {}


# -- annotation API ------------------------------------------------------------------------
def test_annotate_forms_and_errors():
    p, _, _ = megatron_mlp()
    a = annotate(p, "x", MESH22, placements=[Partial("sum"), Shard(1)])
    assert a.dims_mapping == (-1, 1, -1) and a.partial_dims == {0: "sum"}
    with pytest.raises(DistAttrError, match="W1.*a parameter cannot be Partial"):  # issue 43
        annotate(p, "W1", MESH22, placements=[Partial("sum"), Shard(1)])
    assert annotate(p, "W1", MESH22, placements=[Replicate(), Shard(1)]).dims_mapping == (-1, 1)
    assert annotate(p, "W2", MESH22).dims_mapping == (-1, -1)
    assert annotate(p, "x", MESH22, [0, -1, -1], [Shard(0), Replicate()]).dims_mapping == (0, -1, -1)
    with pytest.raises(DistAttrError, match="W1.*disagrees"):
        annotate(p, "W1", MESH22, [0, -1], [Replicate(), Shard(1)])
    with pytest.raises(DistAttrError, match="W1.*mesh dim 2"):
        annotate(p, "W1", MESH22, [2, -1])
    with pytest.raises(DistAttrError, match="x.*rank 3"):
        annotate(p, "x", MESH22, [0, -1])
    with pytest.raises(CompletionError, match="nope"):
        annotate(p, "nope", MESH22)


def test_no_annotation_is_a_clear_error():
    p, _, _ = megatron_mlp()
    with pytest.raises(CompletionError, match="no value is annotated"):
        Completer(p).complete()


def test_non_convergence_names_the_values(shared_dir):
    p = parse_program((shared_dir / "data/programs/mlp_sgd_no_dist_attrs.pir").read_text())
    annotate(p, "parameter_0", ProcessMesh.of(2), [-1, 0])
    with pytest.raises(CompletionError, match=r"fixed point after 1 sweeps; values still changing: %"):
        Completer(p, max_sweeps=1).complete()


def test_annotations_survive_and_reshards_show_in_operands():
    p, y1, _ = megatron_mlp()
    annotate(p, "x", MESH22, [-1, 1, -1])  # sequence sharded on mp, W1 column-parallel on mp
    annotate(p, "W1", MESH22, [-1, 1])
    annotate(p, "W2", MESH22, [1, -1])
    Completer(p).complete()
    assert attr(p.value("x")) == ([-1, 1, -1], {})
    mm = y1.op
    assert list(mm.dist_attr.operands[0].dims_mapping) == [-1, -1, -1]  # all_gather before
    assert attr(y1) == ([-1, -1, 1], {})


def test_unknown_op_completes_replicated_with_a_warning():
    pb = ProgramBuilder(dtype="float32")
    x = pb.data("x", [4, 8], "float32")
    y = pb.op1("opaque", [x], {"source_op": "aten.weird", "out_shapes": [[4, 8]], "out_dtypes": ["float32"]})
    p = pb.program
    annotate(p, "x", ProcessMesh.of(2), [0, -1])
    with pytest.warns(UserWarning, match="opaque"):
        Completer(p).complete()
    assert attr(y) == ([-1, -1], {})


# -- shard_megatron and ZeRO ------------------------------------------------------------------
def llama(layers=1, optimizer="adamw"):
    p = build_model("llama2-7b", 4, 64, num_layers=layers)
    append_backward(p)
    apply_optimizer(p, optimizer)
    return p


def test_shard_megatron_layout_and_completion():
    p = llama()
    shard_megatron(p, MESH22, "dp", "mp")
    Completer(p).complete()
    assert attr(p.value("decoder.layers.0.self_attn.q_proj.weight")) == ([-1, 1], {})
    assert attr(p.value("decoder.layers.0.mlp.down_proj.weight")) == ([1, -1], {})
    assert attr(p.value("embed_tokens.weight")) == ([1, -1], {})
    assert attr(p.value("input_ids")) == ([0, -1], {})
    assert attr(p.value("rotary_emb.sin")) == ([-1, -1, -1, -1], {})
    emb = next(op for op in p.ops if op.type == "embedding")
    assert attr(emb.results[0]) == ([0, -1, -1], {1: "sum"})  # vocab-parallel
    fa = next(op for op in p.ops if op.type == "flash_attention")
    assert attr(fa.results[0]) == ([0, -1, 1, -1], {})  # heads on mp
    ce = next(op for op in p.ops if op.type == "cross_entropy_with_softmax")
    assert list(ce.dist_attr.operands[0].dims_mapping) == [0, -1, 1]  # vocab-parallel loss
    assert attr(p.value("decoder.layers.0.self_attn.q_proj.weight@GRAD")) == ([-1, 1], {0: "sum"})


def test_shard_megatron_sequence_parallel_uses_reduce_scatter_layout():
    p = build_model("gpt3-175b", 2, 64, num_layers=1)
    append_backward(p)
    shard_megatron(p, MESH22, 0, 1, sequence_parallel=True)
    Completer(p).complete()
    o_bias = next(op for op in p.ops if op.type == "add" and op.struct_name.endswith("o_proj"))
    # the row-parallel output (Partial over mp) is required sequence-sharded: reduce_scatter
    assert o_bias.operands[0].dist_attr.partial_dims == {1: "sum"}
    assert list(o_bias.dist_attr.operands[0].dims_mapping) == [0, 1, -1]
    q = next(op for op in p.ops if op.type == "matmul" and op.struct_name.endswith("q_proj"))
    assert list(q.dist_attr.operands[0].dims_mapping) == [0, -1, -1]  # all_gather first
    assert attr(p.value("decoder.layers.0.input_layernorm.weight@GRAD"))[1] == {0: "sum", 1: "sum"}


def test_shard_megatron_errors():
    p = llama()
    with pytest.raises(DistAttrError, match="both mesh dim 0"):
        shard_megatron(p, MESH22, 0, "dp")
    with pytest.raises(DistAttrError, match="no dim named 'tp'"):
        shard_megatron(p, MESH22, "dp", "tp")


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_stages(stage):
    p = llama()
    shard_megatron(p, MESH22, "dp", "mp")
    Completer(p, zero_stage=stage).complete()
    op = next(o for o in p.ops if o.type == "adamw_" and o.operands[0].name.endswith("q_proj.weight"))
    names = ["param", "grad", "learning_rate", "moment1", "moment2"]
    got = {n: list(op.dist_attr.operands[i].dims_mapping) for i, n in enumerate(names)}
    sharded, plain = [0, 1], [-1, 1]
    assert got["moment1"] == got["moment2"] == (sharded if stage >= 1 else plain)
    assert got["grad"] == (sharded if stage >= 2 else plain)
    assert got["param"] == (sharded if stage >= 3 else plain)
    assert list(op.operands[3].dist_attr.dims_mapping) == (sharded if stage >= 1 else plain)
    assert list(op.dist_attr.results[1].dims_mapping) == (sharded if stage >= 1 else plain)
    # annotated parameters are never changed, even at stage 3
    assert list(op.operands[0].dist_attr.dims_mapping) == plain
    with pytest.raises(CompletionError, match="zero_stage"):
        Completer(llama_annotated(), zero_stage=4).complete()


def llama_annotated():
    p = llama()
    shard_megatron(p, MESH22, "dp", "mp")
    return p


def test_zero3_shards_an_unannotated_parameter_value():
    p = llama()
    annotate(p, "input_ids", MESH22, [0, -1])
    Completer(p, zero_stage=3).complete()
    w = p.value("decoder.layers.0.mlp.up_proj.weight")
    assert list(w.dist_attr.dims_mapping) == [0, -1]
    mm = next(op for op in p.ops if op.type == "matmul" and op.operands[1] is w)
    assert list(mm.dist_attr.operands[1].dims_mapping) == [-1, -1]  # all_gather before use


def test_optimizer_state_follows_its_parameter_and_beta_powers_stay_replicated():
    """adamw_: param_out / moment outs take the parameter's layout, the gradient operand is
    required reduced (no Partial), and the beta-power results (shape [1], independent of the
    sharded parameter) are replicated, never Partial."""
    p = llama()
    shard_megatron(p, MESH22, "dp", "mp")
    Completer(p).complete()
    opt = [op for op in p.ops if op.type == "adamw_"]
    assert opt
    for op in opt:
        param_attr = op.dist_attr.operands[0]
        assert not op.dist_attr.operands[1].partial  # gradient reduced before the update
        for k in (0, 1, 2):  # param_out, moment1_out, moment2_out
            assert op.dist_attr.results[k].dims_mapping == param_attr.dims_mapping
            assert not op.dist_attr.results[k].partial
        for k in (3, 4):  # beta1_pow_out, beta2_pow_out
            assert op.dist_attr.results[k].dims_mapping == (-1,)
            assert not op.dist_attr.results[k].partial
