"""The program ``meshplan complete`` completes, built from what the user gave: a named mesh
(:func:`parse_mesh`, :func:`mesh_spec`), per-value annotations (:func:`parse_annotation`),
the program itself with its layout (:func:`build_program`: a PIR file, its own dist attrs,
Megatron's layout or data parallel) and the checks of a program's own process mesh
(:func:`check_program_mesh`). Bad input raises ``completion.errors.CompletionError`` (a
``MeshplanError``) naming the flag or entry at fault. The command: ``meshplan.commands.complete``.
"""

from __future__ import annotations

import pathlib
from typing import Any


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
            raise ValueError
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
