"""Pattern-based and full_random intra-op annotation.

``find_patterns(program)`` finds the embedding, attention block, MLP block, norm, LM head and
loss of a forward program from the ops' declared pattern roles (``OpTraits.pattern_role`` in
``completion.ops``: ``"embedding"``, ``"norm"``, ``"attention"``, ``"matmul"``,
``"activation"``, ``"passthrough"``, ``"loss"``) and dataflow (which op consumes which
parameter and which result), never from struct names:

- embedding: an ``embedding`` op reading a parameter table;
- norm: a normalisation op (``layer_norm``, ``rms_norm``) with its weight (and bias);
- attention block: an attention core (``flash_attention`` ...); walking its q/k/v operands
  back through shape ops (reshape, transpose, rotary) and bias adds reaches the projections
  (parameter matmuls), walking its result forward reaches the output projection;
- LM head: a parameter matmul whose result (through a bias add) feeds the loss;
- MLP block: a parameter matmul fed (through activations such as gelu / swiglu and bias
  adds) by one or more other parameter matmuls: the latter are the up (gate) projections;
- loss: the cross-entropy op.

Each pattern kind has sharding templates (:data:`TEMPLATES`): ``replicated``; Megatron
tensor parallelism (Shoeybi et al. 2019, Sec. 3): column-parallel q/k/v and up/gate
(``[in, out]`` weight ``Shard(1)`` on tp, bias ``Shard(0)``), row-parallel o/down
(``Shard(0)``, bias replicated); vocab-parallel embedding (``[V, h]`` table ``Shard(0)``)
and head (``[h, V]`` weight ``Shard(1)``); the norm's ``sequence_parallel`` variant
(Korthikanti et al. 2022: norm weights stay replicated, activations between the tensor-
parallel regions are split on the sequence; the Strategy's ``sequence_parallel`` flag).
The loss has one template: it follows the head (completion keeps the class dim sharded,
a vocab-parallel cross entropy, when the head is vocab-parallel). A head tied to the token
embedding shares its table and follows the embedding template.

Annotations are ``{value name: [placement per mesh dim]}`` on the mesh ``[dp, tp]``; every
data input gets its batch dim on dp.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from completion.ir import Operation, Program, Value
from completion.ops.registry import PatternRole, op_traits
from tuner.errors import TunerError

R, S0, S1 = "Replicate()", "Shard(0)", "Shard(1)"
KINDS = ("embedding", "attention", "mlp", "norm", "lm_head", "loss")


class PatternError(TunerError):
    """A template or pattern request that does not fit the program."""


@dataclass(frozen=True)
class PatternInstance:
    """One occurrence of a pattern.

    Attributes: kind (one of :data:`KINDS`); ops: indices of its ops in the program;
    params: role -> parameter names (roles: ``table``, ``column``, ``column_bias``, ``row``,
    ``row_bias``, ``weight``, ``bias``); tied: the head shares the embedding table.
    """

    kind: str
    ops: tuple[int, ...]
    params: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    tied: bool = False


def _role(op: Operation) -> PatternRole | None:
    """The op's declared pattern role (``completion.ops.op_traits``)."""
    return op_traits(op.type).pattern_role


def _param_operand(op: Operation) -> Value | None:
    for v in op.operands[1:]:
        if v is not None and v.is_parameter:
            return v
    return None


def _users(v: Value | None) -> list[Operation]:
    return [] if v is None else [u for u, _ in v.uses]


def _bias_after(op: Operation) -> tuple[Operation | None, Value | None]:
    """The ``add`` right after a parameter matmul that adds a parameter bias, if any."""
    for u in _users(op.results[0]):
        if u.type == "add":
            other = [v for v in u.operands if v is not None and v is not op.results[0]]
            if other and other[0].is_parameter:
                return u, other[0]
    return None, None


