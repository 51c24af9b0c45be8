"""The ``note:`` lines ``meshplan tune`` prints on stderr before it searches: a pinned
schedule or context parallelism the framework does not run (costed as asked, not runnable
there), a CPU host whose plans ``meshplan validate`` measures only under some settings, a
journal holding another command line's study. Each function returns its note, or None when
there is nothing to say.
"""

from __future__ import annotations

from pathlib import Path


def cpu_cluster(cluster: str, nodes: int | None, framework: str, dtype: str) -> str | None:
    """The ``note:`` line when the cluster is a CPU host (``cpu-local``, a
    ``meshplan calibrate`` YAML: device name ``cpu...``) and the search is not the one
    ``meshplan validate`` can compare (``meshplan.validation``: it predicts under the
    ``eager`` profile, checks numerics in float32 only, holds ZeRO-1 memory at most; a bf16
    CPU GEMM also runs far below fp32)."""
    from clusters import load_cluster

    if not str(load_cluster(cluster, nodes).device.name).lower().startswith("cpu"):
        return None
    if framework == "eager" and dtype == "float32":
        return None
    return (f"note: {cluster} is a CPU host: meshplan validate predicts a plan under the "
               "eager profile (the executor's), checks numerics of float32 plans and compares "
               "ZeRO 0-1 memory; --framework eager --dtype float32 (and --fix zero=1) search "
               "plans it measures as predicted")


def unrun_cp(pinned: int | None, framework: str) -> str | None:
    """The ``note:`` line when cp > 1 is pinned under a framework that runs no
    context parallelism (``meshplan.tuning.framework_cp_comms`` empty): costed as asked,
    but the plan cannot run there."""
    from meshplan.tuning import framework_cp_comms

    if (pinned or 1) > 1 and not framework_cp_comms(framework):
        return (f"note: the {framework} profile's framework runs no context parallelism: plans "
                f"with cp {pinned} are costed as asked, but cannot run under it")
    return None


def unrun_schedule(pinned: str | None, framework: str, every: bool) -> str | None:
    """The ``note:`` line when the pinned schedule is not one ``framework`` runs
    (its profile's ``pipeline.schedules``, ``meshplan.tuning.runs_schedule``; none listed:
    every one): the search costs it as asked, but the plan cannot run under that framework."""
    from meshplan.tuning import runs_schedule
    from simulator.profiles import load_profile

    runs = load_profile(framework).pipeline.schedules
    if pinned is None or every or runs is None or runs_schedule(runs.value, pinned):
        return None
    return (f"note: the {framework} profile's framework does not run {pinned} (it runs "
            f"{', '.join(runs.value)}): plans are costed as asked, but cannot run there")


def other_studies(out: Path, name: str) -> str | None:
    """The ``note:`` line when the journal in ``out`` holds studies other than
    ``name`` (``tuner.search.other_studies``): an earlier command line of another
    configuration, which this run does not resume."""
    from tuner.search import other_studies as studies_in

    others = studies_in(out, name)
    if others:
        return (f"note: {out}/journal.log holds study {', '.join(others)}, not this command "
                   f"line's {name} (another option, or a default a newer meshplan changed): "
                   f"this search runs beside it and rewrites plan.json and history.csv; the "
                   f"command line that started it resumes it, and tuner.search.load_result"
                   f"({str(out)!r}, {others[0]!r}) reads it")
    return None
