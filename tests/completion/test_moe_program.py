"""Mixture-of-experts programs (issue 21, part B): the ops' semantics against a numpy
reference, FLOPs per token against the active parameters, and completion + partition under
dp x tp (expert weights column- then row-parallel, the collectives' bytes by hand)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from completion.models import MODEL_CATALOG, build_model, config_from_hf_dict
from completion.models.source import resolve_model
from completion.ops.moe import capacity
from completion.plan_program import build_plan_program
from completion.strategy import Strategy
from executor.kernels import get_kernel
from executor.kernels.base import KernelContext
from simulator.op_cost import op_cost
from simulator.op_signature import op_signature

#: a tiny Qwen2-MoE: 2 layers, h 64, 4 heads (2 kv), 4 experts of 32, top-2, a gated
#: shared expert of 64, aux loss 0.01
TINY = {"model_type": "qwen2_moe", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 64,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64, "router_aux_loss_coef": 0.01}


# -- op semantics against a loop reference --------------------------------------------------
def reference_dispatch_combine(x, idx, w, y_of, e, cap):
    """numpy loops: (dispatched [E, b*C, h], combined [b, s, h]) with ``y_of`` applied to
    each expert's rows (completion.ops.moe docstring: token-major slot order, drops)."""
    b, s, h = x.shape
    k = idx.shape[2]
    out = np.zeros((e, b * cap, h))
    where = {}
    for i in range(b):
        fill = [0] * e
        for t in range(s):
            for j in range(k):
                ex = idx[i, t, j]
                if fill[ex] < cap:
                    out[ex, i * cap + fill[ex]] = x[i, t]
                    where[(i, t, j)] = (ex, i * cap + fill[ex])
                fill[ex] += 1
    y = y_of(out)
    comb = np.zeros((b, s, h))
    for (i, t, j), (ex, r) in where.items():
        comb[i, t] += w[i, t, j] * y[ex, r]
    return out, comb


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 3), s=st.integers(1, 7), e=st.integers(1, 5), k=st.integers(1, 3),
       factor=st.sampled_from([0.5, 1.0, 1.5]), seed=st.integers(0, 2**16))
def test_dispatch_and_combine_match_the_loop_reference(b, s, e, k, factor, seed):
    k = min(k, e)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, s, 3))
    idx = rng.integers(0, e, (b, s, k))
    w = rng.standard_normal((b, s, k))
    cap = capacity(s, k, e, factor)
    assert cap == max(1, math.ceil(factor * s * k / e))
    attrs = {"num_experts": e, "capacity_factor": factor}
    ctx = KernelContext()
    (xe,) = get_kernel("moe_dispatch")([torch.tensor(x), torch.tensor(idx)], attrs, ctx)
    ye = xe * 2.0 + 1.0  # any per-row expert function
    (comb,) = get_kernel("moe_combine")([ye, torch.tensor(w), torch.tensor(idx)], attrs, ctx)
    want_xe, want_comb = reference_dispatch_combine(x, idx, w, lambda r: r * 2.0 + 1.0, e, cap)
    np.testing.assert_allclose(xe.numpy(), want_xe, atol=1e-12)
    # empty slots hold zeros, whose expert output (1.0) no pair reads
    np.testing.assert_allclose(comb.numpy(), want_comb, atol=1e-12)


