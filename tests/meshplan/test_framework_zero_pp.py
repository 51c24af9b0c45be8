"""ZeRO beside pipeline parallelism as the framework runs it (profile
``pipeline.zero_stages``): found by a hunt, DeepSpeed's PipelineEngine asserts ZeRO stage < 2,
yet cost costed, tune searched and export wrote ZeRO-2/3 plans with pp > 1 under the
deepspeed profile."""

from __future__ import annotations

import json

from meshplan.frameworks.targets import export_plan
from meshplan.plan import Plan
from meshplan.strategy import Strategy
from simulator.profiles import load_profile
from tests._cli import run_main
from tuner import legality as L
from tuner.space import Candidate, ModelDims, SearchProblem

DIMS = ModelDims("m", 4, 4096, 32, 32, 11008, 32000)


def test_profile_and_legality():
    assert load_profile("deepspeed").pipeline.zero_stages.value == (0, 1)
    assert load_profile("megatron-core").pipeline.zero_stages is None
    p = SearchProblem(DIMS, 16, 8, 32, 2048, pp_zero_stages=(0, 1))
    assert L.zero_runs_with_pp(Candidate(4, 2, 2, zero=2), p) == \
        "zero=2 with pp=2: the framework runs ZeRO 0, 1 beside pipeline parallelism"
    assert L.zero_runs_with_pp(Candidate(4, 2, 2, zero=1), p) is None
    assert L.zero_runs_with_pp(Candidate(8, 2, 1, zero=3), p) is None  # no pipeline
    free = SearchProblem(DIMS, 16, 8, 32, 2048)
    assert L.zero_runs_with_pp(Candidate(4, 2, 2, zero=3), free) is None
    assert "pp_zero_stages" not in free.to_dict()  # a study stored before the field resumes
    assert SearchProblem.from_dict(p.to_dict()) == p


def test_cost_warns_and_export_writes_zero_1(capsys):
    args = ("--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "2", "--dp", "4", "--tp", "2",
            "--pp", "2", "--global-batch", "32", "--zero", "2", "--framework", "deepspeed")
    rc, out, err = run_main(capsys, "cost", *args)
    assert rc == 0, err
    assert "runs ZeRO 0, 1 beside pipeline parallelism, not ZeRO-2" in out + err
    s = Strategy(dp=8, tp=1, pp=2, micro_batch_size=1, global_batch_size=32, zero=3, fsdp_shard_size=4,
                 framework="deepspeed")
    out = export_plan(Plan(model="llama2-7b", cluster="dgx-a100-80g", strategy=s, nodes=2), "deepspeed")
    assert json.loads(out.text)["zero_optimization"]["stage"] == 1
    assert {n.knob for n in out.notes} >= {"zero", "fsdp_shard_size"}
    assert (out.effective["zero"], out.effective["fsdp_shard_size"]) == (1, None)


def test_tune_refuses_pinned_pp_and_zero_the_framework_does_not_run(capsys):
    """The review: --framework deepspeed --pp 2 --zero 3 pruned every dp > 1 plan and said
    nothing about the pins."""
    from tests._cli import one_line_error

    line = one_line_error(*run_main(capsys, "tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g",
                                    "--global-batch", "16", "--layers", "4", "--framework", "deepspeed",
                                    "--pp", "2", "--zero", "3", "--storage", "memory"))
    assert "--pp 2 and --zero 3: framework deepspeed runs ZeRO 0, 1 beside pipeline parallelism" in line


def test_a_nemo_fp8_export_pastes_into_cost(capsys):
    """The review: --grad-reduce-in-bf16 beside --fp8-format was refused as not bf16."""
    import shlex

    base = ("--model", "llama2-7b", "--cluster", "dgx-h100", "--nodes", "2", "--dp", "16", "--framework", "nemo")
    # the plan does not fit (122 GiB as costed): --force exports it anyway (issue 39)
    rc, out, err = run_main(capsys, "export", "--to", "megatron", *base, "--global-batch", "64", "--dtype", "fp8-delayed",
                            "--force")
    assert rc == 0, err
    args = [a for ln in out.splitlines() if not ln.startswith("#") for a in shlex.split(ln.rstrip(" \\"))]
    assert "--grad-reduce-in-bf16" in args and "--fp8-format" in args
    rc, pasted, err = run_main(capsys, "cost", *base, *args, "--json")
    assert rc == 0, err
    rc, direct, err = run_main(capsys, "cost", *base, "--global-batch", "64", "--dtype", "fp8-delayed", "--json")
    assert rc == 0, err
    assert json.loads(pasted)["step_time_ms"] == json.loads(direct)["step_time_ms"]


def test_fsdp_frameworks_offer_no_zero_1(capsys):
    """The new-user pass: tune under fsdp2 picked ZeRO-1 winners, which FSDP2 has no form of
    (export wrote them as ZeRO-2). Profile fact memory.zero_stages: 0, 2, 3 under fsdp2 and
    llm-foundry; the search leaves ZeRO-1 out, a pinned one is refused, cost warns."""
    from meshplan.tune_setup import tune_config
    from tests._cli import one_line_error

    for name in ("fsdp2", "fsdp2-eager", "fsdp2-async-tp", "llm-foundry"):
        assert load_profile(name).memory.zero_stages.value == (0, 2, 3), name
    assert load_profile("megatron-core").memory.zero_stages is None
    cfg = tune_config("llama2-7b", "dgx-h100", 1, 8, 2048, "pattern-based", 0, False, None, "tpe", 2,
                      False, framework="fsdp2")
    assert cfg.space.zero_choices() == [0, 2, 3]
    line = one_line_error(*run_main(capsys, "tune", "--model", "llama2-7b", "--cluster", "dgx-h100",
                                    "--global-batch", "8", "--layers", "2", "--framework", "fsdp2",
                                    "--zero", "1", "--storage", "memory"))
    assert "--zero 1: framework fsdp2 offers ZeRO 0, 2, 3" in line
    rc, out, err = run_main(capsys, "cost", "--model", "llama2-7b", "--cluster", "dgx-h100", "--dp", "8",
                            "--zero", "1", "--framework", "fsdp2", "--global-batch", "8", "--layers", "2")
    assert rc == 0, err
    assert "the fsdp2 profile's framework offers ZeRO 0, 2, 3, not ZeRO-1" in out + err


