"""DualPipeV (issue 42): DeepSeek's DualPipe cut in half as a pipeline schedule
(``simulator.schedules.dualpipe``): its actions follow deepseek-ai/DualPipe 3da1bbe
``DualPipeV.step``, its point-to-point order is safe, its overlapped F&B pairs run as units,
its bubble at equal passes is the DeepSeek-V3 report's (Table 2: (PP/2 - 1)(F&B + B - 3W)),
and the ``overlap.moe_a2a`` profile fact hides each pair's all-to-all."""

from __future__ import annotations

import warnings

import pytest

from completion.strategy import Strategy, StrategyError
from simulator.pipeline_sim import simulate_pipeline
from simulator.schedules import ScheduleError, build_schedule


@pytest.mark.parametrize("p,m", [(1, 2), (2, 4), (2, 7), (3, 6), (4, 8), (4, 13), (8, 16)])
def test_dualpipev_is_complete_and_its_sends_match(p, m):
    """Every rank runs an F and a complete backward of each (chunk, micro-batch), in a V
    (rank r holds virtual stages r and 2p - 1 - r), and the n-th send to a peer is the n-th
    receive it posts (``Schedule.validate``); with a hop time it plays without deadlock."""
    s = build_schedule("DualPipeV", p, m, 2)
    assert s.vstage == tuple((r, 2 * p - 1 - r) for r in range(p))
    assert all(len(row) >= 4 * m for row in s.actions)  # 2 F and 2 backwards (+ W) per micro-batch
    assert simulate_pipeline(s, {"F": 1.0, "B": 1.2, "W": 0.7}, 0.05).step_time > 0


def test_rank_zero_of_two_by_hand():
    """p 2, m 4, rank 0 (DualPipeV.step): 2 F_0; [F_0 F_1] x 1; [B'_1 W F_1] x 1; pairs
    [F_0&B_1, F_1&B_0] x 1; [B_1, F_1&B_0] x 1; [B_1, B_0] with the second half B' (rank 0
    even: after the chunk-1 backward); [W B'_0] x 1; W."""
    s = build_schedule("DualPipeV", 2, 4, 2)
    assert " ".join(str(a) for a in s.actions[0]) == (
        "F0@s0 F1@s0 F2@s0 F0c1@s0 B0c1@s0 W0c1@s0 F1c1@s0 F3@s0 BW1c1@s0 F2c1@s0 BW0@s0 "
        "BW2c1@s0 F3c1@s0 BW1@s0 BW3c1@s0 B2@s0 W2@s0 B3@s0 W3@s0")
    assert s.pairs[0] == frozenset({7, 9, 12})


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("extra", [0, 3])
def test_bubble_is_the_reports_formula_at_equal_passes(p, extra):
    """Stage times F = B = W = 1 s over two chunks: per chunk F = 0.5, a full backward B =
    T_B + T_W = 1, W = 0.5, and an F&B pair F + B = 1.5 (its passes run one after the
    other; what overlaps inside is communication, ``overlap.moe_a2a``). The report's
    bubble with PP = 2p stages, (PP/2 - 1)(F&B + B - 3W) = (p - 1)(1.5 + 1 - 1.5) = p - 1
    seconds, is every rank's idle time in the step (m = 2p + extra micro-batches: the
    bubble does not grow with m)."""
    m = 2 * p + extra
    res = simulate_pipeline(build_schedule("DualPipeV", p, m, 2), {"F": 1.0, "B": 1.0, "W": 1.0}, 0.0)
    f, b_full, w = 0.5, 1.0, 0.5
    want = (p - 1) * ((f + b_full) + b_full - 3 * w)
    assert res.idle_time == pytest.approx([want] * p)
    assert res.step_time == pytest.approx(m * 3.0 + want)


def test_pairs_start_on_both_inputs_and_run_back_to_back():
    """Unequal passes with a hop: every F&B pair's forward starts no earlier than its
    backward's input (the upstream gradient plus the hop), and its backward starts when the
    forward ends -- the pair is one unit (``Schedule.pairs``)."""
    p, m, hop = 3, 8, 0.1
    s = build_schedule("DualPipeV", p, m, 2)
    res = simulate_pipeline(s, {"F": 1.0, "B": 2.0, "W": 0.6}, hop)
    ev = {(e.rank, e.kind, e.microbatch, e.chunk): e for e in res.timeline}
    done_b = {(e.vstage, e.microbatch): e.end for e in res.timeline if e.kind in ("B", "BW")}
    owner = {vs: r for r, row in enumerate(s.vstage) for vs in row}
    checked = 0
    for r, js in enumerate(s.pairs):
        for j in js:
            f, b = s.actions[r][j], s.actions[r][j + 1]
            ef, eb = ev[(r, f.kind, f.microbatch, f.chunk)], ev[(r, b.kind, b.microbatch, b.chunk)]
            vs = s.vstage[r][b.chunk]
            if vs < 2 * p - 1:
                upstream = owner[vs + 1]
                assert ef.start >= done_b[(vs + 1, b.microbatch)] + (hop * 1e9 if upstream != r else 0) - 1
            assert eb.start == ef.end
            checked += 1
    assert checked > 10


