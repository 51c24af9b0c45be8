"""The one plan pipeline: (model, strategy) -> the completed, partitioned program.

Both the cost model (``meshplan.Engine``, through ``simulator.StepModel.from_program``) and
the executor (``executor.program.build_program``) call :func:`build_plan_program`, so what
is predicted is what is executed. The steps:

1. :func:`check_plan` -- the one legality check (Megatron-LM's tensor-parallel rules: tp
   divides the attention heads and the key/value heads, with sequence parallelism the
   sequence length; the layers fill pp * vpp virtual stages; a program text's own
   annotations cover exactly ranks 0 .. dp*tp-1; context parallelism's 2cp divides the
   sequence). A plan with cp > 1 is built as ``completion.context_parallel`` folds it: dp * cp
   data-parallel replicas of ``seq_len / cp``-token sequences, its attention ops marked.
2. The forward program with ``micro_batch_size * dp`` sequences (one micro-batch, every dp
   replica), ``append_backward`` and ``apply_optimizer`` (unless the program has them).
3. The annotation on the stage mesh [dp, tp] (ranks 0 .. dp*tp-1, tensor-parallel
   innermost): the Megatron layout (``shard_megatron``, with sequence parallelism), the
   strategy's per-value placements (layer 0's repeated on every layer:
   :func:`expand_layer_annotations`), or -- ``annotation="none"`` -- every parameter
   replicated; a program text annotated in its own dist attrs keeps them (per-value
   placements of the strategy are applied on top).
4. ``Completer`` with the ZeRO stage over dp, the pipeline degree, the virtual stages and
   their layer split (``Strategy.layers_per_stage``, else an even split): stage s runs on
   ranks ``s*dp*tp .. (s+1)*dp*tp - 1``.
5. ``apply_partition_pass`` (reshard ops, send/recv at stage boundaries) and, unless
   ``resolve_reshards=False``, ``apply_reshard_pass`` (collectives); ids renumbered.

``representative=True`` builds what the cost model costs instead of the whole model: three
decoder layers (fewer for a smaller model) on the stage-0 mesh only. A config model's
layers are identical in their weights, but not in their program: the first reads the
embedding output (a value of the "pre" block), the last has no output gradient to sum in
its backward (the final norm is its only reader), a middle layer has both neighbours. So
layer 0 stands for the first model layer, layer 1 for every middle one and layer 2 for the
last (``simulator.program_costs``); every stage runs the same [dp, tp] layout shifted by
stage * dp * tp ranks. Its layers' ops are those of the whole program's first, middle and
last layers (``tests/completion/test_plan_program.py``). A representative program of a pure data-parallel plan of a config
model (tp = 1, Megatron annotation) is not annotated at all and holds one micro-batch:
every dp rank runs that same program, and its only collectives (the gradient sync; ZeRO's
reduce_scatter / all_gather) are costed by the step model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from completion.annotate import (
    annotate,
    annotated_ranks,
    check_parameter_placement,
    clear_annotations,
    set_annotation,
    shard_megatron,
)
from completion.backward import append_backward
from completion.completer import Completer
from completion.context_parallel import (
    check_context_parallel,
    fold_source,
    fold_strategy,
    mark_attention,
)
from completion.dist_attr import parse_placements
from completion.errors import CompletionError
from completion.expert_layout import layout_of
from completion.fp8 import FP8Weights, mark_fp8_linears
from completion.gc_pause import gc_paused
from completion.ir import OpRole, Program
from completion.mesh import ProcessMesh
from completion.models.source import ModelSource, resolve_model
from completion.optimizer import apply_optimizer
from completion.passes import apply_partition_pass, apply_reshard_pass
from completion.strategy import Strategy

#: learning rates the optimizer ops get (the executor runs them; costs do not depend on them)
LEARNING_RATES = {"sgd": 0.1, "adam": 1e-3, "adamw": 1e-3}
#: names of the stage mesh's dims
MESH_DIMS = ("dp", "tp")


class PlanProgramError(CompletionError):
    """A plan whose model cannot be built or split as its strategy asks; names the field."""


@dataclass
class PlanProgram:
    """A completed, partitioned program and what it was built for.

    Attributes:
        program: the program (forward, backward, optimizer; reshard ops, resolved into
            collectives unless built with ``resolve_reshards=False``).
        strategy: the strategy it was built for.
        batch: rows of the program's batch dim (one micro-batch; every dp replica when the
            program is annotated).
        num_microbatches: m per step. world_size: ranks the plan runs on (dp * cp * tp * pp).
        representative: True for the cost model's one-layer, stage-0 program.
        annotated: False when nothing inside a rank is sharded (no dist attrs at all).
        context_parallel: the plan's cp degree; with cp > 1 ``strategy`` is the folded one
            the program was built for (``completion.context_parallel.fold_strategy``: dp * cp
            replicas of ``seq_len / cp``-token sequences) and the attention ops carry the
            ring (``completion.context_parallel.CP_ATTRS``).
    """

    program: Program
    strategy: Strategy
    batch: int
    num_microbatches: int
    world_size: int
    representative: bool = False
    annotated: bool = True
    context_parallel: int = 1
    replicas: int = 1
    """Data-parallel copies of the program besides its own mesh: dp / ep for a plan with
    1 < ep < dp (:func:`expert_group_strategy`), 1 otherwise. Its costs are those of every
    rank; its model FLOPs are one copy's; the executor runs the copies side by side
    (``executor.expert_copies``)."""


def stage_mesh(strategy: Strategy) -> ProcessMesh:
    """Pipeline stage 0's mesh [dp, tp] over ranks 0 .. dp*tp-1 (tensor-parallel innermost:
    rank = d * tp + t, Megatron-LM's order)."""
    return ProcessMesh((strategy.dp, strategy.tp), tuple(range(strategy.dp * strategy.tp)), MESH_DIMS)


