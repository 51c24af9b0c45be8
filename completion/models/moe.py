"""The mixture-of-experts MLP of a decoder layer (``ModelConfig.is_moe_layer``).

Ops, under ``decoder.layers.{i}.mlp`` (names follow the Megatron layout of
:mod:`completion.annotate`, not Hugging Face's ``block_sparse_moe.experts.{j}.w1``):

- ``.gate``: the router GEMM ``x [b, s, h] @ W_g [h, E]`` (no bias in Mixtral, Qwen-MoE,
  DeepSeek, Llama 4; a bias ``[E]`` in GPT-OSS, ``mlp_bias``);
- ``.router``: ``softmax`` over the experts (or an independent ``sigmoid`` per expert:
  DeepSeek-V3 eq. 15, Llama 4; ``router_score``), ``moe_topk`` (k weights and expert
  indices, renormalised when ``norm_topk_prob``, times ``routed_scaling_factor``, chosen
  within the best ``router_topk_groups`` of ``router_groups`` expert groups: DeepSeek-V3's
  node-limited routing), and ``moe_aux_loss`` when
  ``router_aux_loss_coef`` > 0 (its load-balancing gradient joins the router in backward,
  :mod:`completion.ops.moe`);
- ``.experts``: ``moe_dispatch`` to ``[E, b*C, h]``, the grouped SwiGLU expert GEMMs
  ``gate_proj`` / ``up_proj`` ``[E, h, f]`` and ``down_proj`` ``[E, f, h]`` (batched matmuls,
  one GEMM of ``b*C`` rows per expert; with ``mlp_bias`` each adds a per-expert bias
  ``[E, 1, out]``, GPT-OSS), ``swiglu``, and ``moe_combine`` back to
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


def _expert_linear(pb: ProgramBuilder, xe: Value, shape: list[int], struct: str, bias: bool) -> Value:
    """A grouped expert GEMM ``[E, T, in] @ [E, in, out]`` (``shape`` = the weight's; its
    leading expert dims may be two, ``ModelConfig.expert_grid``) and, with ``bias``, its
    per-expert bias ``[E, 1, out]`` (GPT-OSS ``gate_up_proj_bias`` / ``down_proj_bias``)."""
    w = pb.param(struct, "weight", shape)
    y = pb.op1("matmul", [xe, w], {"transpose_x": False, "transpose_y": False}, struct)
    if bias:
        y = pb.op1("add", [y, pb.param(struct, "bias", [*shape[:-2], 1, shape[-1]])], None, struct)
    return y


def _experts(pb: ProgramBuilder, cfg: ModelConfig, xe: Value, pre: str) -> Value:
    """Grouped SwiGLU on expert-major tokens ``[E, T, h]`` -> ``[E, T, h]`` (biases per
    ``cfg.bias("mlp")``); with ``cfg.expert_grid`` = g the experts' dim is ``[g, E / g]``
    (tokens reshaped to it and back: the weights and tokens are the same, laid out so that
    two mesh dims can split the experts)."""
    e, h, f = cfg.num_experts, cfg.hidden_size, cfg.expert_ffn_hidden_size
    assert e is not None
    g = cfg.expert_grid
    lead = [e] if g is None else [g, e // g]
    if g is not None:
        xe = pb.reshape(xe, [*lead, *xe.shape[1:]], pre)
    bias = cfg.bias("mlp")
    gate = _expert_linear(pb, xe, [*lead, h, f], f"{pre}.gate_proj", bias)
    up = _expert_linear(pb, xe, [*lead, h, f], f"{pre}.up_proj", bias)
    act = pb.op1("swiglu", [gate, up], None, f"{pre}.act")
    out = _expert_linear(pb, act, [*lead, f, h], f"{pre}.down_proj", bias)
    return out if g is None else pb.reshape(out, [e, *out.shape[2:]], pre)


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


def _route(pb: ProgramBuilder, cfg: ModelConfig, x: Value, pre: str) -> tuple[Value, Value, Value]:
    """(scores ``[b, s, E]``, weights, indices ``[b, s, k]``): the router GEMM (a bias per
    ``cfg.bias("mlp")``: GPT-OSS), its scoring (``softmax`` or ``sigmoid``,
    ``cfg.router_score``) and ``moe_topk`` with the config's renormalisation, routed scaling
    and node-limited groups."""
    e, k = cfg.num_experts, cfg.experts_per_token
    assert e is not None and k is not None
    logits = pb.linear(x, cfg.hidden_size, e, f"{pre}.gate", cfg.bias("mlp"))
    if cfg.router_score == "sigmoid":
        probs = pb.op1("sigmoid", [logits], None, f"{pre}.router")
    else:
        probs = pb.op1("softmax", [logits], {"axis": -1}, f"{pre}.router")
    attrs: dict[str, object] = {"k": k, "normalize": cfg.norm_topk_prob}
    if cfg.routed_scaling_factor != 1.0:
        attrs["scale"] = float(cfg.routed_scaling_factor)
    if cfg.router_groups > 1:
        attrs.update(groups=cfg.router_groups, topk_groups=cfg.router_topk_groups)
    res = pb.op("moe_topk", [probs], attrs, f"{pre}.router")
    assert res[0] is not None and res[1] is not None
    return probs, res[0], res[1]


def moe_mlp(pb: ProgramBuilder, cfg: ModelConfig, x: Value, pre: str) -> Value:
    """The MoE block of one layer on ``x [b, s, h]`` (module docstring); ``pre`` is the
    layer's ``decoder.layers.{i}.mlp``. Returns ``[b, s, h]``."""
    probs, weights, idx = _route(pb, cfg, x, pre)
    moe = {"num_experts": cfg.num_experts, "capacity_factor": float(cfg.expert_slot_factor)}
    xe = pb.op1("moe_dispatch", [x, idx], moe, f"{pre}.experts")
    ye = _experts(pb, cfg, xe, f"{pre}.experts")
    y = pb.op1("moe_combine", [ye, weights, idx], moe, f"{pre}.experts")
    if cfg.router_aux_loss_coef > 0:
        y = pb.op1("moe_aux_loss", [y, probs, idx], {"coef": float(cfg.router_aux_loss_coef)},
                   f"{pre}.router")
    if cfg.shared_expert_ffn_hidden_size is not None:
        y = pb.add(y, _shared_expert(pb, cfg, x, pre), pre)
    return y
