"""One validation path (issue 43, item 5): a generated plan is accepted or refused alike by
the Python API (Strategy + Engine), a plan.json and the CLI flags; never a traceback."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from tests._entry_points import as_the_cli_reads_it, plans, via_api, via_flags, via_plan_file


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(p=plans())
def test_every_entry_point_accepts_and_refuses_the_same_plans(tmp_path, p):
    api, plan, flags = via_api(p), via_plan_file(p, tmp_path), via_flags(p)
    assert not plan.startswith("fault") and not flags.startswith("fault"), (p, plan, flags)
    assert api == plan, (p, api, plan)  # the same Strategy, by the API and by a file
    assert via_api(as_the_cli_reads_it(p)) == flags, (p, flags)