def test_torchtitan_runs_ddp_only_as_the_one_parallel_dimension(capsys):
    """torchtitan 238fa99 parallelize_llama: DDP (ZeRO 0) only on a one-dimensional mesh ("DDP
    has not supported > 1D parallelism"), FSDP whenever cp > 1. Before, tune under fsdp2
    could recommend ZeRO 0 beside tp / pp (export then wrote ZeRO-2 with a note). Profile
    fact memory.ddp_alone; a legality rule; a pinned layout refused; cost warns."""
    from meshplan.tune_setup import tune_config
    from tests._cli import one_line_error

    for name in ("fsdp2", "fsdp2-eager", "fsdp2-async-tp"):
        assert load_profile(name).memory.ddp_alone.value is True, name
    for name in ("megatron-core", "deepspeed", "llm-foundry", "eager"):
        assert load_profile(name).memory.ddp_alone is None, name
    p = SearchProblem(DIMS, 16, 8, 32, 2048, ddp_alone=True)
    assert L.zero0_alone(Candidate(8, 2, 1, zero=0), p) == \
        "zero=0 with dp=8, tp=2, pp=1: the framework runs ZeRO 0 (DDP) only as the one parallel dimension"
    assert L.zero0_alone(Candidate(8, 1, 2, zero=0), p) is not None  # beside pp
    # cp at ZeRO 0 stays searchable (dp 1 has no other stage); cost warns that torchtitan shards
    assert L.zero0_alone(Candidate(1, 1, 1, zero=0, cp=8), p) is None
    assert L.zero0_alone(Candidate(16, 1, 1, zero=0), p) is None  # dp alone: DDP
    assert L.zero0_alone(Candidate(1, 8, 2, zero=0), p) is None  # no dp: nothing to replicate
    assert L.zero0_alone(Candidate(8, 2, 1, zero=2), p) is None
    assert L.zero0_alone(Candidate(8, 2, 1, zero=0), SearchProblem(DIMS, 16, 8, 32, 2048)) is None
    assert "ddp_alone" not in SearchProblem(DIMS, 16, 8, 32, 2048).to_dict()  # old studies resume
    assert SearchProblem.from_dict(p.to_dict()) == p
    cfg = tune_config("llama2-7b", "dgx-h100", 2, 16, 2048, "pattern-based", 0, False, None, "tpe", 2,
                      False, framework="fsdp2")
    assert cfg.space.problem.ddp_alone is True
    assert tune_config("llama2-7b", "dgx-h100", 2, 16, 2048, "pattern-based", 0, False, None, "tpe", 2,
                       False, framework="megatron-core").space.problem.ddp_alone is False
    line = one_line_error(*run_main(capsys, "tune", "--model", "llama2-7b", "--cluster", "dgx-h100",
                                    "--nodes", "2", "--global-batch", "16", "--layers", "2",
                                    "--framework", "fsdp2", "--dp", "8", "--tp", "2", "--zero", "0",
                                    "--storage", "memory"))
    assert ("--dp 8 and --tp 2 and --zero 0: framework fsdp2 runs ZeRO 0 (DDP) only as the one "
            "parallel dimension (with cp it shards over the cp ranks), not beside tp 2") in line
    rc, out, err = run_main(capsys, "cost", "--model", "llama2-7b", "--cluster", "dgx-h100", "--dp", "4",
                            "--tp", "2", "--zero", "0", "--framework", "fsdp2", "--global-batch", "8",
                            "--layers", "2")
    assert rc == 0, err
    assert "runs ZeRO 0 (DDP) only as the one parallel dimension" in out + err
    rc, out, err = run_main(capsys, "cost", "--model", "llama2-7b", "--cluster", "dgx-h100", "--dp", "2",
                            "--cp", "4", "--zero", "0", "--framework", "fsdp2", "--global-batch", "8",
                            "--layers", "2", "--seq-len", "8192")
    assert rc == 0, err
    assert "(with cp it shards over the cp ranks), not beside cp 4" in out + err


def test_without_replication_only_cp_is_named(capsys):
    """The break-it pass: dp 1, tp 4, cp 2 at ZeRO 0 warned 'not beside tp 4, cp 2'; with
    no dp there is no DDP, and tp is not the matter: torchtitan shards over the cp ranks."""
    rc, out, err = run_main(capsys, "cost", "--model", "llama2-7b", "--cluster", "dgx-h100", "--tp", "4",
                            "--cp", "2", "--zero", "0", "--framework", "fsdp2", "--global-batch", "1",
                            "--layers", "2", "--seq-len", "8192")
    assert rc == 0, err
    assert "framework shards over the cp ranks (FSDP) where cp > 1, not ZeRO 0 with cp 2" in out + err
    assert "beside tp 4" not in out + err
