"""Capacity factor / token dropping and a load imbalance factor as plan options (issue 21):
the expert slots a plan builds, costs and executes are ceil(min(c, f) * s * k / E) per
expert per sequence (``completion.strategy.Strategy.expert_slot_factor``)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from completion.models.source import resolve_model
from completion.plan_program import build_plan_program
from completion.strategy import Strategy, StrategyError
from tests._cli import run_main
from tests.completion.test_moe_program import TINY


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    p = tmp_path_factory.mktemp("routing") / "moe.json"
    p.write_text(json.dumps({**TINY, "router_aux_loss_coef": 0.0}))
    return str(p)


def _a2a(tiny: str, **kw) -> list[int]:
    s = Strategy(dp=2, ep=2, micro_batch_size=1, global_batch_size=4, **kw)
    prog = build_plan_program(resolve_model(tiny, 32), s, representative=True).program
    return [op.attrs["nbytes"] for op in prog.ops if op.type == "all_to_all"]


@pytest.mark.parametrize(("kw", "slots"), [
    ({}, 16),                                                      # ceil(32 * 2 / 4)
    ({"moe_load_imbalance": 1.5}, 24),                             # dropless, busiest at 1.5x
    ({"moe_load_imbalance": 1.5, "moe_capacity_factor": 1.25}, 20),  # capped by the capacity
    ({"moe_capacity_factor": 0.5}, 8),                             # drops half the pairs
])
def test_expert_slots_and_all_to_all_bytes_by_hand(tiny, kw, slots):
    """TINY (E 4, top-2, h 64) at s 32, mbs 1, dp = ep = 2: C = ceil(min(c, f) * 32 * 2 / 4)
    slots per expert per sequence; the dispatch all_to_all leaves [E/ep 2, ep x C, 64] bf16
    on each rank: 2 * 2C * 64 * 2 bytes (8,192 at C = 16), each of the 8 a step."""
    s = Strategy(dp=2, ep=2, micro_batch_size=1, global_batch_size=4, **kw)
    assert math.ceil(s.expert_slot_factor * 32 * 2 / 4) == slots
    assert _a2a(tiny, **kw) == [2 * (2 * slots) * 64 * 2] * 8


def test_cost_cli_takes_the_routing_options(tiny, capsys):
    base = ["cost", "--model", tiny, "--cluster", "dgx-h100", "--dp", "2", "--ep", "2",
            "--global-batch", "4", "--seq-len", "32", "--json"]
    rc, out, err = run_main(capsys, *base)
    assert rc == 0, err
    even = json.loads(out)["step_time_ms"]
    rc, out, err = run_main(capsys, *base, "--moe-load-imbalance", "2")
    assert rc == 0, err
    assert json.loads(out)["step_time_ms"] > even
    rc, out, err = run_main(capsys, *base, "--moe-load-imbalance", "0.5")
    assert rc == 2 and "--moe-load-imbalance" in err and "[1, 64]" in err
    rc, out, err = run_main(capsys, *base, "--moe-expert-capacity-factor", "0")
    assert rc == 2 and "--moe-expert-capacity-factor" in err


@settings(max_examples=40, deadline=None)
@given(c=st.one_of(st.none(), st.floats(0.05, 64)), f=st.floats(1, 64))
def test_slot_factor_is_the_load_capped_by_the_capacity(c, f):
    s = Strategy(moe_capacity_factor=c, moe_load_imbalance=f)
    assert s.expert_slot_factor == (f if c is None else min(c, f))
    assert Strategy.from_dict(s.to_dict()) == s


def test_bad_routing_fields_are_refused_naming_them():
    with pytest.raises(StrategyError, match="'moe_capacity_factor' must be a number in"):
        Strategy(moe_capacity_factor=-1.0)
    with pytest.raises(StrategyError, match="'moe_load_imbalance' must be a number in"):
        Strategy(moe_load_imbalance=True)


def test_padding_is_executed_not_model_flops_and_impossible_loads_are_refused(tiny):
    """An imbalance f pads every expert to the busiest's load: the kernels run f x the
    routed rows (executed FLOPs, and the step, grow) while the model FLOPs stay the routed
    tokens' (b s k per layer), so MFU falls instead of rising. TINY (E 4, top-2) at s 32:
    C = ceil(32 * 2 / 4) = 16 slots, 32 at f = 2; the expert GEMMs' forward model FLOPs per
    layer 3 x 2 x (E 4 x 16 rows) x 64 x 32 = 786,432 either way. f above E / k = 2 (more
    than every token on one expert) and routing options on a dense model are refused."""
    from completion.plan_program import PlanProgramError, check_plan
    from meshplan import Engine

    runs = {}
    for f in (1.0, 2.0):
        s = Strategy(dp=2, ep=2, micro_batch_size=1, global_batch_size=4, moe_load_imbalance=f)
        runs[f] = Engine(tiny, "dgx-h100", s, seq_len=32).simulate()
    even, busy = runs[1.0], runs[2.0]
    assert busy.model_flops == pytest.approx(even.model_flops, rel=1e-12)
    assert busy.executed_flops > even.executed_flops and busy.step_time > even.step_time
    assert busy.mfu < even.mfu
    # full recompute reruns the forward, padding included: more padded FLOPs executed
    full = {f: Engine(tiny, "dgx-h100", Strategy(dp=2, ep=2, micro_batch_size=1, global_batch_size=4,
                                                  moe_load_imbalance=f, recompute="full"), seq_len=32).simulate()
            for f in (1.0, 2.0)}
    assert full[2.0].model_flops == pytest.approx(full[1.0].model_flops, rel=1e-12)
    assert (full[2.0].executed_flops - full[1.0].executed_flops
            > busy.executed_flops - even.executed_flops)
    assert 3 * 2 * (4 * 16) * 64 * 32 == 786_432
    src = resolve_model(tiny, 32)
    with pytest.raises(PlanProgramError, match="'moe_load_imbalance' = 2.5 is above num_experts / top-k = 4 / 2 = 2"):
        check_plan(src, Strategy(dp=2, ep=2, micro_batch_size=1, global_batch_size=4, moe_load_imbalance=2.5))
    with pytest.raises(PlanProgramError, match="'moe_capacity_factor' is set but model 'llama2-7b' has no"):
        check_plan(resolve_model("llama2-7b", 32, num_layers=1),
                   Strategy(micro_batch_size=1, global_batch_size=1, moe_capacity_factor=1.25))


def test_dropped_tokens_are_not_model_flops_so_mfu_stays_below_the_executed(tiny):
    """A capacity below 1 drops routed pairs: every slot holds a routed token and the
    dropped ones are not computed, so the model FLOPs are the executed ones (before, the
    model FLOPs were the executed / c: at c = 0.001 the MFU of Qwen3-30B-A3B read 110%).
    TINY at s 32: c 0.5 keeps ceil(0.5 * 16) = 8 slots of 16, and its expert FLOPs are half
    of c 1's; the model FLOPs fall with them and never exceed the executed."""
    from meshplan import Engine

    def run(c: float):
        s = Strategy(dp=2, ep=2, micro_batch_size=1, global_batch_size=4, moe_capacity_factor=c)
        return Engine(tiny, "dgx-h100", s, seq_len=32).simulate()

    full, half, tiny_c = run(1.0), run(0.5), run(1e-6)
    for r in (full, half, tiny_c):
        assert r.model_flops == pytest.approx(r.executed_flops, rel=1e-12)
        assert 0 < r.mfu < 1
    assert tiny_c.model_flops < half.model_flops < full.model_flops
