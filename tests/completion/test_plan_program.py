"""One plan pipeline: what the cost model costs is what the executor runs.

- ``Engine.plan_program()`` and ``executor.program.build_program`` print the same program
  for ZeRO, pipeline, interleaved and sequence-parallel plans (both call
  ``completion.plan_program.build_plan_program``; the Engine with the layer split it costed);
- the representative program the Engine costs (three layers, stage 0) holds exactly the
  ops of the whole program's first, middle and last layer (the last on the last stage's
  first rank): same op types, local shapes and layouts;
- both sides refuse an illegal plan with the same message (one legality check).
"""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from completion.pir import print_program
from completion.plan_program import PlanProgramError
from executor.program import build_program
from meshplan.engine import Engine
from meshplan.plan import Plan
from meshplan.strategy import Strategy
from simulator.blocks import assign_blocks
from simulator.op_signature import local_tensor

CONFIG = str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "plans" / "llama_l4.json")

PLANS = {
    "zero1 dp2 tp2 sp": Strategy(dp=2, tp=2, zero=1, sequence_parallel=True, micro_batch_size=1,
                                 global_batch_size=4, dtype="float32"),
    "zero2 dp4": Strategy(dp=4, zero=2, micro_batch_size=1, global_batch_size=8, dtype="float32"),
    "pp2 tp2 1F1B": Strategy(tp=2, pp=2, micro_batch_size=1, global_batch_size=4, dtype="float32"),
    "pp2 vpp2 VPP dp2": Strategy(dp=2, pp=2, vpp=2, schedule="VPP", micro_batch_size=1,
                                 global_batch_size=8, dtype="float32"),
    "pp2 ZBVPP tp2 sp zero1": Strategy(tp=2, pp=2, vpp=2, schedule="zbvpp", zero=1,
                                       sequence_parallel=True, micro_batch_size=1,
                                       global_batch_size=4, dtype="float32"),
}


def _plan(strategy: Strategy) -> Plan:
    return Plan(CONFIG, "dgx-a100-80g", strategy, seq_len=64)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_engine_and_executor_build_the_same_program(name):
    plan = _plan(PLANS[name])
    eng = Engine.from_plan(plan)
    ours = eng.plan_program()
    executed = build_program(dataclasses.replace(plan, strategy=eng.resolved_strategy()))
    assert print_program(ours.program) == print_program(executed.program)
    assert ours.strategy == executed.strategy
    if plan.strategy.zero and plan.strategy.dp > 1:  # ZeRO completed on both sides: moments dp-sharded
        moments = [v for v in ours.program.values() if (v.name or "").endswith("moment1_0")]
        assert moments and all(0 in v.dist_attr.dims_mapping for v in moments)
    if plan.strategy.pp > 1:
        assert any(op.type in ("send", "recv") for op in ours.program.ops)


def _layer_kernels(prog, layer: int = 0, rank: int = 0) -> list[tuple]:
    """(type, role, local operand/result shapes, layouts) of a layer's forward and backward
    kernel ops on ``rank``, in program order (reshard ops and the collectives they resolve
    into left out: the whole program's are resolved, the costed one's are planned by the
    cost model from the same reshard ops; layouts compared without their mesh)."""
    blocks = assign_blocks(prog)
    out = []
    for op in prog.ops:
        if blocks.get(id(op)) != layer or op.type == "reshard" or op.dialect == "dist_op":
            continue
        vals = [v for v in (*op.operands, *op.results) if v is not None]
        out.append((op.type, op.role.name,
                    tuple(local_tensor(v, rank).shape for v in vals),
                    tuple(repr(v.dist_attr.placements) if v.dist_attr else None for v in vals)))
    return out


