"""``meshplan export`` re-costs the exported job as the target framework runs it: the file
read back by the reader ``meshplan cost`` imports it with, costed under the target's profile,
beside the tuned plan (``meshplan.frameworks.recost``); a job that does not fit is an error
unless --force; a change over 5% is a warning naming what changed."""

from __future__ import annotations

import functools
import warnings

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from meshplan.engine import Engine
from meshplan.errors import MeshplanError
from meshplan.frameworks import export_plan
from meshplan.frameworks.recost import FAMILIES, changed_fields, moved_fields, recost
from meshplan.plan import Plan
from meshplan.strategy import Strategy
from tests._cli import run_main

#: issue 39's plan, on llama2-70b (Llama-3.1-70B's layers and widths)
ISSUE = Plan(model="llama2-70b", cluster="dgx-h100", nodes=8,
             strategy=Strategy(dp=4, tp=4, pp=4, global_batch_size=512, zero=2, sequence_parallel=True))


def test_megatron_runs_the_tuned_plan_itself():
    """The Megatron-LM arguments of a megatron-core plan read back as the same Strategy, so
    the re-costed step and peak are the tuned plan's to the bit."""
    r = recost(ISSUE, export_plan(ISSUE, "megatron"))
    res = Engine.from_plan(ISSUE).step_model().run()
    assert (r.step_s, r.peak_bytes) == (r.tuned_step_s, r.tuned_peak_bytes) == (res.step_time, res.max_memory_bytes)
    assert r.changed == [] and r.warning() is None and r.fits


def test_deepspeed_runs_another_plan_and_the_warning_names_it():
    """DeepSpeed's pipeline engine runs ZeRO-1 beside pp and AutoTP has no sequence
    parallelism: the re-imported job is that plan (its own Engine's figures) under the
    deepspeed profile, and the warning names the three changes."""
    r = recost(ISSUE, export_plan(ISSUE, "deepspeed"))
    assert r.changed == ["ZeRO stage 2 -> 1", "sequence parallelism on -> off",
                         "framework profile megatron-core -> deepspeed"]
    want = ISSUE.strategy.replace(zero=1, sequence_parallel=False, framework="deepspeed")
    res = Engine(ISSUE.model, ISSUE.cluster, want, nodes=8).step_model().run()
    assert (r.step_s, r.peak_bytes) == (res.step_time, res.max_memory_bytes)
    assert abs(r.peak_change) > 0.05
    assert "ZeRO stage 2 -> 1; sequence parallelism on -> off" in r.warning()


def test_changed_fields_words():
    a = Strategy(dp=2, tp=2, zero=1, sequence_parallel=True, global_batch_size=8)
    assert changed_fields(a, a) == []
    assert changed_fields(a, a.replace(zero=2, sequence_parallel=False)) == [
        "ZeRO stage 1 -> 2", "sequence parallelism on -> off"]
    one = Strategy(dp=1, tp=4, global_batch_size=8)
    assert changed_fields(one, one.replace(zero=0)) == []


def test_moved_fields_compares_the_costed_split_and_etp():
    """A split left to the framework (None) is compared as costed when the splits are given
    (the cost model's [7, 5] against a listed [6, 6]), else not; etp None is tp, and etp is
    not compared where either side has no experts (ep names that change)."""
    a = Strategy(dp=2, tp=2, pp=2, global_batch_size=8)
    even = a.replace(layers_per_stage=(6, 6))
    assert moved_fields(a, even) == []
    assert moved_fields(a, even, ((7, 5), (6, 6))) == ["layers_per_stage"]
    assert changed_fields(a, even, ((7, 5), (6, 6))) == ["layer split [7, 5] -> [6, 6]"]
    assert moved_fields(a, even, ((6, 6), (6, 6))) == []
    moe = Strategy(dp=2, tp=2, ep=2, global_batch_size=8)
    assert moved_fields(moe, moe.replace(etp=2)) == []  # None is tp
    assert changed_fields(moe, moe.replace(etp=1, ep=4)) == ["ep 2 -> 4", "expert tensor parallelism 2 -> 1"]
    assert moved_fields(moe, Strategy(dp=2, tp=2, global_batch_size=8)) == ["ep"]


def test_torchtitan_export_lists_the_costed_split():
    """torchtitan's file lists every stage's modules whatever the split, so the plan goes out
    with the split the cost model balanced (its own ``layers_per_vstage``, not the even [6,
    6, 6, 6] of 24 layers over pp 2 x vpp 2: the MoE model's 151,936-token embedding and
    head weigh on the first and last stage) and re-costs as the tuned plan, to the bit;
    Megatron-LM's arguments keep the even split (no layout written)."""
    from meshplan.frameworks.recost import costed_plan

    plan = Plan(model=MOE, cluster="dgx-h100", nodes=1, seq_len=4096,
                strategy=Strategy(dp=4, pp=2, vpp=2, schedule="VPP", zero=3, global_batch_size=32, recompute="full",
                                  framework="fsdp2"))
    res = Engine.from_plan(plan).step_model().run()
    split = tuple(res.layers_per_vstage)
    assert sum(split) == 24 and split != (6, 6, 6, 6)
    checked, note = costed_plan(plan, target="torchtitan")
    assert checked.strategy.layers_per_stage == split and note is None
    out = export_plan(checked, "torchtitan")
    assert out.effective["layers_per_stage"] == split
    r = recost(checked, out)
    assert (r.step_s, r.peak_bytes) == (res.step_time, res.max_memory_bytes) and r.moved == []
    assert costed_plan(plan, target="megatron")[0].strategy.layers_per_stage is None


