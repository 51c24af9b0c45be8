"""The strategy options that ``meshplan cost``, ``tune`` and ``complete`` share, defined once.

One spelling per knob, the Strategy field's (``completion.strategy``): ``--dp``, ``--tp``,
``--pp``, ``--cp``, ``--cp-comm``, ``--vpp``, ``--schedule``, ``--micro-batch-size``, ``--global-batch``, ``--seq-len``,
``--recompute``, ``--zero``, ``--fsdp-shard-size`` (alias ``--hsdp``), ``--sequence-parallel``, ``--dtype``; earlier and Megatron-LM
spellings are aliases (:data:`FLAGS`); Megatron-LM arguments that are not one-to-one aliases
(``--num-layers-per-virtual-pipeline-stage``, ``--recompute-granularity`` / ``--recompute-method``,
``--use-distributed-optimizer``) are translated by ``meshplan.frameworks.megatron.arguments``. Closed value sets are typer Enum choices;
schedule names are case-insensitive and take the aliases of
``completion.strategy.SCHEDULE_ALIASES``.

The choices are generated from the registries of ``completion.choices`` (SCHEDULES,
SCHEDULE_ALIASES, RECOMPUTE, DTYPES + FP8_DTYPES, CP_COMMS, ATTENTIONS, FRAMEWORKS, MODES),
the one list of each knob that the Strategy, the simulator and the tuner read too: a light
module (it imports nothing; ``completion``'s ``__init__`` is lazy), so ``meshplan --help``
stays fast (tests/meshplan/test_cli_structure.py).
"""

from __future__ import annotations

import math
import re
from enum import Enum
from typing import Any

import typer
from typer.core import TyperCommand

from completion import choices
from meshplan.errors import MeshplanError
from meshplan.flags import FLAGS, SIZE_FLAGS

SCHEDULE_NAMES = choices.SCHEDULES
SCHEDULE_ALIAS_NAMES = tuple(choices.SCHEDULE_ALIASES)


def _choices(name: str, values: tuple[str, ...]) -> Any:
    """A typer choice Enum of ``values`` (a registry of ``completion.choices``): each member
    named as its value with ``-`` as ``_`` (``Dtype.fp8_delayed``), valued as the value."""
    return Enum(name, {v.replace("-", "_"): v for v in values}, type=str)


#: Pipeline schedule choices (canonical names and aliases; matched case-insensitively).
Schedule = Enum("Schedule", {n: n for n in SCHEDULE_NAMES + SCHEDULE_ALIAS_NAMES}, type=str)
#: Activation recompute (completion.choices.RECOMPUTE).
Recompute = _choices("Recompute", choices.RECOMPUTE)
#: Attention implementation (completion.choices.ATTENTIONS).
Attention = _choices("Attention", choices.ATTENTIONS)
#: How context-parallel attention gets K/V (CP_COMMS, then Megatron-LM's allgather).
CpComm = _choices("CpComm", choices.CP_COMMS + tuple(choices.CP_COMM_ALIASES))
#: Training dtype (DTYPES, then the FP8 recipes' spellings FP8_DTYPES: BF16 with the decoder
#: linears' GEMMs in FP8).
Dtype = _choices("Dtype", choices.DTYPES + tuple(choices.FP8_DTYPES))
#: Strategy search mode (completion.choices.MODES, tuner.study.MODES).
Mode = _choices("Mode", choices.MODES)


#: Upper bounds of the size options (issue 16 item 8), mirrored from the packages that
#: own them so that ``meshplan --help`` imports nothing heavy (tests/meshplan/test_cli_options.py
#: checks that they agree): tokens per sequence and decoder layers
#: (``completion.models.config.MAX_MODEL_SIZES``), nodes (``clusters.spec.MAX_WORLD_SIZE``),
#: sequences per step (``completion.strategy.MAX_BATCH``), pipeline passes and times of one
#: simulated schedule (``simulator.schedules.base.MAX_ACTIONS``, ``MAX_TIME_S``, ``MAX_MEMORY_LIMIT``),
#: model chunks per rank (``completion.strategy.MAX_VPP``), local ranks
#: (``executor.launch.MAX_LOCAL_RANKS``).
MAX_SEQ_LEN = 2**24
MAX_LAYERS = 2**14
MAX_NODES = 2**20
MAX_BATCH = 2**24
MAX_ACTIONS = 2**19
MAX_TIME_S = 1e6
MAX_MEMORY_LIMIT = float(2**20)
MAX_VPP = 64
MAX_LOCAL_RANKS = 64
#: tune: most trials, local worker processes, rows of the top table; sampler seeds are
#: 32-bit (numpy's)
MAX_TRIALS = 10**7
MAX_WORKERS = 256
MAX_SEED = 2**32 - 1