@pytest.mark.parametrize("name", ["zero1 dp2 tp2 sp", "pp2 tp2 1F1B", "pp2 ZBVPP tp2 sp zero1"])
def test_the_costed_layer_is_the_executed_layer(name):
    eng = Engine.from_plan(_plan(PLANS[name]))
    costed = eng.costed_program()
    assert costed.representative and costed.annotated
    whole = eng.plan_program().program
    rep = _layer_kernels(costed.program, 0)
    assert len(rep) > 20  # a whole decoder layer, forward and backward
    assert rep == _layer_kernels(whole, 0)
    last_rank = (PLANS[name].pp - 1) * PLANS[name].dp * PLANS[name].tp
    assert _layer_kernels(costed.program, 1) == _layer_kernels(whole, 1)  # a middle layer
    assert _layer_kernels(costed.program, 2) == _layer_kernels(whole, 3, last_rank)
    # the last layer sums no output gradient (one add_n less than a middle layer)
    n_add = [sum(k[0] == "add_n" for k in _layer_kernels(costed.program, i)) for i in range(3)]
    assert n_add[2] == n_add[1] - 1
    reshards = [op for op in costed.program.ops if op.type == "reshard"
                and assign_blocks(costed.program).get(id(op)) == 0]
    if PLANS[name].sequence_parallel:  # SP: gathers before, reduce_scatters after the TP GEMMs
        assert reshards


def test_a_pure_data_parallel_layer_costs_the_local_shapes_of_the_executed_one():
    eng = Engine.from_plan(_plan(PLANS["zero2 dp4"]))
    costed = eng.costed_program()
    assert not costed.annotated and costed.batch == 1  # one micro-batch, no dist attrs
    rep = [k[:3] for k in _layer_kernels(costed.program)]
    assert rep == [k[:3] for k in _layer_kernels(eng.plan_program().program)]


def test_one_legality_check_refuses_an_illegal_plan_on_both_sides():
    bad = _plan(Strategy(tp=3, micro_batch_size=1, global_batch_size=1, dtype="float32"))
    with pytest.raises(PlanProgramError, match="'tp' = 3 does not divide model .* num_heads = 4") as a:
        Engine.from_plan(bad)
    with pytest.raises(PlanProgramError) as b:
        build_program(bad)
    assert str(a.value) == str(b.value)


def test_an_uneven_layer_split_reaches_the_executed_program():
    s = PLANS["pp2 tp2 1F1B"].replace(layers_per_stage=(1, 3))
    prog = build_program(_plan(s)).program
    blocks = assign_blocks(prog)
    stage_of = {}
    for op in prog.ops:
        blk = blocks.get(id(op))
        if isinstance(blk, int) and op.dist_attr is not None and op.dialect != "dist_op" \
                and op.type not in ("reshard", "send", "recv"):
            stage_of.setdefault(blk, set()).add(op.dist_attr.process_mesh.process_ids[0] // 2)
    assert stage_of == {0: {0}, 1: {1}, 2: {1}, 3: {1}}
    with pytest.raises(PlanProgramError, match="sums to 3, but model .* has 4 layers"):
        Engine.from_plan(_plan(PLANS["pp2 tp2 1F1B"].replace(layers_per_stage=(1, 2))))


@pytest.mark.parametrize("kw", [
    dict(dp=4, tp=2, sequence_parallel=True, zero=1, pp=2, schedule="ZBH1"),
    dict(dp=8, zero=3, recompute="full"),
    dict(dp=2, tp=2, pp=2, vpp=2, schedule="VPP", recompute="selective"),
])
def test_block_costs_do_not_depend_on_pp_schedule_or_zero(kw):
    """The cost cache's premise (simulator.program_costs.costing_strategy): the
    representative program of the plan itself and that of its costing strategy (pp = 1,
    1F1B, no ZeRO) cost the same on rank 0."""
    from simulator.program_costs import ProgramCosts, costing_strategy

    s = Strategy(micro_batch_size=1, global_batch_size=kw["dp"] * 4, dtype="float32", **kw)
    eng = Engine(CONFIG, "dgx-a100-80g", s, nodes=2, seq_len=64)
    direct = ProgramCosts.of(eng.costed_program(), eng.cluster, eng.roofline, 4)
    from completion.plan_program import build_plan_program

    cheap = ProgramCosts.of(build_plan_program(eng.source, costing_strategy(s), representative=True,
                                               resolve_reshards=False), eng.cluster, eng.roofline, 4)
    assert cheap == direct
    assert eng.program_costs() == direct
