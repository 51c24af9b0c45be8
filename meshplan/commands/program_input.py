"""Options that a PIR program text given as the model (``meshplan cost --model FILE.pir``,
``meshplan complete --program FILE.pir``) would silently ignore: each is refused, when the
user typed it, with one line naming the flag as typed and saying that the program is
costed (completed) as written.

What ``cost`` ignores on a program (checked by running each flag and comparing the
results): ``--attention`` (a program runs the attention ops it holds;
``completion.plan_program.resolve_attention`` only reports the name) and
``--moe-capacity-factor`` (a program has no expert slots to cap); and, on a program
without decoder layers (struct names ``...layers.<i>...``, which PIR text does not carry),
``--layers`` (``simulator.program_costs.ProgramCosts.of`` repeats decoder layers only),
``--recompute`` and its Megatron-LM spellings (``simulator.recompute`` recomputes decoder
layers only) and an FP8 ``--dtype`` or ``--fp8-format`` (``completion.fp8`` marks the
decoder layers' linears only); ``--sequence-parallel`` on a program with its own dist
attrs (its layout is kept, never replaced by the Megatron one). ``--seq-len``,
``--dtype`` (other than FP8), ``--framework``, ``--zero`` and the degrees do change the
cost of a program and stay.

Nothing here imports more than typer at import time (``meshplan --help`` stays fast).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshplan.commands import options as opt
from meshplan.errors import MeshplanError

#: the Megatron-LM recompute arguments (``meshplan.frameworks.megatron.arguments``)
MEGATRON_RECOMPUTE = ("--recompute-granularity", "--recompute-method", "--recompute-num-layers",
                      "--recompute-activations")
#: the Megatron-LM FP8 arguments that set the FP8 recipe
MEGATRON_FP8 = ("--fp8-format", "--fp8-recipe")
#: why a program without decoder layers has nothing for a flag to act on
NO_LAYERS = "has no decoder layers (struct names '...layers.<i>...'; PIR text carries none)"


def as_written(flag: str, program: str, why: str, verb: str = "costed") -> MeshplanError:
    """The one-line error of ``flag`` (as typed, with its value when useful) that program
    file ``program`` ignores: ``FLAG: a .pir program is VERB as written, and NAME WHY;
    drop FLAG``."""
    name = Path(program).name
    bare = flag.split(" ", 1)[0]
    return MeshplanError(f"{flag}: a .pir program is {verb} as written, and {name} {why}; "
                         f"drop {bare}")


def refuse_ignored_cost_options(ctx: Any, model: str, strategy: Any) -> None:
    """Refuse the options ``cost`` would ignore for ``model`` when it is a program text
    (``completion.models.source.is_program_path``; a model name or config.json passes):
    see the module docstring. ``strategy``: the Strategy the command built (the Megatron
    arguments translated into it). Raises MeshplanError naming the first such flag typed.
    The program is read only when a flag that depends on its contents was typed."""
    from completion.models.source import is_program_path

    if not is_program_path(model):
        return
    typed = opt.given_flags(ctx, "attention")
    if typed:
        raise as_written(f"{typed[0]} {strategy.attention}", model,
                         "runs the attention ops it holds (the name would only be reported)")
    typed = opt.given_flags(ctx, "moe_capacity_factor")
    if typed:
        raise as_written(f"{typed[0]} {strategy.moe_capacity_factor:g}", model,
                         "has no expert slots for a capacity to cap")
    # (flag as typed, with its value; what the program's decoder layers would let it do)
    layered = [(f"{f} {typed_value(ctx, f)}".rstrip(), "whose count it would set")
               for f in opt.given_flags(ctx, "num_layers")]
    if strategy.recompute != "none":
        layered += [(f"{f} {strategy.recompute}", "to recompute")
                    for f in opt.given_flags(ctx, "recompute")]
        layered += [(f, "to recompute") for f in opt.typed_flags(ctx, *MEGATRON_RECOMPUTE)]
    if strategy.fp8 is not None:
        layered += [(f"{f} {typed_value(ctx, f)}".rstrip(), "whose linears would run in FP8")
                    for f in opt.given_flags(ctx, "dtype")]
        layered += [(f, "whose linears would run in FP8")
                    for f in opt.typed_flags(ctx, *MEGATRON_FP8)]
    sp = opt.given_flags(ctx, "sequence_parallel") if strategy.sequence_parallel else []
    if not layered and not sp:
        return
    from completion.annotate import annotated_ranks
    from completion.models.source import resolve_model

    source = resolve_model(model)
    if layered and source.num_layers == 0:
        flag, what = layered[0]
        raise as_written(flag, model, f"{NO_LAYERS} {what}")
    if sp and annotated_ranks(source.program):
        raise as_written(sp[0], model, "carries its own dist attrs: its layout is kept, not "
                         "replaced by the Megatron layout that --sequence-parallel shards")


def typed_value(ctx: Any, flag: str) -> str:
    """The value typed with ``flag`` on the command line of ``ctx`` (``--dtype fp8-delayed``
    or ``--dtype=fp8-delayed``: ``fp8-delayed``; the last one when typed twice, as click
    keeps it), else ``""``."""
    args = list(ctx.meta.get(opt.ARGS_KEY, ()) if ctx is not None else ())
    value = ""
    for i, tok in enumerate(args):
        if tok == "--":
            break
        if tok == flag and i + 1 < len(args):
            value = args[i + 1]
        elif tok.startswith(flag + "="):
            value = tok.split("=", 1)[1]
    return value
