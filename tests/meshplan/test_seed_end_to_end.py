"""The seed program end to end (issue 10 item 3): ``mlp_sgd_before_partition.pir`` (a program
text annotated on a 1-D mesh of ranks 0, 1: parameter_0 column-split, parameter_1
row-split) as the model of ``meshplan complete``, ``meshplan cost`` and ``meshplan
validate`` and of a 2-rank ``verify`` run (``meshplan.validation.verify``), with the strategy matching its mesh
(dp=1, tp=2 on 2 ranks).

Reference values: the reshards are those of the seed's ``mlp_sgd_after_partition.pir``;
FLOPs are counted by hand; losses come from a numpy float64 run of the same MLP
(x -> relu -> @W0 -> relu -> @W1 -> relu, mean squared error against the label, SGD with
the executor's default learning rate 0.1) on the executor's seeded data.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from clusters import load_cluster
from completion.pir import parse_program, print_program
from executor.data import DEFAULT_LR, input_value, parameter_value
from executor.program import PlanProgramError, build_program
from meshplan.cli import main
from meshplan.engine import Engine
from meshplan.plan import Plan
from meshplan.strategy import Strategy
from tests.conftest import SHARED

PROGRAMS = SHARED / "data" / "programs"
SEED = str(PROGRAMS / "mlp_sgd_before_partition.pir")
# dp=1, tp=2: the program's mesh; its batch (4 rows) is one micro-batch
STRATEGY = dict(tp=2, micro_batch_size=4, global_batch_size=4, dtype="float32", optimizer="sgd")
COST_ARGS = ["cost", "--model", SEED, "--cluster", "cpu-local", "--mp", "2", "--global-batch", "4",
             "--micro-batch-size", "4", "--dtype", "float32", "--json"]
# By hand (simulator.op_cost conventions: GEMM 2mnk, elementwise 1 FLOP per element of the
# largest tensor, its grad 2): forward relu 64 + matmul 2*4*16*16 + relu 64 + matmul
# 2*4*16*8 + relu 32 + subtract 32 + square 32 + mean 32 = 3328; backward mean/square/
# subtract/relu grads 4 * 2*32 + matmul_grad 2 * 1024 + relu_grad 2*64 + matmul_grad
# 2 * 2048 + relu_grad 2*64 = 6656.
SEED_FLOPS = 3328 + 6656


def _plan() -> Plan:
    return Plan(SEED, "cpu-local", Strategy(**STRATEGY))


def numpy_losses(steps: int, seed: int = 0) -> list[float]:
    """Loss of each of ``steps`` SGD steps of the seed MLP in float64 numpy, on the data the
    executor generates for ``seed``."""
    prog = parse_program(open(SEED).read())
    vals = {v.name: v for v in prog.values() if v.name}
    x = input_value(seed, vals["input0"], (4, 16)).double().numpy()
    y = input_value(seed, vals["label0"], (4, 8)).double().numpy()
    w0 = parameter_value(seed, "parameter_0", (16, 16), "float32").double().numpy()
    w1 = parameter_value(seed, "parameter_1", (16, 8), "float32").double().numpy()
    out = []
    for _ in range(steps):
        a0 = np.maximum(x, 0)
        h1 = a0 @ w0
        a1 = np.maximum(h1, 0)
        h2 = a1 @ w1
        d = np.maximum(h2, 0) - y
        out.append(float(np.mean(d * d)))
        dh2 = 2 * d / d.size * (h2 > 0)
        dw1 = a1.T @ dh2
        dw0 = a0.T @ ((dh2 @ w1.T) * (h1 > 0))
        w0, w1 = w0 - DEFAULT_LR * dw0, w1 - DEFAULT_LR * dw1
    return out


def test_engine_partition_inserts_the_seed_reshards():
    eng = Engine(SEED, "cpu-local", Strategy(**STRATEGY))
    prog = eng.partition()
    prog.renumber()
    after = (PROGRAMS / "mlp_sgd_after_partition.pir").read_text()
    assert print_program(prog).strip() == after.strip()
    reshards = [op for op in prog.ops if op.type == "reshard"]
    assert [op.operands[0].shape for op in reshards] == [(4, 8), (4, 16)]
    # both turn Partial(sum) into Replicate on mesh dim 0 (an all_reduce)
    assert [repr(op.operands[0].dist_attr.placements) for op in reshards] == ["(Partial(sum),)"] * 2
    assert [repr(op.results[0].dist_attr.placements) for op in reshards] == ["(Replicate(),)"] * 2


def test_reshard_pass_resolves_two_all_reduces():
    pp = build_program(_plan())
    colls = [op for op in pp.program.ops if op.dialect == "dist_op"]
    assert [op.type for op in colls] == ["all_reduce", "all_reduce"]
    assert [op.attrs["groups"] for op in colls] == [[[0, 1]], [[0, 1]]]
    assert [op.attrs["nbytes"] for op in colls] == [4 * 8 * 4, 4 * 16 * 4]  # fp32 bytes


def test_complete_cli_takes_the_program_as_model(capsys):
    assert main(["complete", "--model", SEED, "--summary-only"]) == 0
    out = capsys.readouterr().out
    assert "pd_op.matmul [] stage 0/chunk 0: (S(1)) (S(0)) -> (P(sum))" in out
    assert "// operands needing a reshard: 2" in out


def test_cost_cli_on_the_seed_program(capsys):
    assert main(COST_ARGS) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["model_flops_per_step"] == SEED_FLOPS
    assert got["step_time_ms"] > 0
    # the two all_reduces (128 and 256 bytes on ranks 0, 1) are the tensor-parallel comm
    cl = load_cluster("cpu-local")
    ar = cl.collective_time("all_reduce", 128, [0, 1]) + cl.collective_time("all_reduce", 256, [0, 1])
    assert got["time_breakdown_s"]["tp_comm"] == pytest.approx(ar, rel=1e-9)
    # parameters split in two: (16*8 + 16*16) fp32 / 2 ranks
    assert got["memory_breakdown_bytes"]["params"] == (16 * 8 + 16 * 16) * 4 // 2


def test_one_rank_costs_the_program_unsharded_and_a_mismatch_is_refused():
    res = Engine(SEED, "cpu-local", Strategy(dtype="float32", global_batch_size=4,
                                             micro_batch_size=4)).simulate()
    assert res.memory_breakdown["params"] == (16 * 8 + 16 * 16) * 4
    assert res.time_breakdown["tp_comm"] == 0.0
    with pytest.raises(PlanProgramError, match=r"annotated for ranks \[0, 1\].*dp\*tp = 1\*4"):
        Engine(SEED, "dgx-a100-80g", Strategy(tp=4, micro_batch_size=4, global_batch_size=4)).simulate()
    bad = Plan(SEED, "cpu-local", Strategy(**{**STRATEGY, "tp": 1, "pp": 2}))
    with pytest.raises(PlanProgramError, match=r"annotated for ranks \[0, 1\]"):
        build_program(bad)


def test_numpy_reference_descends():
    losses = numpy_losses(3)
    assert losses[0] > losses[1] > losses[2] > 0


@pytest.mark.distributed
def test_verify_two_ranks_matches_numpy():
    from meshplan.validation import verify

    r = verify(_plan(), 2, steps=2)
    assert r.ok, r.summary()
    assert sorted(r.param_errors) == ["parameter_0", "parameter_1"]
    np.testing.assert_allclose(r.losses, numpy_losses(2), rtol=1e-5)


@pytest.mark.distributed
def test_validate_cli_on_the_seed_plan(tmp_path, capsys):
    path = _plan().save(tmp_path / "plan.json")
    rc = main(["validate", str(path), "--nproc", "2", "--steps", "2", "--json",
               "--csv", str(tmp_path / "v.csv")])
    assert rc == 0
    got = json.loads(capsys.readouterr().out)
    np.testing.assert_allclose(got["losses"], numpy_losses(4)[2:], rtol=1e-5)  # after 2 warmup
    # validate predicts the executor's own way of running a step: the eager profile
    plan = _plan()
    eager = dataclasses.replace(plan, strategy=plan.strategy.replace(framework="eager"))
    t_ms, peak = Engine.from_plan(eager).cost()
    assert got["predicted_step_time_ms"] == pytest.approx(t_ms)
    assert Engine.from_plan(plan).cost()[0] != pytest.approx(t_ms)  # the profile matters
    assert got["measured_step_time_ms"] > 0
