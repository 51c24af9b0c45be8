"""Options that would have no effect in the combination given are refused, naming them
(issue 43: ``tune --vpp 2 --pp 1`` searched on as if --vpp were not there; ``--objective``
without ``--gpus`` and ``--fix ''`` were read as nothing)."""

from __future__ import annotations

from typing import Any

from meshplan.errors import MeshplanError


class UnusedOptionError(MeshplanError):
    """An option that has no effect beside the others given; names it and why."""


def check_tune_options(ctx: Any, fixed: dict[str, Any], fix_items: list[str] | None,
                       gpus: str | None, workers: int = 1, objective: str = "cost") -> None:
    """Refuse, before any search, a ``tune`` command line with an option that cannot act:
    an empty ``--fix`` item; ``--vpp N > 1`` or an interleaved ``--schedule`` pinned with
    ``--pp 1`` (no pipeline to interleave: cost refuses the same plan); ``--objective``
    without ``--gpus`` (one size: the cheapest plan is the fastest); more ``--workers``
    than this host's cores (:func:`meshplan.resources.check_processes`).
    ``fixed``: the knobs the options and ``--fix`` pin. Raises UnusedOptionError (or
    ResourceError) naming the option."""
    from meshplan.resources import check_processes

    check_processes("--workers", workers, "worker processes", "no faster than one per core: "
                    "each scores plans with the CPU")
    from completion.strategy import interleaved
    from meshplan.commands import options as opt

    for item in fix_items or ():
        if not item.strip() or any(not part.strip() for part in item.split(",")):
            raise UnusedOptionError(f"--fix {item!r} has an empty item; give NAME=VALUE "
                                    f"(e.g. --fix tp=2,pp=4)")
    def pinned(field: str) -> str:  # the pin as typed: --vpp 2, or --fix vpp=2
        typed = opt.given_flags(ctx, field)
        return f"{typed[0]} {fixed[field]}" if typed else f"--fix {field}={fixed[field]}"

    if fixed.get("pp") == 1:
        if fixed.get("vpp", 1) > 1:
            raise UnusedOptionError(f"{pinned('vpp')} needs pp > 1: interleaving splits each "
                                    f"pipeline rank's layers into chunks, and {pinned('pp')} has "
                                    f"no pipeline")
        if fixed.get("schedule") is not None and interleaved(fixed["schedule"]):
            raise UnusedOptionError(f"{pinned('schedule')} interleaves a pipeline's chunks, and "
                                    f"{pinned('pp')} has no pipeline")
    # an unknown objective is refused by name where the sizes are checked
    from meshplan.goodput_inputs import RUN_OBJECTIVES
    from tuner.sizing import OBJECTIVES

    # time and cost only pick among sizes; a run objective also changes what one size's
    # search minimises (meshplan.objective_scoring)
    if (gpus is None and opt.typed_flags(ctx, "--objective") and objective in OBJECTIVES
            and objective not in RUN_OBJECTIVES):
        raise UnusedOptionError(f"--objective {objective} picks among cluster sizes: give it with --gpus "
                                f"(on one size the cheapest plan is the fastest)")
