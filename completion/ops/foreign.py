"""Op types known by their traits only: types a Paddle program (parsed from PIR text, where
an undeclared type keeps the type the text gives it) or another frontend may carry, that
have no declaration here (no operands, inference or SPMD rule), but that the cost model,
the memory model and the tuner must recognise. :func:`completion.ops.registry.op_traits`
answers for them; :func:`completion.ops.registry.get_opdef` stays None.

Our own frontends never emit these types: ``from_torch`` maps ``aten.linear`` to
``matmul`` (+ ``add``), ``aten.scaled_dot_product_attention`` to ``flash_attention``,
``aten.cross_entropy_loss`` to ``cross_entropy_with_softmax`` and ``aten.view`` /
``aten.flatten`` to ``reshape`` (``completion.frontends.aten_ops``). Declaring an op here
instead of registering it keeps every other behaviour (parsing, printing, completion,
backward) as it is for an unknown op.
"""

from __future__ import annotations

from completion.ops.registry import OpTraits, register_traits

# Paddle ops that move no data through a kernel of their own: assign (a copy the executor
# aliases; a parameter seen through it is still that parameter, a value keeps its meaning
# through it), and the builtin combine / split that pack values into a vector and back.
register_traits("assign", OpTraits(kernel=None, weight_passthrough=True,
                                   pattern_role="passthrough"))
for _name in ("combine", "builtin_combine", "builtin_split"):
    register_traits(_name, OpTraits(kernel=None))

# views under other frameworks' names (Paddle's flatten, torch's view)
for _name in ("flatten", "view"):
    register_traits(_name, OpTraits(kernel=None, view=True))

# optimizer updates we do not declare (Paddle momentum_, lamb_)
for _name in ("momentum_", "lamb_"):
    register_traits(_name, OpTraits(optimizer=True))

# frontend spellings of the tuner's pattern ops
register_traits("linear", OpTraits(kernel="gemm", pattern_role="matmul"))
for _name in ("scaled_dot_product_attention", "memory_efficient_attention"):
    register_traits(_name, OpTraits(kernel="attention", attention_core=True,
                                    pattern_role="attention"))
for _name in ("softmax_with_cross_entropy", "cross_entropy"):
    register_traits(_name, OpTraits(pattern_role="loss"))
