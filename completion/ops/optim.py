"""Optimizer update ops ``sgd_``, ``adam_``, ``adamw_`` (in place: results alias operands).

Operand orders and attributes follow Paddle's ``ops.yaml``: ``sgd_(param, learning_rate,
grad, master_param?) -> (param_out, master_param_out?)``; ``adam_(param, grad, learning_rate,
moment1, moment2, beta1_pow, beta2_pow, master_param?, skip_update?) -> (param_out,
moment1_out, moment2_out, beta1_pow_out, beta2_pow_out, master_param_out?)``; ``adamw_``
adds ``lr_ratio``, ``coeff`` and ``with_decay`` (decoupled weight decay, Loshchilov & Hutter
2019).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from completion.ops.declare import defop
from completion.ops.registry import OpError, TensorType
from completion.ops.shapes import need

T = Sequence[TensorType | None]


def _check_grad(param: TensorType, grad: TensorType) -> None:
    if param.shape != grad.shape:
        raise OpError(f"grad shape {list(grad.shape)} differs from param shape {list(param.shape)}")


def _sgd(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    p, g = need(types, 0, "param"), need(types, 2, "grad")
    need(types, 1, "learning_rate")
    _check_grad(p, g)
    master = types[3] if len(types) > 3 else None
    return [p, master]


def _adam(types: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    p, g = need(types, 0, "param"), need(types, 1, "grad")
    _check_grad(p, g)
    m1, m2 = need(types, 3, "moment1"), need(types, 4, "moment2")
    b1, b2 = need(types, 5, "beta1_pow"), need(types, 6, "beta2_pow")
    master = types[7] if len(types) > 7 else None
    return [p, m1, m2, b1, b2, master]


_ADAM_OPERANDS = ("param", "grad", "learning_rate", "moment1", "moment2", "beta1_pow",
                  "beta2_pow", "master_param?", "skip_update?")
_ADAM_RESULTS = ("param_out", "moment1_out", "moment2_out", "beta1_pow_out", "beta2_pow_out",
                 "master_param_out")
_ADAM_ATTRS = {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "lazy_mode": False,
               "min_row_size_to_use_multithread": 1000, "multi_precision": False,
               "use_global_beta_pow": False}
_ADAM_TAGS = {"beta1": "Float", "beta2": "Float", "epsilon": "Float",
              "min_row_size_to_use_multithread": "Int64"}

defop("sgd_", ("param", "learning_rate", "grad", "master_param?"),
      ("param_out", "master_param_out"), _sgd, family="optimizer",
      attrs={"multi_precision": False}, optimizer=True)
defop("adam_", _ADAM_OPERANDS, _ADAM_RESULTS, _adam, family="optimizer",
      attrs=_ADAM_ATTRS, attr_tags=_ADAM_TAGS, optimizer=True)
defop("adamw_", _ADAM_OPERANDS, _ADAM_RESULTS, _adam, family="optimizer",
      attrs={**_ADAM_ATTRS, "coeff": 0.01, "lr_ratio": 1.0, "with_decay": True},
      attr_tags={**_ADAM_TAGS, "coeff": "Float", "lr_ratio": "Float"}, optimizer=True)

