"""``meshplan complete --program FILE.pir | --model NAME [--layers L] [--dp D --tp T --pp P |
--mesh NAME=SIZE,...] [--megatron] [--vpp V --schedule VPP|ZBVPP] [--zero Z]``: complete the
sharding of a program and print it (PIR text) followed by a per-op summary.

- ``--program``: a PIR file; its dist attrs are the annotations (``--megatron`` adds the
  Megatron layout on the mesh; a file without dist attrs gets the data-parallel layout).
- ``--model``: a built-in model or ``config.json``, built with backward and AdamW; without
  ``--megatron`` the layout is pure data parallel (batch on ``dp``, parameters replicated).
- the mesh: ``--dp``/``--tp``/``--pp`` (the strategy options ``cost`` and ``tune`` share:
  ``--dp 2 --tp 2 --pp 2`` is ``--mesh dp=2,tp=2,pp=2``; a ``tp`` dim of size 1 is kept
  only with ``--megatron``), or ``--mesh`` with ``name=size`` pairs for named meshes
  (``d0=2``): a ``pp`` entry is the pipeline degree, the others form each stage's mesh
  (ranks of stage s offset by s times the stage size).
- ``--dp``/``--tp``/``--pp`` (or the mesh), ``--vpp``, ``--schedule``, ``--zero`` and
  ``--sequence-parallel`` are checked as ``cost`` checks them (``options.build_strategy``,
  then ``completion.plan_program.check_plan``: whole attention heads per tp rank,
  ``--vpp`` > 1 only with a pipeline, ...); ``--sequence-parallel`` needs ``--megatron``
  (the layout it shards). Without ``--megatron`` or ``--annotate`` only the batch is
  sharded (over ``dp``): a ``note:`` line on stderr says so for the other mesh dims.
- a program with dist attrs is completed on its own process mesh: a typed mesh
  (``--mesh``, ``--dp``/``--tp``/``--pp``) must be that mesh (``--megatron`` lays it out
  anew on the mesh instead); ``--annotate`` then annotates on it. ``--layers``,
  ``--seq-len`` and ``--batch-size`` size a built model, and are refused with a program
  (it is completed as written).

Bad input raises a ``ValueError`` subclass; ``meshplan.cli.main`` prints ``error: ...``
and exits with code 2."""

from __future__ import annotations

import pathlib
from typing import Any

import typer

from meshplan import complete_inputs as ci
from meshplan.commands import options as opt


def _check_batch(ctx: Any, program: Any, dp: int, program_file: Any) -> None:
    """The data-parallel layout gives each of ``dp`` ranks whole sequences: the program's
    batch (``--batch-size`` of a built model, the data input's rows of a program file) must
    be a multiple of dp, as a plan's global batch must be of dp x micro-batch
    (``completion.strategy.Strategy``); 3 sequences were sharded over 2 ranks. Raises
    CompletionError naming the flags."""
    from completion.errors import CompletionError
    from completion.plan_program import program_batch

    if dp <= 1:
        return
    batch = program_batch(program)
    if batch % dp:
        what = (f"program {pathlib.Path(str(program_file)).name} has batch {batch}" if program_file is not None
                else f"--batch-size {batch}")
        raise CompletionError(f"{what}, not a multiple of {opt.typed_flag(ctx, 'dp')} {dp}: the "
                              f"data-parallel layout gives each rank whole sequences")


def refuse_model_sizes(ctx: Any, program_file: str) -> None:
    """Refuse ``--layers``, ``--seq-len`` or ``--batch-size`` (any spelling) typed beside a
    program: they size a model built from a name or config.json, and a program has its own
    layers and shapes. MeshplanError naming the flag as typed."""
    from meshplan.commands.program_input import as_written, typed_value

    for typed in (opt.given_flags(ctx, "num_layers"), opt.given_flags(ctx, "seq_len"),
                  opt.typed_flags(ctx, "--batch-size", "-b")):
        if typed:
            raise as_written(f"{typed[0]} {typed_value(ctx, typed[0])}".rstrip(), program_file,
                             "has its own layers and input shapes (the flag sizes a model built "
                             "from --model NAME)", verb="completed")


def check_like_cost(ctx: Any, model: Any, strategy: Any, seq_len: int | None,
                    layers: int | None) -> None:
    """What ``cost`` checks of ``strategy`` on ``model`` (a name, config.json or a read
    Program) besides the Strategy itself: ``completion.plan_program.check_plan`` (whole
    attention heads per tp rank, the sequence over tp with sequence parallelism, vpp > 1
    only with pp > 1, ...). Raises its error in the flags the user typed
    (``options.flag_error``)."""
    from completion.models.source import resolve_model
    from completion.plan_program import check_plan

    try:
        check_plan(resolve_model(model, seq_len, num_layers=layers), strategy)
    except ValueError as e:
        raise opt.flag_error(ctx, e) from None


