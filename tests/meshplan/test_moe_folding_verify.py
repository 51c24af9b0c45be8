"""MoE parallel folding (issue 42) on gloo ranks computes what one process computes (loss at
both steps and every parameter, fp32 SGD, ``executor.verify``; TINY, a small Qwen2-MoE):

- 2 ranks: tp 2, ep 2, etp 1 (the experts split over the tensor-parallel ranks, whole);
  cp 2, ep 2 (the experts split over the context-parallel ranks);
- 4 ranks: dp 2, tp 2, ep 4, etp 1 (ep above dp: one whole expert per rank over dp x tp);
  dp 2, tp 2, ep 2, etp 1 (ep groups = tensor-parallel pairs, two expert-data-parallel
  copies, ``executor.expert_copies``).

The cp plan runs with room for every token (``moe_capacity_factor`` and
``moe_load_imbalance`` E / k = 2: a slot per token and expert): the executor's default
slots are the uniform share per sequence, and splitting each sequence over cp ranks would
drop other tokens than one process does (its capacity counts per half sequence)."""

from __future__ import annotations

import json

import pytest

from meshplan.plan import Plan
from meshplan.strategy import Strategy
from meshplan.validation import verify_many
from tests.completion.test_moe_program import TINY


def _plans(tmp_path, cases: dict[str, dict]) -> dict[str, Plan]:
    f = tmp_path / "tiny.json"
    f.write_text(json.dumps({**TINY, "router_aux_loss_coef": 0.0}))
    return {n: Plan(str(f), "cpu-local", Strategy(dtype="float32", optimizer="sgd", **kw), seq_len=32)
            for n, kw in cases.items()}


def _check(plans: dict[str, Plan], nproc: int) -> None:
    results = verify_many(list(plans.values()), nproc)
    bad = [f"{n}: {r.summary()}" for n, r in zip(plans, results, strict=True) if not r.ok]
    assert not bad, "\n".join(bad)
    for r in results:
        assert len(r.losses) == 2 and r.losses[1] != r.losses[0] and r.param_errors and not r.missing


@pytest.mark.slow
@pytest.mark.distributed
def test_folded_experts_verify_on_two_gloo_ranks(tmp_path):
    _check(_plans(tmp_path, {
        "tp2 ep2 etp1": dict(tp=2, ep=2, etp=1, micro_batch_size=2, global_batch_size=2),
        "cp2 ep2": dict(cp=2, ep=2, micro_batch_size=1, global_batch_size=2, moe_capacity_factor=2.0,
                        moe_load_imbalance=2.0),
    }), 2)


@pytest.mark.slow
@pytest.mark.distributed
def test_folded_experts_verify_on_four_gloo_ranks(tmp_path):
    _check(_plans(tmp_path, {
        "dp2 tp2 ep4 etp1": dict(dp=2, tp=2, ep=4, etp=1, micro_batch_size=1, global_batch_size=4),
        "dp2 tp2 ep2 etp1": dict(dp=2, tp=2, ep=2, etp=1, micro_batch_size=1, global_batch_size=4),
    }), 4)
