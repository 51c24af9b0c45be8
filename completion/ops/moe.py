"""Mixture-of-experts ops: ``moe_topk`` (routing), ``moe_dispatch`` (tokens to experts),
``moe_combine`` (experts back to tokens, weighted) and ``moe_aux_loss`` (load balancing),
with their ``*_grad`` ops. The expert GEMMs themselves are batched ``matmul`` ops over the
expert dim (``[E, T, h] @ [E, h, f]``, one GEMM of ``T`` rows per expert: a grouped GEMM).

Layouts (b sequences of s tokens, hidden h, E experts, top-k):

- ``moe_topk(x [..., E]) -> (weights [..., k], indices [..., k] int64)``: the k largest
  router probabilities and their experts (``torch.topk``); ``normalize``: the weights are
  divided by their sum (Mixtral ``MixtralSparseMoeBlock``; Qwen-MoE ``norm_topk_prob``);
  ``scale`` (default 1): then multiplied by it (DeepSeek-V3 ``routed_scaling_factor``);
  ``groups`` / ``topk_groups`` (default 1): node-limited routing, the E experts cut into
  ``groups`` equal groups, each scored by the sum of its two best scores, and the k chosen
  among the experts of the ``topk_groups`` best groups only (DeepSeek-V3, Liu et al. 2024,
  sec. 2.1.2 "node-limited routing": with one group per node a token reaches at most
  ``topk_groups`` nodes; transformers ``DeepseekV3MoE.get_topk_indices``).
- ``moe_dispatch(x [b, s, h], indices [b, s, k]) -> out [E, b * C, h]``: every expert's
  tokens, ``C = ceil(capacity_factor * s * k / E)`` slots per expert per sequence (GShard,
  Lepikhin et al. 2021, sec. 2.2 "expert capacity"): sequence ``i``'s (token, choice) pairs
  routed to expert ``e`` fill rows ``i * C ..`` of ``out[e]`` in token order; pairs beyond
  the capacity are dropped, empty slots are zero. The cost model assumes uniform routing,
  so every slot is used (capacity_factor 1: ``b * s * k / E`` tokens per expert, rounded
  up per sequence).
- ``moe_combine(y [E, b * C, h], weights [b, s, k], indices [b, s, k]) -> out [b, s, h]``:
  ``out[i, t] = sum_j weights[i, t, j] * y[indices[i, t, j], slot(i, t, j)]`` (a dropped
  pair contributes 0).
- ``moe_aux_loss(x [b, s, h], probs [b, s, E], indices [b, s, k]) -> (out [b, s, h],
  loss [])``: ``out`` is ``x`` unchanged and ``loss = coef * E * sum_e f_e * P_e`` with
  ``f_e`` the share of the b*s tokens whose top-k choices include expert e (counted once per
  choice, so ``sum_e f_e = k``) and ``P_e`` the mean router probability of expert e (Switch
  Transformer, Fedus et al. 2022, eq. 4; Hugging Face ``load_balancing_loss_func`` of
  ``modeling_mixtral.py`` sums its per-choice fractions the same way). As Megatron-Core's
  ``MoEAuxLossAutoScaler`` (``megatron/core/transformer/moe/moe_utils.py``), the loss is not
  added to the LM loss in the program: the grad op passes ``out@GRAD`` to ``x`` and adds the
  aux loss's own gradient (loss gradient 1) to ``probs``, ``d loss / d probs[t, e] = coef *
  E * f_e / (b s)``. So the aux loss needs no value sent between pipeline stages. Like
  Megatron-Core's default, it is each rank's loss on its own micro-batch's tokens: a plan
  with several micro-batches or dp ranks balances per micro-batch and rank, which differs
  from one pass over the whole batch (``tests/meshplan/test_moe_verify.py`` verifies it on one
  micro-batch), and its gradient is not scaled by 1 / micro-batches (Megatron-Core's
  ``MoEAuxLossAutoScaler.set_loss_scale`` does; no cost effect).

Integer ``indices`` get no gradient (the grad ops return a null result for them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from completion.ops.declare import defop
from completion.ops.registry import OpError, TensorType
from completion.ops.shapes import count, need

T = Sequence[TensorType | None]
INT = ("int64", "int32")


def capacity(s: int, k: int, experts: int, factor: float = 1.0) -> int:
    """Slots per expert per sequence: ``ceil(factor * s * k / E)`` (module docstring).
    Raises OpError for a non-positive size or factor."""
    if s < 1 or k < 1 or experts < 1 or not factor > 0:
        raise OpError(f"capacity needs s, k, experts >= 1 and factor > 0, got {s}, {k}, {experts}, {factor}")
    return max(1, math.ceil(factor * s * k / experts))


def _experts(attrs: dict[str, Any]) -> int:
    e = attrs.get("num_experts")
    if isinstance(e, bool) or not isinstance(e, int) or e < 1:
        raise OpError(f"attribute num_experts must be an int >= 1, got {e!r}")
    return e


def _routing(x: TensorType, idx: TensorType, what: str) -> tuple[int, int, int]:
    """(b, s, k) after checking ``x [b, s, *]`` and ``indices [b, s, k]`` (int)."""
    if x.ndim != 3 or idx.ndim != 3 or x.shape[:2] != idx.shape[:2]:
        raise OpError(f"{what} [b, s, *] and indices [b, s, k] must agree, got {list(x.shape)} "
                      f"and {list(idx.shape)}")
    if idx.dtype not in INT:
        raise OpError(f"indices must be int64 or int32, got {idx.dtype}")
    return x.shape[0], x.shape[1], idx.shape[2]


def _infer_topk(ts: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    count(ts, 1, ("x",))
    x = need(ts, 0, "x")
    k = attrs.get("k")
    if not x.ndim or isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= x.shape[-1]:
        raise OpError(f"k must be an int in [1, {x.shape[-1] if x.ndim else 0}], got {k!r}")
    g, tg = attrs.get("groups", 1), attrs.get("topk_groups", 1)
    e = x.shape[-1]
    if any(isinstance(a, bool) or not isinstance(a, int) for a in (g, tg)) or not (
            1 <= tg <= g and e % g == 0 and k <= tg * (e // g)):
        raise OpError(f"groups {g!r} must divide the {e} experts and topk_groups {tg!r} be in "
                      f"[1, groups] with k = {k} <= topk_groups * experts per group")
    shape = x.shape[:-1] + (k,)
    return [TensorType(shape, x.dtype), TensorType(shape, "int64")]


def _infer_dispatch(ts: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    count(ts, 2, ("x", "indices"))
    x, idx = need(ts, 0, "x"), need(ts, 1, "indices")
    b, s, k = _routing(x, idx, "x")
    e = _experts(attrs)
    c = capacity(s, k, e, float(attrs.get("capacity_factor", 1.0)))
    return [TensorType((e, b * c, x.shape[2]), x.dtype)]


def _infer_combine(ts: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    count(ts, 3, ("y", "weights", "indices"))
    y, w, idx = need(ts, 0, "y"), need(ts, 1, "weights"), need(ts, 2, "indices")
    b, s, k = _routing(w, idx, "weights")
    e = _experts(attrs)
    c = capacity(s, k, e, float(attrs.get("capacity_factor", 1.0)))
    if w.shape != idx.shape or y.ndim != 3 or y.shape[:2] != (e, b * c):
        raise OpError(f"y must be [E={e}, b*C={b * c}, h] for weights {list(w.shape)}, got {list(y.shape)}")
    return [TensorType((b, s, y.shape[2]), y.dtype)]


def _infer_aux(ts: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    count(ts, 3, ("x", "probs", "indices"))
    x, p, idx = need(ts, 0, "x"), need(ts, 1, "probs"), need(ts, 2, "indices")
    _routing(p, idx, "probs")
    if x.shape[:2] != p.shape[:2]:
        raise OpError(f"x {list(x.shape)} and probs {list(p.shape)} must share [b, s]")
    return [x, TensorType((), p.dtype)]


def _infer_aux_grad(ts: T, attrs: dict[str, Any]) -> list[TensorType | None]:
    """(probs, indices, out@GRAD) -> (x@GRAD like out@GRAD, probs@GRAD like probs, null)."""
    count(ts, 3, ("probs", "indices", "out@GRAD"))
    return [need(ts, 2, "out@GRAD"), need(ts, 0, "probs"), None]


def _grad_first(n_null: int):
    """Grad inference: the first grad operand's type (a float forward operand), then
    ``n_null`` further float operands of their own types, then null for the indices."""
    def infer(ts: T, attrs: dict[str, Any]) -> list[TensorType | None]:
        return [*ts[: 1 + n_null], None]
    return infer


defop("moe_topk", ("x",), ("weights", "indices"), _infer_topk, family="moe_topk",
      attrs={"k": 1, "normalize": True}, grad_inputs=("x", "indices", "weights@GRAD"))
defop("moe_dispatch", ("x", "indices"), ("out",), _infer_dispatch, family="moe_dispatch",
      attrs={"num_experts": 1, "capacity_factor": 1.0}, fusable=False,
      grad_inputs=("x", "indices", "out@GRAD"), grad_infer=_grad_first(0), no_need_buffer=("x",))
defop("moe_combine", ("y", "weights", "indices"), ("out",), _infer_combine, family="moe_combine",
      attrs={"num_experts": 1, "capacity_factor": 1.0}, fusable=False,
      grad_inputs=("y", "weights", "indices", "out@GRAD"), grad_infer=_grad_first(1))
defop("moe_aux_loss", ("x", "probs", "indices"), ("out", "loss"), _infer_aux, family="moe_aux_loss",
      attrs={"coef": 0.0}, grad_inputs=("probs", "indices", "out@GRAD"), grad_infer=_infer_aux_grad)
