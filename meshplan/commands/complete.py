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

from meshplan.commands import options as opt
from meshplan.errors import MeshplanError


def parse_mesh(spec: str) -> tuple[Any, int]:
    """``"dp=2,tp=2,pp=2"`` -> (stage ``ProcessMesh`` [2, 2] named dp, tp; pp degree 2);
    ``mp`` is read as ``tp``. Raises CompletionError naming the bad entry."""
    from completion.errors import CompletionError
    from completion.mesh import ProcessMesh

    dims: list[tuple[str, int]] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, eq, size = part.partition("=")
        if not eq or not name.strip() or not size.strip().isdigit() or int(size) < 1:
            raise CompletionError(f"--mesh entry {part!r} is not name=positive_int (e.g. dp=2)")
        if any(n == name.strip() for n, _ in dims):
            raise CompletionError(f"--mesh names {name.strip()!r} twice")
        dims.append(({"mp": "tp"}.get(name.strip(), name.strip()), int(size)))
    pp = next((s for n, s in dims if n == "pp"), 1)
    rest = [(n, s) for n, s in dims if n != "pp"] or [("dp", 1)]
    return ProcessMesh.of(*[s for _, s in rest], dim_names=tuple(n for n, _ in rest)), pp


def mesh_spec(mesh: str | None, dp: int, tp: int, pp: int, megatron: bool,
              given: list[str]) -> str:
    """The ``--mesh`` spec of a command line: ``mesh`` itself, or the one ``--dp/--tp/--pp``
    describe (``dp=D[,tp=T][,pp=P]``: tp when T > 1 or ``megatron``, pp when P > 1).
    ``given``: the mesh flags the user typed. Raises CompletionError when both are given."""
    from completion.errors import CompletionError

    if mesh is not None:
        if given:
            raise CompletionError(f"give --mesh or {', '.join(given)}, not both")
        return mesh
    parts = [f"dp={dp}"] + ([f"tp={tp}"] if tp > 1 or megatron else [])
    return ",".join(parts + ([f"pp={pp}"] if pp > 1 else []))


def _data_parallel(program: Any, mesh: Any) -> None:
    """Batch dim of the data inputs on ``dp`` (if the mesh has it), everything else
    replicated."""
    from completion.annotate import set_annotation

    dp = mesh.dim_names.index("dp") if "dp" in mesh.dim_names else None
    for v in program.parameters():
        set_annotation(program, v, mesh)
    for op in program.ops:
        v = op.results[0] if op.type == "data" and op.results else None
        if v is None or v.persistable:
            continue
        dm = [-1] * v.ndim
        if dp is not None and v.ndim >= 2 and v.shape[0] > 1:
            dm[0] = dp
        set_annotation(program, v, mesh, dm)


def parse_annotation(spec: str) -> tuple[str, list[int]]:
    """``"parameter_0=-1,0"`` or ``"parameter_0=[-1,0]"`` -> (value name, dims_mapping).
    Raises CompletionError naming the item when it is not NAME=INT,INT,..."""
    from completion.errors import CompletionError

    name, sep, dm = spec.partition("=")
    try:
        if not sep or not name.strip():
            raise MeshplanError
        dims = [int(x) for x in dm.strip().strip("[]").split(",") if x.strip()]
    except ValueError:
        raise CompletionError(f"--annotate {spec!r} is not NAME=DIMS_MAPPING "
                              f"(e.g. parameter_0=-1,0)") from None
    return name.strip(), dims


def program_seq_len(program: Any) -> int:
    """Tokens per sequence of a built model program: dim 1 of its first data input."""
    for op in program.ops:
        if op.type == "data" and op.results and op.results[0].ndim >= 2:
            return int(op.results[0].shape[1])
    return 0


def _check_megatron(model: Any, mesh: Any, seq_len: int, sequence_parallel: bool,
                    layers: int | None) -> None:
    """What ``cost`` checks of a Megatron layout (``completion.plan_program.
    check_tensor_parallel``): whole heads per tp rank, the sequence over tp with sp."""
    from completion.models.source import resolve_model
    from completion.plan_program import check_tensor_parallel

    cfg = resolve_model(model, seq_len or None, num_layers=layers).config
    if cfg is not None:
        check_tensor_parallel(cfg, mesh.shape[mesh.dim_names.index("tp")], seq_len, sequence_parallel)


def build_program(program_file: Any, model: str | None, mesh: Any, megatron: bool,
                  sequence_parallel: bool, annotated: bool, batch_size: int,
                  seq_len: int | None, layers: int | None) -> Any:
    """The program to complete, with its layout: a PIR file, or the Program read from one
    (its own dist attrs; the Megatron layout with ``megatron``; else data parallel unless it
    has dist attrs or ``annotated``), or a built model with backward and AdamW (Megatron or
    data parallel).
    Raises CompletionError (a ValueError) naming the bad input."""
    from completion.annotate import shard_megatron
    from completion.backward import append_backward
    from completion.errors import CompletionError
    from completion.models import build_model
    from completion.models.source import read_program_file
    from completion.optimizer import apply_optimizer

    if program_file is not None:
        program = (read_program_file(program_file)
                   if isinstance(program_file, (str, pathlib.Path)) else program_file)
        if megatron:
            shard_megatron(program, mesh, "dp", "tp", sequence_parallel)
        elif not annotated and not any(v.dist_attr is not None for v in program.values()):
            _data_parallel(program, mesh)
        return program
    program = build_model(model, batch_size, seq_len, num_layers=layers)  # type: ignore[arg-type]
    append_backward(program)
    apply_optimizer(program, "adamw")
    if megatron:
        if "dp" not in mesh.dim_names or "tp" not in mesh.dim_names:
            raise CompletionError("--megatron needs a mesh with dp and tp, e.g. --dp 2 --tp 2")
        _check_megatron(model, mesh, seq_len or program_seq_len(program), sequence_parallel, layers)
        shard_megatron(program, mesh, "dp", "tp", sequence_parallel)
    else:
        _data_parallel(program, mesh)
    return program


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