#: the groups of options ``--help`` shows (typer's ``rich_help_panel``); options without one
#: fall under "Options"
PANEL_INPUTS = "Model and cluster"
PANEL_STRATEGY = "Strategy"
PANEL_MEGATRON = "Megatron-LM arguments (translated)"
PANEL_SEARCH = "Search"
PANEL_STORAGE = "Storage and output"
PANEL_OUTPUT = "Output"
PANEL_TRAIN = "Time to train and cost"

MODEL = typer.Option(..., "--model", "-m",
                     help="Built-in model name, or a Hugging Face config.json (or its model folder; cost: also "
                          "a .pir program text).", rich_help_panel=PANEL_INPUTS)
#: ``complete``'s --model: optional there (it takes --program FILE instead)
MODEL_OR_PROGRAM = typer.Option(None, "--model", "-m",
                                help="Built-in model name or config.json path (or --program).", rich_help_panel=PANEL_INPUTS)
#: ``cost``'s and ``export``'s --model, --cluster and --global-batch: optional there (a plan
#: file gives them instead)
MODEL_OR_PLAN = typer.Option(None, "--model", "-m",
                             help="Built-in model name, or a Hugging Face config.json (or its model "
                                  "folder; cost: also a .pir program text); without PLAN.json.", rich_help_panel=PANEL_INPUTS)
CLUSTER_OR_PLAN = typer.Option(None, "--cluster", help="Catalog cluster name, or a file: a cluster "
                                                       "YAML (with PLAN.json: instead of the plan's).", rich_help_panel=PANEL_INPUTS)
CLUSTER = typer.Option(..., "--cluster", help="Catalog cluster name, or a file: a cluster YAML.", rich_help_panel=PANEL_INPUTS)
NODES = typer.Option(None, "--nodes", min=1, help="Number of nodes (default: the spec's).", rich_help_panel=PANEL_INPUTS)
DP = typer.Option(1, *FLAGS["dp"], help="Data-parallel degree.", rich_help_panel=PANEL_STRATEGY)
TP = typer.Option(1, *FLAGS["tp"], help="Tensor (model) parallel degree.", rich_help_panel=PANEL_STRATEGY)
PP = typer.Option(1, *FLAGS["pp"], help="Pipeline stages.", rich_help_panel=PANEL_STRATEGY)
CP = typer.Option(1, *FLAGS["cp"],
                  help="Context-parallel degree: each sequence split over CP ranks (ring attention).", rich_help_panel=PANEL_STRATEGY)
EP = typer.Option(1, *FLAGS["ep"],
                  help="Expert-parallel degree of a mixture-of-experts model (the experts split over "
                       "ep ranks, tokens sent by all_to_all; the expert layers fold onto the same "
                       "ranks: etp x ep x edp = tp x cp x dp, expert gradients reduced over edp).",
                  rich_help_panel=PANEL_STRATEGY)
ETP = typer.Option(None, *FLAGS["etp"], min=1,
                   help="Expert tensor-parallel degree: tp (default, each expert split as a dense "
                        "MLP) or 1 (whole experts; ep then spans tensor-parallel ranks too, a "
                        "multiple of tp).", rich_help_panel=PANEL_STRATEGY)
MOE_CAPACITY_FACTOR = typer.Option(None, *FLAGS["moe_capacity_factor"],
                                   help="Expert capacity factor c: each expert keeps at most "
                                        "ceil(c * s * k / E) tokens per sequence and drops the "
                                        "rest (default: dropless).", rich_help_panel=PANEL_STRATEGY)
MOE_LOAD_IMBALANCE = typer.Option(1.0, *FLAGS["moe_load_imbalance"],
                                  help="Tokens of the busiest expert over the mean (>= 1; 1: uniform "
                                       "routing); experts are costed at that load, capped by the capacity.", rich_help_panel=PANEL_STRATEGY)
CP_COMM = typer.Option(CpComm.p2p, *FLAGS["cp_comm"], case_sensitive=False,
                       help="Context-parallel K/V exchange: p2p (ring) or all_gather "
                            "(Megatron-LM's allgather).", rich_help_panel=PANEL_STRATEGY)
