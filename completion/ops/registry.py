"""The op registry: every op type declares its operands, results, attributes, its
shape/dtype inference and its traits (:class:`OpTraits`: does it launch a kernel and of what
kind, is it a view, an optimizer update, a program input, does a parameter seen through it
stay that parameter, is it part of an attention core, which grad operands are read only for
their shapes, which role it plays in the tuner's patterns). Frontends, rules, cost models,
memory models, kernels and the tuner look ops up here by their canonical type
(``"matmul"``, ``"relu_grad"``, ``"sgd_"``, ``"reshard"``) instead of keeping their own sets
of op-type names: :func:`get_opdef` for a declaration, :func:`op_traits` for the traits.

Op types that a Paddle program or a frontend may carry but that have no declaration here
(``assign``, ``builtin.combine``, ``linear``, ``scaled_dot_product_attention``, ...) are
*known by their traits only* (:func:`register_traits`, declared in
:mod:`completion.ops.foreign`): :func:`get_opdef` stays None for them (no operands, no
inference, no SPMD rule; the PIR parser keeps their types from the text), but
:func:`op_traits` answers for them as for a declared op.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from completion.errors import CompletionError


class OpError(CompletionError):
    """Bad op: unknown type, wrong operand count, or inconsistent shapes. Names the op."""


@dataclass(frozen=True)
class TensorType:
    """Static type of a value: global shape (ints, () for a scalar) and dtype name
    (``float32``, ``bfloat16``, ``float16``, ``int64``, ``int32``, ``bool``)."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))

    @property
    def ndim(self) -> int:
        """Number of dims."""
        return len(self.shape)

    @property
    def numel(self) -> int:
        """Number of elements (1 for a scalar)."""
        n = 1
        for s in self.shape:
            n *= s
        return n


# inference: (operand types (None for a null operand), attrs) -> result types (None = null)
InferFn = Callable[[Sequence[TensorType | None], dict[str, Any]], list[TensorType | None]]


#: What kind of kernel an op launches, as the cost model and the calibration classify it:
#: ``"gemm"`` (matrix products, compute-bound, size-dependent efficiency), ``"attention"``
#: (fused attention kernels, e.g. FlashAttention) or ``"memory"`` (bandwidth-bound:
#: elementwise, norms, softmax, gathers, optimizer updates, and the generic rule for an op
#: nobody described). An op that launches no kernel has ``kernel=None``.
KernelKind = Literal["gemm", "attention", "memory"]

#: The part an op plays in the tuner's pattern matcher (``tuner.patterns``): ``"matmul"``
#: (a projection when it reads a parameter), ``"attention"`` (an attention core whose q/k/v
#: come from projections), ``"norm"`` (a normalisation with its weight and bias),
#: ``"activation"`` (an elementwise activation or gate between MLP projections),
#: ``"passthrough"`` (a value keeps its meaning through it: layout, position, dtype and
#: scaling ops), ``"loss"`` (the cross entropy after the LM head), ``"embedding"`` (a table
#: lookup).
PatternRole = Literal["matmul", "attention", "norm", "activation", "passthrough", "loss",
                      "embedding"]