def plan_strategy(plan: Any) -> Strategy:
    """The strategy of a plan-like object (``meshplan.Plan`` read duck-typed: ``strategy``,
    ``annotations``): the plan's per-value ``annotations`` become its annotation."""
    s = plan.strategy
    if getattr(plan, "annotations", None):
        s = s.replace(annotation=dict(plan.annotations))
    return s


def resolve_plan(plan: Any) -> tuple[ModelSource, Strategy]:
    """The model source (``model``, ``seq_len``, ``num_layers``) and the strategy
    (:func:`plan_strategy`) of a plan-like object. Raises the errors of
    :func:`completion.models.source.resolve_model`."""
    source = resolve_model(plan.model, plan.seq_len, num_layers=getattr(plan, "num_layers", None))
    return source, plan_strategy(plan)


def check_plan(source: ModelSource, strategy: Strategy) -> None:
    """The legality check both the cost model and the executor run (module docstring).

    Raises PlanProgramError naming the strategy field and the model value at fault (a
    ContextParallelError for a cp the model cannot take)."""
    cfg, s = source.config, strategy
    check_context_parallel(source, s)
    if s.vpp > 1 and s.pp == 1:  # Megatron-LM refuses interleaving without a pipeline too
        raise PlanProgramError(f"strategy field 'vpp' = {s.vpp} needs pp > 1: interleaving splits "
                               "each pipeline rank's layers into chunks, and pp = 1 has no pipeline")
    routes = cfg is not None and cfg.has_moe_layers(source.num_layers)
    routing = [f for f, on in (("moe_capacity_factor", s.moe_capacity_factor is not None),
                               ("moe_load_imbalance", s.moe_load_imbalance != 1.0)) if on]
    if routing and cfg is not None and not routes:
        raise PlanProgramError(f"strategy field {routing[0]!r} is set but model {source.name!r} has "
                               "no mixture-of-experts layer to route")
    if s.moe_load_imbalance != 1.0 and cfg is not None and cfg.num_experts:
        most = cfg.num_experts / cfg.experts_per_token  # every token on the busiest expert
        if s.moe_load_imbalance > most:
            raise PlanProgramError(f"strategy field 'moe_load_imbalance' = {s.moe_load_imbalance:g} "
                                   f"is above num_experts / top-k = {cfg.num_experts} / "
                                   f"{cfg.experts_per_token} = {most:g} (the busiest expert cannot "
                                   "get more than every token)")
    if s.ep > 1:
        experts = cfg.num_experts if cfg is not None else None
        if experts is None:
            raise PlanProgramError(f"strategy field 'ep' = {s.ep}: model {source.name!r} has no "
                                   "experts (expert parallelism needs a mixture-of-experts model)")
        n = source.num_layers
        if not routes:
            deeper = range(n, n + cfg.moe_layer_step + max(cfg.dense_layers, default=0) + 1)
            why = (f"--layers {n} keeps only layers the config makes dense"
                   if any(cfg.is_moe_layer(i) for i in deeper)  # a deeper layer would route
                   else "mlp_only_layers / decoder_sparse_step leave every layer dense")
            raise PlanProgramError(f"strategy field 'ep' = {s.ep}: model {source.name!r} has no "
                                   f"mixture-of-experts layer in its {n} layer{'s' if n > 1 else ''} "
                                   f"({why})")
        if experts % s.ep:
            raise PlanProgramError(f"strategy field 'ep' = {s.ep} does not divide model "
                                   f"{cfg.name!r} num_experts = {experts}")
        if s.annotation != "megatron":
            raise PlanProgramError(f"strategy field 'ep' = {s.ep} needs annotation 'megatron' "
                                   f"(the layout that places the experts), got {s.annotation!r}")
    if cfg is not None:  # every layout that splits attention over tp needs whole heads
        check_tensor_parallel(cfg, s.tp, source.seq_len, s.sequence_parallel, s.cp)
    if s.layers_per_stage is not None and sum(s.layers_per_stage) != source.num_layers and cfg is not None:
        raise PlanProgramError(f"strategy field 'layers_per_stage' {list(s.layers_per_stage)} sums "
                               f"to {sum(s.layers_per_stage)}, but model {source.name!r} has "
                               f"{source.num_layers} layers")


