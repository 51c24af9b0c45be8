"""torchtitan's tensor parallelism always shards the sequence (the fsdp2 profiles'
``kernels.sequence_parallel: always``): the tune space holds no tp > 1 plan without it, and
``cost`` of such a plan says the framework does not run it."""

from __future__ import annotations

from meshplan.tune_setup import tune_config
from tests._cli import run_main
from tuner.legality import is_legal
from tuner.space import iter_base_candidates


def test_the_tune_space_of_torchtitan_has_sequence_parallelism_wherever_tp_is_split():
    """tune --framework fsdp2 (torchtitan) on llama2-7b, 1 x dgx-h100: every legal plan with
    tp > 1 has sequence parallelism (torchtitan cannot run one without it), the tp 1 plans
    stay; megatron-core keeps both kinds."""
    def legal(fw):
        space = tune_config("llama2-7b", "dgx-h100", 1, 32, 4096, "semi-auto", 0, False, None, None,
                            None, False, framework=fw).space
        return [x for x in iter_base_candidates(space) if is_legal(x, space.problem)]

    tt, mc = legal("fsdp2"), legal("megatron-core")
    assert not any(x.tp > 1 and not x.sequence_parallel for x in tt)
    assert any(x.tp == 1 for x in tt) and any(x.tp > 1 for x in tt)
    assert any(x.tp > 1 and not x.sequence_parallel for x in mc)


def test_cost_warns_of_tp_without_sequence_parallelism_under_torchtitan(capsys):
    args = ["cost", "--model", "llama2-7b", "--cluster", "dgx-h100", "--dp", "4", "--tp", "2",
            "--global-batch", "8", "--layers", "2", "--zero", "2"]
    rc, out, err = run_main(capsys, *args, "--framework", "fsdp2")
    assert rc == 0, err
    assert ("warning: the fsdp2 profile's framework runs tp > 1 with sequence parallelism only: tp 2 "
            "without it costed as asked (--sequence-parallel is what it runs)") in out + err
    for more in (["--framework", "fsdp2", "--sequence-parallel"], ["--framework", "megatron-core"]):
        rc, out, err = run_main(capsys, *args, *more)
        assert rc == 0 and "sequence parallelism only" not in out + err