def program_meshes(program: Any) -> list[Any]:
    """The distinct process meshes of ``program``'s dist attrs (values and ops), by their
    first rank; empty for a program without dist attrs."""
    meshes = {v.dist_attr.process_mesh for v in program.values() if v.dist_attr is not None}
    meshes |= {op.dist_attr.process_mesh for op in program.ops if op.dist_attr is not None}
    return sorted(meshes, key=lambda m: m.process_ids)


def _ranks(ids: tuple[int, ...]) -> str:
    """``0..3`` for consecutive ranks, else the list (the first 8 and ``...``)."""
    if len(ids) > 2 and ids == tuple(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}..{ids[-1]}"
    return str(list(ids[:8]))[:-1] + (", ...]" if len(ids) > 8 else "]")


def describe_meshes(meshes: list[Any]) -> str:
    """``[2] on ranks [0, 1]``, or each mesh of several joined by ``and``."""
    return " and ".join(f"{list(m.shape)} on ranks {_ranks(m.process_ids)}" for m in meshes)


def check_program_mesh(program: Any, name: str, stage_mesh: Any, pp: int,
                       typed: str | None) -> Any:
    """A program with dist attrs is completed on its own process mesh: ``typed`` (the mesh
    flags as the user typed them, None when none were) must describe it (``stage_mesh``
    on each of ``pp`` stages, ranks of stage s offset by s times its size; dim names do not
    count). Returns the program's mesh when it has exactly one (``--annotate`` annotates
    on it), else None. Raises CompletionError naming the flags and both meshes."""
    from completion.errors import CompletionError
    from completion.mesh import ProcessMesh

    own = program_meshes(program)
    if not own:
        return None
    if typed is not None:
        size = stage_mesh.size
        want = [ProcessMesh(stage_mesh.shape, tuple(r + s * size for r in stage_mesh.process_ids),
                            stage_mesh.dim_names) for s in range(pp)]
        def squeezed(ms: list[Any]) -> set[tuple[tuple[int, ...], tuple[int, ...]]]:
            # dims of size 1 shard nothing: [2, 1] on ranks 0, 1 is the mesh [2] on them
            return {(tuple(k for k in m.shape if k > 1), tuple(m.process_ids)) for m in ms}

        if squeezed(want) != squeezed(own):
            spec = ",".join(f"{n}={k}" for n, k in zip(own[0].dim_names, own[0].shape, strict=True))
            hint = f"give --mesh {spec} or leave the mesh out" if len(own) == 1 else "leave the mesh out"
            raise CompletionError(
                f"{typed} gives process mesh {describe_meshes(want)}, but {pathlib.Path(name).name} "
                f"carries dist attrs on process mesh {describe_meshes(own)}: a program with dist "
                f"attrs is completed on its own mesh; {hint}")
    return own[0] if len(own) == 1 else None


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


def replicated_note(mesh: Any) -> str | None:
    """The ``note:`` line for a data-parallel layout (no ``--megatron``, no ``--annotate``)
    on ``mesh``: what its dims besides ``dp`` leave replicated; None when they are all 1."""
    dims = [f"{n} ({k} ranks)" for n, k in zip(mesh.dim_names, mesh.shape, strict=True)
            if n != "dp" and k > 1]
    if not dims:
        return None
    return (f"note: nothing is sharded over {', '.join(dims)}: without --megatron or --annotate "
            "every value is replicated there (the data-parallel layout shards only the batch, "
            "over dp); give --megatron for the Megatron layout, or --annotate NAME=DIMS_MAPPING")


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
    from meshplan.commands.complete_summary import summary_lines

    if (program_file is None) == (model is None):
        raise CompletionError("give exactly one of --program FILE or --model NAME")
    if model is not None and (pathlib.Path(model).suffix == ".pir" or (
            pathlib.Path(model).is_file() and pathlib.Path(model).suffix != ".json")):
        program_file, model = model, None  # a program text given as the model
    if program_file is not None:
        refuse_model_sizes(ctx, program_file)
    mesh_flags = opt.given_flags(ctx, "dp", "tp", "pp")
    stage_mesh, pp = parse_mesh(mesh_spec(mesh, dp, tp, pp, megatron, mesh_flags))
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
        own_layout = bool(program_meshes(read)) and not megatron
        typed = (f"--mesh {mesh}" if mesh is not None else
                 " ".join(f"{f} {typed_value(ctx, f)}" for f in mesh_flags) or None)
        if own_layout:  # completed on its own mesh; --annotate annotates on it
            stage_mesh = check_program_mesh(read, program_file, stage_mesh, pp, typed) or stage_mesh
    program = build_program(read, model, stage_mesh, megatron, sequence_parallel,
                            bool(annotations), batch_size, seq_len, layers)
    if not own_layout and not annotations:  # the data-parallel layouts shard the batch over dp
        _check_batch(ctx, program, sizes.get("dp", 1), program_file)
    check_like_cost(ctx, program if model is None else model, knobs,
                    None if model is None else seq_len or program_seq_len(program), layers)
    if not megatron and not annotations and not own_layout:
        note = replicated_note(stage_mesh)
        if note:
            typer.echo(note, err=True)
    for spec in annotations or ():
        name, dims = parse_annotation(spec)
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
