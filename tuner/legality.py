"""Legality rules: a candidate that breaks one is never simulated.

Each rule is a named function ``rule(candidate, problem) -> str | None`` returning the
reason it fails (or None); :data:`RULES` holds them in check order and
:func:`check_legality` returns every :class:`Violation` (name and reason).

The rules follow Megatron-LM's argument checks (``megatron/training/arguments.py``:
heads, kv heads and vocab divisible by the tensor-parallel size, layers divisible by the
pipeline size and by pp * vpp for the interleaved schedule, micro-batches a multiple of pp
for interleaving, sequence parallelism only with tensor parallelism) and the Zero Bubble
repo's ZB-V (two chunks per rank), and context parallelism's load balancing (2cp divides the
sequence, Megatron ``get_batch_on_this_cp_rank``). Two more rules only remove duplicate points:
``schedule_needs_pipeline`` (with pp = 1 every schedule is the same step, kept as 1F1B) and
``zero_needs_dp`` (a ZeRO stage over a data-parallel group of one rank is stage 0).
``hsdp_shard_group`` takes ``completion.strategy.Strategy``'s HSDP check: a shard group
only with ZeRO-3, dividing dp, 2 <= N < dp; ``ep_layout`` its expert-parallel one (ep
divides dp and the experts, cp 1, ZeRO <= 1); ``ep_needs_megatron_layout`` the plan
pipeline's (experts are placed by Megatron's tensor-parallel layout only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from completion.expert_layout import layout_problem
from tuner.space import Candidate, SearchProblem

Rule = Callable[[Candidate, SearchProblem], "str | None"]

#: Schedules that run more than one model chunk per pipeline rank.
INTERLEAVED = ("VPP", "ZBVPP")


@dataclass(frozen=True)
class Violation:
    """A failed rule: its name and a reason naming the numbers at fault."""

    rule: str
    reason: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.reason}"


def mesh_matches_world(c: Candidate, p: SearchProblem) -> str | None:
    """dp * cp * tp * pp must equal the world size."""
    if c.world_size != p.world_size:
        names = "dp*tp*pp" + ("*cp" if c.cp > 1 else "")
        values = f"{c.dp}*{c.tp}*{c.pp}" + (f"*{c.cp}" if c.cp > 1 else "")
        return f"{names} = {values} = {c.world_size} != world size {p.world_size}"
    return None


def _mp_divides(field: str) -> Rule:
    def rule(c: Candidate, p: SearchProblem) -> str | None:
        n = getattr(p.model, field)
        if n % c.tp:
            return f"tp={c.tp} does not divide {field}={n} of {p.model.name}"
        return None
    rule.__name__ = f"tp_divides_{field.removeprefix('num_').removesuffix('_size')}"
    rule.__doc__ = f"Tensor parallelism splits {field} evenly: tp | {field}."
    return rule


tp_divides_heads = _mp_divides("num_heads")
tp_divides_kv_heads = _mp_divides("num_kv_heads")
tp_divides_hidden = _mp_divides("hidden_size")
tp_divides_ffn_hidden = _mp_divides("ffn_hidden_size")
tp_divides_vocab = _mp_divides("vocab_size")


def tp_within_node(c: Candidate, p: SearchProblem) -> str | None:
    """A tensor-parallel group stays inside one node (NVLink) unless the problem allows
    crossing nodes."""
    if not p.allow_cross_node_tp and c.tp > p.devices_per_node:
        return f"tp={c.tp} exceeds {p.devices_per_node} devices per node (cross-node tp not allowed)"
    return None


def pp_divides_layers(c: Candidate, p: SearchProblem) -> str | None:
    """pp | layers, unless an uneven split is requested (then pp <= layers)."""
    l_ = p.model.num_layers
    if c.pp > l_:
        return f"pp={c.pp} exceeds the {l_} layers"
    if not p.uneven_pp and l_ % c.pp:
        return f"pp={c.pp} does not divide the {l_} layers (no uneven split requested)"
    return None


def layers_divisible_by_chunks(c: Candidate, p: SearchProblem) -> str | None:
    """With vpp chunks per rank, layers split into pp * vpp equal chunks (an uneven split:
    at least one layer per chunk, pp * vpp <= layers)."""
    if c.vpp > 1 and p.uneven_pp:
        if c.pp * c.vpp > p.model.num_layers:
            return (f"pp*vpp = {c.pp}*{c.vpp} = {c.pp * c.vpp} virtual stages exceed the "
                    f"{p.model.num_layers} layers")
        return None
    if c.vpp > 1 and p.model.num_layers % (c.pp * c.vpp):
        return (f"{p.model.num_layers} layers are not divisible by pp*vpp = "
                f"{c.pp}*{c.vpp} = {c.pp * c.vpp}")
    return None


def vpp_needs_interleaved_schedule(c: Candidate, p: SearchProblem) -> str | None:
    """vpp > 1 only with VPP / ZBVPP, and VPP needs vpp >= 2 (vpp = 1 is plain 1F1B)."""
    if c.vpp > 1 and c.schedule not in INTERLEAVED:
        return f"vpp={c.vpp} needs schedule VPP or ZBVPP, got {c.schedule}"
    if c.schedule == "VPP" and c.vpp < 2:
        return "schedule VPP needs vpp >= 2 (vpp = 1 is 1F1B)"
    if c.schedule in INTERLEAVED and c.pp < 2:
        return f"schedule {c.schedule} needs pp >= 2, got pp={c.pp}"
    return None


def zbvpp_needs_vpp2(c: Candidate, p: SearchProblem) -> str | None:
    """ZB-V places exactly two chunks per rank in a V."""
    if c.schedule == "ZBVPP" and c.vpp != 2:
        return f"schedule ZBVPP needs vpp = 2, got vpp={c.vpp}"
    return None


def global_batch_divisible(c: Candidate, p: SearchProblem) -> str | None:
    """B must be a multiple of dp * mbs (m = B / (dp * mbs) micro-batches)."""
    per = c.dp * c.micro_batch_size
    if p.global_batch_size % per:
        return (f"global batch {p.global_batch_size} is not divisible by dp*mbs = "
                f"{c.dp}*{c.micro_batch_size} = {per}")
    return None


def microbatches_at_least_pp(c: Candidate, p: SearchProblem) -> str | None:
    """m >= pp, or the pipeline never fills."""
    m = c.num_microbatches(p.global_batch_size)
    if c.pp > 1 and m < c.pp:
        return f"{m} micro-batches < pp={c.pp}"
    return None


def vpp_microbatches_multiple_of_pp(c: Candidate, p: SearchProblem) -> str | None:
    """Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2) needs m a multiple of pp."""
    m = c.num_microbatches(p.global_batch_size)
    if c.schedule == "VPP" and m % c.pp:
        return f"VPP needs micro-batches a multiple of pp: m={m}, pp={c.pp}"
    return None


def sequence_parallel_needs_tp(c: Candidate, p: SearchProblem) -> str | None:
    """Sequence parallelism splits the tensor-parallel region's sequence: tp > 1."""
    if c.sequence_parallel and c.tp < 2:
        return "sequence parallel needs tp > 1"
    return None


