"""Mixture-of-experts plans run on 2 gloo ranks compute what one process computes (loss and
every parameter after the updates, fp32, executor.verify): data parallel, tensor parallel
with the aux loss (one micro-batch: the aux loss is per micro-batch and per rank, as
Megatron-Core computes it, so it matches one process only when both see the same tokens),
and expert parallel (experts split over dp: dispatch and combine by all_to_all), placed by
per-value annotations and by ``Strategy.ep``."""

from __future__ import annotations

import json

import pytest

from meshplan.plan import Plan
from meshplan.strategy import Strategy
from meshplan.validation import verify_many
from tests.completion.test_moe_program import TINY, _ep_annotation


@pytest.mark.slow
@pytest.mark.distributed
def test_moe_plans_verify_on_two_gloo_ranks(tmp_path):
    aux, plain = tmp_path / "aux.json", tmp_path / "plain.json"
    aux.write_text(json.dumps(TINY))
    plain.write_text(json.dumps({**TINY, "router_aux_loss_coef": 0.0}))

    def plan(model, **kw):
        return Plan(str(model), "cpu-local", Strategy(dtype="float32", optimizer="sgd", **kw), seq_len=32)

    cases = {
        "dp2": plan(plain, dp=2, micro_batch_size=1, global_batch_size=4),
        "tp2 aux": plan(aux, tp=2, micro_batch_size=2, global_batch_size=2),
        "ep2 annotated": plan(plain, dp=2, micro_batch_size=1, global_batch_size=4,
                              annotation=_ep_annotation(2)),
        "ep2 strategy": plan(plain, dp=2, ep=2, micro_batch_size=1, global_batch_size=4),
    }
    results = verify_many(list(cases.values()), 2)
    bad = [f"{n}: {r.summary()}" for n, r in zip(cases, results, strict=True) if not r.ok]
    assert not bad, "\n".join(bad)
    for r in results:
        assert len(r.losses) == 2 and r.losses[1] != r.losses[0] and r.param_errors


@pytest.mark.slow
@pytest.mark.distributed
def test_moe_plans_verify_on_four_gloo_ranks(tmp_path):
    """4 gloo ranks, fixed routing (the deterministic top-k of the seeded router, no aux
    loss): ep 2 below dp 4 -- two expert-data-parallel copies of the ep group's program
    (dp ranks 0-1 and 2-3, executor.expert_copies), each on its own rows, gradients averaged
    over the copies -- and ep 2 x tp 2 (dp 2 = ep, experts split over dp and each expert's
    GEMMs over tp) match one process: loss at both steps and every parameter (fp32 SGD)."""
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({**TINY, "router_aux_loss_coef": 0.0}))

    def plan(**kw):
        return Plan(str(plain), "cpu-local", Strategy(dtype="float32", optimizer="sgd", **kw), seq_len=32)

    cases = {
        "dp4 ep2": plan(dp=4, ep=2, micro_batch_size=1, global_batch_size=8),
        "dp2 ep2 tp2": plan(dp=2, ep=2, tp=2, micro_batch_size=1, global_batch_size=4),
    }
    results = verify_many(list(cases.values()), 4)
    bad = [f"{n}: {r.summary()}" for n, r in zip(cases, results, strict=True) if not r.ok]
    assert not bad, "\n".join(bad)
    for r in results:
        assert len(r.losses) == 2 and r.losses[1] != r.losses[0] and r.param_errors and not r.missing
