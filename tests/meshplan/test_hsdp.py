"""HSDP (ZeRO-3 sharded within groups of N dp ranks, replicated across the dp / N groups):
the Strategy field and its errors, the shard / replicate groups, hand-derived collective
times and model states of an HSDP step, the tuner dimension and the CLI.

Hand values use the dgx-a100-80g catalog links (clusters/catalog/dgx-a100-80g.yaml):
intra-node step latency a_i = 3.4 us and bus bandwidth B_i = 230 GB/s, inter-node latency
a_n = 9.6 us, one 24 GB/s NIC per GPU; and the ring formulas of clusters/collectives.py
under NCCL's protocols (clusters/nccl.py: a call latency, per-step hops and a bandwidth
factor each), the fastest taken: all_gather / reduce_scatter of S bytes over n ranks in a
node: base + (n-1)(hop + S/(n f B_i)); all_reduce over 2 ranks on 2 nodes, one per node:
base + 2 hop + S / (f NIC) (ring; the tree moves 2 S and loses).
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from completion.context_parallel import fold_strategy
from meshplan.engine import Engine
from meshplan.plan import Plan
from meshplan.strategy import Strategy, StrategyError
from simulator import dp_groups
from simulator.grad_sync import fixed_time, grad_buckets, optimizer_time
from tests._cli import one_line_error, run_main
from tuner import legality as L
from tuner.space import Candidate, SearchSpace, parse_fix
from tuner.suggest import enumerate_candidates

A_I, B_I, A_N, NIC = 3.4e-6, 2.3e11, 9.6e-6, 24e9
#: NCCL 5067397c tuning.cc: (call latency, NVLink ring hop, Tree NET hop, bandwidth factor)
#: of LL, LL128 and Simple (whose hops are the cluster's a_i, a_n)
PROTOCOLS = ((6.6e-6, 0.6e-6, 5.0e-6, 0.5), (14e-6, 1.9e-6, 8.5e-6, 0.92), (8.4e-6, A_I, A_N, 1.0))
H, FFN = 4096, 11008
#: llama2-7b decoder layer: q, k, v, o (h x h each), gate, up, down (h x ffn) and two norms
LAYER = 4 * H * H + 3 * H * FFN + 2 * H
#: llama2-7b parameters (completion.models: 32 layers, 32000 x 4096 embedding and head)
P_7B = 6_738_415_616


def _engine(shard: int | None = 8, framework: str = "fsdp2", dp: int = 16, **kw) -> Engine:
    s = Strategy(dp=dp, global_batch_size=4 * dp, zero=3, fsdp_shard_size=shard,
                 framework=framework, **kw)
    return Engine("llama2-7b", "dgx-a100-80g", s, nodes=2 * max(1, dp // 16))


def _ring_in_node(nbytes: float, n: int) -> float:
    return min(base + (n - 1) * (hop + nbytes / (n * f * B_I)) for base, hop, _, f in PROTOCOLS)


def _all_reduce_two_nodes(nbytes: float) -> float:
    return min(base + 2 * (net + nbytes / (2 * f * NIC)) for base, _, net, f in PROTOCOLS)


# -- the Strategy field ---------------------------------------------------------------------

def test_strategy_field_checks_and_round_trip(tmp_path):
    s = Strategy(dp=16, global_batch_size=64, zero=3, fsdp_shard_size=8)
    assert (s.zero_shard_degree, s.replicate_degree) == (8, 2)
    assert Strategy(dp=16, global_batch_size=64, zero=3).zero_shard_degree == 16
    assert Strategy(dp=16, global_batch_size=64, zero=3, fsdp_shard_size=0).fsdp_shard_size is None
    assert Strategy.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    plan = Plan(model="llama2-7b", cluster="dgx-a100-80g", strategy=s, nodes=2)
    assert Plan.load(plan.save(tmp_path / "plan.json")).strategy.fsdp_shard_size == 8
    for bad, why in ((dict(fsdp_shard_size=3), "must divide dp = 16"),
                     (dict(fsdp_shard_size=16), "must divide dp = 16 and lie in 2..dp/2"),
                     (dict(fsdp_shard_size=1), "lie in 2..dp/2"),
                     (dict(fsdp_shard_size=8, zero=2), "needs zero 3, got zero 2"),
                     (dict(fsdp_shard_size=True), "integer >= 2 or null"),
                     (dict(fsdp_shard_size=-2), "integer >= 2 or null")):
        with pytest.raises(StrategyError, match="fsdp_shard_size"):
            Strategy(**{"dp": 16, "global_batch_size": 64, "zero": 3, **bad})
        with pytest.raises(StrategyError, match=why.replace(".", r"\.")):
            Strategy(**{"dp": 16, "global_batch_size": 64, "zero": 3, **bad})


def test_cp_fold_shards_over_the_groups_cp_ranks():
    """torchtitan shards over dp_shard x cp: a shard group of 2 dp ranks x cp 2 is 4 folded
    data-parallel ranks out of dp 4 x cp 2 = 8."""
    s = Strategy(dp=4, cp=2, global_batch_size=8, zero=3, fsdp_shard_size=2)
    f = fold_strategy(s)
    assert (f.dp, f.cp, f.fsdp_shard_size, f.replicate_degree) == (8, 1, 4, 2)


def test_cli_flag_errors_name_the_flag(capsys):
    base = ("cost", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
            "--dp", "8", "--global-batch", "16")
    line = one_line_error(*run_main(capsys, *base, "--zero", "3", "--hsdp", "3"))
    assert line.startswith("error: --hsdp = 3 ") and "must divide --dp = 8" in line
    line = one_line_error(*run_main(capsys, *base, "--zero", "1", "--fsdp-shard-size", "4"))
    assert line.startswith("error: --fsdp-shard-size = 4 ") and "needs zero 3" in line


# -- groups ---------------------------------------------------------------------------------

def test_shard_and_replicate_groups():
    """rank = stage * dp * tp + d * tp + t; shard group = N consecutive dp ranks (inner),
    replicate group = one rank per shard group (outer)."""
    c = _engine().step_model().cfg
    assert dp_groups.shard_group(c, 0) == list(range(8))
    assert dp_groups.replicate_group(c, 0) == [0, 8]
    assert dp_groups.dp_group(c, 0) == list(range(16))
    tp2 = Strategy(dp=8, tp=2, pp=2, global_batch_size=16, zero=3, fsdp_shard_size=4)
    c2 = Engine("llama2-7b", "dgx-a100-80g", tp2, nodes=4).step_model().cfg
    assert dp_groups.shard_group(c2, 1) == [16, 18, 20, 22]
    assert dp_groups.replicate_group(c2, 1) == [16, 24]
    plain = _engine(shard=None).step_model().cfg
    assert dp_groups.shard_group(plain, 0) == list(range(16))
    assert dp_groups.replicate_group(plain, 0) == [0]


# -- cost -----------------------------------------------------------------------------------

def test_hsdp_collectives_of_a_7b_layer_by_hand():
    """llama2-7b, dp 16 = 2 replicas x 8 shards on 2 DGX A100 (fsdp2: bf16 weights, fp32
    reduce): per layer an all_gather of 2 x 202,383,360 bytes inside the node, a
    reduce_scatter of 4 x 202,383,360 bytes inside the node, then a cross-node all_reduce
    of 1/8 of that between the two replicas."""
    model = _engine().step_model()
    blk = model.costs.layers[0]
    assert sum(n for n, _ in blk.params.values()) == LAYER == 202_383_360
    gather = _ring_in_node(2 * LAYER, 8)
    assert gather == pytest.approx(8.4e-6 + 1.5636734e-3, rel=1e-6)  # Simple
    assert model.timer.zero3_gather_time(blk) == pytest.approx(gather, rel=1e-12)
    reduce = _ring_in_node(4 * LAYER, 8) + _all_reduce_two_nodes(4 * LAYER / 8)
    # ring / Simple: 8.4 us + 2 x 9.6 us + 101,191,680 B / 24 GB/s
    assert _all_reduce_two_nodes(4 * LAYER / 8) == pytest.approx(4.24392e-3, rel=1e-6)
    assert model.timer.zero3_reduce_time(blk) == pytest.approx(reduce, rel=1e-12)


def test_non_fsdp_zero3_buckets_reduce_within_the_shard_group_then_across():
    """Megatron-FSDP style (megatron-core profile): each gradient bucket of k elements
    (fp32 main grads) is reduce_scattered over the 8 shard ranks and its 1/8 all_reduced
    across the 2 replicas; the parameter gather runs over the 8 shard ranks."""
    model = _engine(framework="megatron-core").step_model()
    c = model.cfg
    per = int(c.profile.gradients.bucket_params.value)
    n = 2 * per + 12345
    items = grad_buckets(c, model.cluster, 0, {0: n})[0]
    sizes = [per, per, 12345]
    assert [f for f, _ in items] == pytest.approx([per / n, 2 * per / n, 1.0])
    for (_, sec), k in zip(items, sizes, strict=True):
        assert sec == pytest.approx(_ring_in_node(4 * k, 8) + _all_reduce_two_nodes(4 * k / 8),
                                    rel=1e-12)


def test_optimizer_updates_one_shard_of_the_group():
    """The optimizer works on params / N and the gradient norm is summed over the shard
    group: HSDP dp 16 / N 8 costs what plain ZeRO-3 over dp 8 costs (one node)."""
    hsdp = _engine().step_model()
    plain8 = _engine(shard=None, dp=8).step_model()
    assert fixed_time(hsdp.cfg, hsdp.cluster, hsdp.rf, 0, P_7B) == pytest.approx(
        fixed_time(plain8.cfg, plain8.cluster, plain8.rf, 0, P_7B), rel=1e-12)
    full = _engine(shard=None).step_model()
    assert fixed_time(hsdp.cfg, hsdp.cluster, hsdp.rf, 0, P_7B) > fixed_time(
        full.cfg, full.cluster, full.rf, 0, P_7B) > 0
    assert optimizer_time(hsdp.cfg, hsdp.rf, P_7B) == pytest.approx(
        optimizer_time(plain8.cfg, plain8.rf, P_7B), rel=1e-12)
    assert optimizer_time(hsdp.cfg, hsdp.rf, P_7B) > optimizer_time(
        _engine(shard=None).step_model().cfg, hsdp.rf, P_7B)


# -- memory ---------------------------------------------------------------------------------

def test_model_states_of_hsdp_by_hand():
    """P / 8 = 842,301,952 elements per rank. fsdp2: fp32 sharded weight 4 + fp32 gradient 4
    + Adam 8 bytes each (16 P / N); megatron-core: 2 + 4 + 12 (18 P / N); and one more NCCL
    communicator (shard and replicate groups)."""
    shard = P_7B // 8
    assert shard * 8 == P_7B and shard == 842_301_952
    mem = _engine().simulate().memory_breakdown
    assert (mem["params"], mem["grads"], mem["optimizer"]) == (4 * shard, 4 * shard, 8 * shard)
    full = _engine(shard=None).simulate().memory_breakdown
    assert full["params"] == 4 * (P_7B // 16)
    assert mem["nccl_buffers"] == full["nccl_buffers"] * 3 // 2  # 3 communicators, not 2
    meg = _engine(framework="megatron-core").simulate().memory_breakdown
    assert (meg["params"], meg["grads"], meg["optimizer"]) == (2 * shard, 4 * shard, 12 * shard)


STATES = ("params", "grads", "optimizer", "param_buffers")


@settings(max_examples=6, deadline=None, derandomize=True)
@given(dp=st.sampled_from([8, 16, 32]), framework=st.sampled_from(["fsdp2", "megatron-core", "deepspeed"]),
       data=st.data())
def test_model_states_fall_with_the_shard_group_and_equal_plain_zero3_over_it(dp, framework, data):
    """Model states per rank are non-increasing in N (1/N of the states, the same gathered
    buffers), and HSDP over groups of N holds what plain ZeRO-3 over dp = N holds."""
    sizes = [n for n in range(2, dp) if dp % n == 0] + [None]
    mems = {n: _engine(n, framework, dp=dp).simulate().memory_breakdown for n in sizes}
    states = [sum(mems[n][k] for k in STATES) for n in sizes]  # None (N = dp) last
    assert all(a >= b for a, b in zip(states, states[1:], strict=False)), states
    n = data.draw(st.sampled_from(sizes[:-1]))
    plain = _engine(None, framework, dp=n).simulate().memory_breakdown
    assert {k: mems[n][k] for k in STATES} == {k: plain[k] for k in STATES}


# -- tuner ----------------------------------------------------------------------------------

def test_tuner_space_and_legality_of_hsdp():
    assert parse_fix("hsdp=4,zero=3") == {"fsdp_shard_size": 4, "zero": 3}
    from meshplan.tuning import search_problem

    prob = search_problem("llama2-7b", "dgx-a100-80g", 2, 64, 4096, num_layers=4)
    space = SearchSpace(prob, hsdp=True, fix={"tp": 1, "pp": 1, "zero": 3, "micro_batch_size": 1,
                                              "recompute": "none"})
    assert space.shard_choices(16, 3) == [None, 2, 4, 8]
    assert space.shard_choices(16, 2) == [None]
    assert SearchSpace(prob).shard_choices(16, 3) == [None]
    cands = enumerate_candidates(space, "pattern-based", {})
    assert sorted(c.fsdp_shard_size or 16 for c in cands) == [2, 4, 8, 16]
    ok = Candidate(16, 1, 1, zero=3, fsdp_shard_size=8)
    assert L.hsdp_shard_group(ok, prob) is None
    assert "needs ZeRO stage 3" in L.hsdp_shard_group(ok.replace(zero=1), prob)
    assert "must divide dp=16" in L.hsdp_shard_group(ok.replace(fsdp_shard_size=6), prob)
    assert Candidate.from_dict(ok.to_dict()) == ok
    # records without HSDP are the ones older studies hold (their plan keys and configs)
    assert "fsdp_shard_size" not in ok.replace(fsdp_shard_size=None).to_dict()
    assert "hsdp" not in SearchSpace(prob).to_dict() and space.to_dict()["hsdp"] is True
    assert SearchSpace.from_dict(space.to_dict()) == space


def test_tune_searches_hsdp_shard_groups(tmp_path, capsys):
    """--search-hsdp: a brute-force search scores ZeRO-3 over dp 16 and over shard groups
    of 2, 4 and 8; history.csv's sharding_degree says which; the best plan reproduces its
    time through the Engine."""
    out = tmp_path / "run"
    rc, stdout, err = run_main(capsys, "tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g",
                               "--nodes", "2", "--global-batch", "64", "--layers", "4",
                               "--sampler", "bruteforce", "--trials", "4", "--search-hsdp",
                               "--no-search-cp", "--fix",
                               "tp=1,pp=1,zero=3,micro_batch_size=1,recompute=none",
                               "--framework", "fsdp2", "--storage", "memory", "--output", str(out),
                               "--no-progress")
    assert rc == 0, err
    hist = pd.read_csv(out / "history.csv")
    done = hist[hist.state == "COMPLETE"]
    assert sorted(done.fsdp_shard_size.fillna(16)) == [2, 4, 8, 16]  # empty: the whole dp
    plan = Plan.load(out / "plan.json")
    best = done.loc[done.step_time_s.idxmin()]
    assert (plan.strategy.fsdp_shard_size or 16) == (16 if pd.isna(best.fsdp_shard_size) else best.fsdp_shard_size)
    assert Engine.from_plan(plan).simulate().step_time == pytest.approx(best.step_time_s, rel=1e-9)


# -- the tour ---------------------------------------------------------------------------------

README_HSDP = ("cost --model llama2-7b --cluster dgx-a100-80g --nodes 2 --dp 16 --global-batch 64 "
               "--framework fsdp2 --zero 3 --hsdp 8")


def test_readme_hsdp_line_runs(capsys):
    """The tour's HSDP line (docs/tutorials/tour.md): params + grads + optimizer are 16 P / 8 bytes."""
    rc, out, err = run_main(capsys, *README_HSDP.split(), "--json")
    assert rc == 0, err
    mem = json.loads(out)["memory_breakdown_bytes"]
    assert mem["params"] + mem["grads"] + mem["optimizer"] == 16 * (P_7B // 8)
    assert math.isfinite(json.loads(out)["step_time_ms"]) and json.loads(out)["fsdp_shard_size"] == 8
    rc, out, err = run_main(capsys, *README_HSDP.split())
    assert rc == 0 and "HSDP: ZeRO-3 in shard groups of 8 dp ranks" in out


def test_lower_bound_stays_below_the_simulated_hsdp_step():
    """The exhaustive search's bound (simulator.bounds.step) holds for every shard group."""
    for n in (2, 4, 8, None):
        e = _engine(n)
        t, m = e.lower_bound()
        res = e.simulate()
        assert t <= res.step_time * (1 + 1e-12) and m <= res.max_memory_bytes, n


def test_executor_refuses_an_hsdp_plan_before_launch():
    """The plan program shards ZeRO-3 over the whole dp mesh dim, so a run would measure
    other groups than the ones costed: refused, naming the field."""
    from executor.run import PlanMismatchError, check_plan

    s = Strategy(dp=4, global_batch_size=8, zero=3, fsdp_shard_size=2)
    with pytest.raises(PlanMismatchError, match="'fsdp_shard_size' = 2 .HSDP. .* cannot run it"):
        check_plan(Plan(model="llama2-7b", cluster="cpu-local", strategy=s), 4)
    check_plan(Plan(model="llama2-7b", cluster="cpu-local", strategy=s.replace(fsdp_shard_size=None)), 4)


def test_search_hsdp_with_a_pinned_lower_zero_stage_is_refused(capsys, tmp_path):
    """--search-hsdp with --zero 1 would search nothing new (HSDP is ZeRO-3): one error line
    naming both flags (new-user trial: it was accepted silently)."""
    line = one_line_error(*run_main(capsys, "tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g",
                                    "--global-batch", "8", "--layers", "4", "--zero", "1",
                                    "--search-hsdp", "--storage", "memory", "--output", str(tmp_path)))
    assert "--search-hsdp" in line and "pinned to stage 1" in line
    line = one_line_error(*run_main(capsys, "cost", "--model", "llama2-7b", "--cluster", "dgx-a100-80g",
                                    "--nodes", "0", "--global-batch", "8"))
    assert "--nodes" in line
