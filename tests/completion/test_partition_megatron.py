"""Megatron layout on llama2-7b (2 layers), mesh [dp=2, tp=2]: the collectives the
partition and reshard passes emit match Megatron-LM's (Shoeybi et al. 2019, sec. 3;
Korthikanti et al. 2022 for sequence parallelism)."""

from __future__ import annotations

from collections import Counter

import pytest

from completion import apply_partition_pass, apply_reshard_pass, build_model
from completion.annotate import shard_megatron
from completion.backward import append_backward
from completion.completer import Completer
from completion.ir import OpRole
from completion.mesh import ProcessMesh
from completion.optimizer import apply_optimizer

LAYERS, DP, MP = 2, 0, 1


def _resolved(sequence_parallel: bool):
    p = build_model("llama2-7b", 4, num_layers=LAYERS)
    append_backward(p)
    apply_optimizer(p, "adamw")
    shard_megatron(p, ProcessMesh.of(2, 2, dim_names=("dp", "mp")), "dp", "mp",
                   sequence_parallel=sequence_parallel)
    Completer(p).complete()
    params = p.parameters()
    apply_partition_pass(p)
    apply_reshard_pass(p)
    return p, params


@pytest.fixture(scope="module")
def plain():
    return _resolved(False)


def _comm(p, role, kind, mesh_dim):
    return [op for op in p.ops if op.dialect == "dist_op" and op.role == role and op.type == kind
            and op.attrs.get("mesh_dim") == mesh_dim]


def _per_layer(ops):
    """Collectives counted by the decoder layer that produced their input."""
    c = Counter()
    for op in ops:
        sn = op.operands[0].op.struct_name
        c[int(sn.split(".")[2]) if sn.startswith("decoder.layers.") else sn] += 1
    return c


def test_forward_two_mp_all_reduces_per_layer(plain):
    p, _ = plain
    ar = _comm(p, OpRole.FORWARD, "all_reduce", MP)
    # + the vocab-parallel embedding's all_reduce (Megatron's VocabParallelEmbedding)
    assert _per_layer(ar) == {0: 2, 1: 2, "embed_tokens": 1}
    assert all(op.attrs["groups"] == [[0, 1], [2, 3]] for op in ar)
    # [4, 4096, 4096] bf16 activations, replicated over mp: 128 MiB / dp 2 = 64 MiB
    assert {op.attrs["nbytes"] for op in ar} == {2 * 4096 * 4096 * 2}
    assert not [op for op in p.ops if op.type in ("reduce_scatter", "all_gather", "all_to_all")
                and op.attrs.get("mesh_dim") == MP and op.role == OpRole.FORWARD]


def test_backward_two_mp_all_reduces_per_layer(plain):
    p, _ = plain
    ar = _comm(p, OpRole.BACKWARD, "all_reduce", MP)
    # + lm_head's input gradient (column-parallel over the vocabulary)
    assert _per_layer(ar) == {0: 2, 1: 2, "lm_head": 1}


def test_one_dp_gradient_all_reduce_per_parameter(plain):
    p, params = plain
    grads = _comm(p, OpRole.OPTIMIZE, "all_reduce", DP)
    assert len(grads) == len(params) == 9 * LAYERS + 3
    assert all(op.attrs["groups"] == [[0, 2], [1, 3]] for op in grads)
    # each feeds the optimizer op of a distinct parameter
    users = {u.operands[0].name for op in grads for u, _ in op.results[0].uses}
    assert users == {v.name for v in params}
    q = next(op for op in grads
             if op.results[0].uses[0][0].operands[0].name == "decoder.layers.0.self_attn.q_proj.weight")
    assert q.attrs["nbytes"] == 4096 * 2048 * 2  # column-split over mp, bf16


def test_sequence_parallel_turns_all_reduce_into_rs_ag_pairs():
    p, _ = _resolved(True)
    fwd = [op for op in p.ops if op.dialect == "dist_op" and op.role == OpRole.FORWARD
           and op.attrs.get("mesh_dim") == MP]
    kinds = Counter(op.type for op in fwd)
    assert "all_reduce" not in kinds
    rs = [op for op in fwd if op.type == "reduce_scatter"]
    ag = [op for op in fwd if op.type == "all_gather"]
    assert _per_layer(rs) == {0: 2, 1: 2, "embed_tokens": 1}
    assert len(ag) == len(rs) == 2 * LAYERS + 1
    # the scatter and the gather move the same sequence dim, same buffer size
    assert {op.attrs["dst_dim"] for op in rs} == {op.attrs["src_dim"] for op in ag} == {1}
    assert {op.attrs["nbytes"] for op in rs} == {op.attrs["nbytes"] for op in ag}
