"""Op roles for programs that do not carry them (PIR text has no role field).

Rule (documented contract, applied by the PIR parser and usable on any program):

1. An op of the ``optimizer`` family (``sgd_``, ``adam_``, ``adamw_``) is OPTIMIZE.
2. The backward region starts at the first grad op (an op declared as some op's gradient,
   or any type ending in ``_grad``), extended backwards over the contiguous
   ``full`` / ``full_like`` ops right before it (the loss-gradient seed, Paddle's
   ``full`` + ``full_like(loss, 1.0)``). Every later non-optimizer op is BACKWARD,
   including ``add_n`` and ``reshard`` there.
3. The op defining the loss is LOSS: the first operand of the seed ``full_like`` when there
   is a backward region, else the operand of a ``shadow_output`` whose ``output_name``
   starts with ``loss``. Everything else is FORWARD.

Passes that want "every forward op" should test ``op.role in FORWARD_ROLES``.
"""

from __future__ import annotations

from completion.ir import OpRole, Program
from completion.ops.registry import get_opdef

FORWARD_ROLES = (OpRole.FORWARD, OpRole.LOSS)
SEED_TYPES = ("full", "full_like")


def is_grad_type(op_type: str) -> bool:
    """True for a gradient op type: a registered op with a ``forward`` op, or any type
    ending in ``_grad`` (so unknown grad ops still count)."""
    od = get_opdef(op_type)
    return (od is not None and od.forward is not None) or op_type.endswith("_grad")


def is_optimizer_type(op_type: str) -> bool:
    """True for a registered op of the ``optimizer`` family (``sgd_``, ``adamw_``, ...)."""
    od = get_opdef(op_type)
    return od is not None and od.family == "optimizer"


def infer_roles(program: Program) -> None:
    """Set ``op.role`` on every op of ``program`` by the rule in the module docstring."""
    ops = program.ops
    start = next((i for i, op in enumerate(ops) if is_grad_type(op.type)), None)
    if start is not None:
        while start > 0 and ops[start - 1].type in SEED_TYPES:
            start -= 1
    for i, op in enumerate(ops):
        if is_optimizer_type(op.type):
            op.role = OpRole.OPTIMIZE
        elif start is not None and i >= start:
            op.role = OpRole.BACKWARD
        else:
            op.role = OpRole.FORWARD
    loss = None
    if start is not None:
        seed = next((op for op in ops[start:] if op.type == "full_like"), None)
        if seed is not None and seed.operands and seed.operands[0] is not None:
            loss = seed.operands[0]
    if loss is None:
        for op in ops:
            name = str(op.attrs.get("output_name", ""))
            if op.type == "shadow_output" and name.startswith("loss") and op.operands:
                loss = op.operands[0]
    if loss is not None and loss.op is not None and loss.op.role == OpRole.FORWARD:
        loss.op.role = OpRole.LOSS
