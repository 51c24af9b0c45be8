"""The whole step on its streams (issue 20 item 7): ``simulator.step_trace`` events, the
Chrome trace of ``meshplan cost --trace`` checked against the trace-event format, and
``StepResult.to_frame()``."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from meshplan.engine import Engine
from meshplan.strategy import Strategy
from simulator.step_trace import STREAMS, step_events


def check_trace_format(events: list[dict]) -> None:
    """The trace-event format (Google's "Trace Event Format"): every event has ``ph``;
    complete events ``X`` carry name, numeric ``ts`` and ``dur`` >= 0 (microseconds),
    integer ``pid``/``tid``; counters ``C`` carry name, ``ts``, ``pid`` and numeric
    ``args``; metadata ``M`` name processes and threads (``args.name``); every process
    and (process, thread) an event uses is named."""
    named_procs, named_threads = set(), set()
    for e in events:
        assert e["ph"] in ("X", "C", "M"), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index",
                                 "thread_sort_index")
            if e["name"] == "process_name":
                named_procs.add(e["pid"])
                assert isinstance(e["args"]["name"], str) and e["args"]["name"]
            if e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
                assert isinstance(e["args"]["name"], str) and e["args"]["name"]
    for e in events:
        if e["ph"] == "X":
            assert isinstance(e["name"], str) and isinstance(e["pid"], int) and isinstance(e["tid"], int)
            assert isinstance(e["ts"], float | int) and isinstance(e["dur"], float | int)
            assert e["ts"] >= 0 and e["dur"] >= 0
            assert (e["pid"], e["tid"]) in named_threads
        if e["ph"] == "C":
            assert isinstance(e["pid"], int) and e["ts"] >= 0
            assert all(isinstance(v, float | int) for v in e["args"].values())
        assert e.get("pid", 0) in named_procs


@pytest.fixture(scope="module")
def step():
    """megatron-1.7b, dp 2 x tp 2 x pp 2, 1F1B, m = 4, ZeRO-1 (gradient buckets,
    parameter all_gather), 512 tokens."""
    s = Strategy(dp=2, tp=2, pp=2, global_batch_size=8, zero=1)
    return Engine("megatron-1.7b", "dgx-a100-80g", s, nodes=1, seq_len=512).simulate()


def test_every_stream_of_every_rank_is_there_and_the_step_ends_with_the_last_event(step):
    ev = step_events(step)
    per = Counter((e.rank, e.stream) for e in ev)
    for r in range(2):
        assert {s for (rr, s) in per if rr == r} == set(STREAMS)
        assert per[(r, "compute")] == 4 * 2  # m = 4 x (F, BW)
        assert per[(r, "optimizer")] == 1
    # the last event ends at the step time (ns rounding of each piece of the tail)
    assert max(e.end for e in ev) == pytest.approx(step.step_time * 1e9, abs=10)
    crit = max(range(2), key=lambda r: max(e.end for e in ev if e.rank == r))
    tail = step.rank_tails[crit]
    opt = [e for e in ev if e.rank == crit and e.stream == "optimizer"][0]
    assert (opt.end - opt.start) == round(tail["optimizer"] * 1e9)
    assert opt.start == pytest.approx((tail["end"] + tail["dp_wait"] + tail["tail_collectives"]) * 1e9, abs=2)
    # ZeRO-1: the updated parameters are all_gathered after the optimizer
    gather = [e for e in ev if e.rank == crit and e.kind == "param_gather"]
    assert len(gather) == 1 and gather[0].start == opt.end


def test_pipeline_hops_are_one_comm_time_and_precede_their_consumer(step):
    ev = step_events(step)
    hop = round(step.comm_time * 1e9)
    assert hop > 0
    sends = [e for e in ev if e.kind == "send"]
    recvs = [e for e in ev if e.kind == "recv"]
    # rank 0 sends 4 activations, rank 1 sends 4 gradients; each has its recv
    assert Counter(e.rank for e in sends) == {0: 4, 1: 4}
    assert Counter(e.rank for e in recvs) == {0: 4, 1: 4}
    assert all(e.end - e.start == hop for e in sends + recvs)
    starts = {(e.rank, e.kind, e.microbatch): e.start for e in ev if e.stream == "compute"}
    for e in recvs:  # a forward (backward) starts after its input arrived
        kind = "F" if "activation" in e.name else "BW"
        assert starts[(e.rank, kind, e.microbatch)] >= e.end


def test_tp_share_adds_up_to_the_breakdown_and_lies_inside_its_action(step):
    ev = step_events(step)
    actions = {(e.rank, e.name): e for e in ev if e.stream == "compute"}
    for r in range(2):
        tp = [e for e in ev if e.rank == r and e.stream == "tp_comm"]
        assert len(tp) == 8
        for e in tp:
            a = actions[(r, e.name.removeprefix("TP comm "))]
            assert a.start <= e.start < e.end == a.end
        # m x the virtual stage's comm seconds per micro-batch (StageTimer.stage_time)
        want = 4 * step.stage_parts[r]["comm"] * 1e9
        assert sum(e.end - e.start for e in tp) == pytest.approx(want, abs=8)
    crit = max(range(2), key=lambda r: max(e.end for e in ev if e.rank == r))
    got = sum(e.end - e.start for e in ev if e.rank == crit and e.stream == "tp_comm")
    assert got == pytest.approx(step.time_breakdown["tp_comm"] * 1e9, abs=8)


def test_gradient_buckets_on_the_dp_stream(step):
    """dp = 2: each rank's buckets run one after another on its dp stream; the last ends
    where the dp wait of the tail says (before or after the rank's last action)."""
    ev = step_events(step)
    for r in range(2):
        b = [e for e in ev if e.rank == r and e.kind == "grad_reduce"]
        assert b and len(b) == len(step.dp_buckets[r])
        assert all(x.end <= y.start for x, y in zip(b, b[1:], strict=False))
        tail = step.rank_tails[r]
        assert max(tail["end"], b[-1].end * 1e-9) == pytest.approx(tail["end"] + tail["dp_wait"], abs=1e-9)


def test_chrome_trace_of_cost_is_valid_and_in_microseconds(tmp_path, step, capsys):
    from meshplan.cli import main

    path = tmp_path / "t.json"
    args = ["cost", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
            "--dp", "2", "--tp", "2", "--pp", "2", "--global-batch", "8", "--zero", "1",
            "--seq-len", "512", "--trace", str(path)]
    assert main(args) == 0
    data = json.loads(path.read_text())
    assert data["displayTimeUnit"] == "ms"
    events = data["traceEvents"]
    check_trace_format(events)
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert procs == {0: "pipeline rank 0", 1: "pipeline rank 1"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == {(r, t): n for r in range(2) for t, n in STREAMS.values()}
    x = [e for e in events if e["ph"] == "X"]
    assert len(x) == len(step_events(step))
    # ts / dur in microseconds: the compute events are the timeline's ns / 1e3
    first = min(step.sim.timeline, key=lambda e: (e.start, e.rank))
    f0 = [e for e in x if e["pid"] == first.rank and e["tid"] == 0 and e["ts"] == first.start / 1e3]
    assert f0 and f0[0]["dur"] == pytest.approx((first.end - first.start) / 1e3)
    assert max(e["ts"] + e["dur"] for e in x) == pytest.approx(step.step_time * 1e6, abs=0.05)
    counters = [e for e in events if e["ph"] == "C"]
    assert {e["pid"] for e in counters} == {0, 1}  # memory: a counter track per rank
    for r in range(2):
        acts = [e["args"]["activations"] for e in counters if e["pid"] == r]
        assert max(acts) == pytest.approx(step.memory_per_stage[r]["activations"] / 2**30)


def test_pipeline_only_trace_of_simulate_has_a_process_per_rank(tmp_path):
    from simulator.pipeline_sim import simulate_pipeline
    from simulator.schedules import build_schedule

    res = simulate_pipeline(build_schedule("VPP", 2, 4, 2), {"F": 1e-3, "B": 2e-3}, 1e-4)
    events = json.loads(res.to_chrome_trace(tmp_path / "p.json").read_text())["traceEvents"]
    check_trace_format(events)
    x = [e for e in events if e["ph"] == "X"]
    assert Counter(e["pid"] for e in x) == {0: 16, 1: 16}  # m x v x (F, BW)
    assert {e["name"] for e in x if e["pid"] == 0} >= {"F0.c0", "F0.c1", "BW3.c1"}


def test_to_frame_one_row_per_event(step):
    df = step.to_frame()
    assert list(df.columns) == ["rank", "stream", "name", "kind", "microbatch", "chunk",
                                "start_ms", "end_ms", "dur_ms"]
    assert len(df) == len(step_events(step))
    busy = df[df.stream == "compute"].groupby("rank").dur_ms.sum()
    for r in range(2):  # the compute stream is the pipeline's busy time
        assert busy[r] == pytest.approx(step.sim.busy_time[r] * 1e3, rel=1e-9)
    opt = df[df.stream == "optimizer"].set_index("rank").dur_ms
    assert opt[0] == pytest.approx(step.rank_tails[0]["optimizer"] * 1e3, abs=1e-6)


def test_zero3_gathers_are_on_the_fsdp_thread():
    """FSDP2 ZeRO-3 (dp 4 x tp 2): the time the per-block gathers and reduces add
    (``stage_parts[vs]["fsdp"]``) is drawn on the DP/FSDP thread at each action's start,
    the rest of the in-stage comm on TP comm; together m x comm, the breakdown's tp_comm."""
    s = Strategy(dp=4, tp=2, global_batch_size=8, zero=3, framework="fsdp2")
    res = Engine("megatron-1.7b", "dgx-a100-80g", s, nodes=1, seq_len=512).simulate()
    ev = step_events(res)
    p = res.stage_parts[0]
    assert 0 < p["fsdp"] < p["comm"]
    fsdp = [e for e in ev if e.kind == "fsdp"]
    tp = [e for e in ev if e.kind == "tp"]
    assert fsdp and all(e.stream == "dp_sync" for e in fsdp)
    acts = {e.name: e for e in ev if e.stream == "compute"}
    for e in fsdp:
        a = acts[e.name.removeprefix("FSDP gather/reduce ")]
        assert e.start == a.start and e.end <= a.end
    m = 2
    assert sum(e.end - e.start for e in fsdp) == pytest.approx(m * p["fsdp"] * 1e9, abs=8)
    total = sum(e.end - e.start for e in fsdp + tp)
    assert total == pytest.approx(res.time_breakdown["tp_comm"] * 1e9, abs=8)
    # FSDP-style ZeRO-3 leaves no end-of-step bucket or parameter gather
    assert not [e for e in ev if e.kind in ("grad_reduce", "param_gather")]


# -- properties ---------------------------------------------------------------------------

def test_bucket_intervals_of_the_hand_example():
    """tests/simulator/test_overlap_mechanisms.py's example: buckets of 0.8 s ready at 2 s and 3 s
    run [2, 2.8] and [3, 3.8] s."""
    from simulator.dp_stream import grad_reduce_intervals
    from simulator.result import TimelineEvent

    tl = [TimelineEvent(0, "F", 0, 0, 0, 0, 10**9), TimelineEvent(0, "BW", 0, 0, 0, 10**9, 3 * 10**9)]
    spans = grad_reduce_intervals(tl, 1, {(0, 0): [(0.5, 0.8), (1.0, 0.8)]}, overlap=True)
    assert spans == [[(2 * 10**9, 28 * 10**8), (3 * 10**9, 38 * 10**8)]]


@settings(max_examples=40, deadline=None)
@given(schedule=hs.sampled_from(["1F1B", "ZBH1", "VPP", "FThenB"]), p=hs.integers(1, 4),
       m_mult=hs.integers(1, 3), tf=hs.integers(1, 50), tb=hs.integers(1, 50), tw=hs.integers(0, 30),
       hop=hs.integers(0, 20), comm=hs.floats(0.0, 0.9), opt=hs.integers(0, 40), wait=hs.integers(0, 9))
def test_step_events_invariants(schedule, p, m_mult, tf, tb, tw, hop, comm, opt, wait):
    """On any played pipeline: each rank's compute events are its timeline; TP shares lie
    inside their actions and add up to m x comm; every recv ends before its consumer
    starts; the tail (dp wait, optimizer) follows the last action, and the last event ends
    at end + wait + optimizer."""
    from simulator.pipeline_sim import simulate_pipeline
    from simulator.schedules import build_schedule

    v = 2 if schedule == "VPP" else 1
    m = p * m_mult
    sim = simulate_pipeline(build_schedule(schedule, p, m, v),
                            {"F": tf * 1e-6, "B": tb * 1e-6, "W": tw * 1e-6}, hop * 1e-7)
    per_vs = (tf + tb + tw) * 1e-6 / v
    ends = [max(e.end for e in sim.timeline if e.rank == r) * 1e-9 for r in range(p)]
    res = SimpleNamespace(
        sim=sim, stage_parts=[{"compute": per_vs * (1 - comm), "comm": per_vs * comm}] * (p * v),
        comm_time=hop * 1e-7, dp_buckets=[[] for _ in range(p)], memory_per_stage=[],
        rank_tails=[{"end": ends[r], "dp_wait": wait * 1e-6, "tail_collectives": 0.0,
                     "param_gather": 0.0, "optimizer": opt * 1e-6} for r in range(p)])
    ev = step_events(res)
    comp = [e for e in ev if e.stream == "compute"]
    assert len(comp) == len(sim.timeline)
    acts = {(e.rank, e.name): e for e in comp}
    starts = {(e.rank, e.kind, e.microbatch, e.chunk): e.start for e in comp}
    for r in range(p):
        tp = [e for e in ev if e.rank == r and e.kind == "tp"]
        for e in tp:
            a = acts[(r, e.name.removeprefix("TP comm "))]
            assert a.start <= e.start <= e.end == a.end
        # each action's share is rounded to whole ns (a share under 0.5 ns is dropped)
        n_actions = sum(1 for e in comp if e.rank == r)
        assert sum(e.end - e.start for e in tp) == pytest.approx(m * v * per_vs * comm * 1e9,
                                                                abs=n_actions + 1)
        # (a send may end after its producer's last action: the tail does not wait for it)
        last = max(e.end for e in ev if e.rank == r and e.stream != "pp_comm")
        assert last == round(ends[r] * 1e9) + round(wait * 1e3) + round(opt * 1e3)
    for e in ev:
        if e.kind == "recv":
            kinds = ("F",) if "activation" in e.name else ("B", "BW")
            assert any(starts.get((e.rank, k, e.microbatch, e.chunk), -1) >= e.end for k in kinds)
    assert all(e.end - e.start == hop * 100 for e in ev if e.stream == "pp_comm")
