"""Annotation API: :func:`annotate` one value, or :func:`shard_megatron` a whole model.

The Megatron-LM layout (Shoeybi et al. 2019, sec. 3; Korthikanti et al. 2022 for sequence
parallelism) on a mesh with a data-parallel and a tensor-parallel (mp) dim:

- column-parallel ``q_proj``, ``k_proj``, ``v_proj``, ``gate_proj``, ``up_proj`` (and a fused
  ``qkv_proj``; multi-head latent attention's up-projections ``q_b_proj`` / ``kv_b_proj``,
  its down-projections ``q_a_proj`` / ``kv_a_proj_with_mqa`` replicated as Megatron-Core's
  duplicated linears, :mod:`completion.models.mla`; a multi-token prediction module's
  ``eh_proj``, Megatron-Core's column-parallel ``eh_proj`` gathered after it): weight
  ``[in, out]`` split on ``out``
  over mp, bias split over mp; attention sinks ``[heads]`` split with the heads;
- row-parallel ``o_proj``, ``down_proj``: weight split on ``in`` over mp, bias replicated;
- mixture-of-experts layers: the grouped expert weights ``mlp.experts.{gate,up}_proj``
  ``[E, h, f]`` column-parallel (split on f) and ``mlp.experts.down_proj`` ``[E, f, h]``
  row-parallel (split on f), as a dense MLP per expert (Megatron-Core expert tensor
  parallelism with etp = tp), their biases ``[E, 1, out]`` (GPT-OSS) split as the
  column-parallel outputs or replicated (down_proj); a shared expert like a dense MLP; the
  router ``mlp.gate`` replicated;
- vocab-parallel ``embed_tokens`` (weight ``[V, h]`` split on V) and ``lm_head`` (weight
  ``[h, V]`` split on V);
- every other parameter (norms, position embedding) replicated;
- data inputs with a batch dim: the batch dim over dp (tables such as rotary sin/cos, whose
  leading dim is 1, and scalars stay replicated);
- ``sequence_parallel``: the outputs of the norms and of the residual adds (the regions
  Megatron runs on ``[b, s/mp, h]``) are annotated sharded on the sequence dim over mp, so
  completion turns the row-parallel all_reduce into a reduce_scatter and gathers before
  the column-parallel matmuls (multi-head latent attention's joint kv latent,
  :data:`SP_GATHERED`, is gathered whole right after its projection, as Megatron-Core does).

Names follow the model builders (:mod:`completion.models`): parameters are
``<struct name>.weight`` / ``.bias``, decoder layers ``decoder.layers.<i>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from completion.dist_attr import Placement, TensorDistAttr
from completion.errors import CompletionError, DistAttrError
from completion.ir import OpRole, Program, Value
from completion.mesh import ProcessMesh

DERIVED_ATTR = "_completion_derived"


def annotate(program: Program, value_name: str | int, mesh: ProcessMesh,
             dims_mapping: Sequence[int] | None = None,
             placements: Sequence[Placement] | None = None) -> TensorDistAttr:
    """Annotate the value ``value_name`` (a name or ``%N``) with a layout on ``mesh``.

    Give ``dims_mapping`` (one mesh dim or -1 per tensor dim) or ``placements`` (one
    Shard/Replicate/Partial per mesh dim); neither means replicated. The annotation is
    never overwritten by completion. Returns the attr. Raises CompletionError for an unknown
    value, DistAttrError for an invalid layout (naming the value) or when both forms are
    given and disagree.
    """
    v = program.value(value_name)
    return set_annotation(program, v, mesh, dims_mapping, placements)


def check_parameter_placement(v: Value, attr: TensorDistAttr) -> None:
    """A parameter is held whole or sharded, never Partial: a Partial placement (DTensor)
    means each rank holds a term of a pending reduction (sum, avg, max, min), which an
    optimizer cannot update and a forward cannot read; completion gives Partial only to
    results (a row-parallel matmul's output, a gradient before its reduce). Raises
    DistAttrError naming the parameter and the placement."""
    if v.is_parameter and attr.partial:
        dim, op = attr.partial[0]
        raise DistAttrError(f"{v.label()}: a parameter cannot be Partial({op}) (on mesh dim "
                            f"{dim}); give Shard(dim) or Replicate()")


def set_annotation(program: Program, v: Value, mesh: ProcessMesh,
                   dims_mapping: Sequence[int] | None = None,
                   placements: Sequence[Placement] | None = None) -> TensorDistAttr:
    """:func:`annotate` for a value object."""
    try:
        if placements is not None:
            attr = TensorDistAttr.from_placements(mesh, placements, v.ndim)
            if dims_mapping is not None and tuple(dims_mapping) != attr.dims_mapping:
                raise DistAttrError(f"dims_mapping {list(dims_mapping)} disagrees with placements "
                                    f"{list(placements)}")
        else:
            dm = [-1] * v.ndim if dims_mapping is None else dims_mapping
            attr = TensorDistAttr(mesh, dm)
        attr.check_shape(v.shape, v.label())
        check_parameter_placement(v, attr)
    except DistAttrError as e:
        # check_shape names the value already: once is enough
        raise DistAttrError(f"annotate {v.label()}: {str(e).removeprefix(v.label() + ': ')}") from None
    v.dist_attr = attr
    derived = getattr(program, DERIVED_ATTR, None)
    if derived is not None:
        derived.discard(v)
    return attr


# -- Megatron layout -----------------------------------------------------------------------
Layout = Callable[[Value, int, int], list[int] | None]


def _column(v: Value, dp: int, mp: int) -> list[int]:
    return [-1] * (v.ndim - 1) + [mp]


def _row(v: Value, dp: int, mp: int) -> list[int]:
    """Split the ``in`` dim: a weight ``[in, out]``, or a grouped expert weight
    ``[E, in, out]`` (each expert row-parallel, Megatron-Core's expert TP); replicated
    otherwise."""
    return [-1] * (v.ndim - 2) + [mp, -1] if v.ndim in (2, 3) else [-1] * v.ndim


def _replicated(v: Value, dp: int, mp: int) -> list[int]:
    return [-1] * v.ndim


#: parameter-name pattern -> layout (first match wins)
MEGATRON_PARAMS: list[tuple[re.Pattern[str], Layout]] = [
    (re.compile(r"(^|\.)(q_proj|k_proj|v_proj|qkv_proj|gate_proj|up_proj|q_b_proj|kv_b_proj|eh_proj)"
                r"\.(weight|bias)$"), _column),
    (re.compile(r"(^|\.)self_attn\.sinks$"), _column),
    (re.compile(r"(^|\.)(o_proj|down_proj)\.weight$"), _row),
    (re.compile(r"(^|\.)embed_tokens\.weight$"), _row),
    (re.compile(r"(^|\.)lm_head\.weight$"), _column),
    (re.compile(r".*"), _replicated),
]
#: grouped expert weights ``[E, in, out]`` (``completion.models.moe``): split on the expert
#: dim over dp under expert parallelism
EXPERT_PARAMS = re.compile(r"(^|\.)experts\.(gate_proj|up_proj|down_proj)\.(weight|bias)$")
NORM_TYPES = ("layer_norm", "rms_norm")
GRAD_NORM_TYPES = ("layer_norm_grad", "rms_norm_grad")
RESIDUAL_STRUCT = re.compile(r"(^|\.)layers\.\d+$|(^|\.)embed_positions$")


def _batch_size(program: Program) -> int | None:
    data = [op.results[0] for op in program.ops if op.type == "data" and op.results and op.results[0] is not None]
    ids = next((v for v in data if v.name == "input_ids"), None)
    if ids is not None and ids.ndim:
        return ids.shape[0]
    return next((v.shape[0] for v in data if v.ndim >= 2 and v.shape[0] > 1), None)


#: struct names of the projections whose outputs sequence parallelism gathers whole right
#: away: multi-head latent attention's joint kv latent and rotary key (Megatron-Core
#: ``MLASelfAttention``: ``kv_combined`` is all-gathered over the sequence-parallel ranks
#: before it is split, so the one rotary key head reaches every rank whole and expands to
#: each rank's heads locally)
SP_GATHERED = re.compile(r"(^|\.)kv_a_proj_with_mqa$")
#: norms that run on that gathered latent, whole on every rank (not sequence-split)
SP_WHOLE_NORM = re.compile(r"(^|\.)kv_a_layernorm$")


def _sequence_parallel_values(program: Program) -> list[Value]:
    out = []
    for op in program.ops:
        if op.role not in (OpRole.FORWARD, OpRole.LOSS):
            continue
        if SP_WHOLE_NORM.search(op.struct_name or ""):
            continue
        if op.type in NORM_TYPES or (op.type == "add" and RESIDUAL_STRUCT.search(op.struct_name or "")):
            r = op.results[0] if op.results else None
            if r is not None and r.ndim == 3:
                out.append(r)
    return out


def _gathered_values(program: Program) -> list[Value]:
    """Values sequence parallelism keeps whole: the forward results of the
    :data:`SP_GATHERED` projections (the last op of each such struct), and, in backward,
    the output gradient and input gradient of each :data:`SP_WHOLE_NORM` norm (so the
    norm's backward runs whole, as its forward and its saved statistics do; the Partial
    gradient from the column-parallel up-projection is all-reduced, not reduce-scattered)."""
    last: dict[str, Value] = {}
    grads: list[Value] = []
    for op in program.ops:
        st = op.struct_name or ""
        if op.role == OpRole.FORWARD and SP_GATHERED.search(st) and op.results and op.results[0] is not None:
            if op.results[0].ndim == 3:
                last[st] = op.results[0]
        elif op.role == OpRole.BACKWARD and op.type in GRAD_NORM_TYPES and SP_WHOLE_NORM.search(st):
            grads += [v for v in (op.operands[-1], op.results[0]) if v is not None and v.ndim == 3]
    return list(last.values()) + grads


def shard_megatron(program: Program, mesh: ProcessMesh, dp_dim: int | str, mp_dim: int | str,
                   sequence_parallel: bool = False, expert_parallel: bool = False
                   ) -> dict[str, TensorDistAttr]:
    """Annotate a built model with the Megatron layout (module docstring).

    Args:
        program: a program from :func:`completion.build_model` (before or after backward).
        mesh: the process mesh; ``dp_dim`` / ``mp_dim`` are its data- and tensor-parallel
            dims (index or name; they must differ).
        expert_parallel: also split every grouped expert weight (:data:`EXPERT_PARAMS`) on
            its expert dim over ``dp_dim`` (ep = dp; the dispatch and combine become
            all_to_all on the dp group, ``completion.spmd.moe``); a weight laid out as
            ``[ep_dp, E / ep_dp, in, out]`` (``ModelConfig.expert_grid``: whole experts
            folded over data- and tensor-parallel ranks, etp 1) splits its first dim over
            ``dp_dim`` and its second over ``mp_dim``, its GEMMs unsplit.
    Returns the annotations by value label. Raises DistAttrError for a missing mesh dim or
    dp_dim == mp_dim, CompletionError when the program has no parameters.
    """
    dp, mp = mesh.dim_index(dp_dim), mesh.dim_index(mp_dim)
    if dp == mp:
        raise DistAttrError(f"dp_dim and mp_dim are both mesh dim {dp}")
    params = program.parameters()
    if not params:
        raise CompletionError("shard_megatron: the program has no parameters")
    out: dict[str, TensorDistAttr] = {}
    for v in params:
        name = v.name or ""
        layout = next(f for rx, f in MEGATRON_PARAMS if rx.search(name))
        dm = layout(v, dp, mp)
        if expert_parallel and EXPERT_PARAMS.search(name):
            if v.ndim == 4:  # [ep_dp, E / ep_dp, in, out]: whole experts over dp x tp (etp 1)
                dm = [dp, mp, -1, -1]
            elif v.ndim == 3:
                dm[0] = dp
        out[v.label()] = set_annotation(program, v, mesh, dm)
    batch = _batch_size(program)
    for op in program.ops:
        if op.type != "data" or not op.results or op.results[0] is None:
            continue
        v = op.results[0]
        if v.persistable or not v.ndim:
            continue
        dm = [-1] * v.ndim
        if batch is not None and batch > 1 and v.shape[0] == batch:
            dm[0] = dp
        out[v.label()] = set_annotation(program, v, mesh, dm)
    if sequence_parallel:
        for v in _sequence_parallel_values(program):
            out[v.label()] = set_annotation(program, v, mesh, [dp, mp, -1])
        for v in _gathered_values(program):
            out[v.label()] = set_annotation(program, v, mesh, [dp, -1, -1])
    if expert_parallel:
        for v, dm in _expert_grid_values(program, dp, mp):
            out[v.label()] = set_annotation(program, v, mesh, dm)
    return out


def _expert_grid_values(program: Program, dp: int, mp: int) -> list[tuple[Value, list[int]]]:
    """Layouts that make the reshards around whole experts folded over dp x tp
    (``ModelConfig.expert_grid``) move each rank's share once, as Megatron-Core's all-to-all
    dispatcher does: the expert-major tokens, reshaped to ``[g, E / g, slots, h]``, are split
    over the tensor-parallel dim first (a local slice: each tensor-parallel rank sends only
    the tokens of its own experts over the data-parallel all_to_all), and the expert
    outputs come back over the data-parallel all_to_all before the tensor-parallel ranks
    gather them (the input of the reshape back to ``[E, slots, h]`` is annotated as the
    tokens were sent: experts over tp, slots over dp); their gradients alike. Each
    pair: (value, dims_mapping); none without a 4-D expert grid."""
    grid = [-1, mp, dp, -1]
    out: list[tuple[Value, list[int]]] = []
    for op in program.ops:
        if op.type not in ("reshape", "reshape_grad") or not (op.struct_name or "").endswith(".mlp.experts"):
            continue
        # the 4-D side of each reshape between [E, slots, h] and [g, E / g, slots, h]: forward
        # (its result or operand), backward (the gradient flowing in or out)
        sides = [*op.operands[-1:], *op.results[:1]] if op.type == "reshape" else op.results[:1]
        out += [(v, grid) for v in sides if v is not None and v.ndim == 4]
    return out



# -- programs annotated in their text ------------------------------------------------------
def annotated_ranks(program: Program) -> tuple[int, ...]:
    """The sorted ranks of every process mesh in the program's dist attrs (values and ops);
    empty when nothing is annotated (e.g. a program text without dist attrs). A program
    text with dist attrs (the seed ``mlp_sgd_before_partition.pir``) is annotated for
    exactly these ranks."""
    ranks: set[int] = set()
    for v in program.values():
        if v.dist_attr is not None:
            ranks.update(v.dist_attr.process_mesh.process_ids)
    for op in program.ops:
        if op.dist_attr is not None:
            ranks.update(op.dist_attr.process_mesh.process_ids)
    return tuple(sorted(ranks))


def clear_annotations(program: Program) -> None:
    """Drop every value's and op's dist attr, so a program annotated for many ranks runs
    (or is costed) unsharded on one."""
    for v in program.values():
        v.dist_attr = None
    for op in program.ops:
        op.dist_attr = None
    derived = getattr(program, DERIVED_ATTR, None)
    if derived is not None:
        derived.clear()