def complete_cmd(
    ctx: typer.Context,
    program_file: str | None = typer.Option(None, "--program", "-p", help="PIR program file."),
    model: str | None = opt.MODEL_OR_PROGRAM,
    layers: int | None = opt.LAYERS,
    dp: int = opt.DP,
    tp: int = opt.TP,
    pp: int = opt.PP,
    mesh: str | None = typer.Option(None, "--mesh",
                                    help="Named mesh instead of --dp/--tp/--pp, e.g. d0=2 or dp=2,tp=2,pp=2."),
    megatron: bool = typer.Option(False, "--megatron", help="Apply the Megatron layout (dp x tp)."),
    sequence_parallel: bool = opt.SEQUENCE_PARALLEL,
    vpp: int = opt.VPP,
    schedule: opt.Schedule = opt.SCHEDULE,
    zero: int = opt.ZERO,
    batch_size: int = typer.Option(4, "--batch-size", "-b", max=opt.MAX_BATCH,
                                   help="Sequences per step (--model)."),
    seq_len: int | None = opt.SEQ_LEN,
    summary_only: bool = typer.Option(False, "--summary-only", help="Print only the summary."),
    annotations: list[str] | None = typer.Option(
        None, "--annotate", "-a",
        help="NAME=DIMS_MAPPING on the mesh, e.g. parameter_0=-1,0 (repeatable)."),
) -> None:
    """Complete the sharding of a program (or a built model) and print it with a summary."""
    from completion.annotate import annotate
    from completion.completer import Completer
    from completion.errors import CompletionError
    from completion.ir import OpRole
    from completion.pir import print_program
    from meshplan.complete_summary import summary_lines

    if (program_file is None) == (model is None):
        raise CompletionError("give exactly one of --program FILE or --model NAME")
    if model is not None and (pathlib.Path(model).suffix == ".pir" or (
            pathlib.Path(model).is_file() and pathlib.Path(model).suffix != ".json")):
        program_file, model = model, None  # a program text given as the model
    if program_file is not None:
        refuse_model_sizes(ctx, program_file)
    mesh_flags = opt.given_flags(ctx, "dp", "tp", "pp")
    stage_mesh, pp = ci.parse_mesh(ci.mesh_spec(mesh, dp, tp, pp, megatron, mesh_flags))
    sizes = dict(zip(stage_mesh.dim_names, stage_mesh.shape, strict=True))
    knobs = opt.build_strategy(ctx, dp=sizes.get("dp", 1), tp=sizes.get("tp", 1), pp=pp, vpp=vpp,
                               schedule=schedule, zero=zero, sequence_parallel=sequence_parallel,
                               global_batch_size=sizes.get("dp", 1))
    if sequence_parallel and not megatron:
        raise CompletionError(f"{opt.typed_flag(ctx, 'sequence_parallel')} shards the sequence of "
                              "the Megatron layout: give --megatron with it")
    read, own_layout = None, False
    if program_file is not None:
        from completion.models.source import read_program_file
        from meshplan.commands.program_input import typed_value

        read = read_program_file(program_file)
        own_layout = bool(ci.program_meshes(read)) and not megatron
        typed = (f"--mesh {mesh}" if mesh is not None else
                 " ".join(f"{f} {typed_value(ctx, f)}" for f in mesh_flags) or None)
        if own_layout:  # completed on its own mesh; --annotate annotates on it
            stage_mesh = ci.check_program_mesh(read, program_file, stage_mesh, pp, typed) or stage_mesh
    program = ci.build_program(read, model, stage_mesh, megatron, sequence_parallel,
                            bool(annotations), batch_size, seq_len, layers)
    if not own_layout and not annotations:  # the data-parallel layouts shard the batch over dp
        _check_batch(ctx, program, sizes.get("dp", 1), program_file)
    check_like_cost(ctx, program if model is None else model, knobs,
                    None if model is None else seq_len or ci.program_seq_len(program), layers)
    if not megatron and not annotations and not own_layout:
        note = ci.replicated_note(stage_mesh)
        if note:
            typer.echo(note, err=True)
    for spec in annotations or ():
        name, dims = ci.parse_annotation(spec)
        annotate(program, name, stage_mesh, dims_mapping=dims)
    completer = Completer(program, knobs.zero, pp_degree=pp, vpp_degree=knobs.vpp,
                          schedule_mode=knobs.chunk_schedule)
    completer.complete()
    if not summary_only:
        typer.echo(print_program(program).rstrip("\n"))
    roles = {r.name.lower(): sum(1 for op in program.ops if op.role == r) for r in OpRole}
    typer.echo(f"// completed {len(program.ops)} ops ({', '.join(f'{k} {n}' for k, n in roles.items() if n)}); "
               f"sweeps {completer.sweeps}")
    typer.echo("\n".join(summary_lines(program, completer)))


def register(app: typer.Typer) -> None:
    """Attach the ``complete`` command to the root app."""
    app.command("complete", cls=opt.StrategyCommand)(complete_cmd)