@dataclass(frozen=True, kw_only=True)
class OpTraits:
    """What the models know about an op type beyond its signature. Every field has the
    default of an ordinary memory-bound op, so an op declares only what differs; an unknown
    op type gets ``OpTraits()`` from :func:`op_traits`.

    Attributes:
        kernel: the kind of kernel the op launches (:data:`KernelKind`), or None when it
            launches none: program inputs (``data``, ``parameter``), constants the runtime
            materialises once (``full``), sinks (``shadow_output``), views, and ``reshard``
            placeholders (their collectives are costed from the reshard plan, not as ops).
            A grad op has its forward op's kind.
        view: the result is a view of the first operand: it shares that operand's storage
            (no copy, no kernel), so memory models count the storage once (reshape,
            squeeze, unsqueeze). Their grad ops are not views of their first operand (that
            operand is only read for its shape, see ``no_need_buffer``) and get False.
        optimizer: an optimizer update (``sgd_``, ``adam_``, ``adamw_``): its kernels run in
            the optimizer phase ``"O"``.
        input: the op only declares a program input (``data``, ``parameter``): no operands,
            no kernel; its result is fed or loaded, not computed.
        weight_passthrough: a parameter seen through the op is still that parameter, read
            from the op's first operand (cast, reshard, transpose, reshape, all_gather,
            assign): the gradient of its result is a weight gradient (W phase) and the
            value counts as a weight.
        weight_alias: stricter than ``weight_passthrough`` (which it implies): the result
            *is* the parameter in another dtype or layout (cast, reshard), so a block that
            reads it reads that parameter (its bytes are parameter bytes, not workspace).
        attention_core: the op can be part of an attention core, the part that selective
            recompute drops and recomputes (Korthikanti et al. 2022, "Reducing Activation
            Recomputation", section 5): a fused attention kernel, or the softmax, dropout,
            scale and activation-by-activation matmuls of unfused attention. Whether a given
            op is in the core also depends on where it is
            (``simulator.memory.is_attention_core``). A grad op has its forward op's value.
        no_need_buffer: for a grad op, the indices of the operands whose buffers the kernel
            does not read, only their shapes/dtypes, so their forward values need not be
            kept for backward (Paddle's ``paddle/phi/ops/yaml/backward.yaml``
            ``no_need_buffer``, e.g. ``layer_norm_grad``: bias; ``add_grad``: x, y).
            Declared by operand name on the forward op (``defop(..., no_need_buffer=...)``).
        pattern_role: the op's part in the tuner's pattern matcher (:data:`PatternRole`), or
            None. Grad ops have none.
        fusable: a memory-bound op that a fusion compiler (torch.compile / Inductor, a
            framework's fused kernels) may merge with its memory-bound neighbours; False for
            gathers and scatter-adds (``embedding`` and its grad), which Inductor leaves as
            their own kernels. A grad op has its forward op's value.
        random: the op's results depend on random numbers (``dropout``): a fused backward
            kernel cannot recompute them, they must be read from memory. Grad ops: False.
        gradient_sum: the op only sums or re-types its operands (``add``, ``add_n``,
            ``cast``): a gradient that flows through it is the sum of its operands'
            gradients, so the producers of its operands produce that gradient. Grad ops: False.
    """

    kernel: KernelKind | None = "memory"
    view: bool = False
    optimizer: bool = False
    input: bool = False
    weight_passthrough: bool = False
    weight_alias: bool = False
    attention_core: bool = False
    no_need_buffer: frozenset[int] = frozenset()
    pattern_role: PatternRole | None = None
    fusable: bool = True
    random: bool = False
    gradient_sum: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "no_need_buffer", frozenset(int(i) for i in self.no_need_buffer))


#: the traits of an op type nobody declared (what every model assumes of an unknown op)
UNKNOWN_TRAITS = OpTraits()


