"""``meshplan simulate``: play a pipeline schedule on the SimPy engine (times in ms)."""

from __future__ import annotations

import json

import typer

from completion.choices import INTERLEAVED
from meshplan import outputs as outs
from meshplan.commands import options as opt
from meshplan.commands import outputs

#: Longest time option (ms): ``simulator.schedules.base.MAX_TIME_S`` in milliseconds.
MAX_TIME_MS = opt.MAX_TIME_S * 1e3


def simulate_cmd(
    schedule: str = typer.Option(..., "--schedule", help="FThenB, 1F1B, VPP, ZBH1, ZBH2, ZBVPP, ZB, ZB-1p or "
                                 "ZB-2p (case-insensitive; cost's aliases too: GPipe, 1F1B-I, ZB-H1, ZB-V ...)."),
    stages: int = typer.Option(..., "--stages", min=1, max=opt.MAX_ACTIONS // 3, help="Pipeline stages p."),
    microbatches: int = typer.Option(..., "--microbatches", min=1, max=opt.MAX_ACTIONS // 3,
                                     help="Micro-batches m per step."),
    tf: float = typer.Option(..., "--tf", help="Forward time per stage and micro-batch (ms)."),
    tb: float = typer.Option(..., "--tb", help="Input-gradient backward time (ms)."),
    tw: float = typer.Option(0.0, "--tw", help="Weight-gradient backward time (ms)."),
    tcomm: float = typer.Option(0.0, "--tcomm", help="One p2p hop between stages (ms)."),
    chunks: int | None = typer.Option(None, "--chunks", min=1, max=opt.MAX_VPP,
                                      help="Chunks per rank (VPP; ZBVPP needs 2)."),
    memory_limit: float | None = typer.Option(None, "--memory-limit", help="ZB only: limit in M_B units."),
    trace: str | None = typer.Option(None, "--trace", help="Write a Chrome trace JSON here."),
    plot: str | None = typer.Option(None, "--plot", help="Write a Gantt PNG here."),
    framework: opt.Framework = opt.FRAMEWORK,
    as_json: bool = typer.Option(False, "--json", help="Print step_time_ms, bubble_ratio, peak_memory as JSON."),
    force: bool = outputs.FORCE,
) -> None:
    """Simulate one pipeline step of a schedule from given stage times.

    Peak memory is in M_B units (M_W = M_B / 2). Times are finite milliseconds of at most {max_ms}; at most
    {max_actions} passes are simulated. The framework profile sets the pipeline send mode:
    sync (Megatron-LM 2021) keeps the sender busy for --tcomm after each send, async only
    delays the receiver."""
    from simulator.pipeline_sim import simulate_pipeline
    from simulator.schedules import build_schedule

    for flag, x in (("--tf", tf), ("--tb", tb)):
        opt.finite(flag, x, 0.0, MAX_TIME_MS, low_open=True)
    for flag, x in (("--tw", tw), ("--tcomm", tcomm)):
        opt.finite(flag, x, 0.0, MAX_TIME_MS)
    opt.finite("--memory-limit", memory_limit, 1.0, opt.MAX_MEMORY_LIMIT)
    outs.distinct_outputs({"--trace": trace, "--plot": plot})
    outs.check_outputs({"--trace": (trace, "trace"), "--plot": (plot, "image")}, force)
    st = {"F": tf * 1e-3, "B": tb * 1e-3, "W": tw * 1e-3}
    asked = schedule
    schedule, zb_limit = _builder(schedule, stages)
    if zb_limit is not None:
        if memory_limit is not None:
            raise typer.BadParameter(f"{asked} is ZB at a memory limit of {zb_limit:g} M_B; give "
                                     f"--schedule ZB with --memory-limit {memory_limit:g} instead",
                                     param_hint="'--memory-limit'")
        memory_limit = zb_limit
    if chunks is not None and chunks > 1 and schedule not in INTERLEAVED:
        raise typer.BadParameter(f"{asked} runs one chunk per rank; --chunks {chunks} needs VPP or ZBVPP",
                                 param_hint="'--chunks'")
    v = chunks if chunks is not None else (2 if schedule in INTERLEAVED else 1)
    if tw == 0 and schedule in SPLIT_BACKWARD:
        _no_weight_pass(asked, schedule)
    opts = {"stage_times": st, "comm_time": tcomm * 1e-3} if schedule in ("ZB", "ZBVPP") else {}
    sched = build_schedule(schedule, stages, microbatches, v, memory_limit, **opts)
    from simulator.profiles import load_profile

    p2p = load_profile(opt.value(framework)).pipeline.p2p.value
    res = simulate_pipeline(sched, st, tcomm * 1e-3, memory={"M_B": 1.0, "M_W": 0.5},
                            p2p_sync=p2p == "sync")
    if trace is not None:
        outs.write_output("--trace", trace, lambda: res.to_chrome_trace(trace))
    if plot is not None:
        outs.write_output("--plot", plot, lambda: res.plot_timeline(plot))
    if as_json:
        out = {"step_time_ms": res.step_time * 1e3, "bubble_ratio": res.bubble_ratio,
               "peak_memory": res.peak_memory, "framework": opt.value(framework), "p2p": p2p}
        typer.echo(json.dumps(out))
    else:
        limit = f" at a memory limit of {memory_limit:g} M_B" if schedule == "ZB" and memory_limit else ""
        typer.echo(f"{schedule}{limit} p={stages} m={microbatches} v={v}: step {res.step_time * 1e3:.3f} ms, "
                   f"bubble ratio {res.bubble_ratio:.4f}, max peak memory {res.max_peak_memory:g} M_B "
                   f"(framework {opt.value(framework)}: {p2p} p2p)")


# --help shows the limits' values (MAX_TIME_MS, opt.MAX_ACTIONS), not their names, and
# each paragraph as one line for the terminal to wrap
simulate_cmd.__doc__ = "\n\n".join(
    " ".join(part.split()) for part in (simulate_cmd.__doc__ or "").format(
        max_ms=f"{MAX_TIME_MS:.0e}".replace("e+0", "e"), max_actions=f"{opt.MAX_ACTIONS:,}").split("\n\n"))


def register(app: typer.Typer) -> None:
    """Add the ``simulate`` command to ``app``."""
    app.command("simulate")(simulate_cmd)


#: schedules that split the backward into B (input gradients) and W (weight gradients)
#: and place W on its own (Qi et al. 2024): the builders that search the placement (ZB,
#: ZBVPP) need W > 0, the handcrafted ZB-H1 / ZB-H2 with W = 0 are 1F1B / its 2p variant
SPLIT_BACKWARD = ("ZBH1", "ZBH2", "ZB", "ZBVPP", "DualPipeV")


def _no_weight_pass(asked: str, schedule: str) -> None:
    """``--tw 0`` with a schedule of :data:`SPLIT_BACKWARD`: an error naming ``--tw`` for
    the searched ones, one ``note:`` line on stderr for ZB-H1 / ZB-H2 (whose W passes are
    then empty: the step takes 1F1B's time, its memory stays ZB-H1's / ZB-H2's, which a user
    giving --tb as the whole backward did not mean)."""
    if schedule in ("ZB", "ZBVPP"):
        raise typer.BadParameter(f"{asked} places the weight-gradient pass W on its own: it needs "
                                 f"--tw > 0 (the W part of the backward; --tb is then B alone)",
                                 param_hint="'--tw'")
    typer.echo(f"note: --tw 0: {asked} has no weight-gradient pass to defer: its step takes "
               "1F1B's time (its memory stays its own); give --tw, the W part of the backward "
               "(--tb is then B alone)", err=True)


def _builder(name: str, stages: int) -> tuple[str, float | None]:
    """(registered builder name, ZB memory limit in M_B or None) of a schedule spelled as
    ``cost`` takes it (``completion.strategy.canonical_schedule``: case-insensitive, aliases;
    ZB-1p / ZB-2p are the ZB heuristic at a limit of p / 2p M_B, Qi et al. 2024 sec. 4).
    Raises typer.BadParameter naming ``--schedule`` for an unknown name."""
    from completion.strategy import ZB_LIMITS, StrategyError, canonical_schedule

    try:
        canon = canonical_schedule(name)
    except StrategyError:
        from completion.strategy import SCHEDULE_ALIASES, SCHEDULES

        raise typer.BadParameter(f"{name!r} is none of {', '.join(SCHEDULES)} (case-insensitive) "
                                 f"or their aliases {', '.join(sorted(SCHEDULE_ALIASES))}",
                                 param_hint="'--schedule'") from None
    if canon in ZB_LIMITS:
        return "ZB", float(ZB_LIMITS[canon] * stages)
    return canon, None