VPP = typer.Option(1, *FLAGS["vpp"], help="Model chunks per pipeline rank (VPP/ZBVPP).", rich_help_panel=PANEL_STRATEGY)
SCHEDULE = typer.Option(
    Schedule["1F1B"], *FLAGS["schedule"], case_sensitive=False, show_choices=False,
    help=f"Pipeline schedule, case-insensitive: {', '.join(SCHEDULE_NAMES)} "
         f"(aliases: {', '.join(SCHEDULE_ALIAS_NAMES)}).", rich_help_panel=PANEL_STRATEGY)
MICRO_BATCH_SIZE = typer.Option(1, *FLAGS["micro_batch_size"], help="Sequences per micro-batch.", rich_help_panel=PANEL_STRATEGY)
GLOBAL_BATCH = typer.Option(..., *FLAGS["global_batch_size"], help="Sequences per step.", rich_help_panel=PANEL_INPUTS)
GLOBAL_BATCH_OR_PLAN = typer.Option(None, *FLAGS["global_batch_size"],
                                    help="Sequences per step (without PLAN.json).", rich_help_panel=PANEL_INPUTS)
SEQ_LEN = typer.Option(None, *SIZE_FLAGS["seq_len"], min=1, max=MAX_SEQ_LEN,
                       help="Tokens per sequence (default: the model's).", rich_help_panel=PANEL_INPUTS)
LAYERS = typer.Option(None, *SIZE_FLAGS["num_layers"], min=1, max=MAX_LAYERS,
                      help="Override the layer count.", rich_help_panel=PANEL_INPUTS)
RECOMPUTE = typer.Option(Recompute.none, *FLAGS["recompute"], case_sensitive=False,
                         help="Activation recompute.", rich_help_panel=PANEL_STRATEGY)
ZERO = typer.Option(0, *FLAGS["zero"], help="ZeRO sharding stage 0-3 over dp.", rich_help_panel=PANEL_STRATEGY)
FSDP_SHARD_SIZE = typer.Option(
    None, *FLAGS["fsdp_shard_size"], min=0, max=MAX_NODES,
    help="HSDP with --zero 3: shard weights, gradients and optimizer states within groups of "
         "N dp ranks (N divides dp, 2 <= N < dp) and all_reduce gradients across the dp/N "
         "groups. Default: shard over all of dp.", rich_help_panel=PANEL_STRATEGY)
SEQUENCE_PARALLEL = typer.Option(False, *FLAGS["sequence_parallel"],
                                 help="Megatron sequence parallelism (needs tp > 1).", rich_help_panel=PANEL_STRATEGY)
DTYPE = typer.Option(Dtype.bfloat16, *FLAGS["dtype"], case_sensitive=False, help="Training dtype; fp8-delayed (Transformer Engine), fp8-tensorwise or fp8-rowwise (torchao) run the decoder linears in FP8.", rich_help_panel=PANEL_STRATEGY)
Framework = Enum("Framework", {n: n for n in choices.FRAMEWORKS}, type=str)
FRAMEWORK = typer.Option(Framework["megatron-core"], *FLAGS["framework"], case_sensitive=False,
                         help="Framework profile that runs the plan (what fuses, what overlaps).", rich_help_panel=PANEL_STRATEGY)
ATTENTION = typer.Option(None, *FLAGS["attention"], case_sensitive=False,
                         help="Attention implementation (default: the model's, else the "
                              "framework's).", rich_help_panel=PANEL_STRATEGY)
#: ``--layers-per-stage``: a list, or a word of ``completion.choices.SPLITS`` (:func:`pipeline_split`)
LAYERS_PER_STAGE = typer.Option(
    None, *FLAGS["layers_per_stage"],
    help="Decoder layers per virtual stage in model order: pp x vpp comma-separated integers "
         "(e.g. 5,3), or 'even' (Megatron-LM's default split), or 'balanced' (cost's "
         "default: the stages' or ranks' times balanced, the first and last stage also "
         "carrying the embedding and the loss). export without it writes the even split "
         "where the layers divide.", rich_help_panel=PANEL_STRATEGY)
MODE = typer.Option(Mode.framework, "--mode", case_sensitive=False,
                    help="Search mode: framework (the default: Megatron's tensor-parallel layout, "
                         "as the frameworks run it), pattern-based (also the pattern variants "
                         "that replicate attention, MLP, embedding or head across the tp ranks), "
                         "full_random (a random layout per parameter), semi-auto.",
                    rich_help_panel=PANEL_SEARCH)