def test_topk_renormalises_and_aux_loss_by_hand():
    """Two tokens, 3 experts, top-2. probs t0 = (0.5, 0.3, 0.2) -> experts (0, 1), weights
    (0.625, 0.375) renormalised; t1 = (0.1, 0.2, 0.7) -> (2, 1), (0.7/0.9, 0.2/0.9).
    f = counts / tokens = (1, 2, 1) / 2; P = mean probs = (0.3, 0.25, 0.45);
    aux = coef * E * sum f P = 0.1 * 3 * (0.15 + 0.25 + 0.225) = 0.1875;
    d aux / d probs[t, e] = coef * E * f_e / tokens = 0.15 * f = (0.075, 0.15, 0.075)."""
    p = torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.2, 0.7]]], dtype=torch.float64)
    w, idx = get_kernel("moe_topk")([p], {"k": 2, "normalize": True}, KernelContext())
    assert idx.tolist() == [[[0, 1], [2, 1]]]
    torch.testing.assert_close(w, torch.tensor([[[0.625, 0.375], [0.7 / 0.9, 0.2 / 0.9]]], dtype=torch.float64))
    x = torch.randn(1, 2, 4, dtype=torch.float64)
    out, loss = get_kernel("moe_aux_loss")([x, p, idx], {"coef": 0.1}, KernelContext())
    assert out is x and math.isclose(float(loss), 0.1875, rel_tol=1e-12)
    g = torch.randn(1, 2, 4, dtype=torch.float64)
    dx, dp, di = get_kernel("moe_aux_loss_grad")([p, idx, g], {"coef": 0.1}, KernelContext())
    assert dx is g and di is None
    torch.testing.assert_close(dp, torch.tensor([[[0.075, 0.15, 0.075]] * 2], dtype=torch.float64))
    # the injected gradient is the autograd of the aux loss itself (indices fixed)
    pr = p.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(get_kernel("moe_aux_loss")([x, pr, idx], {"coef": 0.1}, KernelContext())[1], pr)
    torch.testing.assert_close(dp, auto)


# -- FLOPs per token ------------------------------------------------------------------------
def _mlp_gemm_flops(prog) -> float:
    return sum(k.flops for op in prog.ops if ".mlp" in op.struct_name and op.type == "matmul"
               for k in op_cost(op_signature(op)))


def test_mixtral_forward_flops_per_token_are_the_active_parameters():
    """Mixtral-8x7B, one layer, s = 64 (C = 64 * 2 / 8 = 16 slots per expert: every routed
    token computed once per choice): MLP GEMM FLOPs per token = 2 * (router 4096*8 + top-2 *
    3 * 4096*14336) = 2 * 352,354,304 = 704,708,608; the 6 experts a token skips cost nothing."""
    prog = build_model(MODEL_CATALOG["mixtral-8x7b"], 2, seq_len=64, num_layers=1)
    assert _mlp_gemm_flops(prog) / (2 * 64) == 2 * (4096 * 8 + 2 * 3 * 4096 * 14336) == 704_708_608


def test_qwen2_moe_flops_per_token_with_shared_expert():
    """Qwen1.5-MoE-A2.7B layer, s = 30 (C = 30 * 4 / 60 = 2): 2 * (router 2048*60 + 4 * 3 *
    2048*1408 + shared 3 * 2048*5632 + gate 2048) = 2 * 69,330,944 = 138,661,888."""
    cfg = config_from_hf_dict(json.loads(open("tests/data/hf_configs/qwen1.5-moe-a2.7b.json").read()))
    prog = build_model(cfg, 1, seq_len=30, num_layers=1)
    want = 2 * (2048 * 60 + 4 * 3 * 2048 * 1408 + 3 * 2048 * 5632 + 2048)
    assert _mlp_gemm_flops(prog) / 30 == want == 138_661_888


def test_grouped_gemm_is_costed_per_expert_shape():
    """The expert GEMM x [E, T, h] @ W [E, h, f] is E GEMMs of T rows: gemm_shape
    (E, T, f, h) for the forward, (E, h, f, T) for the weight gradient (roofline tiles)."""
    prog = build_model(MODEL_CATALOG["mixtral-8x7b"], 1, seq_len=64, num_layers=1)
    from completion import append_backward
    append_backward(prog)
    fwd = next(op for op in prog.ops if op.struct_name.endswith("experts.gate_proj") and op.type == "matmul")
    grad = next(op for op in prog.ops if op.struct_name.endswith("experts.gate_proj") and op.type == "matmul_grad")
    assert [k.gemm_shape for k in op_cost(op_signature(fwd))] == [(8, 16, 14336, 4096)]
    assert sorted(k.gemm_shape for k in op_cost(op_signature(grad))) == sorted(
        [(8, 16, 4096, 14336), (8, 4096, 14336, 16)])


