"""Work an exhaustive search shares across candidates gives the costs building each one
alone gives, bit for bit: the representative program and its block costs shared by the
recompute modes of a layout (``Engine.shared_program``), block times memoised per block
(``BlockCost.times``)."""

from __future__ import annotations

import pytest

from clusters import load_cluster
from completion.plan_program import build_plan_program
from completion.strategy import RECOMPUTE, Strategy
from meshplan.engine import COSTS, PROGRAMS, Engine
from simulator.program_costs import ProgramCosts, costing_strategy


def _alone(e: Engine) -> ProgramCosts:
    """The costs of ``e``'s plan built from its own program (no shared cache)."""
    cs = costing_strategy(e.strategy)
    prog = build_plan_program(e.source, cs, representative=True, resolve_reshards=False)
    return ProgramCosts.of(prog, e.cluster, e.roofline, e.source.num_layers, e.profile)


@pytest.mark.parametrize("framework", ["megatron-core", "fsdp2"])
def test_shared_program_costs_equal_the_costs_alone(framework):
    """Llama 2 7B (4 layers), tp 2 x dp 2 with sequence parallelism and tp 2 x dp 1: every
    recompute mode's ProgramCosts, built through the program shared by the modes, equals
    (dataclass equality: every float of every block, activation table and FLOP count) the
    costs of a program built for that mode alone."""
    COSTS.clear()
    PROGRAMS.clear()
    cluster = load_cluster("dgx-a100-80g")  # one Cluster: the caches key it by identity
    for dp in (1, 2):
        for rc in RECOMPUTE:
            s = Strategy(dp=dp, tp=2, sequence_parallel=True, recompute=rc, micro_batch_size=2,
                         global_batch_size=2 * dp, framework=framework)
            e = Engine("llama2-7b", cluster, s, num_layers=4)
            assert e.program_costs() == _alone(e), (dp, rc)
    assert len(PROGRAMS._items) == 2  # one program per layout, whatever the recompute mode


def test_block_times_memo_returns_fresh_equal_dicts():
    """``BlockCost.times`` gives the same values on every call, as new dicts (callers add
    recompute to them), and a second profile gets its own values."""
    from simulator.profiles import load_profile

    e = Engine("llama2-7b", "dgx-a100-80g", Strategy(tp=2, sequence_parallel=True), num_layers=2)
    blk = e.program_costs().layers[0]
    a, b = blk.times(e.profile, 0.0), blk.times(e.profile, 0.0)
    assert a == b and a is not b
    assert a == blk._times(e.profile, 0.0)
    a["B"] += 1.0
    assert blk.times(e.profile, 0.0) == b
    other = load_profile("megatron-2021")
    assert blk.times(other, 0.0) == blk._times(other, 0.0)


def test_expert_group_program_shared_by_dp():
    """Mixtral (2 layers) at ep 2: dp 4 and dp 8 plans are one ep group's program run as
    dp / ep copies; their ProgramCosts through the shared program equal those of programs
    built alone (model FLOPs scale with the copies), and one program serves both."""
    COSTS.clear()
    PROGRAMS.clear()
    cluster = load_cluster("dgx-h100", 2)
    for dp in (4, 8):
        s = Strategy(dp=dp, tp=2, ep=2, sequence_parallel=True, micro_batch_size=1, global_batch_size=dp,
                     annotation="megatron")
        e = Engine("mixtral-8x7b", cluster, s, num_layers=2, seq_len=2048)
        assert e.program_costs() == _alone(e), dp
    assert len(PROGRAMS._items) == 1
