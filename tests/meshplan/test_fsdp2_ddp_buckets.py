"""torchtitan without sharding (the fsdp2 profile at ZeRO 0) is torch DDP with 100 MiB
buckets all_reduced as the backward fills them (torchtitan 9dec370 ``apply_ddp``:
``replicate(model, bucket_cap_mb=100)``), not one all_reduce after the backward.

Before, the profile's bucket was the whole model (the FSDP path ignores it), so a dp-only
fsdp2 plan paid its full fp32 all_reduce exposed: Llama 2 7B on 8 A100s, 205 ms of a
1194 ms step, slower than ZeRO-3."""

from __future__ import annotations

import math

import pytest

from meshplan import Engine, Strategy
from simulator.grad_sync import grad_buckets


def test_dp_only_fsdp2_reduces_in_100_mib_buckets_hidden_behind_the_backward():
    s = Strategy(dp=8, micro_batch_size=1, global_batch_size=8, framework="fsdp2", zero=0)
    e = Engine("llama2-7b", "dgx-a100-80g", s)
    sm = e.step_model()
    params = sm.rank_params([0], synced=True)
    assert params == 6_738_415_616
    per = int(100 * 2**20 / 4)  # 100 MiB of fp32 gradients
    assert per == 26_214_400
    buckets = grad_buckets(sm.cfg, sm.cluster, 0, {0: params})[0]
    assert len(buckets) == math.ceil(params / per) == 258
    one = e.cluster.collective_time("all_reduce", per * 4, list(range(8)))
    assert buckets[0][1] == pytest.approx(one, rel=1e-9)
    res = sm.run()
    # only what the last backward cannot hide is exposed: at most the last bucket's
    assert 0 <= res.time_breakdown["dp_sync"] <= one * (1 + 1e-9)