def test_pair_hidden_shortens_each_pairs_backward():
    """``pair_hidden`` h: each pair's backward runs h shorter (the all-to-all it hides)."""
    s = build_schedule("DualPipeV", 2, 4, 2)
    h = {(r, c0, c1): 0.2 for r in range(2) for c0 in (0, 1) for c1 in (0, 1)}
    plain = simulate_pipeline(s, {"F": 1.0, "B": 1.0, "W": 1.0}, 0.0)
    hid = simulate_pipeline(s, {"F": 1.0, "B": 1.0, "W": 1.0}, 0.0, pair_hidden=h)
    n_pairs = [len(js) for js in s.pairs]
    assert [round(a - b, 9) for a, b in zip(plain.busy_time, hid.busy_time, strict=True)] == \
        [round(0.2 * n, 9) for n in n_pairs]


def test_strategy_rules_name_the_field():
    with pytest.raises(StrategyError, match="'vpp' must be 2 for DualPipeV"):
        Strategy(pp=2, vpp=3, schedule="DualPipeV", global_batch_size=8)
    with pytest.raises(StrategyError, match="DualPipeV needs at least 2 x pp = 8 micro-batches"):
        Strategy(pp=4, vpp=2, schedule="dualpipe-v", global_batch_size=4)
    with pytest.raises(ScheduleError, match="needs at least 2 x pp = 4 micro-batches"):
        build_schedule("DualPipeV", 2, 3, 2)


def test_moe_a2a_overlap_is_a_profile_fact_the_step_honours():
    """A small MoE model on pp 2 x ep 2 under DualPipeV: with the profile's
    ``overlap.moe_a2a`` on, each pair hides min(a2a_F, B - a2a_B) + min(a2a_B, F - a2a_F)
    of its all-to-all (``StepModel.pair_hidden``) and the step is that much faster on the
    critical rank's pairs; off (every catalog profile), nothing changes; a dense model
    (no all-to-all) hides nothing."""
    from completion.models import ModelConfigWarning, config_from_hf_dict
    from meshplan import Engine
    from simulator.profiles.spec import Flag
    from tests.completion.test_moe_program import TINY

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ModelConfigWarning)
        cfg = config_from_hf_dict({**TINY, "num_hidden_layers": 4})
    s = Strategy(dp=2, ep=2, pp=2, vpp=2, schedule="DualPipeV", micro_batch_size=1, global_batch_size=8)
    eng = Engine(cfg, "dgx-h100", s, seq_len=256)
    off = eng.step_model()
    assert not off.cfg.profile.overlap.moe_a2a.value
    sched = off.schedule()
    times = [off.stage_time(vs)[0] for vs in range(off.nvs)]
    assert off.pair_hidden(sched, times) is None
    prof = off.cfg.profile
    on_prof = prof.model_copy(update={"overlap": prof.overlap.model_copy(
        update={"moe_a2a": Flag(value=True, provenance="test")})})
    eng.profile = on_prof
    on = eng.step_model()
    hidden = on.pair_hidden(sched, times)
    a2a = [on.timer.a2a_time(vs) for vs in range(on.nvs)]
    assert all(f > 0 and b > 0 for f, b in a2a)
    v0, v1 = sched.vstage[0]
    want = min(a2a[v0][0], times[v1]["BW"] - a2a[v1][1]) + min(a2a[v1][1], times[v0]["F"] - a2a[v0][0])
    assert hidden[(0, 0, 1)] == pytest.approx(want) and want > 0
    assert on.run().step_time < off.run().step_time


@pytest.mark.slow
@pytest.mark.distributed
def test_dualpipev_runs_on_two_gloo_ranks(tmp_path):
    """A 4-layer LLaMA on pp 2 under DualPipeV (two chunks per rank in a V, B and W split
    where the schedule defers W) computes what one process computes."""
    import json

    from meshplan.plan import Plan
    from meshplan.validation import verify_many

    f = tmp_path / "l.json"
    f.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                             "vocab_size": 256, "max_position_embeddings": 64}))
    plan = Plan(str(f), "cpu-local", Strategy(dtype="float32", optimizer="sgd", pp=2, vpp=2, schedule="DualPipeV",
                                              micro_batch_size=1, global_batch_size=4, framework="eager"),
                seq_len=32)
    (r,) = verify_many([plan], 2)
    assert r.ok, r.summary()
    assert len(r.losses) == 2 and r.losses[1] != r.losses[0]