#: ``tune``'s strategy options: each pins its knob in the search (as ``--fix`` does; default:
#: searched), under the same spellings as ``cost``'s (:data:`FLAGS`)
DP_PIN = typer.Option(None, *FLAGS["dp"], min=1, help="Pin the data-parallel degree.", rich_help_panel=PANEL_STRATEGY)
TP_PIN = typer.Option(None, *FLAGS["tp"], min=1, help="Pin the tensor-parallel degree.", rich_help_panel=PANEL_STRATEGY)
PP_PIN = typer.Option(None, *FLAGS["pp"], min=1, help="Pin the pipeline stages.", rich_help_panel=PANEL_STRATEGY)
CP_PIN = typer.Option(None, *FLAGS["cp"], min=1, help="Pin the context-parallel degree.", rich_help_panel=PANEL_STRATEGY)
EP_PIN = typer.Option(None, *FLAGS["ep"], min=1, help="Pin the expert-parallel degree (a MoE model).", rich_help_panel=PANEL_STRATEGY)
VPP_PIN = typer.Option(None, *FLAGS["vpp"], min=1, max=MAX_VPP,
                       help="Pin the model chunks per pipeline rank.", rich_help_panel=PANEL_STRATEGY)
SCHEDULE_PIN = typer.Option(None, *FLAGS["schedule"], case_sensitive=False, show_choices=False,
                            help="Pin the pipeline schedule (names as cost's --schedule).", rich_help_panel=PANEL_STRATEGY)
MICRO_BATCH_SIZE_PIN = typer.Option(None, *FLAGS["micro_batch_size"], min=1, max=MAX_BATCH,
                                    help="Pin the sequences per micro-batch.", rich_help_panel=PANEL_STRATEGY)
RECOMPUTE_PIN = typer.Option(None, *FLAGS["recompute"], case_sensitive=False,
                             help="Pin activation recompute.", rich_help_panel=PANEL_STRATEGY)
ZERO_PIN = typer.Option(None, *FLAGS["zero"], min=0, max=3, help="Pin the ZeRO stage (0-3).", rich_help_panel=PANEL_STRATEGY)
SEQUENCE_PARALLEL_PIN = typer.Option(None, "--sequence-parallel/--no-sequence-parallel",
                                     help="Pin Megatron sequence parallelism on or off.", rich_help_panel=PANEL_STRATEGY)
#: ``clusters.spec.DEFAULT_MEMORY_HEADROOM``, mirrored (tests/meshplan/test_cli_options.py checks it)
DEFAULT_MEMORY_HEADROOM = 0.05
MEMORY_HEADROOM = typer.Option(
    DEFAULT_MEMORY_HEADROOM, "--memory-headroom", min=0.0, max=0.99,
    help="Fraction of the device's usable memory (capacity minus the driver's reserve) a "
         "plan must leave free: it fits when peak <= usable x (1 - headroom). Default 0.05.", rich_help_panel=PANEL_INPUTS)

ARGS_KEY = "meshplan.command_args"


