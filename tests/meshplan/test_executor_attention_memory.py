"""The executor's attention kernel materialises the attention scores inside the op, which the
prediction (costed with FlashAttention's memory) does not hold: ``validate``'s pre-launch
host check adds them (``meshplan.validation.executor_attention_bytes``).

Before, a long sequence passed the check and the ranks were killed by the kernel's OOM
killer (llama2-7b, one layer, s 32768 on one CPU rank: 27.7 GiB predicted, 640 GiB of fp32
scores inside the backward)."""

from __future__ import annotations

import pytest

from completion.models.source import resolve_model
from meshplan.plan import Plan
from meshplan.strategy import Strategy
from meshplan.validation import EXECUTOR_SCORE_TENSORS, check_fits_host, executor_attention_bytes


def _s(**kw):
    base = {"dp": 1, "micro_batch_size": 1, "global_batch_size": 1}
    return Strategy(**{**base, **kw})


def test_scores_by_hand():
    """5 fp32 tensors of micro-batch x local heads x s_q x s_k: llama2-7b (32 heads) at s 4096,
    micro-batch 2, tp 2: 5 x 2 x 16 x 4096^2 x 4 = 10,737,418,240 bytes; cp 2 ring blocks
    (s/2)^2, all-gathered K/V s/2 x s; the same fp32 scores for a bf16 plan."""
    src = resolve_model("llama2-7b", 4096)
    assert EXECUTOR_SCORE_TENSORS == 5
    assert executor_attention_bytes(src, _s(tp=2, micro_batch_size=2, global_batch_size=2)) == 10_737_418_240
    ring = executor_attention_bytes(src, _s(cp=2))
    assert ring == 5 * 32 * 2048 * 2048 * 4
    assert executor_attention_bytes(src, _s(cp=2, cp_comm="all_gather")) == 2 * ring
    assert executor_attention_bytes(src, _s(dtype="bfloat16")) == 5 * 32 * 4096 * 4096 * 4
    assert executor_attention_bytes(src, _s(attention="unfused")) == 0  # no flash_attention op


def _peak_bytes(s: int) -> int:
    """Peak bytes of live CPU tensors during the backward of one head (d 64) at sequence s,
    counted by torch's own tensor-memory tracker (every storage created inside, freed when
    its last reference goes): deterministic, unlike the process's resident memory."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from executor.kernels.attention import _flash_attention, _flash_attention_grad
    from executor.kernels.base import KernelContext

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, s, 1, 64) for _ in range(3))
    o, _, lse, _ = _flash_attention([q, k, v], {"causal": True}, KernelContext())
    g = torch.randn_like(o)
    tracker = MemTracker()
    with tracker:
        grads = _flash_attention_grad([q, k, v, o, lse, None, g], {"causal": True}, KernelContext())
        del grads
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def test_the_kernel_holds_five_fp32_score_tensors():
    """The backward's peak is A s^2 + B s bytes (the s x s score-sized tensors and the
    s x d ones); from s and 2s, A = (P(2s) - 2 P(s)) / (2 s^2) = 20 bytes: five fp32 score
    tensors (scores, P, dP, dP - D, dS) live at once, the count the host check uses.
    Measured before with the process's peak RSS at s 6144 (5.0, but 5.7-6.0 under a
    loaded host); now by counting tensors."""
    s = 1024
    quadratic = (_peak_bytes(2 * s) - 2 * _peak_bytes(s)) / (2 * s * s)
    assert quadratic == EXECUTOR_SCORE_TENSORS * 4


def test_host_check_counts_the_scores(monkeypatch):
    """A plan whose tensors fit the host but whose scores do not is refused before launch,
    naming the scores; without them it passes."""
    import meshplan.validation as v
    from executor import LaunchError

    pred = {"max_memory_bytes": 2**30, "executor_attention_bytes": 3 * 2**30}
    monkeypatch.setattr(v, "host_memory_bytes", lambda: 5 * 2**30)
    check_fits_host({"max_memory_bytes": 2**30}, 2, "gloo")  # 2 GiB of 5: fits
    with pytest.raises(LaunchError, match=r"1.00 GiB per rank \(predicted\) \+ 3.00 GiB of attention "
                                          r"scores .* 8.00 GiB for 2 ranks; this machine has 5.00 GiB"):
        check_fits_host(pred, 2, "gloo")
    check_fits_host(pred, 2, "nccl")  # a GPU run: the host's memory is not the limit


def test_predict_carries_the_scores():
    """``predict`` of a one-layer llama2-7b plan at s 32768 on the CPU cluster: 640 GiB of
    scores (5 x 32 x 32768^2 x 4), beside its 27.7 GiB of tensors."""
    from meshplan.validation import predict

    plan = Plan(model="llama2-7b", cluster="cpu-local", strategy=_s(dtype="float32"), seq_len=32768,
                num_layers=1)
    pred, _ = predict(plan)
    assert pred["executor_attention_bytes"] == 5 * 32 * 32768**2 * 4 == 640 * 2**30
    assert 20 * 2**30 < pred["max_memory_bytes"] < 40 * 2**30


def test_verify_checks_its_one_process_reference(monkeypatch):
    """The break-it pass: validate's numerics check runs the whole global batch on one
    process (single_process_strategy), which no host check covered: dp 1 tp 2 mbs 1 gbs 8,
    s 2048, one layer: 2 ranks of about 5.6 GiB passed, the reference needs about 17 GiB +
    20 GiB of scores (5 x 8 x 32 x 2048^2 x 4)."""
    import meshplan.validation as v
    from executor import LaunchError

    plan = Plan(model="llama2-7b", cluster="cpu-local", seq_len=2048, num_layers=1,
                strategy=_s(tp=2, global_batch_size=8, dtype="float32"))
    ref = v.reference_plan(plan)
    assert (ref.strategy.tp, ref.strategy.dp, ref.strategy.micro_batch_size) == (1, 1, 8)
    pred, _ = v.predict(ref)
    assert pred["executor_attention_bytes"] == 5 * 8 * 32 * 2048**2 * 4 == 20 * 2**30
    monkeypatch.setattr(v, "host_memory_bytes", lambda: 24 * 2**30)
    with pytest.raises(LaunchError, match="verify's one-process reference needs"):
        v.verify(plan, 2)