class _Index:
    """Dataflow helpers over one program."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.pos = {id(op): i for i, op in enumerate(program.ops)}
        self.pmatmul = {id(op): op for op in program.ops
                        if _role(op) == "matmul" and _param_operand(op) is not None}

    def producer_matmuls(self, v: Value | None, through: PatternRole | None) -> list[Operation]:
        """Parameter matmuls reached walking back from ``v`` through ops of pattern role
        ``through`` (None: none) and bias adds (a residual add stops the walk)."""
        out: list[Operation] = []
        stack, seen = [v], set()
        while stack:
            x = stack.pop()
            if x is None or x.op is None or id(x) in seen:
                continue
            seen.add(id(x))
            op = x.op
            if id(op) in self.pmatmul:
                out.append(op)
            elif through is not None and _role(op) == through:
                stack.extend(o for o in op.operands if o is not None and not o.stop_gradient)
            elif op.type == "add" and any(o is not None and o.is_parameter for o in op.operands):
                stack.extend(o for o in op.operands if o is not None and not o.is_parameter)
        return sorted(out, key=lambda o: self.pos[id(o)])

    def consumer_matmul(self, v: Value | None, through: PatternRole | None) -> Operation | None:
        """The first parameter matmul reached walking forward from ``v`` through ops of
        pattern role ``through`` (None: none)."""
        stack = [v]
        while stack:
            x = stack.pop()
            for u in _users(x):
                if id(u) in self.pmatmul and u.operands[0] is x:
                    return u
                if through is not None and _role(u) == through:
                    stack.extend(r for r in u.results if r is not None)
        return None


def _linear_params(ix: _Index, op: Operation) -> tuple[str, str | None, list[int]]:
    """(weight name, bias name or None, [index of the bias add]) of a parameter matmul."""
    w = _param_operand(op)
    assert w is not None
    add, b = _bias_after(op)
    return w.name or "", (b.name if b is not None else None), [ix.pos[id(add)]] if add else []


def _block(ix: _Index, kind: str, cols: Sequence[Operation], row: Operation,
           core: Operation | None) -> PatternInstance:
    ops, params = [], {"column": [], "column_bias": [], "row": [], "row_bias": []}
    for role, lst in (("column", cols), ("row", [row])):
        for op in lst:
            w, b, extra = _linear_params(ix, op)
            params[role].append(w)
            if b:
                params[f"{role}_bias"].append(b)
            ops += [ix.pos[id(op)], *extra]
    if core is not None:
        ops.append(ix.pos[id(core)])
    return PatternInstance(kind, tuple(sorted(ops)),
                           {k: tuple(v) for k, v in params.items() if v})


def find_patterns(program: Program) -> list[PatternInstance]:
    """Every pattern instance of ``program`` in program order (see the module docstring).

    A parameter matmul that belongs to no pattern stays unannotated (completion decides
    its layout)."""
    ix = _Index(program)
    out: list[PatternInstance] = []
    claimed: set[int] = set()
    loss_inputs: set[int] = set()
    emb_tables: set[str] = set()
    for i, op in enumerate(program.ops):
        role = _role(op)
        if role == "embedding" and _param_operand(op) is not None:
            t = _param_operand(op)
            emb_tables.add(t.name or "")
            out.append(PatternInstance("embedding", (i,), {"table": (t.name or "",)}))
        elif role == "norm":
            ps = tuple(v.name or "" for v in op.operands[1:] if v is not None and v.is_parameter)
            roles = dict(zip(("weight", "bias"), ((p,) for p in ps), strict=False))
            out.append(PatternInstance("norm", (i,), roles))
        elif role == "attention":
            cols: list[Operation] = []
            for v in op.operands[:3]:
                cols += [m for m in ix.producer_matmuls(v, "passthrough") if m not in cols]
            cols.sort(key=lambda o: ix.pos[id(o)])
            row = ix.consumer_matmul(op.results[0], "passthrough")
            if cols and row is not None:
                claimed.update(id(o) for o in (*cols, row))
                out.append(_block(ix, "attention", cols, row, op))
        elif role == "loss":
            heads = ix.producer_matmuls(op.operands[0], None)
            for h in heads:
                loss_inputs.add(id(h))
                claimed.add(id(h))
                w, b, extra = _linear_params(ix, h)
                tied = w in emb_tables
                roles = {"weight": (w,)} | ({"bias": (b,)} if b else {})
                out.append(PatternInstance("lm_head", (ix.pos[id(h)], *extra), roles, tied=tied))
            out.append(PatternInstance("loss", (i,)))
    for op in program.ops:
        if id(op) not in ix.pmatmul or id(op) in claimed:
            continue
        ups = [u for u in ix.producer_matmuls(op.operands[0], "activation") if id(u) not in claimed]
        if ups:
            claimed.update(id(o) for o in (*ups, op))
            out.append(_block(ix, "mlp", ups, op, None))
    return sorted(out, key=lambda p: p.ops[0])


# -- templates ---------------------------------------------------------------------------
def _shifted(placement: str, ndim: int) -> str:
    """A template's ``Shard(d)`` of a 2-d ``[in, out]`` weight for a weight of ``ndim``
    dims: a grouped expert weight ``[E, in, out]`` (mixture-of-experts, one matrix per
    expert, ``completion.models.moe``) keeps the per-expert placement, ``Shard(d + ndim -
    2)``, so column-parallel splits each expert's ``out`` and row-parallel its ``in``
    (Megatron-Core expert tensor parallelism), never the expert dim."""
    if ndim <= 2 or not placement.startswith("Shard("):
        return placement
    return f"Shard({int(placement[6:-1]) + ndim - 2})"


def _roles(inst: PatternInstance, spec: Mapping[str, str],
           ndims: Mapping[str, int] | None = None) -> dict[str, list[str]]:
    """Placements [dp, tp] for each parameter of ``inst`` by role: tp placement per role
    (``ndims``: parameter name -> rank, for :func:`_shifted`; absent: 2-d)."""
    out: dict[str, list[str]] = {}
    for role, names in inst.params.items():
        for n in names:
            out[n] = [R, _shifted(spec.get(role, R), (ndims or {}).get(n, 2))]
    return out


_MEGATRON = {"column": S1, "column_bias": S0, "row": S0, "row_bias": R}

#: kind -> template name -> tp placement by parameter role (missing roles: replicated).
TEMPLATES: dict[str, dict[str, dict[str, str]]] = {
    "embedding": {"replicated": {}, "vocab_parallel": {"table": S0}},
    "attention": {"replicated": {}, "megatron": _MEGATRON},
    "mlp": {"replicated": {}, "megatron": _MEGATRON},
    "norm": {"replicated": {}, "sequence_parallel": {}},
    "lm_head": {"replicated": {}, "vocab_parallel": {"weight": S1, "bias": S0}},
    "loss": {"follow_head": {}},
}


def template_choices(kind: str, patterns: Sequence[PatternInstance] = ()) -> list[str]:
    """Template names of ``kind`` (a tied head has the single choice ``tied``)."""
    if kind not in TEMPLATES:
        raise PatternError(f"unknown pattern kind {kind!r}; known: {list(TEMPLATES)}")
    if kind == "lm_head" and any(p.kind == "lm_head" and p.tied for p in patterns):
        return ["tied"]
    return list(TEMPLATES[kind])


def megatron_templates() -> dict[str, str]:
    """The template choice equal to Megatron's standard layout."""
    return {"embedding": "vocab_parallel", "attention": "megatron", "mlp": "megatron",
            "norm": "replicated", "lm_head": "vocab_parallel", "loss": "follow_head"}