class StrategyCommand(TyperCommand):
    """A typer command with strategy options: it remembers its command line so that an
    invalid strategy names the flag the user typed (:func:`flag_error`)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """Record ``args`` in ``ctx.meta``, refuse one setting typed twice with different
        values (:func:`conflicting_flags`), take out a Megatron-LM launch line's
        cost-neutral and architecture arguments on the commands that read one
        (``megatron_launch.split``; checked and noted by the command), then parse the rest
        as typer does."""
        ctx.meta[ARGS_KEY] = tuple(args)
        clash = conflicting_flags(args)
        from meshplan.commands.click_compat import click_exceptions

        if clash:
            raise click_exceptions().UsageError(clash, ctx)
        from meshplan.frameworks.megatron import launch

        if self.name in launch.COMMANDS:
            try:
                args, ctx.meta[launch.NEUTRAL_KEY], ctx.meta[launch.ARCH_KEY] = launch.split(args)
            except ValueError as e:
                raise click_exceptions().UsageError(str(e), ctx) from None
        return super().parse_args(ctx, args)


#: every flag of :data:`FLAGS` and :data:`SIZE_FLAGS` -> its field
_FIELD_OF = {f: name for table in (FLAGS, SIZE_FLAGS) for name, flags in table.items() for f in flags}


def conflicting_flags(args: list[str] | tuple[str, ...]) -> str | None:
    """The message for a setting given by two of its aliases with different values (``--tp
    2 --tensor-model-parallel-size 1``: click keeps the last one silently), naming both
    flags as typed; None when every setting is given once or consistently. One flag typed
    twice with two values is refused for every command by
    :func:`meshplan.commands.repeated.repeated_option`."""
    seen: dict[str, tuple[str, str]] = {}
    for i, tok in enumerate(args):
        if tok == "--":
            break
        flag, eq, val = tok.partition("=")
        field = _FIELD_OF.get(flag)
        if field is None:
            continue
        if not eq:
            nxt = args[i + 1] if i + 1 < len(args) else ""
            val = "" if nxt.startswith("-") and not nxt[1:2].isdigit() else nxt
        if field in seen and seen[field][1] != val and seen[field][0] != flag:
            f0, v0 = seen[field]
            return (f"{f0} {v0} and {flag} {val} set the same thing ({field.replace('_', ' ')}); "
                    f"give one of them")
        seen.setdefault(field, (flag, val))
    return None


def typed_flag(ctx: Any, field: str) -> str:
    """The spelling of ``field``'s flag on the command line of ``ctx`` (e.g. ``--mp`` when the
    user typed ``--mp 4``), else its canonical flag (``--tp``). Raises KeyError for a field
    without a flag."""
    return (given_flags(ctx, field) or {**FLAGS, **SIZE_FLAGS}[field])[0]


def typed_flags(ctx: Any, *flags: str) -> list[str]:
    """The ``flags`` present on the command line of ``ctx`` (``--f`` or ``--f=V``)."""
    args = {a.split("=", 1)[0] for a in (ctx.meta.get(ARGS_KEY, ()) if ctx is not None else ())}
    return [f for f in flags if f in args]


def given_flags(ctx: Any, *fields: str) -> list[str]:
    """The flags of ``fields`` the user typed on the command line of ``ctx``, as typed."""
    flags = {**FLAGS, **SIZE_FLAGS}
    return typed_flags(ctx, *(f for name in fields for f in flags[name]))


#: Strategy fields whose bare name in a message is always the field (not an English word),
#: so :func:`user_words` turns it into the flag
_BARE_FIELDS = ("micro_batch_size", "global_batch_size", "sequence_parallel", "dp", "tp", "pp",
                "cp", "vpp", "cp_comm", "seq_len")
_FIELDS_RE = re.compile(r"(?:strategy|search problem) field (?:'\w+'(?: x '\w+')*)")
_QUOTED = re.compile(r"'(\w+)'")
_BARE = re.compile(r"(?<![\w'-])(" + "|".join(sorted(_BARE_FIELDS, key=len, reverse=True))
                   + r")(?![\w'=-])")


def user_words(ctx: Any, msg: str, field: str | None = None) -> str:
    """``msg`` (an error of the Strategy, Engine or planner, in field names) in the words of
    the command line of ``ctx``: ``strategy field 'F'`` and the bare field names of
    :data:`_BARE_FIELDS` become the flag the user typed for F, else its canonical flag
    (``strategy field 'global_batch_size' (8) must be a multiple of dp * micro_batch_size``
    -> ``--global-batch-size (8) must be a multiple of --dp * --micro-batch-size``).
    ``field`` (the error's ``.field``, the input at fault) names the flag of a message that
    opens with ``strategy field 'F'`` directly; the patterns read the other fields it names."""
    lead = f"strategy field {field!r}"
    if field in FLAGS and msg.startswith(lead) and not msg.startswith(lead + " x "):
        msg = typed_flag(ctx, field) + msg[len(lead):]

    def fields(m: re.Match[str]) -> str:
        return " x ".join(typed_flag(ctx, f) if f in FLAGS else f
                          for f in _QUOTED.findall(m.group(0)))

    out = _FIELDS_RE.sub(fields, msg)
    out = re.sub(r"\bstrategy (?=(?:dp|cp|tp|pp)\*)", "", out)
    return _BARE.sub(lambda m: typed_flag(ctx, m.group(1)), out)


def flag_error(ctx: Any, err: Exception) -> Exception:
    """``err`` (a StrategyError, EngineError, ... naming ``strategy field 'F'`` or the bare
    fields; its ``.field`` the one at fault) in the user's words (:func:`user_words`): ``--zero (ZeRO stage) must be 0, 1, 2
    or 3``; the same type (a MeshplanError when that type cannot be rebuilt from a message),
    so ``meshplan.cli.main`` still prints one ``error:`` line and exits 2. An error naming no
    field is returned as is."""
    if not isinstance(err, MeshplanError):  # a bug, not bad input: shown as it is
        return err
    msg = str(err)
    field = err.field
    if field not in FLAGS and _FIELDS_RE.search(msg) is None and _BARE.search(msg) is None:
        return err
    text = user_words(ctx, msg, field)
    try:
        return type(err)(text, field=field)
    except Exception:  # an error type with another constructor
        return MeshplanError(text, field=field)


def pipeline_split(ctx: Any, text: str | None, strategy: Any, num_layers: Any) -> Any:
    """``meshplan.pipeline_split.with_split`` in the flags the user typed; a list beside
    Megatron-LM's ``--num-layers-per-virtual-pipeline-stage`` is refused (both set the layers
    of each virtual stage). Raises what it raises, a StrategyError in the user's words
    (:func:`flag_error`)."""
    from meshplan.pipeline_split import split_word, with_split
    from meshplan.strategy import StrategyError

    vpp_flag = "--num-layers-per-virtual-pipeline-stage"
    if text is not None and split_word(text) is None and typed_flags(ctx, vpp_flag) \
            and all(re.fullmatch(r"\s*[0-9]+\s*", p) for p in text.split(",")):
        raise MeshplanError(f"{typed_flag(ctx, 'layers_per_stage')} {text} and {vpp_flag} both set "
                            f"the layers of each virtual stage (Megatron-LM refuses a layout beside "
                            f"it too): give --vpp with the list, or {vpp_flag} alone")
    try:
        return with_split(strategy, text, num_layers, typed_flag(ctx, "layers_per_stage"),
                          typed_flag(ctx, "pp"), typed_flag(ctx, "vpp"))
    except StrategyError as e:
        raise flag_error(ctx, e) from None


def value(choice: Any) -> Any:
    """The plain value of an Enum choice (``Dtype.float32`` -> ``"float32"``); others as is."""
    return choice.value if isinstance(choice, Enum) else choice


def build_strategy(ctx: Any, **knobs: Any) -> Any:
    """``meshplan.strategy.Strategy(**knobs)`` with Enum choices as plain values. A ``vpp``
    of 1 the user did not type is left to the Strategy (vpp 0: 2 model chunks per rank for
    an interleaved schedule on pp > 1, else 1); every rule is the Strategy's
    (``completion.strategy``), so the Python API and the CLI accept and refuse the same
    things. Raises StrategyError naming the flag the user typed (:func:`flag_error`)."""
    from meshplan.strategy import Strategy, StrategyError

    knobs = {k: value(v) for k, v in knobs.items()}
    if knobs.get("vpp") == 1 and not given_flags(ctx, "vpp"):
        knobs["vpp"] = 0  # the Strategy's choice by the schedule
    try:
        return Strategy(**knobs)
    except StrategyError as e:
        raise flag_error(ctx, e) from None


def either(names: Any) -> str:
    """``a, b or c``: the choices of a message."""
    *first, last = list(names)
    return f"{', '.join(first)} or {last}" if first else last


def typed_on_line(ctx: Any, params: dict[str, str]) -> list[str]:
    """The flags of ``params`` (parameter name -> flag) whose value came from the command
    line of ``ctx`` (click's ``get_parameter_source``), in ``params`` order: for commands
    that do not record their arguments (not a :class:`StrategyCommand`)."""
    return [flag for name, flag in params.items()
            if getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"]


def finite(flag: str, x: float | None, low: float = 0.0, high: float = float("inf"),
           low_open: bool = False) -> float | None:
    """``x`` (None passes) unless it is NaN, infinite, below ``low`` (or equal, with
    ``low_open``) or above ``high``: then ValueError naming ``flag``, which
    ``meshplan.cli.main`` prints as one ``error:`` line."""
    if x is None:
        return None
    bad = not math.isfinite(x) or x < low or (low_open and x == low) or x > high
    if bad:
        lo = f"> {low:g}" if low_open else f">= {low:g}"
        hi = "" if high == float("inf") else f" and at most {high:g}"
        raise MeshplanError(f"{flag} must be a finite number {lo}{hi}, got {x!r}")
    return x