def sequence_parallel_always(c: Candidate, p: SearchProblem) -> str | None:
    """A framework whose tensor parallelism always shards the sequence (its profile's
    ``kernels.sequence_parallel`` ``always``: torchtitan) runs no tp > 1 plan without it."""
    if p.sp_always and c.tp > 1 and not c.sequence_parallel:
        return "the framework runs tp > 1 with sequence parallelism only"
    return None


def sequence_parallel_seq_divisible(c: Candidate, p: SearchProblem) -> str | None:
    """Sequence parallelism shards the sequence over tp: tp | seq_len (the cp rank's
    seq_len / cp under context parallelism)."""
    if c.sequence_parallel and (p.seq_len // c.cp) % c.tp:
        return f"sequence parallel: seq_len {p.seq_len} / cp={c.cp} is not divisible by tp={c.tp}"
    return None


def cp_load_balance(c: Candidate, p: SearchProblem) -> str | None:
    """Context parallelism's causal load balancing cuts the sequence into 2cp chunks
    (``completion.context_parallel``): 2cp | seq_len."""
    if c.cp > 1 and p.seq_len % (2 * c.cp):
        return f"cp={c.cp}: seq_len {p.seq_len} is not divisible by 2*cp = {2 * c.cp}"
    return None


def schedule_needs_pipeline(c: Candidate, p: SearchProblem) -> str | None:
    """With pp = 1 all schedules run the same step; only 1F1B is kept (no duplicates)."""
    if c.pp == 1 and c.schedule != "1F1B":
        return f"pp=1: schedule {c.schedule} is the same step as 1F1B"
    return None


def zero_needs_dp(c: Candidate, p: SearchProblem) -> str | None:
    """A ZeRO stage over a data-parallel group of one rank is stage 0 (no duplicates)."""
    if c.dp == 1 and c.zero > 0:
        return f"dp=1: ZeRO stage {c.zero} shards over one rank (same as stage 0)"
    return None


def hsdp_shard_group(c: Candidate, p: SearchProblem) -> str | None:
    """An HSDP shard group N needs ZeRO-3 and 2 <= N < dp with N | dp (as a Strategy)."""
    n = c.fsdp_shard_size
    if n is None:
        return None
    if c.zero != 3:
        return f"fsdp_shard_size={n} (HSDP) needs ZeRO stage 3, got {c.zero}"
    if n < 2 or n >= c.dp or c.dp % n:
        return f"fsdp_shard_size={n} must divide dp={c.dp} with 2 <= N < dp"
    return None


def ep_layout(c: Candidate, p: SearchProblem) -> str | None:
    """Expert parallelism (``completion.strategy.Strategy.ep``, ``etp``): only for a model
    with experts, ep | num_experts (each rank an equal share of the experts: Megatron-Core's
    ``num_moe_experts % expert_model_parallel_size``), the expert layers folding onto the
    stage (``completion.expert_layout.layout_problem``, the Strategy's own rule) and ZeRO
    <= 1 (the modelled layouts)."""
    if c.ep == 1 and c.etp is None:
        return None
    e = p.model.num_experts
    if e <= 1:
        return f"ep={c.ep}: model {p.model.name} has no mixture-of-experts layer (of more than one expert)"
    if e % c.ep:
        return f"ep={c.ep} must divide num_experts={e}"
    why = layout_problem(c.dp, c.cp, c.tp, c.ep, c.etp)
    if why is not None:
        return why
    if c.zero > 1:
        return f"ep={c.ep} needs ZeRO <= 1, got zero={c.zero}"
    return None


#: Templates that make up Megatron's tensor-parallel layout (``tuner.patterns``); the norm's
#: sequence-parallel variant is offered on top of it.
MEGATRON_BASE = {"embedding": "vocab_parallel", "attention": "megatron", "mlp": "megatron",
                 "lm_head": "vocab_parallel"}


def megatron_layout(c: Candidate) -> bool:
    """Whether ``c`` runs Megatron's tensor-parallel layout (the Strategy annotation
    ``"megatron"``, ``meshplan.tuning.annotation_of``): tp = 1 (nothing sharded inside a
    rank), the ``megatron`` annotation, or pattern templates equal to
    :data:`MEGATRON_BASE` (a tied head follows the embedding)."""
    if c.tp == 1:
        return True
    if c.annotation == "templates":
        t = dict(c.templates)
        return all(t.get(k, v) in (v, "tied") for k, v in MEGATRON_BASE.items())
    return c.annotation == "megatron"


def ep_needs_megatron_layout(c: Candidate, p: SearchProblem) -> str | None:
    """Expert parallelism places the experts with Megatron's tensor-parallel layout
    (``completion.plan_program.check_plan``: ep > 1 needs the annotation ``megatron``): a
    pattern-based plan with other templates, or a full_random plan with tp > 1 (a random
    annotation), cannot take ep > 1."""
    if c.ep > 1 and not megatron_layout(c):
        what = "a random annotation" if c.annotation == "random" else "templates other than Megatron's"
        return f"ep={c.ep} needs Megatron's tensor-parallel layout; tp={c.tp} with {what}"
    return None


def zero_runs_with_pp(c: Candidate, p: SearchProblem) -> str | None:
    """A ZeRO stage the framework runs beside pipeline parallelism
    (``SearchProblem.pp_zero_stages``: DeepSpeed's pipeline engine refuses ZeRO-2 and 3)."""
    if c.pp > 1 and p.pp_zero_stages is not None and c.zero not in p.pp_zero_stages:
        return (f"zero={c.zero} with pp={c.pp}: the framework runs ZeRO "
                f"{', '.join(map(str, p.pp_zero_stages))} beside pipeline parallelism")
    return None


def replicated_beside_others(dp: int, tp: int, pp: int, cp: int) -> bool:
    """A ZeRO-0 layout that is not data parallelism alone: replicated dp > 1 beside tp > 1
    or pp > 1, or any cp > 1 (torchtitan 238fa99 ``parallelize_llama`` runs DDP only on a
    one-dimensional mesh, and shards over the cp ranks when cp > 1)."""
    return (dp > 1 and (tp > 1 or pp > 1)) or cp > 1


def zero0_alone(c: Candidate, p: SearchProblem) -> str | None:
    """ZeRO 0 only as the one parallel dimension where the framework runs DDP so
    (``SearchProblem.ddp_alone``: torchtitan, profile ``memory.ddp_alone``): replicated
    dp > 1 beside tp or pp is refused there. cp > 1 at ZeRO 0 stays searchable (dp = 1
    admits no other ZeRO stage, ``zero_needs_dp``): torchtitan shards such a plan over its
    cp ranks, which costs less memory than the replicated plan scored, and ``export``
    writes it as ZeRO-2 with a note."""
    if p.ddp_alone and c.zero == 0 and replicated_beside_others(c.dp, c.tp, c.pp, 1):
        return (f"zero=0 with dp={c.dp}, tp={c.tp}, pp={c.pp}: the framework runs ZeRO 0 (DDP) "
                f"only as the one parallel dimension")
    return None


#: Every rule, in check order (cheap mesh rules first).
RULES: tuple[Rule, ...] = (
    mesh_matches_world, tp_divides_heads, tp_divides_kv_heads, tp_divides_hidden,
    tp_divides_ffn_hidden, tp_divides_vocab, tp_within_node, pp_divides_layers,
    cp_load_balance, layers_divisible_by_chunks, vpp_needs_interleaved_schedule, zbvpp_needs_vpp2,
    global_batch_divisible, microbatches_at_least_pp, vpp_microbatches_multiple_of_pp,
    sequence_parallel_needs_tp, sequence_parallel_always, sequence_parallel_seq_divisible, schedule_needs_pipeline,
    zero_needs_dp, hsdp_shard_group, ep_layout, ep_needs_megatron_layout, zero_runs_with_pp,
    zero0_alone,
)
RULES_BY_NAME: dict[str, Rule] = {r.__name__: r for r in RULES}
#: Rules that read only dp, tp, pp (checked right after the mesh is chosen).
MESH_RULES: tuple[Rule, ...] = RULES[:9]


def check_legality(c: Candidate, p: SearchProblem, rules: tuple[Rule, ...] = RULES
                   ) -> list[Violation]:
    """Every failing rule of ``rules`` for ``c`` (empty when legal)."""
    out = []
    for r in rules:
        reason = r(c, p)
        if reason is not None:
            out.append(Violation(r.__name__, reason))
    return out


def first_violation(c: Candidate, p: SearchProblem, rules: tuple[Rule, ...] = RULES
                    ) -> Violation | None:
    """The first failing rule (cheap early exit), or None when ``c`` is legal."""
    for r in rules:
        reason = r(c, p)
        if reason is not None:
            return Violation(r.__name__, reason)
    return None


def is_legal(c: Candidate, p: SearchProblem) -> bool:
    """True when ``c`` breaks none of the legality rules for ``p`` (see ``first_violation``)."""
    return first_violation(c, p) is None