def test_torchtitan_expert_layout_round_trips():
    """A whole-experts plan (ep 4, etp 1 over dp 1 x tp 4; torchtitan's default expert
    layout) read back with dp 1 ("ep must divide dp = 1", the reader taking etp as tp): the
    export writes expert_tensor_parallel_degree 1 and the job re-costs as the plan."""
    plan = Plan(model=MOE, cluster="dgx-h100", nodes=1, seq_len=4096,
                strategy=Strategy(dp=1, tp=4, pp=2, ep=4, etp=1, sequence_parallel=True,
                                  global_batch_size=32, framework="fsdp2", recompute="full"))
    out = export_plan(plan, "torchtitan")
    assert "expert_parallel_degree = 4\nexpert_tensor_parallel_degree = 1" in out.text
    r = recost(plan, out)
    assert (r.strategy.ep, r.strategy.etp, r.strategy.dp) == (4, 1, 1)
    assert (r.step_s, r.peak_bytes) == (r.tuned_step_s, r.tuned_peak_bytes) and r.moved == []


def test_export_prints_the_recosted_job_and_warns(capsys, tmp_path):
    p = str(ISSUE.save(tmp_path / "plan.json"))
    rc, out, err = run_main(capsys, "export", p, "--to", "megatron")
    assert rc == 0, err
    assert "note: re-costed as megatron runs it (megatron-core profile" in err and "warning:" not in err
    rc, out, err = run_main(capsys, "export", p, "--to", "deepspeed")
    assert rc == 0, err
    assert "note: re-costed as deepspeed runs it (deepspeed profile" in err
    assert "warning: the exported job is predicted at" in err and "ZeRO stage 2 -> 1" in err


# -- the round trip over the default tune space ---------------------------------------------

#: target -> the profile ``tune --framework`` searches with for it
PROFILE = {target: fams[0] for target, fams in FAMILIES.items()}
#: a mixture-of-experts model (24 MoE layers of 60 experts, top-4, a shared expert; a
#: 151,936-token vocabulary: its embedding and head weigh on the first and last stage)
MOE = "tests/data/hf_configs/qwen1.5-moe-a2.7b.json"


@functools.cache
def _candidates(framework: str, model: str = "llama2-7b", nodes: int = 1) -> list:
    """The legal candidates of ``meshplan tune``'s default space for ``framework`` (``model``
    on ``nodes`` x dgx-h100, global batch 32 a node, seq 4096)."""
    from meshplan.tune_setup import tune_config
    from tuner.legality import is_legal
    from tuner.space import iter_base_candidates

    space = tune_config(model, "dgx-h100", nodes, 32 * nodes, 4096, "semi-auto", 0, False, None, None,
                        None, False, framework=framework).space
    return [c for c in iter_base_candidates(space) if is_legal(c, space.problem)]


def _round_trip(c, target: str, model: str = "llama2-7b", nodes: int = 1) -> None:
    """``tune --framework X`` then ``export --to X`` of candidate ``c`` (the plan as the
    export command checks it, ``costed_plan``): the exported job re-costs within 1% of the
    tuned plan's step and peak, or the export says why not: every Strategy field the
    framework runs otherwise (the layer split compared as each side was costed) carries an
    exporter note and the re-cost names it, or the reason the file cannot be re-costed is
    given."""
    from meshplan.frameworks.recost import costed_plan
    from meshplan.tuning import to_strategy

    s = to_strategy(c, 32 * nodes, model, 4096, framework=PROFILE[target])
    plan = Plan(model=model, cluster="dgx-h100", nodes=nodes, seq_len=4096, strategy=s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            plan, _ = costed_plan(plan, target=target)
        except (MeshplanError, ValueError):
            assume(False)  # the tuner prunes it too
        out = export_plan(plan, target)
        try:
            r = recost(plan, out)
        except MeshplanError as e:
            assert str(e).startswith(f"the {target} export cannot be re-costed")
            assert out.notes, e  # what the file runs otherwise is noted
            return
    moved = set(r.moved)
    if moved:
        assert moved <= {n.knob for n in out.notes}, (moved, out.notes)
        assert len(r.changed) == len(moved)
        return
    assert abs(r.step_change) <= 0.01 and abs(r.peak_change) <= 0.01, (c, r.line())


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), target=st.sampled_from(sorted(PROFILE)))
def test_tune_framework_then_export_round_trips(data, target):
    """:func:`_round_trip` over llama2-7b's default tune space on 1 x dgx-h100."""
    _round_trip(data.draw(st.sampled_from(_candidates(PROFILE[target]))), target)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), target=st.sampled_from(sorted(PROFILE)),
       where=st.sampled_from([(MOE, 1), (MOE, 2), ("llama2-7b", 2)]))
def test_round_trips_for_moe_and_two_nodes(data, target, where):
    """:func:`_round_trip` over the default tune spaces of a mixture-of-experts model (ep,
    etp, its heavy embedding and head moving the cost model's layer split away from an even
    one) on 1 and 2 x dgx-h100, and of llama2-7b on 2 (inter-node dp and pp)."""
    model, nodes = where
    _round_trip(data.draw(st.sampled_from(_candidates(PROFILE[target], model, nodes))), target, model, nodes)
