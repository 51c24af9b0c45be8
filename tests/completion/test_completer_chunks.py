"""Pipeline chunk ids: VPP and ZBVPP placement, stage meshes, the layers outside decoder
layers (reference case 12) and the errors."""

from __future__ import annotations

import re

import pytest

from completion.annotate import shard_megatron
from completion.backward import append_backward
from completion.chunks import assign_chunks
from completion.completer import Completer, stage_meshes
from completion.errors import CompletionError
from completion.mesh import ProcessMesh
from completion.models import build_model
from completion.optimizer import apply_optimizer

LAYER = re.compile(r"layers\.(\d+)")


def program(layers: int):
    p = build_model("llama2-7b", 2, 32, num_layers=layers)
    append_backward(p)
    apply_optimizer(p, "adamw")
    return p


def layer_stages(p, completer):
    out: dict[int, set[tuple[int, int]]] = {}
    for op in p.ops:
        m = LAYER.search(op.struct_name)
        if m:
            out.setdefault(int(m.group(1)), set()).add((completer.stage_of(op), op.chunk_id))
    return out


@pytest.mark.parametrize("mode,stage0", [("VPP", {0, 1, 4, 5}), ("ZBVPP", {0, 1, 6, 7})])
def test_eight_layers_pp2_vpp2(mode, stage0):
    p = program(8)
    mesh = ProcessMesh.of(2, 2, dim_names=("dp", "mp"))
    shard_megatron(p, mesh, "dp", "mp")
    c = Completer(p, pp_degree=2, vpp_degree=2, schedule_mode=mode)
    c.complete()
    st = layer_stages(p, c)
    assert all(len(v) == 1 for v in st.values())  # forward and backward ops of a layer agree
    assert {k for k, v in st.items() if next(iter(v))[0] == 0} == stage0
    # chunk 0 holds the first layers of each stage, chunk 1 the later ones
    assert st[0] == {(0, 0)} and st[2] == {(1, 0)}
    assert st[7] == ({(1, 1)} if mode == "VPP" else {(0, 1)})
    # each stage runs on its own mesh: ranks 0-3 and 4-7
    meshes = {c.stage_of(op): op.dist_attr.process_mesh.process_ids for op in p.ops}
    assert meshes == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}
    # every value lives on its producer's stage mesh, with the producer's chunk id
    for op in p.ops:
        for r in op.results:
            if r is not None:
                assert r.dist_attr.process_mesh == op.dist_attr.process_mesh
                assert r.dist_attr.chunk_id == op.chunk_id


def test_case12_embedding_first_stage_norm_and_loss_last():
    p = program(8)
    plan = assign_chunks(p, 4, 1, "1F1B")
    stage = {op.struct_name: plan.stage[id(op)] for op in p.ops}
    assert stage["embed_tokens"] == 0
    assert stage["decoder.norm"] == stage["lm_head"] == stage["loss"] == 3
    emb_w = next(op for op in p.ops if op.type == "parameter" and op.struct_name == "embed_tokens")
    assert plan.stage[id(emb_w)] == 0
    for op in p.ops:
        if op.type == "adamw_":
            assert plan.stage[id(op)] == plan.stage[id(op.operands[0].op)]


def test_ten_layers_pp4_vpp2_is_rejected_naming_both_numbers():
    p = program(10)
    with pytest.raises(CompletionError, match=r"^10 layers .* = 8 segments"):
        Completer(p).complete_chunk_id(4, 2, "VPP")


def test_chunk_errors():
    p = program(2)
    with pytest.raises(CompletionError, match="needs schedule_mode VPP or ZBVPP"):
        assign_chunks(p, 2, 2, "1F1B")
    with pytest.raises(CompletionError, match="unknown schedule_mode"):
        assign_chunks(p, 2, 1, "GPipe-ish")
    with pytest.raises(CompletionError, match="matches no forward op"):
        assign_chunks(p, 2, 1, "1F1B", seg_method=r"blocks\.(\d+)")
    with pytest.raises(CompletionError, match="not a valid regex"):
        assign_chunks(p, 2, 1, "1F1B", seg_method="(")
    with pytest.raises(CompletionError, match="pp_degree"):
        assign_chunks(p, 0, 1, "1F1B")


def test_stage_meshes_from_a_pp_dim_and_by_offset():
    full = ProcessMesh.of(2, 2, 2, dim_names=("pp", "dp", "mp"))
    sm = stage_meshes(full, 2)
    assert [m.process_ids for m in sm] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert sm[1].dim_names == ("dp", "mp")
    off = stage_meshes(ProcessMesh.of(2), 3)
    assert [m.process_ids for m in off] == [(0, 1), (2, 3), (4, 5)]
    with pytest.raises(CompletionError, match="pp_degree is 4"):
        stage_meshes(full, 4)


def test_annotations_on_a_mesh_with_a_pp_dim_move_to_stage_meshes():
    p = program(4)
    full = ProcessMesh.of(2, 1, 2, dim_names=("pp", "dp", "mp"))
    shard_megatron(p, full, "dp", "mp")
    c = Completer(p, pp_degree=2)
    c.complete()
    w = p.value("decoder.layers.3.mlp.up_proj.weight")
    assert w.dist_attr.process_mesh.process_ids == (2, 3)
    assert list(w.dist_attr.dims_mapping) == [-1, 1]
