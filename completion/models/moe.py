"""The mixture-of-experts MLP of a decoder layer (``ModelConfig.is_moe_layer``).

Ops, under ``decoder.layers.{i}.mlp`` (names follow the Megatron layout of
:mod:`completion.annotate`, not Hugging Face's ``block_sparse_moe.experts.{j}.w1``):

- ``.gate``: the router GEMM ``x [b, s, h] @ W_g [h, E]`` (no bias; Mixtral, Qwen-MoE);
- ``.router``: ``softmax`` over the experts, ``moe_topk`` (k weights and expert indices,
  renormalised when ``norm_topk_prob``), and ``moe_aux_loss`` when
  ``router_aux_loss_coef`` > 0 (its load-balancing gradient joins the router in backward,
  :mod:`completion.ops.moe`);
- ``.experts``: ``moe_dispatch`` to ``[E, b*C, h]``, the grouped SwiGLU expert GEMMs
  ``gate_proj`` / ``up_proj`` ``[E, h, f]`` and ``down_proj`` ``[E, f, h]`` (batched matmuls,
  one GEMM of ``b*C`` rows per expert), ``swiglu``, and ``moe_combine`` back to
  ``[b, s, h]`` weighted by the routing weights (Jiang et al. 2024, "Mixtral of Experts",
  eq. 1-2: ``y = sum_{i in top-k} softmax(topk(x W_g))_i SwiGLU_i(x)``);
- ``.shared_expert``: a dense SwiGLU MLP of ``shared_expert_ffn_hidden_size`` every token
  passes through, scaled by ``sigmoid(x W [h, 1])`` (``.shared_expert_gate``) when
  ``shared_expert_gate``, added to the routed output (Qwen2-MoE,
  ``Qwen2MoeSparseMoeBlock.forward`` in Hugging Face transformers).

Uniform routing: ``C = ceil(s * k / E)`` slots per expert per sequence, so each expert GEMM
has ``b * C`` rows (= ``b s k / E`` when E divides s k) and the routed FLOPs per token are
the active experts' ``k * 3 * 2 h f``.
"""

from __future__ import annotations

from completion.ir import Value
from completion.models.builder import ProgramBuilder
from completion.models.config import ModelConfig


def _experts(pb: ProgramBuilder, cfg: ModelConfig, xe: Value, pre: str) -> Value:
    """Grouped SwiGLU on expert-major tokens ``[E, T, h]`` -> ``[E, T, h]``."""
    e, h, f = cfg.num_experts, cfg.hidden_size, cfg.expert_ffn_hidden_size
    mm = {"transpose_x": False, "transpose_y": False}
    wg = pb.param(f"{pre}.gate_proj", "weight", [e, h, f])
    gate = pb.op1("matmul", [xe, wg], mm, f"{pre}.gate_proj")
    wu = pb.param(f"{pre}.up_proj", "weight", [e, h, f])
    up = pb.op1("matmul", [xe, wu], mm, f"{pre}.up_proj")
    act = pb.op1("swiglu", [gate, up], None, f"{pre}.act")
    wd = pb.param(f"{pre}.down_proj", "weight", [e, f, h])
    return pb.op1("matmul", [act, wd], mm, f"{pre}.down_proj")


def _shared_expert(pb: ProgramBuilder, cfg: ModelConfig, x: Value, pre: str) -> Value:
    """The shared expert's SwiGLU (``[b, s, h]`` -> ``[b, s, h]``), gated when the config says."""
    h, f = cfg.hidden_size, cfg.shared_expert_ffn_hidden_size
    assert f is not None
    st = f"{pre}.shared_expert"
    gate = pb.linear(x, h, f, f"{st}.gate_proj", False)
    up = pb.linear(x, h, f, f"{st}.up_proj", False)
    y = pb.linear(pb.op1("swiglu", [gate, up], None, f"{st}.act"), f, h, f"{st}.down_proj", False)
    if cfg.shared_expert_gate:
        g = pb.op1("sigmoid", [pb.linear(x, h, 1, f"{pre}.shared_expert_gate", False)], None,
                   f"{pre}.shared_expert_gate")
        y = pb.op1("multiply", [y, g], None, f"{st}.act")
    return y


def moe_mlp(pb: ProgramBuilder, cfg: ModelConfig, x: Value, pre: str) -> Value:
    """The MoE block of one layer on ``x [b, s, h]`` (module docstring); ``pre`` is the
    layer's ``decoder.layers.{i}.mlp``. Returns ``[b, s, h]``."""
    e, k = cfg.num_experts, cfg.experts_per_token
    assert e is not None and k is not None
    logits = pb.linear(x, cfg.hidden_size, e, f"{pre}.gate", False)
    probs = pb.op1("softmax", [logits], {"axis": -1}, f"{pre}.router")
    res = pb.op("moe_topk", [probs], {"k": k, "normalize": cfg.norm_topk_prob}, f"{pre}.router")
    weights, idx = res[0], res[1]
    assert weights is not None and idx is not None
    moe = {"num_experts": e, "capacity_factor": float(cfg.expert_slot_factor)}
    xe = pb.op1("moe_dispatch", [x, idx], moe, f"{pre}.experts")
    ye = _experts(pb, cfg, xe, f"{pre}.experts")
    y = pb.op1("moe_combine", [ye, weights, idx], moe, f"{pre}.experts")
    if cfg.router_aux_loss_coef > 0:
        y = pb.op1("moe_aux_loss", [y, probs, idx], {"coef": float(cfg.router_aux_loss_coef)},
                   f"{pre}.router")
    if cfg.shared_expert_ffn_hidden_size is not None:
        y = pb.add(y, _shared_expert(pb, cfg, x, pre), pre)
    return y