@dataclass(frozen=True)
class OpDef(OpTraits):
    """Declaration of one op type: its signature, and its traits (inherited from
    :class:`OpTraits`, keyword-only: ``get_opdef("reshape").view``).

    Attributes:
        name: canonical type without dialect prefix, e.g. ``"matmul"``.
        dialect: prefix used in PIR text: ``"pd_op"``, ``"builtin"`` or ``"dist_op"``.
        operands: operand names in order; a trailing ``"?"`` marks an optional operand that
            may be a null value (``<<NULL VALUE>>``).
        results: result names in order.
        attrs: attribute name -> default value (documentational and for builders).
        infer: shape/dtype inference; raises OpError naming the problem.
        family: a tag shared by ops handled alike (``"elementwise_unary"``, ``"matmul"``...),
            used by SPMD rules, cost and kernels when a per-type entry is absent.
        grad: the ``*_grad`` op type, if the op has one.
        variadic: operands may repeat (``concat``, ``add_n``).
        grad_inputs: operands of the ``grad`` op, each naming a forward operand
            (``"x"``), a forward result (``"out"``) or a result's gradient (``"out@GRAD"``),
            in Paddle's order, e.g. matmul: ``("x", "y", "out@GRAD")``, relu:
            ``("out", "out@GRAD")``. The grad op's results are the gradients of the forward
            operands, in operand order (null where no gradient is needed).
        attr_tags: attribute name -> PIR type tag printed before the value
            (``{"axis": "pd_op.IntArray"}`` prints ``axis:(pd_op.IntArray)[]``).
        internal_attrs: attributes used by inference/builders but not printed in PIR text
            (e.g. a parameter's ``shape``/``dtype``, which the text carries in its type).
        forward: for a ``*_grad`` op, the forward op type it differentiates.
        carried_attrs: for a ``*_grad`` op, optional forward attributes (not declared, so
            absent unless a builder sets them) that the grad op takes over when the forward
            op carries them (``flash_attention``'s ``sliding_window``: the backward kernel
            skips the same key blocks, ``simulator.op_cost``).
        variadic_results: the last result repeats (``split``).
        kernel, view, optimizer, input, weight_passthrough, weight_alias, attention_core,
            no_need_buffer, pattern_role, fusable, random, gradient_sum: the op's traits, see :class:`OpTraits`.
    """

    name: str
    dialect: str
    operands: tuple[str, ...]
    results: tuple[str, ...]
    infer: InferFn
    attrs: dict[str, Any] = field(default_factory=dict)
    family: str = ""
    grad: str | None = None
    variadic: bool = False
    grad_inputs: tuple[str, ...] = ()
    attr_tags: dict[str, str] = field(default_factory=dict)
    internal_attrs: tuple[str, ...] = ()
    forward: str | None = None
    variadic_results: bool = False
    carried_attrs: tuple[str, ...] = ()


OP_REGISTRY: dict[str, OpDef] = {}
#: op types known by their traits only (no declaration): see the module docstring
FOREIGN_TRAITS: dict[str, OpTraits] = {}


def register_op(opdef: OpDef) -> OpDef:
    """Add an op type to the registry. Raises OpError on a duplicate name."""
    if opdef.name in OP_REGISTRY or opdef.name in FOREIGN_TRAITS:
        raise OpError(f"op type {opdef.name!r} is registered twice")
    OP_REGISTRY[opdef.name] = opdef
    return opdef


def register_traits(name: str, traits: OpTraits) -> OpTraits:
    """Record the traits of an op type that has no declaration (a Paddle or frontend op
    type the models must recognise, see the module docstring). ``name`` may carry a dialect
    prefix. Raises OpError when the type is declared or already has traits."""
    key = canonical_type(name)
    if key in OP_REGISTRY or key in FOREIGN_TRAITS:
        raise OpError(f"op type {key!r} is registered twice")
    FOREIGN_TRAITS[key] = traits
    return traits


def op_traits(name: str) -> OpTraits:
    """The traits of op type ``name`` (dialect prefix allowed): its declaration (an
    :class:`OpDef` is an :class:`OpTraits`), else its traits-only entry, else
    :data:`UNKNOWN_TRAITS` (a memory-bound kernel, every flag off)."""
    key = canonical_type(name)
    return OP_REGISTRY.get(key) or FOREIGN_TRAITS.get(key) or UNKNOWN_TRAITS


def get_opdef(name: str) -> OpDef | None:
    """The declaration of ``name`` (prefix such as ``pd_op.`` allowed), or None if unknown."""
    return OP_REGISTRY.get(canonical_type(name))


def canonical_type(name: str) -> str:
    """Strip a dialect prefix: ``pd_op.matmul`` -> ``matmul``."""
    return name.split(".", 1)[1] if "." in name else name