def data_annotations(program: Program) -> dict[str, list[str]]:
    """Every named data input with its batch dim (dim 0) on dp; size-1 dims replicated."""
    out = {}
    for op in program.ops:
        if op.type == "data" and op.results[0] is not None and op.results[0].name:
            v = op.results[0]
            out[v.name] = [S0 if v.shape and v.shape[0] > 1 else R, R]
    return out


def apply_templates(program: Program, patterns: Sequence[PatternInstance],
                    choice: Mapping[str, str]) -> dict[str, list[str]]:
    """Annotation ``{value name: [dp placement, tp placement]}`` from one template per kind.

    Raises PatternError naming the kind and template when a choice is unknown."""
    ann = data_annotations(program)
    ndims = {v.name: v.ndim for v in program.parameters() if v.name}
    for inst in patterns:
        t = choice.get(inst.kind, "replicated" if inst.kind != "loss" else "follow_head")
        if inst.kind == "lm_head" and inst.tied:
            continue  # the table is annotated by the embedding template
        if t not in TEMPLATES[inst.kind]:
            raise PatternError(f"pattern {inst.kind!r}: unknown template {t!r}; "
                               f"known: {list(TEMPLATES[inst.kind])}")
        ann.update(_roles(inst, TEMPLATES[inst.kind][t], ndims))
    return ann


def random_annotation(program: Program, tp: int, seed: int) -> dict[str, list[str]]:
    """full_random: for every parameter a uniformly random legal dims_mapping on tp
    (replicated, or one tensor dim whose size tp divides), dp replicated; data inputs with
    batch on dp. Deterministic in ``seed``."""
    rng = random.Random(seed)
    ann = data_annotations(program)
    for v in program.parameters():
        opts = [R] + [f"Shard({d})" for d, n in enumerate(v.shape) if tp > 1 and n % tp == 0]
        ann[v.name or ""] = [R, rng.choice(opts)]
    return ann
