"""Mechanisms of collective exposure, pipeline p2p, gradient buckets and per-iteration work,
each against a value derived by hand (issue 14 items 5-8)."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.dp_stream import grad_reduce_end, last_backward
from simulator.pipeline_sim import simulate_pipeline
from simulator.profiles import load_profile
from simulator.result import TimelineEvent
from simulator.schedules import build_schedule
from simulator.streams import Kernel, exposed_time, overlapped_time, prefetched_chain

NS = 1e9


# -- two streams: a collective beside compute --------------------------------------------
def test_an_all_reduce_beside_a_gemm_runs_as_the_fluid_model_says():
    """GEMM 1 s alone, 1.25 s on the SMs a collective leaves (it holds 20% of them);
    all_reduce 0.5 s: 0.5 s side by side (the GEMM gets 0.5/1.25 = 40% done), then the
    remaining 60% at full speed: 0.6 s; together 1.1 s, 0.1 s more than the GEMM alone."""
    gemm = Kernel(1.0, 1.25)
    assert overlapped_time(0.5, [gemm]) == pytest.approx(1.1)
    assert exposed_time(0.5, [gemm]) == pytest.approx(0.1)
    # a collective longer than the window: the window runs contended, the rest is exposed
    assert overlapped_time(2.0, [gemm]) == pytest.approx(2.0)
    # nothing to overlap: fully exposed; an idle collective: the window at full speed
    assert overlapped_time(0.3, []) == pytest.approx(0.3)
    assert overlapped_time(0.0, [gemm, Kernel(0.5, 0.5)]) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        Kernel(1.0, 0.5)


def test_fsdp_prefetch_hides_all_gathers_but_the_first():
    """Three 1 s blocks with 0.5 s all_gathers: prefetched one block ahead only the first
    gather is exposed (0.5 + 3 = 3.5 s); without prefetch every one is (4.5 s); gathers of
    2 s (slower than compute) bound the chain: 2 + 2 + 2 + 1 = 7 s."""
    blocks = [Kernel(1.0, 1.0)] * 3
    assert prefetched_chain(blocks, [0.5] * 3, 1) == pytest.approx(3.5)
    assert prefetched_chain(blocks, [0.5] * 3, 0) == pytest.approx(4.5)
    assert prefetched_chain(blocks, [2.0] * 3, 1) == pytest.approx(7.0)
    # backward: gathers and reduce_scatters share one stream (by hand: gather 0 [0, .5];
    # block 0 [.5, 1.5] beside gather 1 [.5, 1]; reduce 0 [1.5, 2], gather 2 [2, 2.5]; block 1
    # [1.5, 2.5]; reduce 1 [2.5, 3]; block 2 [2.5, 3.5]; reduce 2 [3.5, 4]): 4 s
    assert prefetched_chain(blocks, [0.5] * 3, 1, [0.5] * 3) == pytest.approx(4.0)
    # contention: block 0 beside the 0.5 s gather runs 0.5 s at half speed (contended 2 s):
    # 0.5 + 0.75 = 1.25 s, so 0.5 + 1.25 + 1 = 2.75 s for two blocks
    assert prefetched_chain([Kernel(1.0, 2.0)] * 2, [0.5] * 2, 1) == pytest.approx(2.75)


# -- pipeline p2p ---------------------------------------------------------------------------
def test_a_synchronous_send_occupies_the_sender():
    """1F1B, p=2, m=1, T_F = T_B = 1 s, hop 0.25 s. Asynchronous: F0 [0,1], F1 [1.25,2.25],
    B1 [2.25,3.25], B0 [3.5,4.5]: 4.5 s. Synchronous: stage 0 also stays busy 0.25 s after
    its F (sending) and stage 1 after its B; the receiver still waits one hop, so the
    critical path is the same 4.5 s, but stage 0's busy time grows by 0.25 s and stage 1's
    by 0.25 s (the exchange occupies both stages)."""
    sched = build_schedule("1F1B", 2, 1)
    t = {"F": 1.0, "B": 1.0, "W": 0.0}
    a = simulate_pipeline(sched, t, 0.25)
    s = simulate_pipeline(sched, t, 0.25, p2p_sync=True)
    assert a.step_time == pytest.approx(4.5) and s.step_time == pytest.approx(4.5)
    assert [b - x for b, x in zip(s.busy_time, a.busy_time, strict=True)] == pytest.approx([0.25, 0.25])
    # with m = 2 the sender's busy send delays its own next action: stage 0 runs F0 [0,1],
    # sends [1,1.25], F1 of mb 1 ... the step is longer than asynchronous
    s2 = simulate_pipeline(build_schedule("1F1B", 2, 2), t, 0.25, p2p_sync=True)
    a2 = simulate_pipeline(build_schedule("1F1B", 2, 2), t, 0.25)
    assert s2.step_time > a2.step_time


def test_a_fused_backward_may_take_less_than_b_plus_w():
    sched = build_schedule("1F1B", 1, 2)
    r = simulate_pipeline(sched, {"F": 1.0, "B": 1.0, "W": 1.0, "BW": 1.5}, 0.0)
    assert r.step_time == pytest.approx(2 * (1.0 + 1.5))


# -- the data-parallel stream --------------------------------------------------------------
def _events(*spec):
    return [TimelineEvent(r, k, mb, c, c, round(s * NS), round(e * NS)) for r, k, mb, c, s, e in spec]


def test_gradient_buckets_reduce_during_the_last_backward():
    """One rank, its last BW action [1, 3] s; two buckets of 0.8 s each, ready at 50% and
    100% of the action: issued at 2 s and 3 s; the stream runs [2, 2.8] and [3, 3.8]: the
    gradients are synchronised at 3.8 s (0.8 s after the compute ends). Without overlap both
    run after the last action: [3, 4.6]."""
    tl = _events((0, "F", 0, 0, 0.0, 1.0), (0, "BW", 0, 0, 1.0, 3.0))
    buckets = {(0, 0): [(0.5, 0.8), (1.0, 0.8)]}
    assert grad_reduce_end(tl, 1, buckets, overlap=True) == pytest.approx([3.8])
    assert grad_reduce_end(tl, 1, buckets, overlap=False) == pytest.approx([4.6])
    # the last backward of a chunk is its last W (or BW), not an earlier B
    tl2 = _events((0, "B", 0, 0, 0.0, 1.0), (0, "W", 0, 0, 1.0, 2.0), (0, "B", 1, 0, 2.0, 3.0),
                  (0, "W", 1, 0, 3.0, 4.0))
    assert last_backward(tl2)[(0, 0)].end == round(4.0 * NS)


# -- the optimizer and fixed work ------------------------------------------------------------
def _cfg(profile: str, **kw):
    from simulator.step import StepConfig

    base = dict(dp=8, tp=1, pp=1, vpp=1, num_microbatches=4, schedule="1F1B", memory_limit=None,
                recompute="none", zero=1, param_bytes=2, grad_bytes=2, optimizer_bytes=12,
                boundary_bytes=0.0, tokens_per_step=1, peak_flops=1e15, dtype="bfloat16",
                profile=load_profile(profile))
    base.update(kw)
    return StepConfig(**base)


class _Roof:
    mem_bandwidth, mem_efficiency, kernel_overhead = 2e12, 0.5, 1e-5

    def memory_time(self, nbytes: float, op: str = "", phase: str = "") -> float:
        return nbytes / (self.mem_bandwidth * self.mem_efficiency)


def test_optimizer_bytes_per_parameter_by_profile():
    """Adam with fp32 master weights, ZeRO-1 over 8 ranks, P = 8e9: each rank updates 1e9
    parameters, reading and writing the bf16 weight (2), master + m + v (12) and reading
    the fp32 main gradient (4 under megatron-core): 2*(2+12)+4 = 32 bytes per parameter;
    32e9 B at 1e12 B/s = 32 ms, plus one fused kernel. The eager executor reads a bf16
    gradient (30 bytes) and launches one kernel per tensor."""
    from simulator.grad_sync import optimizer_time

    rf = _Roof()
    assert optimizer_time(_cfg("megatron-core"), rf, 8_000_000_000, 100) == pytest.approx(0.032 + 1e-5)
    eager = _cfg("eager", accumulate_grads=False)
    assert optimizer_time(eager, rf, 8_000_000_000, 100) == pytest.approx(0.030 + 100 * 1e-5)


def test_fixed_work_grad_norm_loss_scale_and_embedding_sync():
    """megatron-2021, fp16, pp=2 dp=8: the gradient norm reads the rank's fp32 main
    gradients (the fp16 gradients copied to fp32 for the step; ZeRO-1 shard: 1e9 x 4 B)
    once: 4 ms + a kernel, plus an all_reduce of one float over dp; the fp16 loss-scale
    check reads and writes them: 8 ms + a kernel; the tied embedding gradient (1e8
    elements, fp16: Megatron 2021 all_reduces the 16-bit gradient) is all_reduced between
    the two stages."""
    from clusters import load_cluster
    from simulator.grad_sync import fixed_time
    from simulator.stage_timing import stream_time

    cl = load_cluster("dgx-a100-80g", 2)
    rf = _Roof()
    cfg = _cfg("megatron-2021", pp=2, dtype="float16")
    norm_ar = cl.collective_time("all_reduce", 4, [0, 1, 2, 3, 4, 5, 6, 7])
    emb = cl.collective_time("all_reduce", 100_000_000 * 2, [0, 8])
    want = (stream_time(rf, 4e9) + 1e-5 + norm_ar) + (stream_time(rf, 8e9) + 1e-5) + emb
    assert fixed_time(cfg, cl, rf, 0, 8_000_000_000, 100_000_000) == pytest.approx(want)
    bf16 = dataclasses.replace(cfg, dtype="bfloat16")
    assert fixed_time(bf16, cl, rf, 0, 8_000_000_000, 100_000_000) == pytest.approx(want - stream_time(rf, 8e9) - 1e-5)
    # the middle of a pipeline (no embedding) and a profile without fixed work
    assert fixed_time(dataclasses.replace(cfg, pp=3), cl, rf, 1, 8_000_000_000, 100_000_000) \
        == pytest.approx(want - emb)
    assert fixed_time(_cfg("eager"), cl, rf, 0, 8_000_000_000) == 0.0


def test_gradient_buckets_follow_the_profile_bucket_size():
    """megatron-core buckets of 4e7 parameters, fp32 reduce, ZeRO-1: a chunk of 1e8
    parameters gives buckets of 4e7, 4e7, 2e7 (ready at 40%, 80%, 100% of its last
    backward), each a reduce_scatter of 4 bytes per element over the dp group. Megatron
    2021's local DDP all_reduces its one fp16 gradient buffer (2 bytes per element: no
    --accumulate-allreduce-grads-in-fp32) after the backward."""
    from clusters import load_cluster
    from simulator.grad_sync import grad_buckets

    cl = load_cluster("dgx-a100-80g", 1)
    got = grad_buckets(_cfg("megatron-core"), cl, 0, {0: 100_000_000})
    g = list(range(8))
    assert [f for f, _ in got[0]] == pytest.approx([0.4, 0.8, 1.0])
    assert [t for _, t in got[0]] == pytest.approx([cl.collective_time("reduce_scatter", 4e7 * 4, g)] * 2
                                                   + [cl.collective_time("reduce_scatter", 2e7 * 4, g)])
    plain = grad_buckets(_cfg("megatron-2021", zero=0), cl, 0, {0: 100_000_000})
    assert plain[0] == [(1.0, cl.collective_time("all_reduce", 1e8 * 2, g))]
    # FSDP-style ZeRO-3 reduces per block inside the backward: no end-of-step buckets
    assert grad_buckets(_cfg("fsdp2", zero=3), cl, 0, {0: 100_000_000}) == {}
