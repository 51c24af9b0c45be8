"""The Megatron-LM options of ``meshplan cost``, ``tune`` and ``export``, declared once: the
typer options of the arguments :mod:`meshplan.frameworks.megatron.arguments` translates
(:data:`OPTIONS`, in ``--help`` order) and of the MoE arguments
:mod:`meshplan.frameworks.megatron.moe` checks (:data:`MOE_OPTIONS`, ``cost`` only).

:func:`megatron_options` adds the group to a command: the command declares one parameter
``megatron: MegatronArgs = MEGATRON`` where the options go in ``--help``, and receives the
arguments as one :class:`~meshplan.frameworks.megatron.arguments.MegatronArgs`; likewise
``moe: MegatronMoE = MOE``. :func:`given` turns the command line into the plain
:class:`~meshplan.frameworks.given.GivenFlags` the framework adapters take.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import typer

from meshplan.commands.options import ARGS_KEY, MAX_LAYERS, PANEL_MEGATRON
from meshplan.flags import FLAGS, SIZE_FLAGS
from meshplan.frameworks.given import GivenFlags
from meshplan.frameworks.megatron import arguments as mg
from meshplan.frameworks.megatron import launch
from meshplan.frameworks.megatron import moe as moe_args

PANEL = PANEL_MEGATRON
MOE_PANEL = "Megatron-LM MoE arguments (checked against --model)"

VPP_LAYERS = typer.Option(
    None, "--num-layers-per-virtual-pipeline-stage", min=1, max=MAX_LAYERS,
    help="Megatron-LM: decoder layers per virtual pipeline stage; vpp = layers / (pp x N), "
         "schedule VPP unless --schedule is given.", rich_help_panel=PANEL)
GRANULARITY = typer.Option(None, "--recompute-granularity", case_sensitive=False,
                           help="Megatron-LM: full or selective (= --recompute full / selective).", rich_help_panel=PANEL)
METHOD = typer.Option(None, "--recompute-method", case_sensitive=False,
                      help="Megatron-LM, with --recompute-granularity full: uniform or block.", rich_help_panel=PANEL)
RECOMPUTE_LAYERS = typer.Option(
    None, "--recompute-num-layers", min=1, max=MAX_LAYERS,
    help="Megatron-LM: layers per recompute unit (uniform; 1, the default) or recomputed layers "
         "per model chunk (block; all of them).", rich_help_panel=PANEL)
RECOMPUTE_ACTIVATIONS = typer.Option(False, "--recompute-activations",
                                     help="Megatron-LM: = --recompute-granularity selective.", rich_help_panel=PANEL)
DISTRIBUTED_OPTIMIZER = typer.Option(False, "--use-distributed-optimizer",
                                     help="Megatron-LM: optimizer states sharded over dp (= --zero 1).", rich_help_panel=PANEL)

MEGATRON_FSDP = typer.Option(False, "--use-megatron-fsdp",
                             help="Megatron-LM: Megatron-FSDP; --data-parallel-sharding-strategy "
                                  "gives the ZeRO stage.", rich_help_panel=PANEL)
DP_SHARDING = typer.Option(None, "--data-parallel-sharding-strategy", case_sensitive=False,
                           help="Megatron-FSDP: no_shard, optim, optim_grads, optim_grads_params "
                                "(= --zero 0, 1, 2, 3).", rich_help_panel=PANEL)
OPTIMIZER_INSTANCES = typer.Option(None, "--num-distributed-optimizer-instances", min=1,
                                   help="Megatron-FSDP HSDP: K replicas of the sharded states "
                                        "(= --hsdp dp / K, with --outer-dp-sharding-strategy no_shard).", rich_help_panel=PANEL)
OUTER_SHARDING = typer.Option(None, "--outer-dp-sharding-strategy",
                              help="Megatron-FSDP HSDP across the replicas: no_shard (what meshplan "
                                   "costs).", rich_help_panel=PANEL)
GRAD_REDUCE_BF16 = typer.Option(False, "--grad-reduce-in-bf16",
                                help="Megatron-LM: gradients reduced in bf16; must be what the "
                                     "--framework profile does (nemo, megatron-bridge).", rich_help_panel=PANEL)
OVERLAP_GRAD_REDUCE = typer.Option(False, "--overlap-grad-reduce",
                                   help="Megatron-LM: gradient reduce overlapped with backward "
                                        "(the megatron-core profiles cost it so).", rich_help_panel=PANEL)
OVERLAP_PARAM_GATHER = typer.Option(False, "--overlap-param-gather",
                                    help="Megatron-LM: the distributed optimizer's all_gather "
                                         "overlapped with forward (the megatron-core profiles).", rich_help_panel=PANEL)
TP_COMM_OVERLAP = typer.Option(False, "--tp-comm-overlap",
                               help="Megatron-LM: Transformer Engine userbuffers overlap of the "
                                    "TP collectives (the megatron-core profiles).", rich_help_panel=PANEL)
PIPELINE_LAYOUT = typer.Option(
    None, "--pipeline-model-parallel-layout",
    help="Megatron-LM: decoder layers per virtual stage, e.g. 'E,t*4|t*4,L' (E embedding on the "
         "first, L loss on the last, | between stages): = --layers-per-stage 4,4, with vpp = "
         "stages / pp.", rich_help_panel=PANEL)
BF16 = typer.Option(False, "--bf16", help="Megatron-LM: = --dtype bfloat16.", rich_help_panel=PANEL)
FP16 = typer.Option(False, "--fp16", help="Megatron-LM: = --dtype float16.", rich_help_panel=PANEL)
FP8_FORMAT = typer.Option(None, "--fp8-format", case_sensitive=False,
                          help="Megatron-LM: FP8 decoder linears (hybrid or e4m3, the same cost) under "
                               "BF16: = --dtype fp8-delayed.", rich_help_panel=PANEL)
FP8_RECIPE = typer.Option(None, "--fp8-recipe", case_sensitive=False,
                          help="Megatron-LM, with --fp8-format: delayed (the default) or tensorwise "
                               "(current scaling, costed as delayed).", rich_help_panel=PANEL)
FP8_AMAX_HISTORY = typer.Option(None, "--fp8-amax-history-len", min=1,
                                help="Megatron-LM: taken, no cost effect (the model keeps a "
                                     "1024-step amax history).", rich_help_panel=PANEL)
FP8_AMAX_ALGO = typer.Option(None, "--fp8-amax-compute-algo",
                             help="Megatron-LM: max or most_recent; taken, no cost effect.", rich_help_panel=PANEL)
OPTIMIZER = typer.Option(None, "--optimizer", case_sensitive=False,
                         help="Megatron-LM: adam (Adam with decoupled weight decay, meshplan's "
                              "adamw, the default) or sgd.", rich_help_panel=PANEL)

NUM_EXPERTS = typer.Option(None, "--num-experts", min=1, rich_help_panel=MOE_PANEL,
                           help="Routed experts; must be the model's.")
TOPK = typer.Option(None, "--moe-router-topk", min=1, rich_help_panel=MOE_PANEL,
                    help="Experts per token; must be the model's.")
FFN = typer.Option(None, "--moe-ffn-hidden-size", min=1, rich_help_panel=MOE_PANEL,
                   help="An expert's hidden width; must be the model's.")
SHARED = typer.Option(None, "--moe-shared-expert-intermediate-size", min=1, rich_help_panel=MOE_PANEL,
                      help="The shared expert's width; must be the model's.")
LAYER_FREQ = typer.Option(None, "--moe-layer-freq", rich_help_panel=MOE_PANEL,
                          help="MoE layers: every N-th (an int) or a list [1,0,...] per layer; "
                               "must be the model's.")
AUX_COEFF = typer.Option(None, "--moe-aux-loss-coeff", min=0.0, rich_help_panel=MOE_PANEL,
                         help="Load-balancing loss weight; must be the model's.")
BALANCING = typer.Option(None, "--moe-router-load-balancing-type", case_sensitive=False,
                         rich_help_panel=MOE_PANEL,
                         help="aux_loss (with the model's coefficient) or none (a model without one).")
GROUPED = typer.Option(False, "--moe-grouped-gemm", rich_help_panel=MOE_PANEL,
                       help="Grouped expert GEMMs (what meshplan costs).")
DISPATCHER = typer.Option(None, "--moe-token-dispatcher-type", case_sensitive=False,
                          rich_help_panel=MOE_PANEL,
                          help="alltoall (what meshplan costs); allgather and flex are refused.")



#: the Megatron-LM group, in ``--help`` order: (command parameter, its type, its option);
#: the parameter names are :attr:`MegatronArgs.PARAMS`' (``--fp8-amax-history-len`` is
#: taken and does not change the cost: no field)
OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("vpp_layers", int | None, VPP_LAYERS),
    ("recompute_granularity", mg.Granularity | None, GRANULARITY),
    ("recompute_method", mg.Method | None, METHOD),
    ("recompute_num_layers", int | None, RECOMPUTE_LAYERS),
    ("recompute_activations", bool, RECOMPUTE_ACTIVATIONS),
    ("use_distributed_optimizer", bool, DISTRIBUTED_OPTIMIZER),
    ("bf16", bool, BF16),
    ("fp16", bool, FP16),
    ("fp8_format", mg.Fp8Format | None, FP8_FORMAT),
    ("fp8_recipe", mg.Fp8Recipe | None, FP8_RECIPE),
    ("fp8_amax_history_len", int | None, FP8_AMAX_HISTORY),
    ("fp8_amax_compute_algo", str | None, FP8_AMAX_ALGO),
    ("megatron_optimizer", mg.MegatronOptimizer | None, OPTIMIZER),
    ("pipeline_model_parallel_layout", str | None, PIPELINE_LAYOUT),
    ("use_megatron_fsdp", bool, MEGATRON_FSDP),
    ("data_parallel_sharding_strategy", mg.DpSharding | None, DP_SHARDING),
    ("num_distributed_optimizer_instances", int | None, OPTIMIZER_INSTANCES),
    ("outer_dp_sharding_strategy", str | None, OUTER_SHARDING),
    ("grad_reduce_in_bf16", bool, GRAD_REDUCE_BF16),
    ("overlap_grad_reduce", bool, OVERLAP_GRAD_REDUCE),
    ("overlap_param_gather", bool, OVERLAP_PARAM_GATHER),
    ("tp_comm_overlap", bool, TP_COMM_OVERLAP),
)
#: the part of :data:`OPTIONS` ``tune`` offers (recompute, precision, optimizer: the
#: layout, Megatron-FSDP and overlap switches describe one run, not a search)
TUNE_OPTIONS = tuple(name for name, _, _ in OPTIONS[:13])
#: the MoE group (``cost``): parameter names are :class:`MegatronMoE`'s fields
MOE_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("num_experts", int | None, NUM_EXPERTS),
    ("moe_router_topk", int | None, TOPK),
    ("moe_ffn_hidden_size", int | None, FFN),
    ("moe_shared_expert_intermediate_size", int | None, SHARED),
    ("moe_layer_freq", str | None, LAYER_FREQ),
    ("moe_aux_loss_coeff", float | None, AUX_COEFF),
    ("moe_router_load_balancing_type", moe_args.Balancing | None, BALANCING),
    ("moe_grouped_gemm", bool, GROUPED),
    ("moe_token_dispatcher_type", moe_args.Dispatcher | None, DISPATCHER),
)

#: the placeholder defaults of a command's ``megatron`` / ``moe`` parameter
MEGATRON = mg.MegatronArgs()
MOE = moe_args.MegatronMoE()


def megatron_options(names: tuple[str, ...] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator putting the Megatron-LM option group (:data:`OPTIONS`; ``names``: only
    those, e.g. :data:`TUNE_OPTIONS`) in place of the command's ``megatron`` parameter and
    the MoE group (:data:`MOE_OPTIONS`) in place of its ``moe`` parameter, as typer reads a
    signature; the command is called with one ``MegatronArgs`` / ``MegatronMoE``."""
    chosen = [o for o in OPTIONS if names is None or o[0] in names]

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn, eval_str=True)
        groups = {"megatron": chosen, "moe": list(MOE_OPTIONS)}
        params: list[inspect.Parameter] = []
        for p in sig.parameters.values():
            params += ([inspect.Parameter(n, p.kind, default=o, annotation=t) for n, t, o in groups[p.name]]
                       if p.name in groups else [p])

        @functools.wraps(fn)
        def command(**kw: Any) -> Any:
            if "megatron" in sig.parameters:
                kw["megatron"] = mg.MegatronArgs.from_params({n: kw.pop(n) for n, _, _ in chosen})
            if "moe" in sig.parameters:
                kw["moe"] = moe_args.MegatronMoE.from_params({n: kw.pop(n) for n, _, _ in MOE_OPTIONS})
            return fn(**kw)

        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params
                                   if p.annotation is not inspect.Parameter.empty}
        return command

    return deco


