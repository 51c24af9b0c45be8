"""``meshplan compare``: cost several plans of one model and cluster and show them side by
side -- one table (step time, tokens/s, MFU, bubble, peak memory, fits) and, with
``--plot``, one timeline PNG with a panel per plan on a shared time axis.

Each strategy option of ``meshplan cost`` (``meshplan.flags.FLAGS``, aliases
included) takes a comma list here, e.g. ``--schedule 1F1B,VPP,ZBH1,ZB-2p`` (also spelled
``--schedules``), ``--tp 4,8`` or ``--recompute none,full``; the plans are the cross
product of the lists (:data:`PARSERS` order: dp varies slowest, then tp, pp, ...). A plan the
strategy rules refuse (e.g. ``--tp 3`` for 32 heads) is a table row marked ``refused`` and
``[i]``, reason i listed under the table; if every plan is refused the command fails with the
first reason. Without ``--vpp`` each plan runs the chunks its schedule needs (the
Strategy's rule): 2 for the interleaved schedules (VPP, ZBVPP;
``completion.strategy.INTERLEAVED``) on pp > 1, 1 for the others, so ``--schedules 1F1B,VPP`` compares them as each is normally run. ``--layers-per-stage``
takes the words only (``balanced,even``: the cost model's split beside the frameworks' even
one; the table shows each split costed), the MoE routing options
(``--moe-capacity-factor``, ``--moe-load-imbalance``) lists of numbers. ``--json`` prints
one object per plan, with ``layers_per_vstage``. Each costed plan carries its error band
(``simulator.error_band``: ``step_time_band`` in ``--json``), and
plans whose band overlaps the best plan's (the fastest that fits) are marked statistically
tied (``*`` after yes / NO in the fits column, ``tied_with_best`` in ``--json``).
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

import typer

from meshplan import comparison as cmp
from meshplan import outputs as outs
from meshplan.commands import options as opt
from meshplan.commands import outputs
from meshplan.errors import MeshplanError
from meshplan.frameworks.megatron import arguments as mg
from meshplan.pipeline_split import SPLIT_WORDS, split_word

#: most plans one compare costs (the product of the list lengths)
MAX_PLANS = 64


def _ints(flag: str, low: int) -> Any:
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise MeshplanError(f"{flag}: {s!r} is not an integer") from None
        if v < low:
            raise MeshplanError(f"{flag}: {v} must be >= {low}")
        return v
    return parse


def _floats(flag: str, low: float, low_open: bool = False) -> Any:
    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise MeshplanError(f"{flag}: {s!r} is not a number") from None
        return opt.finite(flag, v, low, low_open=low_open)  # type: ignore[return-value]
    return parse


def _split(s: str) -> str:
    word = split_word(s)
    if word is None:
        raise MeshplanError(f"--layers-per-stage: {s!r} is not one of {', '.join(SPLIT_WORDS)} "
                         f"(compare takes the words; cost takes a list of layers per stage)")
    return word


def _choices(flag: str, enum: type[Enum]) -> Any:
    names = {m.value.lower(): m.value for m in enum}

    def parse(s: str) -> str:
        if s.lower() not in names:
            raise MeshplanError(f"{flag}: {s!r} is not one of {', '.join(m.value for m in enum)}")
        return names[s.lower()]
    return parse


#: Strategy field -> parser of one list item (``FLAGS[field][0]`` names it in errors)
PARSERS = {
    "dp": _ints("--dp", 1), "tp": _ints("--tp", 1), "pp": _ints("--pp", 1),
    "cp": _ints("--cp", 1), "ep": _ints("--ep", 1), "vpp": _ints("--vpp", 1),
    "micro_batch_size": _ints("--micro-batch-size", 1),
    "global_batch_size": _ints("--global-batch", 1), "zero": _ints("--zero", 0),
    "schedule": _choices("--schedule", opt.Schedule), "recompute": _choices("--recompute", opt.Recompute),
    "cp_comm": _choices("--cp-comm", opt.CpComm), "dtype": _choices("--dtype", opt.Dtype),
    "framework": _choices("--framework", opt.Framework),
    "attention": _choices("--attention", opt.Attention),
    "moe_capacity_factor": _floats("--moe-capacity-factor", 0.0, low_open=True),
    "moe_load_imbalance": _floats("--moe-load-imbalance", 1.0),
    "layers_per_stage": _split,
    "fsdp_shard_size": _ints("--fsdp-shard-size", 0),
}
#: a comma list of each option, for the empty-item error (others: 1,2)
EXAMPLES = {"schedule": "1F1B,VPP", "recompute": "none,full", "cp_comm": "p2p,all_gather",
            "dtype": "bfloat16,fp8-delayed", "framework": "megatron-core,fsdp2",
            "attention": "flash,unfused", "moe_capacity_factor": "1,1.25",
            "moe_load_imbalance": "1,1.5", "layers_per_stage": "balanced,even",
            "fsdp_shard_size": "0,4"}


def parse_lists(raw: dict[str, str | None]) -> dict[str, list[Any]]:
    """Strategy field -> its list of values from the comma lists ``raw`` (None: left out,
    the Strategy default). Raises ValueError naming the flag for a bad or empty item or
    more than :data:`MAX_PLANS` plans."""
    out: dict[str, list[Any]] = {}
    for field, text in raw.items():
        if text is None:
            continue
        items = [s.strip() for s in text.split(",")]
        if any(not s for s in items):
            raise MeshplanError(f"{opt.FLAGS[field][0]}: empty item in {text!r} (a comma list, "
                             f"e.g. {EXAMPLES.get(field, '1,2')})")
        out[field] = list(dict.fromkeys(PARSERS[field](s) for s in items))
    n = 1
    for vals in out.values():
        n *= len(vals)
    if n > MAX_PLANS:
        sizes = " x ".join(f"{opt.FLAGS[f][0]} {len(v)}" for f, v in out.items() if len(v) > 1)
        raise MeshplanError(f"compare: {sizes} = {n} plans, at most {MAX_PLANS}; shorten a list")
    return out


def _strategy(ctx: Any, knobs: dict[str, Any], sequence_parallel: bool, num_layers: Any) -> Any:
    """The Strategy of one compared plan: its knobs (``opt.build_strategy``), then its
    ``layers_per_stage`` word (``opt.pipeline_split``; ``num_layers`` gives the model's
    decoder layers). Raises what those raise."""
    plain = {k: v for k, v in knobs.items() if k != "layers_per_stage"}
    strategy = opt.build_strategy(ctx, **plain, sequence_parallel=sequence_parallel)
    return opt.pipeline_split(ctx, knobs.get("layers_per_stage"), strategy, num_layers)


def _list_option(field: str, default: str | None, what: str) -> Any:
    extra = ("--schedules",) if field == "schedule" else ()
    return typer.Option(default, *opt.FLAGS[field], *extra, help=f"{what}; a comma list compares.",
                        rich_help_panel=opt.PANEL_STRATEGY)


def compare_cmd(
    ctx: typer.Context,
    model: str = opt.MODEL,
    cluster: str = opt.CLUSTER,
    nodes: int | None = opt.NODES,
    dp: str = _list_option("dp", "1", "Data-parallel degree"),
    tp: str = _list_option("tp", "1", "Tensor (model) parallel degree"),
    pp: str = _list_option("pp", "1", "Pipeline stages"),
    cp: str = _list_option("cp", "1", "Context-parallel degree"),
    cp_comm: str = _list_option("cp_comm", "p2p", "Context-parallel K/V exchange: p2p or all_gather"),
    ep: str = _list_option("ep", "1", "Expert-parallel degree (MoE models; a divisor of dp)"),
    moe_capacity_factor: str | None = _list_option("moe_capacity_factor", None,
                                                   "Expert capacity factor (MoE; default: dropless)"),
    moe_load_imbalance: str | None = _list_option("moe_load_imbalance", None,
                                                  "Busiest expert's tokens over the mean (MoE; >= 1)"),
    vpp: str | None = _list_option("vpp", None, "Model chunks per pipeline rank (default: 2 "
                                   "for VPP and ZBVPP, else 1)"),
    layers_per_stage: str | None = _list_option("layers_per_stage", None,
                                                "Pipeline layer split: balanced (default) or even"),
    schedule: str = _list_option("schedule", "1F1B", "Pipeline schedule (names as for cost)"),
    micro_batch_size: str = _list_option("micro_batch_size", "1", "Sequences per micro-batch"),
    global_batch: str = _list_option("global_batch_size", None, "Sequences per step (required)"),
    seq_len: int | None = opt.SEQ_LEN,
    layers: int | None = opt.LAYERS,
    recompute: str = _list_option("recompute", "none", "Activation recompute: none, selective, selective-op, full"),
    zero: str = _list_option("zero", "0", "ZeRO stage 0-3"),
    fsdp_shard_size: str | None = _list_option("fsdp_shard_size", None,
                                               "HSDP shard group with --zero 3 (N divides dp, "
                                               "2 <= N < dp; 0: shard over all of dp)"),
    sequence_parallel: bool = opt.SEQUENCE_PARALLEL,
    dtype: str = _list_option("dtype", "bfloat16", "Training dtype"),
    framework: str = _list_option("framework", "megatron-core", "Framework profile"),
    attention: str | None = _list_option("attention", None, "Attention implementation"),
    memory_headroom: float = opt.MEMORY_HEADROOM,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per plan (a list).", rich_help_panel=opt.PANEL_OUTPUT),
    plot: str | None = typer.Option(None, "--plot", help="Write the plans' step timelines, one "
                                    "panel each on a shared time axis, as a PNG.", rich_help_panel=opt.PANEL_OUTPUT),
    force: bool = outputs.FORCE,
) -> None:
    """Cost the cross product of comma-listed strategy options and compare the plans."""
    from meshplan.cost_inputs import framework_warnings
    from meshplan.cost_report import memory_fit
    from meshplan.engine import Engine
    from simulator.error_band import band_of

    if global_batch is None:
        raise MeshplanError(f"compare needs {' / '.join(opt.FLAGS['global_batch_size'])}")
    outs.check_output("--plot", plot, "image", force)
    raw = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "cp_comm": cp_comm, "ep": ep, "vpp": vpp,
           "schedule": schedule, "micro_batch_size": micro_batch_size,
           "global_batch_size": global_batch, "recompute": recompute, "zero": zero,
           "dtype": dtype, "framework": framework, "attention": attention,
           "moe_capacity_factor": moe_capacity_factor, "moe_load_imbalance": moe_load_imbalance,
           "layers_per_stage": layers_per_stage, "fsdp_shard_size": fsdp_shard_size}
    lists = parse_lists(raw)
    varied = [f for f, v in lists.items() if len(v) > 1]
    rows, panels, first_error = [], [], None
    for knobs in cmp.plans(lists):
        if vpp is None:
            from completion.strategy import default_vpp

            knobs = {**knobs, "vpp": default_vpp(knobs["schedule"], knobs["pp"])}
        try:
            strategy = _strategy(ctx, knobs, sequence_parallel,
                                 lambda: mg.model_layers(model, seq_len, layers))
            engine = Engine(model, cluster, strategy, nodes=nodes, seq_len=seq_len, num_layers=layers)
            res = engine.simulate()
        except MeshplanError as e:  # StrategyError, ProgramCostError, ...: this plan only
            e = opt.flag_error(ctx, e)  # in the flags' words, as cost says it
            first_error = first_error or e
            rows.append({**knobs, **dict.fromkeys(cmp.RESULT_KEYS), "error": " ".join(str(e).split()),
                         "warnings": []})
            continue
        cl = engine.cluster
        rows.append({**cmp.row(knobs, res, memory_fit(res, cl.device, memory_headroom),
                            strategy.world_size, cl.num_nodes * cl.devices_per_node),
                     "band": band_of(engine), "warnings": framework_warnings(engine)})
        panels.append((cmp.label(knobs, varied), res))
    if not panels:
        raise first_error  # type: ignore[misc]
    def write_plot() -> None:  # after the table: a plot that cannot be written loses no result
        if plot is not None:
            from simulator.gantt import plot_steps

            outs.write_output("--plot", plot, lambda: plot_steps(panels, plot))

    cmp.mark_ties(rows)
    if as_json:
        typer.echo(json.dumps(rows))
    else:
        cmp.echo_table(rows, varied, f"{model} on {cluster}: {len(rows)} plans")
    for knobs_row in rows:  # on stderr, as cost warns: a plan its framework cannot run
        for w in knobs_row.get("warnings") or ():
            typer.echo(f"warning: {cmp.label(knobs_row, varied)}: {w}", err=True)
    write_plot()
    if plot is not None and not as_json:
        typer.echo(f"wrote {plot}")


def register(app: typer.Typer) -> None:
    """Add the ``compare`` command to ``app``."""
    app.command("compare", cls=opt.StrategyCommand)(compare_cmd)
