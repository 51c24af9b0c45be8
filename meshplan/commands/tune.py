"""``meshplan tune`` (strategy search with Optuna) and ``meshplan worker`` (join a study).

``tune`` runs, by default, the branch and bound over the framework's space under
``--time-budget`` (``tuner.search``): the proven optimum, or the best plan and the gap to
the optimum (``tuner.gap``). It writes ``plan.json`` (the best feasible plan, loadable with
``Plan.load``, with what the search knew of it under ``search``), ``history.csv`` (one row per
trial, the project's names: ``tuner.result.HISTORY_COLUMNS``) and ``report.txt`` (counts, the answer and its gap, the top
plans and why the best won: its margin over the runner-up and the best plan of each other
mesh shape with what is proven of it, or with no feasible plan which constraint bound and
by how much, ``tuner.explain``) to ``--output`` (default ``meshplan-runs/STUDY``);
``--json`` prints one JSON object instead of the report. The default storage is the Optuna
journal file ``--output/journal.log``; rerunning the same command resumes the search.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import typer

from meshplan import goodput_inputs as gi
from meshplan import outputs as outs
from meshplan import tune_notes as tn
from meshplan import tune_output as to
from meshplan.commands import goodput_options as gp
from meshplan.commands import megatron_options as mo
from meshplan.commands import options as opt
from meshplan.errors import MeshplanError
from meshplan.frameworks.megatron import arguments as mg
from meshplan.pipeline_split import SPLIT_WORDS, split_word

#: seconds the default search may take before it answers with its gap (``--time-budget``)
DEFAULT_TIME_BUDGET = 120.0


def _tune_config(*args: Any, **kwargs: Any) -> Any:
    """``meshplan.tune_setup.tune_config`` (imported when called: ``meshplan --help`` stays
    light)."""
    from meshplan.tune_setup import tune_config

    return tune_config(*args, **kwargs)


def _pins(ctx: Any, fix: str | None, flags: dict[str, Any], m: mg.MegatronArgs,
          num_layers: Any) -> dict[str, Any]:
    """The knobs pinned by ``--fix`` and by the strategy options (``flags``: field -> value or
    None, not given) with the Megatron arguments ``m`` translated (``meshplan.frameworks.megatron.arguments.apply``).
    Raises MeshplanError when an option and ``--fix`` pin one knob to different values."""
    from tuner.space import parse_fix, tuner_schedule

    pins = {k: opt.value(v) for k, v in flags.items() if v is not None}
    if "schedule" in pins:
        pins["schedule"] = tuner_schedule(pins["schedule"])
    pins = mg.apply(mo.given(ctx), pins, m, num_layers, searched=True)
    if pins.pop("optimizer", "adamw") != "adamw":
        raise MeshplanError(f"--optimizer {opt.value(m.optimizer)}: tune scores AdamW plans (Megatron's "
                            "adam); cost and export take sgd")
    fixed = parse_fix(fix)
    for k, v in pins.items():
        if k in fixed and fixed[k] != v:
            raise MeshplanError(f"{opt.typed_flag(ctx, k)} pins {k}={v} but --fix pins "
                                f"{k}={fixed[k]}; give one of them")
    return {**fixed, **pins}


def _split_word(ctx: Any, text: str | None) -> str | None:
    """``--layers-per-stage`` of tune: ``balanced`` or ``even`` (lower-cased), None when not
    given. A list is refused: each searched plan has its own pp and vpp (cost, compare and
    export take one). Raises MeshplanError naming the flag."""
    if text is None:
        return None
    word = split_word(text)
    if word is None:
        raise MeshplanError(f"{opt.typed_flag(ctx, 'layers_per_stage')} {text!r}: tune takes "
                            f"{' or '.join(SPLIT_WORDS)} (a list of layers per stage fits one "
                            f"plan: give it to cost or export)")
    return word


def _pin_words(ctx: Any, msg: str, by_flag: set[str]) -> str:
    """A search-space error (written for ``--fix k=v``) in the words of the command line: a
    knob the user pinned with an option (``by_flag``) is named by that option (``--tp 3``,
    not ``--fix: tp=3``), and the ``--fix:`` prefix goes when ``--fix`` was not typed."""
    if not opt.typed_flags(ctx, "--fix"):
        msg = msg.removeprefix("--fix: ")
    for k in sorted(by_flag, key=len, reverse=True):
        msg = re.sub(rf"(?<![\w-]){k}=('?)([^,\s']+)\1", rf"{opt.typed_flag(ctx, k)} \2", msg)
    return opt.user_words(ctx, msg.replace(",--", ", --"))


def _note(line: str | None) -> None:
    """Print a ``note:`` line (``meshplan.tune_notes``) on stderr; None: nothing."""
    if line is not None:
        typer.echo(line, err=True)


@mo.megatron_options(mo.TUNE_OPTIONS)
def tune_cmd(
    ctx: typer.Context,
    model: str = opt.MODEL,
    cluster: str = opt.CLUSTER,
    nodes: int | None = opt.NODES,
    global_batch: int = opt.GLOBAL_BATCH,
    seq_len: int | None = opt.SEQ_LEN,
    dtype: opt.Dtype = opt.DTYPE,
    framework: opt.Framework = opt.FRAMEWORK,
    attention: opt.Attention | None = opt.ATTENTION,
    mode: opt.Mode = opt.MODE,
    memory_headroom: float = opt.MEMORY_HEADROOM,
    trials: int | None = typer.Option(
        None, "--trials", min=1, max=opt.MAX_TRIALS,
        help="Distinct plans to score (a repeat is not counted): a sampled search scores that "
             "many (default 100); the default search scores at most that many (default: no "
             "cap), then answers with its gap.", rich_help_panel=opt.PANEL_SEARCH),
    time_budget: float = typer.Option(
        DEFAULT_TIME_BUDGET, "--time-budget", "--timeout", metavar="SECONDS",
        help="Wall-clock budget of the search: within it the default search proves the "
             "optimum; past it every search answers with the best plan found and the proven "
             "lower bound over the rest (the gap).", rich_help_panel=opt.PANEL_SEARCH),
    seed: int = typer.Option(0, "--seed", min=0, max=opt.MAX_SEED, help="Sampler seed.",
                             rich_help_panel=opt.PANEL_SEARCH),
    storage: str | None = typer.Option(None, "--storage",
                                       help="'memory', a journal file or a database URL.", rich_help_panel=opt.PANEL_STORAGE),
    study: str | None = typer.Option(None, "--study", help="Study name (default: derived).", rich_help_panel=opt.PANEL_STORAGE),
    workers: int = typer.Option(1, "--workers", min=1, max=opt.MAX_WORKERS,
                                help="Local worker processes (with --sampler exhaustive they share its slices).", rich_help_panel=opt.PANEL_SEARCH),
    pareto: bool = typer.Option(False, "--pareto", help="Minimise (step time, peak memory).", rich_help_panel=opt.PANEL_SEARCH),
    fix_items: list[str] | None = typer.Option(None, "--fix",
                                               help="Pin knobs, e.g. dp=8,tp=8 (repeatable).", rich_help_panel=opt.PANEL_SEARCH),
    output: str | None = typer.Option(None, "--output", help="Output dir (meshplan-runs/STUDY).", rich_help_panel=opt.PANEL_STORAGE),
    sampler: str | None = typer.Option(None, "--sampler", help="exhaustive (the default: branch and bound, the proven optimum or, past --time-budget, the gap; --workers N and `meshplan worker` share its slices), tpe, random or bruteforce (sampled searches of legal plans; their answers carry the gap too).", rich_help_panel=opt.PANEL_SEARCH),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (the plan, its predicted step and peak memory, the proof status and gap, the search counts) instead of the report.", rich_help_panel=opt.PANEL_OUTPUT),
    layers: int | None = typer.Option(None, "--layers", "--num-layers", min=1, max=opt.MAX_LAYERS,
                                      help="Override the layer count.", rich_help_panel=opt.PANEL_INPUTS),
    cross_node_tp: bool = typer.Option(False, "--allow-cross-node-tp", "--allow-cross-node-mp",
                                       help="Let tensor parallelism span nodes.", rich_help_panel=opt.PANEL_SEARCH),
    top: int = typer.Option(10, "--top", max=opt.MAX_TRIALS, help="Rows of the top-plans table.", rich_help_panel=opt.PANEL_STORAGE),
    no_progress: bool = typer.Option(False, "--no-progress",
                                     help="No progress bar (there is none unless stderr is a terminal).", rich_help_panel=opt.PANEL_STORAGE),
    dp: int | None = opt.DP_PIN,
    tp: int | None = opt.TP_PIN,
    pp: int | None = opt.PP_PIN,
    cp: int | None = opt.CP_PIN,
    cp_comm: opt.CpComm = opt.CP_COMM,
    ep: int | None = opt.EP_PIN,
    vpp: int | None = opt.VPP_PIN,
    schedule: opt.Schedule | None = opt.SCHEDULE_PIN,
    micro_batch_size: int | None = opt.MICRO_BATCH_SIZE_PIN,
    recompute: opt.Recompute | None = opt.RECOMPUTE_PIN,
    zero: int | None = opt.ZERO_PIN,
    sequence_parallel: bool | None = opt.SEQUENCE_PARALLEL_PIN,
    megatron: mg.MegatronArgs = mo.MEGATRON,
    gpus: str | None = typer.Option(None, "--gpus",
                                    help="Cluster sizes to compare: 512, 256,512 or 256-1024 "
                                         "(doubling); one search per size.", rich_help_panel=opt.PANEL_SEARCH),
    objective: str = typer.Option("cost", "--objective",
                                  help="With --gpus: pick the size by 'cost' (GPU-hours per "
                                       "million tokens) or 'time' (shortest step). 'time-to-train' "
                                       "and 'cost-to-train' (with --tokens) score every plan by the "
                                       "expected wall time to train, checkpoints and interruptions "
                                       "included, and its dollars; 'p90' by the sampled P90 step.", rich_help_panel=opt.PANEL_SEARCH),
    tokens: str | None = gp.TOKENS,
    price: float | None = gp.PRICE,
    prices: str | None = gp.PRICES,
    checkpoint: str = gp.CHECKPOINT,
    checkpoint_interval: int | None = gp.CHECKPOINT_INTERVAL,
    spares: int = gp.SPARES,
    deadline: str | None = gp.DEADLINE,
    jitter_samples: int | None = gp.JITTER_SAMPLES,
    jitter_seed: int = gp.JITTER_SEED,
    max_step_time: float | None = typer.Option(None, "--max-step-time",
                                               help="Deadline: only plans whose step takes at "
                                                    "most S seconds qualify.", rich_help_panel=opt.PANEL_SEARCH),
    search_fp8: bool = typer.Option(False, "--search-fp8",
                                    help="Also try the FP8 recipes the framework runs (te-delayed; "
                                         "tensorwise, rowwise under fsdp2) beside BF16 (off by "
                                         "default: FP8 changes the numerics); pin one with "
                                         "--fix fp8=NAME. Needs a device with an FP8 peak.", rich_help_panel=opt.PANEL_SEARCH),
    seed_from_bound: int | None = typer.Option(
        None, "--seed-from-bound", min=0, max=opt.MAX_TRIALS, metavar="K",
        help="tpe/random samplers: enqueue the K plans with the lowest step-time lower bound "
             "first, and report the best bound still open (no unexplored plan can beat it: the "
             "gap to the optimum). Default: 16 for pattern-based TPE on a space of at most "
             "1,000 plans, else off; 0: off. full_random: only its tp=1 plans are bounded.", rich_help_panel=opt.PANEL_SEARCH),
    layers_per_stage: str | None = typer.Option(
        None, *opt.FLAGS["layers_per_stage"],
        help="Pipeline layer split each plan is costed with: 'balanced' (the default: the "
             "stages' times balanced) or 'even' (Megatron-LM's default split, which "
             "export writes when the layers divide; plan.json then states it).", rich_help_panel=opt.PANEL_STRATEGY),
    all_schedules: bool = typer.Option(False, "--all-schedules",
                                       help="Also search the pipeline schedules the framework does "
                                            "not run (ZB-H1, ZB-2p ... under Megatron-LM): by "
                                            "default a search tries only the --framework "
                                            "profile's (pipeline.schedules).", rich_help_panel=opt.PANEL_SEARCH),
    search_cp: bool | None = typer.Option(
        None, "--search-cp/--no-search-cp",
        help="Context parallelism, under a --framework that runs it: by default the degrees "
             "that keep at least 8,192 tokens per cp rank (none at --seq-len 8192); "
             "--search-cp every divisor of the GPUs whose 2 cp divides --seq-len; "
             "--no-search-cp none; pin one with --cp N.", rich_help_panel=opt.PANEL_SEARCH),
    search_hsdp: bool = typer.Option(False, "--search-hsdp",
                                     help="With ZeRO-3 also try HSDP shard groups (every divisor "
                                          "N of dp, 2 <= N < dp); pin one with --fix "
                                          "fsdp_shard_size=N.", rich_help_panel=opt.PANEL_SEARCH),
    force: bool = typer.Option(False, "--force", help="Write into an --output folder that holds "
                                                      "another study's plan.json and history.csv.",
                               rich_help_panel=opt.PANEL_STORAGE),
) -> None:
    """Search the fastest plan of MODEL on CLUSTER that fits in memory (--gpus: the cheapest size).

    With --gpus, one search per cluster size picks the cheapest size and its plan.

    MODEL is a built-in model name, a Hugging Face config.json file or its folder; CLUSTER a
    catalog name or a cluster YAML file. The strategy options (--tp, --pp, ... and their
    Megatron-LM spellings) pin their knob, as --fix does; the rest is searched."""
    import optuna

    from meshplan import terminal
    from meshplan.commands.unused import check_tune_options
    from meshplan.tune_sizes import tune_over_sizes
    from tuner.search import MEMORY, search
    from tuner.space import SpaceError, parse_fix

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # --fix may be repeated: its items are pinned together (a knob pinned twice is refused)
    fix = ",".join(fix_items) if fix_items else None
    if top < 1:
        raise MeshplanError(f"--top must be >= 1, got {top}")
    if not (time_budget > 0 and math.isfinite(time_budget)):
        flag = (opt.typed_flags(ctx, "--time-budget", "--timeout") or ["--time-budget"])[0]
        raise MeshplanError(f"{flag} must be > 0 seconds (and finite), got {time_budget}")
    mode_name = opt.value(mode)
    split = _split_word(ctx, layers_per_stage)
    fixed = _pins(ctx, fix, {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "vpp": vpp,
                             "schedule": schedule, "micro_batch_size": micro_batch_size,
                             "recompute": recompute, "zero": zero,
                             "sequence_parallel": sequence_parallel},
                  megatron, lambda: mg.model_layers(model, seq_len, layers))

    # --cluster A,B with --gpus: every size of each cluster (tune_sizes.tune_over_sizes)
    many = [c.strip() for c in cluster.split(",")] if gpus is not None and "," in cluster else None
    cluster = many[0] if many else cluster
    deadline_s = gi.parse_duration(deadline)

    def goal(cl: str) -> dict[str, Any] | None:  # --objective time-to-train ...: the scorer's
        from clusters import load_cluster

        return gi.search_objective(objective, load_cluster(cl), tokens, price, prices, checkpoint,
                                   checkpoint_interval, spares, jitter_samples, jitter_seed)

    def config_for(n: int | None, cl: str | None = None) -> Any:  # this command line on n nodes
        cl = cl or cluster
        return _tune_config(model, cl, n, global_batch, seq_len, mode_name, seed, pareto,
                            fixed, sampler, layers, cross_node_tp,
                            opt.value(mg.dtype_of(mo.given(ctx), dtype, megatron, mo.echo_note)),
                            opt.value(framework), opt.value(attention), memory_headroom,
                            search_hsdp, search_fp8, split, all_schedules, search_cp,
                            opt.value(cp_comm), goal(cl))

    check_tune_options(ctx, fixed, fix_items, gpus, workers, objective)
    try:
        cfg = config_for(nodes)
    except SpaceError as e:
        raise SpaceError(_pin_words(ctx, str(e), set(fixed) - set(parse_fix(fix)))) from None
    if fixed.get("pp") != 1:  # one stage runs no pipeline schedule
        _note(tn.unrun_schedule(fixed.get("schedule"), opt.value(framework), all_schedules))
    _note(tn.unrun_cp(fixed.get("cp"), opt.value(framework)))
    _note(tn.cpu_cluster(cluster, nodes, opt.value(framework), str(opt.value(dtype))))
    name, out, note = to.checked_output(cfg, (model, mode_name), study, output, storage,
                                        seed_from_bound, objective, max_step_time, gpus, nodes,
                                        cluster, force)
    _note(note)

    def run(c: Any, study_name: str, d: Path) -> Any:  # one study, in d unless in memory
        return search(c, study_name, storage=storage, study_dir=None if storage == MEMORY else d,
                      n_trials=trials, timeout=time_budget, workers=workers,
                      progress=not no_progress and terminal.progress_enabled(),
                      progress_bar=terminal.Progress, seed_from_bound=seed_from_bound)

    if gpus is not None:
        def run_one(n: int | None, study_name: str, d: Path, cl: str | None = None) -> Any:
            cfg_n = config_for(n, cl)
            if storage is None:
                outs.ensure_dir(d)
                _note(tn.other_studies(d, study_name))
            res_n = run(cfg_n, study_name, d)
            outs.ensure_dir(d)
            to.finish(res_n, cfg_n, study_name, storage or str(d / "journal.log"), d, top,
                      quiet=as_json)
            return res_n

        try:
            chosen = tune_over_sizes(gpus, objective, max_step_time, many or cluster, name, out, run_one,
                                     global_batch * cfg.space.problem.seq_len, deadline_s, as_json)
        except ValueError as e:
            raise MeshplanError(str(e)) from None
        if chosen is None:
            raise typer.Exit(1)  # no size qualifies
        return
    res = run(cfg, name, out)
    where = storage or str(out / "journal.log")
    outs.ensure_dir(out)
    if not to.finish(res, cfg, name, where, out, top, max_step_time, deadline_s, as_json):
        raise typer.Exit(1)  # no feasible plan, or none within --max-step-time / --deadline


def worker_cmd(
    study: str = typer.Option(..., "--study", help="Study name to join."),
    storage: str = typer.Option(..., "--storage", help="Journal file or database URL."),
    trials: int | None = typer.Option(None, "--trials", min=1, max=opt.MAX_TRIALS,
                                      help="Target (default: the study's)."),
    timeout: float | None = typer.Option(None, "--timeout", help="Stop after S seconds."),
) -> None:
    """Join a search that meshplan tune started and run its trials.

    With --sampler exhaustive: take open slices of the enumeration until none is left."""
    import optuna

    from tuner.study import check_study_name, run_worker

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_study_name(study)
    journal = storage[len("journal:"):] if storage.startswith("journal:") else storage
    if "://" not in journal and not Path(journal).is_file():  # joining: nothing to create
        raise MeshplanError(f"--storage {storage!r}: no such journal file; a worker joins a study "
                            f"that `meshplan tune --storage` started")
    n = run_worker(study, storage, trials, timeout)
    typer.echo(f"worker ran {n} trials on study {study}")


def register(app: typer.Typer) -> None:
    """Add the ``tune`` and ``worker`` commands to ``app``."""
    app.command("tune", cls=opt.StrategyCommand)(tune_cmd)
    app.command("worker")(worker_cmd)