def given(ctx: Any) -> GivenFlags:
    """The flags typed on the command line of ``ctx`` (a :class:`~meshplan.commands.options.StrategyCommand`'s),
    with the Strategy and size fields' spellings, as the framework adapters take them."""
    args = ctx.meta.get(ARGS_KEY, ()) if ctx is not None else ()
    return GivenFlags(tuple(args), {**FLAGS, **SIZE_FLAGS})


def echo_note(text: str) -> None:
    """One ``note: TEXT`` line on stderr: how the commands show an adapter's note."""
    typer.echo(f"note: {text}", err=True)


def sequence_parallel(ctx: Any, sp: bool, tp: int) -> bool:
    """``--sequence-parallel`` as Megatron-LM takes it (``launch.sequence_parallel``), the
    note kept with the launch line's cost-neutral arguments of ``ctx``."""
    return launch.sequence_parallel(ctx.meta.setdefault(launch.NEUTRAL_KEY, []), sp, tp)


def launch_notes(ctx: Any, source: Callable[[], Any]) -> list[str]:
    """``launch.finish`` of the Megatron-LM launch line ``options.StrategyCommand`` took out of
    the command line of ``ctx``: the architecture arguments checked against ``source()``,
    the note naming the cost-neutral ones."""
    meta = getattr(ctx, "meta", {}) or {}
    return launch.finish(meta.get(launch.ARCH_KEY) or {}, meta.get(launch.NEUTRAL_KEY) or [], source)


