"""Robustness of Strategy / Plan / Engine: plans that cannot run (a head split across
tensor-parallel ranks, a sequence that sequence parallelism cannot split, a GEMM efficiency
outside (0, 1]) and malformed annotations fail up front naming the field (regressions found
by a break-it review)."""

from __future__ import annotations

import json

import pytest

from completion.plan_program import PlanProgramError
from meshplan.engine import Engine, EngineError
from meshplan.plan import Plan, PlanError
from meshplan.strategy import Strategy, StrategyError


@pytest.mark.parametrize("tp, field", [(3, "num_heads = 32"), (6, "num_heads = 32")])
def test_tp_must_divide_heads(tp, field):
    with pytest.raises(PlanProgramError, match=f"'tp' = {tp} does not divide model 'llama2-7b' {field}"):
        Engine("llama2-7b", "dgx-a100-80g", Strategy(tp=tp))


def test_tp_must_divide_kv_heads():
    # llama2-70b: 64 heads, 8 kv heads; tp=16 divides the heads but not the kv heads.
    with pytest.raises(PlanProgramError, match="num_kv_heads = 8"):
        Engine("llama2-70b", "dgx-a100-80g", Strategy(tp=16), nodes=2)


def test_sequence_parallel_needs_seq_divisible_by_tp():
    s = Strategy(tp=8, sequence_parallel=True)
    with pytest.raises(PlanProgramError, match="seq_len 4100 is not divisible by tp = 8"):
        Engine("llama2-7b", "dgx-a100-80g", s, seq_len=4100)
    Engine("llama2-7b", "dgx-a100-80g", s, seq_len=4096)  # divisible: accepted


@pytest.mark.parametrize("eff", [0.0, -0.5, 2.0, float("nan")])
def test_gemm_efficiency_out_of_range(eff):
    with pytest.raises(EngineError, match="gemm_efficiency must be in"):
        Engine("llama2-7b", "dgx-a100-80g", Strategy(), gemm_efficiency=eff)


@pytest.mark.parametrize("pl", [["Shard(x)"], ["Partial(prod)"], ["S(1"]])
def test_strategy_rejects_malformed_placements(pl):
    with pytest.raises(StrategyError, match="annotation"):
        Strategy(annotation={"w": pl})


def test_plan_annotations_are_validated():
    base = json.loads(Plan("llama2-7b", "dgx-a100-80g", Strategy()).to_json())
    with pytest.raises(PlanError, match="'annotations' must be a mapping"):
        Plan.from_dict({**base, "annotations": [1]})
    with pytest.raises(PlanError, match="plan field 'annotations'.*'w'"):
        Plan.from_dict({**base, "annotations": {"w": "R"}})
    ok = Plan.from_dict({**base, "annotations": {"w": ["R", "S(1)"]}})
    assert ok.annotations == {"w": ["R", "S(1)"]}
