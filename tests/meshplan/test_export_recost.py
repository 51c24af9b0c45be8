"""``meshplan export`` re-costs the exported job as the target framework runs it: the file
read back by the reader ``meshplan cost`` imports it with, costed under the target's profile,
beside the tuned plan (``meshplan.frameworks.recost``); a job that does not fit is an error
unless --force; a change over 5% is a warning naming what changed."""

from __future__ import annotations

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


def _candidates(framework: str) -> list:
    """The legal candidates of ``meshplan tune``'s default space for ``framework`` (llama2-7b,
    1 x dgx-h100, global batch 32, seq 4096)."""
    from meshplan.tune_setup import tune_config
    from tuner.legality import is_legal
    from tuner.space import iter_base_candidates

    space = tune_config("llama2-7b", "dgx-h100", 1, 32, 4096, "semi-auto", 0, False, None, None, None,
                        False, framework=framework).space
    return [c for c in iter_base_candidates(space) if is_legal(c, space.problem)]


CANDIDATES = {t: _candidates(fw) for t, fw in PROFILE.items()}


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), target=st.sampled_from(sorted(PROFILE)))
def test_tune_framework_then_export_round_trips(data, target):
    """``tune --framework X`` then ``export --to X`` (the plan as the export command checks
    it, ``costed_plan``): the exported job re-costs within 1% of the tuned plan's step and
    peak, or the export says why not: every Strategy field the framework runs otherwise
    carries an exporter note (and the re-cost warning names it), or the reason the file
    cannot be re-costed is given."""
    from meshplan.frameworks.recost import costed_plan
    from meshplan.tuning import to_strategy

    c = data.draw(st.sampled_from(CANDIDATES[target]))
    s = to_strategy(c, 32, "llama2-7b", 4096, framework=PROFILE[target])
    plan = Plan(model="llama2-7b", cluster="dgx-h100", nodes=1, seq_len=4096, strategy=s)
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
            return
    moved = set(moved_fields(plan.strategy, r.strategy))
    if moved:
        assert moved <= {n.knob for n in out.notes}, (moved, out.notes)
        assert len(r.changed) == len(moved)
        return
    assert abs(r.step_change) <= 0.01 and abs(r.peak_change) <= 0.01, (c, r.line())