def megatron_dp(ctx: Any, knobs: dict[str, Any], cluster: str, nodes: int | None) -> tuple[dict[str, Any], str | None]:
    """``(knobs, note)``: ``knobs`` with dp read as Megatron-LM reads it when the command line
    of ``ctx`` holds Megatron-LM arguments and no ``--dp`` (the cluster's GPUs over tp x pp x
    cp, ``frameworks.megatron.data_parallel.megatron_dp``) and its note (for the command to
    show once the strategy is built), else ``(knobs, None)``. A degree below 1 is left to
    the Strategy's own refusal."""
    from clusters import load_cluster
    from meshplan.frameworks.megatron.data_parallel import megatron_dp as derive
    from meshplan.frameworks.megatron.data_parallel import megatron_spelled

    g = given(ctx)
    degrees = [int(knobs[k]) for k in ("tp", "pp", "cp")]
    if g.given("dp") or min(degrees) < 1 or not megatron_spelled(g):  # no cluster loaded then
        return knobs, None
    got = derive(g, *degrees, load_cluster(cluster, nodes).world_size)
    return (knobs, None) if got is None else ({**knobs, "dp": got[0]}, got[1])


def megatron_strategy(ctx: Any, knobs: dict[str, Any], megatron: mg.MegatronArgs,
                      num_layers: Callable[[], int], layers_per_stage: str | None) -> Any:
    """The Strategy of a command's strategy options ``knobs`` (Strategy field -> the option's
    value) with the Megatron-LM arguments ``megatron`` translated into them
    (``arguments.apply``, its checks of the overlap and gradient-reduce switches against the
    profile, ``--sequence-parallel`` at tp 1), then the pipeline split of
    ``--layers-per-stage``; ``num_layers()``: the model's decoder layers, called only when
    needed. ``cost`` and ``export`` build their strategy here. Raises MeshplanError /
    StrategyError naming the flags typed."""
    from meshplan.commands import options as opt

    moved = mg.apply(given(ctx), {k: knobs[k] for k in ("pp", "vpp", "schedule", "recompute", "zero",
                                                        "dtype", "fsdp_shard_size")},
                     megatron, num_layers, dp=int(knobs["dp"]), note=echo_note)
    mg.check_grad_reduce(megatron, knobs["framework"], moved["dtype"])
    mg.check_overlaps(megatron, knobs["framework"])
    sp = sequence_parallel(ctx, bool(knobs["sequence_parallel"]), int(knobs["tp"]))
    strategy = opt.build_strategy(ctx, **{**knobs, **moved, "sequence_parallel": sp})
    return opt.pipeline_split(ctx, layers_per_stage, strategy, num_layers)