def check_tensor_parallel(cfg: Any, tp: int, seq_len: int, sequence_parallel: bool, cp: int = 1) -> None:
    """Megatron's tensor-parallel layout of model config ``cfg`` on ``tp`` ranks: whole
    attention heads and KV heads per rank (Megatron-LM ``divide(num_attention_heads,
    world_size)``), and with sequence parallelism the (per-cp-rank) sequence split over
    tp. Raises PlanProgramError naming the strategy field and the model value."""
    if tp <= 1:
        return
    for field_, n in (("num_heads", cfg.num_heads), ("num_kv_heads", cfg.num_kv_heads)):
        if n % tp:
            raise PlanProgramError(f"strategy field 'tp' = {tp} does not divide model "
                                   f"{cfg.name!r} {field_} = {n}")
    if sequence_parallel and (seq_len // cp) % tp:
        per_rank = f" / cp = {cp}" if cp > 1 else ""
        raise PlanProgramError(f"strategy field 'sequence_parallel': seq_len {seq_len}"
                               f"{per_rank} is not divisible by tp = {tp}")


def _needs_annotation(source: ModelSource, s: Strategy, representative: bool) -> bool:
    """Whether the program is annotated and completed (module docstring: a representative
    pure data-parallel config model is not)."""
    if isinstance(s.annotation, dict) or s.tp > 1 or s.ep > 1:
        return True
    if representative:
        return source.is_program and s.dp > 1
    return s.world_size > 1


def _file_annotation(prog: Program, source: ModelSource, s: Strategy) -> bool:
    """A program text's own dist attrs are its annotation (completed as they are, never
    replaced by the strategy's). On a one-rank plan they are dropped (the program runs
    unsharded); otherwise they must cover exactly ranks 0 .. dp*tp-1. Returns True when the program
    keeps its own annotation; raises PlanProgramError naming both rank sets."""
    ranks = annotated_ranks(prog) if source.is_program else ()
    if not ranks:
        return False
    if s.world_size == 1:
        clear_annotations(prog)
        return False
    if ranks != tuple(range(s.dp * s.tp)):
        raise PlanProgramError(f"program {source.name!r} is annotated for ranks {list(ranks)} but "
                               f"the strategy's mesh dp*tp = {s.dp}*{s.tp} has ranks "
                               f"0..{s.dp * s.tp - 1}")
    check_meshes(prog, source.name)
    for v in prog.parameters():  # the program's own placements obey the annotation rule
        if v.dist_attr is not None:
            check_parameter_placement(v, v.dist_attr)
    return True


def check_meshes(prog: Program, name: str) -> None:
    """The process meshes of a program's dist attrs must be equal or disjoint (one mesh per
    pipeline stage, as Paddle's partitioned programs have): two meshes that share some ranks
    but not all place one rank in two stages at once, which no schedule runs. Raises
    PlanProgramError naming both."""
    meshes = sorted({a.process_mesh for a in _dist_attrs(prog)}, key=lambda m: m.process_ids)
    for i, a in enumerate(meshes):
        for b in meshes[i + 1:]:
            if set(a.process_ids) & set(b.process_ids):
                raise PlanProgramError(
                    f"program {name!r} uses process meshes {list(a.shape)} on ranks "
                    f"{list(a.process_ids)} and {list(b.shape)} on ranks {list(b.process_ids)}, "
                    f"which share ranks without being the same mesh; give each pipeline stage "
                    f"its own mesh (equal or disjoint)")


def _dist_attrs(prog: Program) -> list[Any]:
    """Every dist attr of the program's values and ops."""
    return ([v.dist_attr for v in prog.values() if v.dist_attr is not None]
            + [op.dist_attr for op in prog.ops if op.dist_attr is not None])


_LAYER0 = re.compile(r"^(.*\blayers\.)0(\..+)$")


def expand_layer_annotations(program: Program, annotation: dict[str, list[str]]) -> dict[str, list[str]]:
    """Per-value placements with those of layer 0 repeated on every decoder layer.

    Decoder layers are identical, so a layout given for a value of layer 0
    (``decoder.layers.0.mlp.up_proj.weight``) applies to the same value of every layer
    (``decoder.layers.<i>.mlp.up_proj.weight``) the program has, unless the mapping names
    that value itself: the tuner writes its templates and full_random draws against a
    one-layer program, and every layer shares the draw."""
    names = {v.name for v in program.values() if v.name}
    out = dict(annotation)
    for name, pl in annotation.items():
        m = _LAYER0.match(name)
        if m is None:
            continue
        i = 1
        while f"{m.group(1)}{i}{m.group(2)}" in names:
            out.setdefault(f"{m.group(1)}{i}{m.group(2)}", pl)
            i += 1
    return out


def _annotate(prog: Program, s: Strategy, mesh: ProcessMesh) -> None:
    if s.annotation == "megatron":
        shard_megatron(prog, mesh, 0, 1, sequence_parallel=s.sequence_parallel,
                       expert_parallel=s.ep > 1)
    elif isinstance(s.annotation, dict):
        for name, pl in expand_layer_annotations(prog, s.annotation).items():
            annotate(prog, name, mesh, placements=parse_placements(pl))
    else:
        for v in prog.parameters():  # replicated everywhere (pipeline stages still split)
            set_annotation(prog, v, mesh)


def program_batch(prog: Program) -> int:
    """Rows of the batch dim: dim 0 of the first non-persistable data input with dims.
    Raises PlanProgramError when the program has none."""
    for op in prog.ops:
        v = op.results[0] if op.type == "data" and op.results else None
        if v is not None and not v.persistable and v.ndim and not (v.name or "").startswith("rotary"):
            return int(v.shape[0])
    raise PlanProgramError("the program has no batched data input")


#: decoder layers of a representative program: the first, a middle one, the last
REPRESENTATIVE_LAYERS = 3


def resolve_attention(strategy: Strategy, source: ModelSource, default: str | None = None) -> str:
    """The attention implementation a plan builds: ``strategy.attention``, else the model's
    own (``ModelConfig.attention``, e.g. Hugging Face ``attn_implementation``), else
    ``default`` (the caller's: the Engine passes its framework profile's
    ``kernels.attention``; ``completion`` knows no profiles), else ``"flash"``. A given
    program keeps the attention it has (the answer is then only reported)."""
    return strategy.attention or source.attention or default or "flash"


def _forward(source: ModelSource, s: Strategy, batch: int, representative: bool,
             attention: str | None) -> Program:
    uniform = source.config is None or source.config.replace(
        num_layers=source.num_layers).uniform_at(source.seq_len)
    if representative:  # mixed MLP kinds or attention spans: every layer (ModelConfig.uniform_at)
        layers = min(REPRESENTATIVE_LAYERS, source.num_layers) if uniform else source.num_layers
    else:
        layers = None
    prog = source.forward_program(batch, s.dtype, layers, attention or resolve_attention(s, source))
    if source.is_program and program_batch(prog) != batch:
        # one rank too: a step of micro-batches of another size than the program's would
        # be costed at the program's batch and counted at the strategy's (tokens/s off)
        raise PlanProgramError(f"model {source.name!r} has batch {program_batch(prog)} but the "
                               f"strategy needs micro_batch_size * dp = {batch} (a program's "
                               f"batch is fixed: micro_batch_size * dp must be {program_batch(prog)})")
    return prog


@gc_paused()  # builds a graph of cyclic Values/Operations (completion.gc_pause)
def build_plan_program(source: ModelSource, strategy: Strategy, *, representative: bool = False,
                       resolve_reshards: bool = True, adam_epsilon: float | None = None,
                       attention: str | None = None, fp8_weights: FP8Weights | None = None) -> PlanProgram:
    """The completed, partitioned program of ``strategy`` on ``source`` (module docstring).

    Args:
        source: the resolved model (``completion.models.source.resolve_model``).
        strategy: the plan's strategy (its ``layers_per_stage`` fixes the pipeline split).
        representative: the cost model's one-layer, stage-0 program instead of the whole one.
        resolve_reshards: also run the reshard pass (collectives), as the executor needs.
        adam_epsilon: Adam's epsilon (the executor's verification uses a larger one).
        attention: the attention implementation to build (``flash`` / ``unfused``); None:
            :func:`resolve_attention` without a default (strategy, model, flash). The
            Engine passes ``resolve_attention(strategy, source, <its framework profile's
            kernels.attention>)``.
        fp8_weights: how the framework holds the weights of FP8 linears
            (``completion.fp8.FP8Weights``; None: its default). The Engine passes its
            framework profile's ``fp8_weights``.

    Raises PlanProgramError (a CompletionError) for an illegal plan, and completion's errors
    (naming the op or value) for a layout that does not fit.
    """
    check_plan(source, strategy)
    cp = strategy.cp
    s, source = fold_strategy(strategy), fold_source(source, cp)  # identities for cp = 1
    plan_s, replicas = s, 1
    group_dp = layout_of(s).group_dp
    if s.ep > 1 and group_dp < s.dp:  # one ep group's program, run as edp copies (executor.expert_copies)
        s, replicas = expert_group_strategy(s), s.dp // group_dp
    annotated = _needs_annotation(source, s, representative)
    batch = s.micro_batch_size * (s.dp if annotated or not representative else 1)
    prog = _forward(with_expert_grid(with_expert_slots(source, s), s), s, batch, representative, attention)
    own = _file_annotation(prog, source, s)
    if not any(op.role == OpRole.BACKWARD for op in prog.ops):
        append_backward(prog)
    if cp > 1:
        mark_attention(prog, strategy)
    if s.fp8 is not None:  # the decoder linears' GEMMs in FP8 (completion.fp8)
        mark_fp8_linears(prog, s.fp8, fp8_weights, s.tp)
    if not any(op.role == OpRole.OPTIMIZE for op in prog.ops):
        extra = {} if adam_epsilon is None or s.optimizer == "sgd" else {"epsilon": adam_epsilon}
        apply_optimizer(prog, s.optimizer, learning_rate=LEARNING_RATES[s.optimizer], **extra)
    if annotated:
        if not own or isinstance(s.annotation, dict):  # per-value placements win over the text's
            _annotate(prog, s, stage_mesh(s))
        pp, vpp, lps = (1, 1, None) if representative else (s.pp, s.vpp, s.layers_per_stage)
        Completer(prog, zero_stage=s.zero, dp_mesh_dim=0, pp_degree=pp, vpp_degree=vpp,
                  schedule_mode=s.chunk_schedule, layers_per_stage=lps).complete()
        apply_partition_pass(prog)
        if resolve_reshards:
            apply_reshard_pass(prog)
    prog.renumber()
    return PlanProgram(prog, plan_s, batch, plan_s.num_microbatches, plan_s.world_size, representative,
                       annotated, cp, replicas)


def with_expert_slots(source: ModelSource, s: Strategy) -> ModelSource:
    """``source`` whose config builds its dispatch / combine with ``s.expert_slot_factor``
    (``ModelConfig.expert_slot_factor``: the busiest expert's load, capped by the capacity
    when tokens are dropped; ``completion.strategy``); ``source`` itself at factor 1.
    Raises PlanProgramError for a given program (its slots are its own)."""
    f = s.expert_slot_factor
    if f == 1.0:
        return source
    if source.config is None:
        raise PlanProgramError(f"strategy fields 'moe_capacity_factor' / 'moe_load_imbalance' "
                               f"(slot factor {f}) need a model built from a config; model "
                               f"{source.name!r} is a given program")
    return replace(source, config=source.config.replace(expert_slot_factor=f))


def expert_group_strategy(s: Strategy) -> Strategy:
    """The strategy a representative program of ``s`` (cp folded) is built for when an ep
    group spans fewer data-parallel ranks than ``s.dp`` (``completion.expert_layout``:
    ``group_dp`` = ep with etp = tp, ep / tp with etp = 1): one ep group (``dp =
    group_dp``, the global batch scaled by group_dp / dp so the micro-batches stay the
    same). Each of the edp expert-data-parallel copies of that group runs the same program
    on its own data, so rank 0's local shapes, its all_to_all on the ep group (ranks 0 ..
    ep * etp - 1, Megatron-Core's ``tp-ep-dp-pp`` expert rank order:
    ``simulator.expert_parallel``) and its activations are those of the whole plan; the
    step model (``simulator.step``, built from the plan's own strategy) reduces dense
    gradients over dp and expert ones over edp. ``s`` itself otherwise."""
    g = layout_of(s).group_dp
    if s.ep == 1 or g >= s.dp:
        return s
    return replace(s, dp=g, global_batch_size=s.global_batch_size * g // s.dp)


def with_expert_grid(source: ModelSource, s: Strategy) -> ModelSource:
    """``source`` whose config lays its routed experts out as ``[group_dp, E / group_dp]``
    (``ModelConfig.expert_grid``) when the plan folds whole experts over tensor-parallel
    ranks too (etp = 1 < tp: ``completion.expert_layout``), so the Megatron layout splits
    the first dim over the data-parallel mesh dim and the second over the tensor-parallel
    one; ``source`` itself otherwise (and for a given program)."""
    lay = layout_of(s)
    if s.ep == 1 or not lay.folded or source.config is None:
        return source
    return replace(source, config=source.config.replace(expert_grid=lay.group_dp))


def single_process_strategy(strategy: Strategy, source: ModelSource) -> Strategy:
    """The strategy of the one-process reference run that ``verify`` compares with: the same
    model unpartitioned on one rank, with the whole global batch as one micro-batch for a
    model built from a config (a given program keeps its batch and runs the same
    micro-batches)."""
    s = strategy
    micro = s.micro_batch_size * s.dp if source.is_program else s.global_batch_size
    return replace(s, dp=1, tp=1, pp=1, cp=1, cp_comm="p2p", ep=1, etp=None, vpp=1, schedule="1F1B", micro_batch_size=micro,
                   sequence_parallel=False, zero=0, fsdp_shard_size=None, annotation="none",
                   layers_per_stage=None)
