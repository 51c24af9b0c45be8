"""``meshplan complete --program FILE.pir | --model NAME [--layers L] --mesh dp=2,tp=2[,pp=2]
[--megatron] [--vpp V --schedule VPP|ZBVPP] [--zero-stage Z]``: complete the sharding of a
program and print it (PIR text) followed by a per-op summary.

- ``--program``: a PIR file; its dist attrs are the annotations (``--megatron`` adds the
  Megatron layout on ``--mesh``; a file without dist attrs gets the data-parallel layout).
- ``--model``: a built-in model or ``config.json``, built with backward and AdamW; without
  ``--megatron`` the layout is pure data parallel (batch on ``dp``, parameters replicated).
- ``--mesh``: ``name=size`` pairs; a ``pp`` entry is the pipeline degree, the others form
  each stage's mesh (ranks of stage s offset by s times the stage size).

Bad input raises a ``ValueError`` subclass; ``meshplan.cli.main`` prints ``error: ...``
and exits with code 2."""

from __future__ import annotations

import pathlib

import typer

from completion.annotate import annotate, set_annotation, shard_megatron
from completion.backward import append_backward
from completion.completer import Completer
from completion.errors import CompletionError
from completion.ir import Operation, OpRole, Program
from completion.mesh import ProcessMesh
from completion.models import build_model
from completion.optimizer import apply_optimizer
from completion.pir import parse_program, print_program


def parse_mesh(spec: str) -> tuple[ProcessMesh, int]:
    """``"dp=2,tp=2,pp=2"`` -> (stage mesh [2, 2] named dp, tp; pp degree 2); ``mp`` is read
    as ``tp``. Raises CompletionError naming the bad entry."""
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


def _data_parallel(program: Program, mesh: ProcessMesh) -> None:
    """Batch dim of the data inputs on ``dp`` (if the mesh has it), everything else
    replicated."""
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
    name, sep, dm = spec.partition("=")
    try:
        if not sep or not name.strip():
            raise ValueError
        dims = [int(x) for x in dm.strip().strip("[]").split(",") if x.strip()]
    except ValueError:
        raise CompletionError(f"--annotate {spec!r} is not NAME=DIMS_MAPPING "
                              f"(e.g. parameter_0=-1,0)") from None
    return name.strip(), dims


def _fmt(a) -> str:
    if a is None:
        return "null"
    return "(" + ",".join(repr(p).replace("Replicate()", "R").replace("Shard", "S")
                          .replace("Partial", "P") for p in a.placements) + ")"


def summary_lines(program: Program, completer: Completer) -> list[str]:
    """One line per op: type, struct name, stage / chunk, operand and result placements;
    a ``*`` marks an operand whose value has a different layout (a reshard goes there)."""
    lines = ["// per-op summary: type [struct] stage/chunk: operands -> results (* = reshard needed)"]
    for op in program.ops:
        lines.append("//   " + _op_line(op, completer))
    n = sum(1 for op in program.ops for i, v in enumerate(op.operands)
            if v is not None and op.dist_attr and i < len(op.dist_attr.operands)
            and op.dist_attr.operands[i] is not None and _differs(v.dist_attr, op.dist_attr.operands[i]))
    lines.append(f"// operands needing a reshard: {n}")
    return lines


def _differs(a, b) -> bool:
    return a is not None and (a.dims_mapping != b.dims_mapping or a.partial != b.partial
                              or a.process_mesh != b.process_mesh)


def _op_line(op: Operation, completer: Completer) -> str:
    d = op.dist_attr
    where = f"stage {completer.stage_of(op)}/chunk {op.chunk_id}"
    if d is None:
        return f"{op.full_type} [{op.struct_name}] {where}: (no dist attr)"
    ins = []
    for i, a in enumerate(d.operands):
        v = op.operands[i] if i < len(op.operands) else None
        mark = "*" if v is not None and a is not None and _differs(v.dist_attr, a) else ""
        ins.append(_fmt(a) + mark)
    outs = [_fmt(a) for a in d.results]
    return f"{op.full_type} [{op.struct_name}] {where}: {' '.join(ins)} -> {' '.join(outs)}"


def complete_cmd(
    program_file: str | None = typer.Option(None, "--program", "-p", help="PIR program file."),
    model: str | None = typer.Option(None, "--model", "-m", help="Built-in model or config.json."),
    layers: int | None = typer.Option(None, "--layers", "-l", help="Override the layer count."),
    mesh_spec: str = typer.Option("dp=1", "--mesh", help="Mesh, e.g. dp=2,tp=2,pp=2."),
    megatron: bool = typer.Option(False, "--megatron", help="Apply the Megatron layout."),
    sequence_parallel: bool = typer.Option(False, "--sequence-parallel", help="With --megatron."),
    vpp: int = typer.Option(1, "--vpp", help="Virtual pipeline degree (chunks per stage)."),
    schedule: str = typer.Option("1F1B", "--schedule", help="1F1B, VPP, ZBVPP, ..."),
    zero_stage: int = typer.Option(0, "--zero-stage", help="ZeRO stage 0-3."),
    batch_size: int = typer.Option(4, "--batch-size", "-b", help="Sequences per step (--model)."),
    seq_len: int | None = typer.Option(None, "--seq-len", "-s", help="Tokens per sequence (--model)."),
    summary_only: bool = typer.Option(False, "--summary-only", help="Print only the summary."),
    annotations: list[str] | None = typer.Option(
        None, "--annotate", "-a",
        help="NAME=DIMS_MAPPING on the mesh, e.g. parameter_0=-1,0 (repeatable)."),
) -> None:
    """Complete the sharding of a program (or a built model) and print it with a summary."""
    if (program_file is None) == (model is None):
        raise CompletionError("give exactly one of --program FILE or --model NAME")
    if model is not None and (pathlib.Path(model).suffix == ".pir" or (
            pathlib.Path(model).is_file() and pathlib.Path(model).suffix != ".json")):
        program_file, model = model, None  # a program text given as the model
    mesh, pp = parse_mesh(mesh_spec)
    if program_file is not None:
        program = parse_program(pathlib.Path(program_file).read_text())
        if megatron:
            shard_megatron(program, mesh, "dp", "tp", sequence_parallel)
        elif not annotations and not any(v.dist_attr is not None for v in program.values()):
            _data_parallel(program, mesh)
    else:
        program = build_model(model, batch_size, seq_len, num_layers=layers)  # type: ignore[arg-type]
        append_backward(program)
        apply_optimizer(program, "adamw")
        if megatron:
            if "dp" not in mesh.dim_names or "tp" not in mesh.dim_names:
                raise CompletionError("--megatron needs a mesh with dp and tp, e.g. dp=2,tp=2")
            shard_megatron(program, mesh, "dp", "tp", sequence_parallel)
        else:
            _data_parallel(program, mesh)
    for spec in annotations or ():
        name, dims = parse_annotation(spec)
        annotate(program, name, mesh, dims_mapping=dims)
    completer = Completer(program, zero_stage, pp_degree=pp, vpp_degree=vpp, schedule_mode=schedule)
    completer.complete()
    if not summary_only:
        typer.echo(print_program(program).rstrip("\n"))
    roles = {r.name.lower(): sum(1 for op in program.ops if op.role == r) for r in OpRole}
    typer.echo(f"// completed {len(program.ops)} ops ({', '.join(f'{k} {n}' for k, n in roles.items() if n)}); "
               f"sweeps {completer.sweeps}")
    typer.echo("\n".join(summary_lines(program, completer)))


def register(app: typer.Typer) -> None:
    """Attach the ``complete`` command to the root app."""
    app.command("complete")(complete_cmd)