# -- completion and partition ---------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("moe") / "config.json"
    p.write_text(json.dumps(TINY))
    return str(p)


def _plan(path, **kw):
    return build_plan_program(resolve_model(path, 32), Strategy(micro_batch_size=1, global_batch_size=4, **kw))


def test_dp_tp_partition_shards_experts_like_a_dense_mlp(tiny_path):
    """dp 2 x tp 2 (mesh [[0, 1], [2, 3]]), b = 2, s = 32, C = 32 * 2 / 4 = 16:
    expert gate/up [4, 64, 32] split on f (local [4, 64, 16]), down [4, 32, 64] on f; the
    dispatched tokens [4, 32, 64] split on the token dim over dp (local [4, 16, 64]); one
    forward all_reduce of the expert outputs over tp: 4 * 16 * 64 * 2 bytes = 8,192, and one
    in backward on the dispatched tokens' gradient (same bytes); no collective on dp in
    the layer (each rank routes its own sequences to its copy of every expert)."""
    prog = _plan(tiny_path, dp=2, tp=2).program
    vals = {v.name: v for v in prog.values() if v.name}
    st_ = "decoder.layers.0.mlp.experts"
    assert vals[f"{st_}.gate_proj.weight"].dist_attr.dims_mapping == (-1, -1, 1)
    assert vals[f"{st_}.down_proj.weight"].dist_attr.dims_mapping == (-1, 1, -1)
    assert vals["decoder.layers.0.mlp.gate.weight"].dist_attr.dims_mapping == (-1, -1)
    disp = next(op for op in prog.ops if op.type == "moe_dispatch" and op.struct_name == st_)
    assert disp.results[0].dist_attr.dims_mapping == (-1, 0, -1)
    assert op_signature(disp, rank=0).outs[0].shape == (4, 16, 64)
    up = next(op for op in prog.ops if op.type == "matmul" and op.struct_name == f"{st_}.up_proj")
    assert [t.shape for t in op_signature(up, rank=3).ins] == [(4, 16, 64), (4, 64, 16)]
    coll = [(op.type, op.role.name, op.attrs["nbytes"], op.attrs["mesh_dim"]) for op in prog.ops
            if op.struct_name.startswith("decoder.layers.0.mlp.experts")
            and op.type in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")]
    assert coll == [("all_reduce", "FORWARD", 8192, 1), ("all_reduce", "BACKWARD", 8192, 1)]
    grads = {op.results[1].name: op.results[1].dist_attr for op in prog.ops
             if op.type == "matmul_grad" and op.struct_name.startswith(st_) and op.results[1] is not None}
    # weight gradients: Partial(sum) over dp (the data-parallel gradient reduction)
    assert all(dict(a.partial) == {0: "sum"} for a in grads.values()) and len(grads) == 3


@pytest.mark.parametrize("kw", [dict(dp=4), dict(dp=1, tp=2), dict(dp=2, tp=2, sequence_parallel=True),
                                dict(dp=1, tp=2, pp=2)])
def test_moe_plans_complete_without_fallback_rules(tiny_path, kw, recwarn):
    gb = 8 if kw.get("pp", 1) > 1 else 4
    pp = build_plan_program(resolve_model(tiny_path, 32), Strategy(micro_batch_size=1, global_batch_size=gb, **kw))
    assert not [w for w in recwarn if "no SPMD rule" in str(w.message)]
    types = {op.type for op in pp.program.ops}
    assert {"moe_topk", "moe_dispatch", "moe_combine", "moe_aux_loss", "moe_dispatch_grad",
            "moe_combine_grad", "moe_topk_grad", "moe_aux_loss_grad"} <= types
    # the optimizer updates every expert weight
    updated = {op.operands[0].name for op in pp.program.ops if op.role.name == "OPTIMIZE" and op.operands
               and op.operands[0] is not None and op.operands[0].name}
    experts = {v.name for v in pp.program.parameters() if ".experts." in (v.name or "")}
    assert experts and experts <= updated


# -- expert parallelism through per-value annotations (issue 21 D, partial) -----------------
def _ep_annotation(layers: int) -> dict:
    """Every expert weight split on its expert dim over the dp mesh dim (ep = dp = 2)."""
    ann = {f"decoder.layers.{i}.mlp.experts.{w}.weight": ["Shard(0)", "Replicate()"]
           for i in range(layers) for w in ("gate_proj", "up_proj", "down_proj")}
    return ann | {"input_ids": ["Shard(0)", "Replicate()"], "labels": ["Shard(0)", "Replicate()"]}


def test_expert_parallel_annotation_dispatches_and_combines_by_all_to_all(tiny_path):
    """Experts split over dp = 2 (2 experts a rank). Per layer and micro-batch each rank's
    expert-major tokens are [E 4, C 16 x its 1 sequence, h 64] bf16 = 4 * 16 * 64 * 2 = 8,192
    bytes: the dispatch all_to_all (Shard(1) -> Shard(0)) and the combine all_to_all back,
    and their two transposes in backward, all on the dp group [0, 1]; no other collective in
    the MoE block, and the expert weight gradients are not Partial (each expert lives on one
    rank: no data-parallel reduction). Per step (2 layers, gbs 4 / (dp 2 x mbs 1) = 2
    micro-batches): 2 * 2 * 4 * 8,192 = 131,072 all_to_all bytes a rank, and the cost model
    charges a layer's forward and its backward twice the cluster's all_to_all of 8,192 bytes
    on [0, 1] each. (Only the program is expert-parallel here: no Strategy field yet, and
    the step's gradient sync still counts the expert gradients over dp.)"""
    from clusters import load_cluster
    from simulator.roofline import Roofline
    from simulator.stage_cost import StageCoster

    pp = build_plan_program(resolve_model(tiny_path, 32),
                            Strategy(dp=2, micro_batch_size=1, global_batch_size=4, annotation=_ep_annotation(2)))
    prog = pp.program
    a2a = [(op.role.name, op.attrs["nbytes"], op.attrs["groups"]) for op in prog.ops if op.type == "all_to_all"]
    assert a2a == [("FORWARD", 8192, [[0, 1]])] * 4 + [("BACKWARD", 8192, [[0, 1]])] * 4
    others = [op.type for op in prog.ops if op.struct_name.startswith("decoder.layers.0.mlp")
              and op.type in ("all_reduce", "all_gather", "reduce_scatter")]
    assert others == []
    assert sum(n for _, n, _ in a2a) * pp.num_microbatches == 131_072
    grads = [op.results[1].dist_attr for op in prog.ops if op.type == "matmul_grad"
             and ".experts." in op.struct_name]
    assert len(grads) == 6 and all(g.dims_mapping[0] == 0 and not g.partial for g in grads)
    cl = load_cluster("dgx-h100", 1)
    cost = build_plan_program(resolve_model(tiny_path, 32), Strategy(
        dp=2, micro_batch_size=1, global_batch_size=4, annotation=_ep_annotation(2)),
        representative=True, resolve_reshards=False)
    layer = StageCoster(cost.program, cl, Roofline.from_device(cl.device), rank=0).block_costs()
    first = layer[0]  # decoder layer 0 (block keys: "pre", layer indices, "post")
    one = cl.collective_time("all_to_all", 8192, [0, 1])
    assert first.comm["F"] == pytest.approx(2 * one, rel=1e-9) and first.comm_count["F"] == 2
    assert first.comm["B"] == pytest.approx(2 * one, rel=1e-9) and first.comm_count["B"] == 2
