"""Context parallelism (issue 17 item 2): the cp knob, load balancing, the folded plan
program, attention FLOPs over all keys, and the ring's bytes and exposed time against
values derived by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusters import load_cluster
from completion.context_parallel import (
    ContextParallelError,
    cp_group,
    rank_positions,
    zigzag_order,
)
from completion.models.config import ModelConfig
from completion.models.source import resolve_model
from completion.plan_program import build_plan_program, single_process_strategy
from completion.strategy import MAX_DEGREE, Strategy, StrategyError
from meshplan.engine import Engine
from simulator.context_parallel import (
    all_gather_time,
    cp_workspace_bytes,
    kv_block_bytes,
    ring_exposed_time,
    ring_volume,
)
from simulator.op_cost import op_cost
from simulator.op_signature import op_signature

#: a small Llama: 4 query heads of 16, 2 kv heads (GQA), 2 layers, 64-token sequences
TINY = ModelConfig(name="tiny-llama", family="llama", num_layers=2, hidden_size=64, num_heads=4,
                   num_kv_heads=2, ffn_hidden_size=128, vocab_size=256, seq_len=64)


def _attention_ops(pp, kind="flash_attention"):
    return [op for op in pp.program.ops if op.type == kind]


# -- the knob ------------------------------------------------------------------------------


def test_strategy_cp_fields():
    s = Strategy(dp=2, cp=4, tp=2, pp=2, micro_batch_size=1, global_batch_size=2)
    assert s.world_size == 2 * 4 * 2 * 2 and s.cp_comm == "p2p"
    assert s.num_microbatches == 1  # the cp ranks of a replica share its sequences
    assert Strategy.from_dict(s.to_dict()) == s
    with pytest.raises(StrategyError, match="'cp'"):
        Strategy(cp=0)
    with pytest.raises(StrategyError, match="'cp_comm'"):
        Strategy(cp=2, cp_comm="a2a")
    with pytest.raises(StrategyError, match="'cp' = 2 needs the fused"):
        Strategy(cp=2, attention="unfused")
    with pytest.raises(StrategyError, match="MAX_VALUES"):
        Strategy(cp=MAX_DEGREE + 1)
    with pytest.raises(StrategyError, match="'dp' x 'cp' x 'tp' x 'pp'"):
        Strategy(cp=2**10, dp=2**11)


# -- load balancing ------------------------------------------------------------------------


def test_rank_positions_by_hand():
    # 16 tokens, cp 2: 4 chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert rank_positions(16, 2, 0) == [0, 1, 2, 3, 12, 13, 14, 15]
    assert rank_positions(16, 2, 1) == [4, 5, 6, 7, 8, 9, 10, 11]
    with pytest.raises(ContextParallelError, match="multiple of 2 \\* cp = 8"):
        rank_positions(12, 4, 0)


@settings(max_examples=60, deadline=None)
@given(cp=st.integers(1, 8), chunk=st.integers(1, 16))
def test_zigzag_is_a_balanced_permutation(cp, chunk):
    """Every position once, and every rank the same number of causal (query, key) pairs:
    sum over its positions p of (p + 1) = S(S+1)/(2cp)."""
    seq = 2 * cp * chunk
    assert sorted(zigzag_order(seq, cp)) == list(range(seq))
    pairs = [sum(p + 1 for p in rank_positions(seq, cp, c)) for c in range(cp)]
    assert pairs == [seq * (seq + 1) // (2 * cp)] * cp


def test_cp_group_megatron_order():
    # tp 2, cp 2, dp 2: rank = (d * cp + c) * tp + t
    assert cp_group(0, 2, 2) == (0, 2) and cp_group(3, 2, 2) == (1, 3)
    assert cp_group(5, 2, 2) == (5, 7) and cp_group(6, 2, 2) == (4, 6)


# -- the plan program --------------------------------------------------------------------


def test_folded_plan_program():
    """cp 2 x dp 2 x tp 2: the program of 4 data-parallel replicas of 32-token sequences
    (mesh [dp*cp, tp], ranks (d*cp + c)*tp + t), attention marked with the ring."""
    s = Strategy(dp=2, cp=2, tp=2, micro_batch_size=1, global_batch_size=2, attention="flash")
    pp = build_plan_program(resolve_model(TINY), s)
    assert pp.context_parallel == 2 and pp.world_size == 8
    assert (pp.strategy.dp, pp.strategy.cp, pp.strategy.global_batch_size) == (4, 1, 4)
    assert pp.num_microbatches == s.num_microbatches == 1
    ops = _attention_ops(pp) + _attention_ops(pp, "flash_attention_grad")
    assert len(ops) == 4
    for op in ops:
        assert (op.attrs["context_parallel"], op.attrs["cp_comm"], op.attrs["cp_stride"]) == (2, "p2p", 2)
        q = op.operands[0]
        assert tuple(q.shape) == (4, 32, 4, 16)
        assert q.dist_attr.process_mesh.shape == (4, 2)
    ref = single_process_strategy(s, resolve_model(TINY))
    assert (ref.cp, ref.dp, ref.micro_batch_size) == (1, 1, 2)


def test_cp_plan_refusals():
    with pytest.raises(ContextParallelError, match="seq_len 64 must be a multiple of 2 \\* cp = 128"):
        build_plan_program(resolve_model(TINY), Strategy(cp=64, attention="flash"))


# -- cost --------------------------------------------------------------------------------


def test_attention_flops_over_all_keys():
    """The rank's 32 queries attend to all 64 keys: model FLOPs 4 * b * hq * 32 * 64 * d,
    half of the whole sequence's; executed ones the load-balanced causal share
    (S+1)/(2S) = 65/128."""
    s = Strategy(cp=2, micro_batch_size=1, global_batch_size=1, attention="flash")
    pp = build_plan_program(resolve_model(TINY), s, representative=True, resolve_reshards=False)
    op = _attention_ops(pp)[0]
    (k,) = op_cost(op_signature(op, 0))
    assert k.flops == 4 * 1 * 4 * 32 * 64 * 16
    assert k.exec_flops == pytest.approx(k.flops * 65 / 128)
    (g,) = op_cost(op_signature(_attention_ops(pp, "flash_attention_grad")[0], 0))
    assert g.flops == 2 * k.flops and g.exec_flops == pytest.approx(2.5 * k.exec_flops)


def _llama8b_attention(cp: int, comm: str = "p2p", tp: int = 1):
    cfg = ModelConfig(name="l8b", family="llama", num_layers=3, hidden_size=4096, num_heads=32,
                      num_kv_heads=8, ffn_hidden_size=14336, vocab_size=128256, seq_len=8192)
    s = Strategy(dp=1, cp=cp, tp=tp, micro_batch_size=1, global_batch_size=1, cp_comm=comm,
                 attention="flash")
    pp = build_plan_program(resolve_model(cfg), s, representative=True, resolve_reshards=False)
    return [op_signature(op, 0) for op in _attention_ops(pp) + _attention_ops(pp, "flash_attention_grad")][::3]


def test_ring_volume_by_hand():
    """Llama-3.1-8B, s 8192, cp 2, bf16: one K/V block is 2 * b * (s/cp) * kv_heads *
    head_dim * 2 bytes = 2 * 1 * 4096 * 8 * 128 * 2 = 16 MiB; forward sends (cp - 1) blocks,
    backward twice that; cp 4: 3 blocks of 8 MiB forward."""
    fwd, bwd = _llama8b_attention(2)
    assert kv_block_bytes(fwd) == 2 * 1 * 4096 * 8 * 128 * 2 == 16 * 2**20
    assert ring_volume(fwd) == 16 * 2**20 and ring_volume(bwd) == 32 * 2**20
    fwd4, bwd4 = _llama8b_attention(4)
    assert ring_volume(fwd4) == 3 * 8 * 2**20 and ring_volume(bwd4) == 6 * 8 * 2**20


def test_ring_exposed_time_by_hand():
    """Exposed = (cp - 1) * max(0, t_send - t_attention / cp): with a slow attention the
    sends hide; with a fast one the difference shows. Across nodes (tp 8, cp 2 on two DGX
    H100) the slower NIC edge bounds the ring."""
    cl = load_cluster("dgx-h100", 2)
    fwd, bwd = _llama8b_attention(2)
    t_send = cl.p2p_time(16 * 2**20, 0, 1)  # = alpha_intra + 16 MiB / NVLink
    assert ring_exposed_time(fwd, 1.0, cl, 0) == (0.0, t_send)
    assert ring_exposed_time(fwd, 0.0, cl, 0) == (pytest.approx(t_send), pytest.approx(t_send))
    t_attn = t_send  # half of it per step: half of the send stays exposed
    assert ring_exposed_time(fwd, t_attn, cl, 0)[0] == pytest.approx(t_send / 2)
    t_b = cl.p2p_time(32 * 2**20, 0, 1)
    assert ring_exposed_time(bwd, 0.0, cl, 0)[0] == pytest.approx(t_b)
    f8, _ = _llama8b_attention(2, tp=8)
    assert ring_exposed_time(f8, 0.0, cl, 0)[0] == pytest.approx(cl.p2p_time(kv_block_bytes(f8), 0, 8))


def test_all_gather_variant_by_hand():
    cl = load_cluster("dgx-h100", 1)
    fwd, bwd = _llama8b_attention(4, "all_gather")
    full = 4 * kv_block_bytes(fwd)
    group = [0, 1, 2, 3]
    assert all_gather_time(fwd, 1.0, cl, 0) == (pytest.approx(cl.collective_time("all_gather", full, group)),) * 2
    want = cl.collective_time("all_gather", full, group) + cl.collective_time("reduce_scatter", full, group)
    assert all_gather_time(bwd, 1.0, cl, 0)[0] == pytest.approx(want)
    assert cp_workspace_bytes(fwd) == 3 * kv_block_bytes(fwd)
    f2, b2 = _llama8b_attention(2)
    assert (cp_workspace_bytes(f2), cp_workspace_bytes(b2)) == (2 * 16 * 2**20, 4 * 16 * 2**20)


def test_engine_cp_keeps_flops_and_splits_activations():
    """cp 2 on 2 GPUs vs cp 1 on 1 GPU, same global batch: the same model FLOPs per step (the
    attention's blocks summed over the ring equal the whole attention), and the per-rank
    activations of the layers about halve."""
    cfg = ModelConfig(name="m", family="llama", num_layers=4, hidden_size=1024, num_heads=16,
                      num_kv_heads=8, ffn_hidden_size=2816, vocab_size=32000, seq_len=4096)
    base = Strategy(micro_batch_size=1, global_batch_size=2, attention="flash")
    one = Engine(cfg, "dgx-h100", base, nodes=1).simulate()
    two = Engine(cfg, "dgx-h100", base.replace(cp=2), nodes=1).simulate()
    assert two.model_flops == pytest.approx(one.model_flops, rel=1e-9)
    a1, a2 = one.memory_breakdown["activations"], two.memory_breakdown["activations"]
    assert a2 == pytest.approx(a1 / 2, rel=0.02)
    assert two.step_time < one.step_time


# -- the tuner dimension ----------------------------------------------------------------------


def _problem(seq_len: int = 4096):
    from tuner.space import ModelDims, SearchProblem

    return SearchProblem(ModelDims.of(TINY), world_size=8, devices_per_node=8,
                         global_batch_size=8, seq_len=seq_len)


def test_tuner_cp_dimension():
    """cp_degrees (1, 2) doubles the meshes: every cp = 2 point has dp = 8 / (tp*pp*2);
    the default space has cp = 1 only; --fix cp=2 pins it; the Strategy carries it."""
    from meshplan.tuning import to_strategy
    from tuner.space import SearchSpace, iter_base_candidates, parse_fix

    small = {"schedules": ("1F1B",), "micro_batch_sizes": (1,), "recompute": ("none",),
             "zero_stages": (0,), "sequence_parallel": (False,)}
    base = list(iter_base_candidates(SearchSpace(_problem(), **small)))
    both = list(iter_base_candidates(SearchSpace(_problem(), cp_degrees=(1, 2), **small)))
    assert {c.cp for c in base} == {1}
    two = [c for c in both if c.cp == 2]
    assert len(two) == len([c for c in base if c.dp % 2 == 0]) > 0
    assert all(c.dp * c.tp * c.pp * 2 == 8 == c.world_size for c in two)
    fixed = SearchSpace(_problem(), fix=parse_fix("cp=2,tp=2"), **small)
    assert {(c.cp, c.tp) for c in iter_base_candidates(fixed)} == {(2, 2)}
    assert {c.dp * c.pp for c in iter_base_candidates(fixed)} == {2}
    assert parse_fix("context_parallel_size=4") == {"cp": 4}
    s = to_strategy(two[0], 8, "llama2-7b", 4096)
    assert s.cp == 2 and s.world_size == 8


def test_tuner_cp_legality():
    from tuner.legality import first_violation, is_legal, sequence_parallel_seq_divisible
    from tuner.space import Candidate

    c = Candidate(dp=2, tp=2, pp=1, cp=2)
    assert is_legal(c, _problem(4096))
    v = first_violation(c, _problem(4094))
    assert v.rule == "cp_load_balance" and "2*cp = 4" in v.reason
    v = first_violation(Candidate(dp=1, tp=2, pp=1, cp=2), _problem())
    assert v.rule == "mesh_matches_world" and "dp*tp*pp*cp = 1*2*1*2 = 4" in v.reason
    sp = Candidate(dp=2, tp=2, pp=1, cp=2, sequence_parallel=True)
    assert is_legal(sp, _problem(4096))
    # sequence parallelism splits the cp rank's seq_len / cp tokens over tp
    sp3 = Candidate(dp=1, tp=3, pp=1, cp=2, sequence_parallel=True)
    assert sequence_parallel_seq_divisible(sp3, _problem(12)) is None
    assert "seq_len 20 / cp=2 is not divisible by tp=3" in sequence_parallel_seq_divisible(sp3, _problem(20))


def test_sequence_sharded_program_needs_no_attention_reshard():
    """A program annotated with its sequence on a cp mesh dim (mesh [cp=2, tp=2], token ids
    and labels split on the sequence, Megatron tp layout) completes with q, k, v, out and
    their gradients sequence-sharded on the cp dim and heads on tp: the context-parallel
    attention rule takes them as they are, so no reshard feeds or follows an attention op."""
    from completion import build_model
    from completion.annotate import annotate, shard_megatron
    from completion.backward import append_backward
    from completion.completer import Completer
    from completion.context_parallel import mark_attention
    from completion.mesh import ProcessMesh
    from completion.passes import apply_partition_pass

    prog = build_model(TINY, batch_size=2, seq_len=64, dtype="float32", num_layers=2, attention="flash")
    append_backward(prog)
    mark_attention(prog, Strategy(cp=2, tp=2, attention="flash"))
    mesh = ProcessMesh((2, 2), (0, 1, 2, 3), ("cp", "tp"))
    shard_megatron(prog, mesh, 0, 1)
    for name in ("input_ids", "labels"):
        v = prog.value(name)
        annotate(prog, name, mesh, [-1, 0] + [-1] * (v.ndim - 2))
    Completer(prog, zero_stage=0, dp_mesh_dim=0).complete()
    apply_partition_pass(prog)
    att = [op for op in prog.ops if op.type in ("flash_attention", "flash_attention_grad")]
    assert len(att) == 4
    for op in att:
        assert all(x.dist_attr.dims_mapping == (-1, 0, 1, -1) for x in op.operands[:3])
        assert all(x.op.type != "reshard" for x in op.operands[:3])
        assert all(u.type != "reshard" for r in op.results[:1] if r is not None for u, _ in r.uses)
    fwd = [op for op in att if op.type == "flash_attention"]
    assert all(op.results[2].dist_attr.dims_mapping == (-1, 1, 0) for op in fwd)


@settings(max_examples=12, deadline=None)
@given(cp=st.sampled_from([1, 2, 4]), mbs=st.integers(1, 2), chunks=st.integers(1, 3))
def test_ring_volume_property(cp, mbs, chunks):
    """For any cp, micro-batch and sequence: a K/V block is 2 * b * (s/cp) * kv_heads *
    head_dim * 2 bytes (bf16), forward sends (cp-1) of them, backward 2(cp-1); the rank's
    attention model FLOPs are 4 * b * hq * (s/cp) * s * d; exposed <= alone."""
    seq = 8 * chunks * 2 * max(cp, 1)
    cfg = TINY.replace(seq_len=seq)
    s = Strategy(cp=cp, micro_batch_size=mbs, global_batch_size=mbs, attention="flash")
    pp = build_plan_program(resolve_model(cfg), s, representative=True, resolve_reshards=False)
    f = op_signature(_attention_ops(pp)[0], 0)
    b = op_signature(_attention_ops(pp, "flash_attention_grad")[0], 0)
    block = 2 * mbs * (seq // cp) * 2 * 16 * 2
    assert kv_block_bytes(f) == block
    assert (ring_volume(f), ring_volume(b)) == ((cp - 1) * block, 2 * (cp - 1) * block)
    assert op_cost(f)[0].flops == 4 * mbs * 4 * (seq // cp) * seq * 16
    cl = load_cluster("dgx-h100", 1)
    for sig in (f, b):
        exposed, alone = ring_exposed_time(sig, 1e-6, cl, 0)
        assert 0.0 <= exposed <= alone


def test_gradients_reduce_over_dp_times_cp():
    """Megatron reduces weight gradients over the dp x cp group and shards the distributed
    optimizer over it: dp 1 x cp 2 syncs exactly as dp 2 x cp 1 (same 2 ranks, same
    gradient bytes) and ZeRO-1 halves its optimizer states."""
    cfg = ModelConfig(name="m", family="llama", num_layers=4, hidden_size=1024, num_heads=16,
                      num_kv_heads=8, ffn_hidden_size=2816, vocab_size=32000, seq_len=4096)
    base = Strategy(micro_batch_size=1, global_batch_size=2, attention="flash")
    cp = Engine(cfg, "dgx-h100", base.replace(cp=2), nodes=1).simulate()
    dp = Engine(cfg, "dgx-h100", base.replace(dp=2), nodes=1).simulate()
    assert cp.time_breakdown["dp_sync"] > 0
    assert cp.time_breakdown["dp_sync"] == pytest.approx(dp.time_breakdown["dp_sync"])
    z1 = Engine(cfg, "dgx-h100", base.replace(cp=2, zero=1), nodes=1).simulate()
    assert z1.memory_breakdown["optimizer"] * 2 == cp.memory_breakdown["optimizer"]


def test_selective_recompute_reruns_the_exchange():
    """Selective recompute reruns the attention core in backward, the cp exchange with it:
    a short sequence with its cp peers on two nodes (tp 8, cp 2 on 2 DGX H100) leaves the
    ring exposed, and the layer's selective recompute time is the attention kernel's plus
    that exposed time."""
    from simulator.roofline import Roofline
    from simulator.stage_cost import StageCoster

    cfg = ModelConfig(name="m8", family="llama", num_layers=3, hidden_size=512, num_heads=8,
                      num_kv_heads=8, ffn_hidden_size=1024, vocab_size=1000, seq_len=256)
    cl = load_cluster("dgx-h100", 2)
    s = Strategy(tp=8, cp=2, micro_batch_size=1, global_batch_size=1, attention="flash")
    pp = build_plan_program(resolve_model(cfg), s, representative=True, resolve_reshards=False)
    rf = Roofline.from_device(cl.device)
    layer = StageCoster(pp.program, cl, rf, rank=0).block_costs()[0]
    sig = op_signature(_attention_ops(pp)[0], 0)
    t_attn = rf.kernels_time(op_cost(sig))["F"]
    exposed, alone = ring_exposed_time(sig, t_attn, cl, 0)
    assert alone == cl.p2p_time(kv_block_bytes(sig), 0, 8) and 0 < exposed == pytest.approx(alone - t_attn / 2)
    assert layer.recompute_f["selective"] == pytest.approx(t_attn + exposed)


def test_a_hidden_ring_exchange_shows_as_issued_and_overlapped_in_the_breakdown():
    """Ring attention hidden behind the blockwise attention used to leave ``tp_comm`` at 0
    ("all issued") although every rank sent its K/V blocks. Now the issued sends are in
    ``tp_comm`` and, hidden, in ``overlapped``; the step time is unchanged by the report.

    Hand-derived: llama2-7b (32 layers, 32 heads of 128, no GQA), seq 32768 on cp 4: a
    rank's K/V block is 2 x 8192 tokens x 32 x 128 x 2 bytes = 134,217,728 bytes. Per layer
    and micro-batch the forward sends 3 blocks, the full recompute 3 more, the backward 3
    double blocks (K/V and dK/dV); 4 micro-batches (global batch 8 / dp 2), 32 layers."""
    from meshplan.engine import Engine
    from meshplan.strategy import Strategy

    s = Strategy(dp=2, cp=4, micro_batch_size=1, global_batch_size=8, recompute="full")
    e = Engine("llama2-7b", "dgx-h100", s, nodes=1, seq_len=32768)
    r = e.simulate()
    blk = 2 * 8192 * 32 * 128 * 2
    issued = 4 * 32 * 3 * (2 * e.cluster.p2p_time(blk, 0, 1) + e.cluster.p2p_time(2 * blk, 0, 1))
    t = r.time_breakdown
    assert t["tp_comm"] == pytest.approx(issued, rel=1e-9) and issued > 0.5
    assert t["overlapped"] == pytest.approx(issued, rel=1e-9)  # all hidden on NVLink
    lines = t["compute"] + t["tp_comm"] - t["overlapped"] + t["bubble"] + t["dp_sync"] + t["optimizer"]
    assert lines == pytest.approx(r.step_time, rel=1e-9)
