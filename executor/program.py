"""Build the partitioned program a plan runs: model -> forward + backward + optimizer ->
annotation on mesh [dp, mp] -> completion (pipeline stages, ZeRO) -> partition and reshard
passes.

The steps mirror ``meshplan.Engine`` (Megatron order, mp innermost: rank = stage * dp * mp
+ d * mp + t) but build the *whole* model (every layer, not one representative layer) and
resolve reshards into collectives (``completion.apply_reshard_pass``), because the executor
runs every op. Pipeline stages come from the Completer (``pp_degree``, ``vpp_degree``,
``schedule_mode``): stage s runs on ranks ``s*dp*mp .. (s+1)*dp*mp - 1`` and the partition
pass inserts send/recv pairs at stage boundaries.

A plan is read duck-typed (``model``, ``seq_len``, ``strategy`` with the fields of
``meshplan.Strategy``), so the executor does not import ``meshplan``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from completion import (
    Completer,
    ProcessMesh,
    Program,
    append_backward,
    apply_optimizer,
    apply_partition_pass,
    apply_reshard_pass,
    build_model,
    get_model_config,
    parse_program,
    shard_megatron,
)
from completion.annotate import annotate, annotated_ranks, clear_annotations, set_annotation
from completion.dist_attr import parse_placements
from completion.ir import OpRole
from completion.roles import infer_roles

# Completer schedule names (completion.chunks): the ZB heuristics place chunks like 1F1B
_CHUNK_MODE = {"ZB": "1F1B", "ZB-1p": "1F1B", "ZB-2p": "1F1B"}
_LR = {"sgd": 0.1, "adam": 1e-3, "adamw": 1e-3}


class PlanProgramError(ValueError):
    """The plan's model cannot be built or split as the strategy asks; names the field."""


@dataclass
class PlanProgram:
    """A partitioned program ready to run.

    Attributes:
        program: the completed, partitioned program (reshards resolved).
        strategy: the strategy it was built for.
        batch: rows of the program's batch dim (one micro-batch, all dp replicas).
        num_microbatches: m per step. world_size: ranks the program runs on.
    """

    program: Program
    strategy: Any
    batch: int
    num_microbatches: int
    world_size: int


def _load_model(model: str, batch: int, seq_len: int | None, dtype: str,
                num_layers: int | None = None) -> Program:
    path = Path(model)
    if path.suffix == ".pir" or (path.is_file() and path.suffix != ".json"):
        if not path.is_file():
            raise FileNotFoundError(f"program file not found: {path}")
        prog = parse_program(path.read_text())
        infer_roles(prog)
        return prog
    cfg = get_model_config(model)
    return build_model(cfg, batch_size=batch, seq_len=seq_len, dtype=dtype,
                       num_layers=num_layers or cfg.num_layers)


def program_batch(prog: Program) -> int:
    """Rows of the batch dim: dim 0 of the first non-persistable data input with dims."""
    for op in prog.ops:
        v = op.results[0] if op.type == "data" and op.results else None
        if v is not None and not v.persistable and v.ndim and not (v.name or "").startswith("rotary"):
            return int(v.shape[0])
    raise PlanProgramError("the program has no batched data input")


def _annotate(prog: Program, s: Any, mesh: ProcessMesh) -> None:
    if s.annotation == "megatron":
        shard_megatron(prog, mesh, 0, 1, sequence_parallel=s.sequence_parallel)
    elif isinstance(s.annotation, dict):
        for name, pl in s.annotation.items():
            annotate(prog, name, mesh, placements=parse_placements(pl))
    else:
        for v in prog.parameters():  # replicated everywhere (pipeline stages still split)
            set_annotation(prog, v, mesh)


def _file_annotation(prog: Program, s: Any) -> tuple[int, ...]:
    """The ranks a program text annotates (its dist attrs are then the annotation, completed
    as they are). On one rank the annotations are dropped (the program runs unsharded);
    otherwise they must cover exactly ranks 0 .. dp*mp-1 with pp = 1, else
    PlanProgramError names both."""
    ranks = annotated_ranks(prog)
    if not ranks:
        return ()
    if s.dp * s.tp * s.pp == 1:
        clear_annotations(prog)
        return ()
    if ranks != tuple(range(s.dp * s.tp)) or s.pp != 1:
        raise PlanProgramError(
            f"the program is annotated for ranks {list(ranks)} but the strategy needs dp*mp = "
            f"{s.dp}*{s.tp} ranks 0..{s.dp * s.tp - 1} with pp=1 (got pp={s.pp})")
    return ranks


def build_program(plan: Any, single_process: bool = False,
                  adam_epsilon: float | None = None) -> PlanProgram:
    """The partitioned program of ``plan`` (module docstring).

    ``single_process``: the same model unpartitioned on one rank, with the whole global
    batch as one micro-batch when the model is built from a config (a given program keeps
    its batch and runs the same micro-batches). Raises PlanProgramError when a given
    program's batch is not micro_batch_size * dp, FileNotFoundError for a missing file, and
    completion's errors for a layout that does not fit.
    """
    s = plan.strategy
    if getattr(plan, "annotations", None):  # a tuned plan's per-value placements
        s = replace(s, annotation=dict(plan.annotations))
    is_file = Path(str(plan.model)).suffix == ".pir" or Path(str(plan.model)).is_file()
    if single_process:
        micro = s.micro_batch_size * s.dp if is_file else s.global_batch_size
        s = replace(s, dp=1, tp=1, pp=1, vpp=1, schedule="1F1B", micro_batch_size=micro,
                    sequence_parallel=False, zero=0, annotation="none")
    batch = s.micro_batch_size * s.dp
    prog = _load_model(str(plan.model), batch, plan.seq_len, s.dtype,
                       getattr(plan, "num_layers", None))
    if program_batch(prog) != batch:
        raise PlanProgramError(f"model {plan.model!r} has batch {program_batch(prog)} but the strategy "
                               f"needs micro_batch_size * dp = {batch}")
    pre = _file_annotation(prog, s) if is_file else ()
    if not any(op.role == OpRole.BACKWARD for op in prog.ops):
        append_backward(prog)
    if not any(op.role == OpRole.OPTIMIZE for op in prog.ops):
        extra = {} if adam_epsilon is None or s.optimizer == "sgd" else {"epsilon": adam_epsilon}
        apply_optimizer(prog, s.optimizer, learning_rate=_LR[s.optimizer], **extra)
    if s.dp * s.tp * s.pp > 1 or isinstance(s.annotation, dict):
        mesh = ProcessMesh((s.dp, s.tp), tuple(range(s.dp * s.tp)), ("dp", "tp"))
        if not pre:  # a program annotated in its text keeps its own annotations
            _annotate(prog, s, mesh)
        mode = _CHUNK_MODE.get(s.schedule, s.schedule)
        Completer(prog, zero_stage=s.zero, dp_mesh_dim=0, pp_degree=s.pp,
                  vpp_degree=s.vpp, schedule_mode=mode).complete()
        apply_partition_pass(prog)
        apply_reshard_pass(prog)
    prog.renumber()
    m = s.global_batch_size // batch
    if m < 1 or m * batch != s.global_batch_size:
        raise PlanProgramError(f"global_batch_size {s.global_batch_size} is not a multiple of "
                               f"micro_batch_size * dp = {batch}")
    return PlanProgram(prog, s, batch, m, s.dp * s.tp * s.pp)
