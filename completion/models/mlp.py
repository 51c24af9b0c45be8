"""The seed's small MLP (``shared/data/programs/mlp_sgd_no_dist_attrs.pir``, forward part)."""

from __future__ import annotations

from completion.errors import CompletionError
from completion.ir import OpRole, Program
from completion.models.builder import ProgramBuilder


def build_mlp(batch_size: int = 4, in_features: int = 16, hidden: int = 16, out_features: int = 8,
              dtype: str = "float32") -> Program:
    """The two-layer MLP of the seed programs, forward part with its loss.

    Ops, in the seed's order: data ``learning_rate_1`` (scalar, persistable),
    parameter ``parameter_1`` [hidden, out_features], parameter ``parameter_0``
    [in_features, hidden], data ``input0`` [batch, in_features], data ``label0``
    [batch, out_features], relu, matmul(x, parameter_0), relu, matmul(., parameter_1), relu,
    subtract(., label0), square, mean (role LOSS) and ``shadow_output`` ``loss_0``.
    With the defaults (4, 16, 16, 8, float32) this prints as the forward part of the seed file.

    Raises ValueError for a non-positive size or an unknown dtype.
    """
    for nm, v in (("batch_size", batch_size), ("in_features", in_features), ("hidden", hidden),
                  ("out_features", out_features)):
        if not isinstance(v, int) or v < 1:
            raise CompletionError(f"build_mlp: {nm} must be a positive int, got {v!r}")
    pb = ProgramBuilder(dtype=dtype)
    pb.data("learning_rate_1", [], dtype, persistable=True)
    w1 = pb.param("", "parameter_1", [hidden, out_features])
    w0 = pb.param("", "parameter_0", [in_features, hidden])
    x = pb.data("input0", [batch_size, in_features], dtype)
    label = pb.data("label0", [batch_size, out_features], dtype)
    mm = {"transpose_x": False, "transpose_y": False}
    y = pb.op1("relu", [x])
    y = pb.op1("matmul", [y, w0], mm)
    y = pb.op1("relu", [y])
    y = pb.op1("matmul", [y, w1], mm)
    y = pb.op1("relu", [y])
    y = pb.op1("subtract", [y, label])
    y = pb.op1("square", [y])
    loss = pb.op1("mean", [y], {"axis": [], "keepdim": False}, role=OpRole.LOSS)
    pb.op("shadow_output", [loss], {"output_name": "loss_0"}, role=OpRole.LOSS)
    pb.program.renumber()
    return pb.program
