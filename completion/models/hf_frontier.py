"""Architecture readers of the ``config.json`` keys that the generic reader
(:mod:`completion.models.hf_config`) does not know: DeepSeek-V3 / Kimi-K2 (multi-head latent
attention, shared and routed experts with node-limited sigmoid routing, first dense layers,
multi-token prediction), GPT-OSS (attention sinks, biased router and experts) and Llama 4
(MoE interleaved with dense layers, a shared expert, sigmoid top-1 routing, NoPE layers and
chunked attention). Each reader returns the :class:`~completion.models.config.ModelConfig`
fields of its keys (``HFModelType.reader``); a bad value raises ModelConfigError naming
the file and key, a key absent where transformers' config class has a default warns
(:class:`~completion.models.config.ModelConfigWarning`) and takes that default.

Sources, transformers v4.55: ``configuration_deepseek_v3.py`` / ``modeling_deepseek_v3.py``
(Kimi-K2 ships the same classes under ``model_type`` ``kimi_k2``), ``configuration_gpt_oss.py``
/ ``modeling_gpt_oss.py``, ``configuration_llama4.py`` / ``modeling_llama4.py``.
"""

from __future__ import annotations

import warnings
from typing import Any

from completion.models.config import ModelConfigError, ModelConfigWarning
from completion.models.hf_keys import bool_key, float_key, int_key


def _default(raw: dict[str, Any], name: str, key: str, value: Any) -> Any:
    """``raw[key]``, or transformers' default ``value`` with a warning when absent."""
    if key in raw and raw[key] is not None:
        return raw[key]
    warnings.warn(f"{name}: {key!r} is absent: transformers' default for this model_type, "
                  f"{value!r}, applies", ModelConfigWarning, stacklevel=4)
    return value


def _int_default(raw: dict[str, Any], name: str, key: str, lo: int, value: int) -> int:
    return int_key(raw, name, key, lo, default=_default(raw, name, key, value))


def _experts(raw: dict[str, Any], name: str, experts_key: str, width_key: str) -> dict[str, Any]:
    """The routed experts: count, top-k (``num_experts_per_tok``) and width."""
    e = int_key(raw, name, experts_key, 1)
    k = int_key(raw, name, "num_experts_per_tok", 1)
    if k > e:
        raise ModelConfigError(f"{name}: 'num_experts_per_tok' = {k} exceeds {experts_key!r} = {e}")
    return {"num_experts": e, "experts_per_token": k, "moe_ffn_hidden_size": int_key(raw, name, width_key, 1)}


def _aux(raw: dict[str, Any], name: str, key: str, default: float) -> float:
    coef = raw.get(key, default)
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not 0.0 <= coef < 1e3:
        raise ModelConfigError(f"{name}: {key!r} must be a number >= 0, got {coef!r}")
    return float(coef)


# -- DeepSeek-V3 / Kimi-K2 -----------------------------------------------------------------
#: DeepSeek ``topk_method`` -> whether the expert groups limit the choice (``noaux_tc``:
#: groups scored by their two best experts, transformers ``DeepseekV3MoE.get_topk_indices``;
#: ``greedy``: plain top-k). DeepSeek-V2's ``group_limited_greedy`` (a group scored by its
#: best expert) is not modelled.
TOPK_METHODS = {"noaux_tc": True, "greedy": False}


def _mla(raw: dict[str, Any], name: str) -> dict[str, Any]:
    """Multi-head latent attention (``completion.models.mla``): every size key present
    (``q_lora_rank`` null: a full q projection, as DeepSeek-V2-Lite)."""
    if "q_lora_rank" not in raw:
        raise ModelConfigError(f"{name}: missing key 'q_lora_rank' (null: a full q projection)")
    q = raw.get("q_lora_rank")
    return {"q_lora_rank": None if q is None else int_key(raw, name, "q_lora_rank", 1),
            **{k: int_key(raw, name, k, 1) for k in ("kv_lora_rank", "qk_rope_head_dim",
                                                      "qk_nope_head_dim", "v_head_dim")}}


def _deepseek_layers(raw: dict[str, Any], name: str, layers: Any) -> tuple[int, ...]:
    """The dense layers: the first ``first_k_dense_replace`` and those off the
    ``moe_layer_freq`` pattern (transformers: layer i is MoE when i >= first_k_dense_replace
    and i % moe_layer_freq == 0)."""
    first = _int_default(raw, name, "first_k_dense_replace", 0, 3)
    freq = int_key(raw, name, "moe_layer_freq", 1, default=1)
    n = layers if isinstance(layers, int) and not isinstance(layers, bool) else 0
    return tuple(i for i in range(n) if i < first or i % freq)


def _deepseek_routing(raw: dict[str, Any], name: str, experts: int) -> dict[str, Any]:
    """Scoring, renormalisation, routed scaling and node-limited groups."""
    score = raw.get("scoring_func", "sigmoid")
    if score not in ("sigmoid", "softmax"):
        raise ModelConfigError(f"{name}: 'scoring_func' must be 'sigmoid' or 'softmax', got {score!r}")
    method = raw.get("topk_method", "noaux_tc")
    if method not in TOPK_METHODS:
        raise ModelConfigError(f"{name}: 'topk_method' {method!r} is not modelled; modelled: "
                               f"{sorted(TOPK_METHODS)}")
    groups, top = 1, 1
    if TOPK_METHODS[method]:
        groups = _int_default(raw, name, "n_group", 1, 8)
        top = _int_default(raw, name, "topk_group", 1, 4)
        if top > groups or experts % groups:
            raise ModelConfigError(f"{name}: 'n_group' = {groups} must divide 'n_routed_experts' = "
                                   f"{experts} and 'topk_group' = {top} be at most n_group")
    return {"router_score": score, "router_groups": groups, "router_topk_groups": top,
            "routed_scaling_factor": float_key(raw, name, ("routed_scaling_factor",),
                                               _default(raw, name, "routed_scaling_factor", 2.5)),
            "norm_topk_prob": bool_key(raw, name, "norm_topk_prob", True)}


def deepseek_fields(raw: dict[str, Any], name: str, layers: Any) -> dict[str, Any]:
    """DeepSeek-V3 / Kimi-K2 keys (transformers ``DeepseekV3Config``): the MLA sizes, the
    routed experts (``n_routed_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``),
    ``n_shared_experts`` shared experts as one SwiGLU of ``n_shared_experts *
    moe_intermediate_size`` (transformers ``DeepseekV3MoE.shared_experts``; no gate), the
    dense layers (``first_k_dense_replace``, ``moe_layer_freq``), the routing
    (``scoring_func``, ``topk_method``, ``n_group``, ``topk_group``,
    ``routed_scaling_factor``, ``norm_topk_prob``), ``aux_loss_alpha`` (the load-balancing
    loss, 0 when absent: DeepSeek-V3 balances by the bias of its auxiliary-loss-free
    strategy, a buffer outside backpropagation that only shifts the choice and is 0 here)
    and ``num_nextn_predict_layers`` (multi-token prediction modules)."""
    out = _mla(raw, name)
    moe = _experts(raw, name, "n_routed_experts", "moe_intermediate_size")
    shared = _int_default(raw, name, "n_shared_experts", 0, 1)
    out.update(moe, **_deepseek_routing(raw, name, moe["num_experts"]))
    out.update(shared_expert_ffn_hidden_size=shared * moe["moe_ffn_hidden_size"] if shared else None,
               shared_expert_gate=False, dense_layers=_deepseek_layers(raw, name, layers),
               router_aux_loss_coef=_aux(raw, name, "aux_loss_alpha", 0.0),
               mtp_layers=int_key(raw, name, "num_nextn_predict_layers", 0, default=0))
    return out


# -- GPT-OSS -------------------------------------------------------------------------------
def gpt_oss_fields(raw: dict[str, Any], name: str, layers: Any) -> dict[str, Any]:
    """GPT-OSS keys (transformers ``GptOssConfig``): ``num_local_experts`` experts of
    ``intermediate_size``, top ``num_experts_per_tok`` (``experts_per_token``, the original
    checkpoint's spelling, must agree), softmax over the chosen logits (the renormalised
    top-k of a softmax: ``GptOssTopKRouter``), ``router_aux_loss_coef`` (default 0.9), and
    the attention sinks every GPT-OSS layer has (``GptOssAttention.sinks``)."""
    out = _experts(raw, name, "num_local_experts", "intermediate_size")
    alt = raw.get("experts_per_token")
    if alt is not None and alt != out["experts_per_token"]:
        raise ModelConfigError(f"{name}: 'experts_per_token' = {alt!r} and 'num_experts_per_tok' = "
                               f"{out['experts_per_token']} disagree")
    out.update(router_aux_loss_coef=_aux(raw, name, "router_aux_loss_coef", 0.9), norm_topk_prob=True,
               attention_sinks=True)
    return out


# -- Llama 4 -------------------------------------------------------------------------------
def _layer_list(raw: dict[str, Any], name: str, key: str, n: int) -> list[int] | None:
    v = raw.get(key)
    if v is None or v == []:
        return None
    if not isinstance(v, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        raise ModelConfigError(f"{name}: {key!r} must be a list of integers, got {v!r}")
    return v


def _llama4_moe_layers(raw: dict[str, Any], name: str, n: int) -> dict[str, Any]:
    """``moe_layers`` (the MoE layer indices) when given, else every
    ``interleave_moe_layer_step``-th layer from ``step - 1`` (transformers ``Llama4TextConfig``)."""
    step = int_key(raw, name, "interleave_moe_layer_step", 1, default=1)
    listed = _layer_list(raw, name, "moe_layers", n)
    if listed is None:
        return {"moe_layer_step": step, "dense_layers": ()}
    if any(not 0 <= i < n for i in listed):
        raise ModelConfigError(f"{name}: 'moe_layers' must hold layer indices in [0, {n}), got {listed}")
    return {"moe_layer_step": 1, "dense_layers": tuple(i for i in range(n) if i not in set(listed))}


def _llama4_nope(raw: dict[str, Any], name: str, n: int) -> tuple[int, ...]:
    """Layers without rotary positions: ``no_rope_layers`` (one 0/1 per layer, 1 = rotary)
    when given, else every ``no_rope_layer_interval``-th (default 4) layer is NoPE."""
    flags = _layer_list(raw, name, "no_rope_layers", n)
    if flags is None:
        every = int_key(raw, name, "no_rope_layer_interval", 1, default=4)
        return tuple(i for i in range(n) if (i + 1) % every == 0)
    if len(flags) != n or any(f not in (0, 1) for f in flags):
        raise ModelConfigError(f"{name}: 'no_rope_layers' must be {n} entries of 0 or 1 (1: rotary), "
                               f"got {len(flags)}")
    return tuple(i for i, f in enumerate(flags) if not f)


def llama4_fields(raw: dict[str, Any], name: str, layers: Any) -> dict[str, Any]:
    """Llama 4 text keys (transformers ``Llama4TextConfig``): ``num_local_experts`` experts
    and a shared expert (``Llama4TextMoe.shared_expert``, no gate) of ``intermediate_size``
    each, the dense layers' width ``intermediate_size_mlp`` (the ffn keys), top
    ``num_experts_per_tok`` chosen by logit and weighted by its sigmoid (the sigmoid of the
    top-k logits, ``Llama4Router``: not renormalised), the MoE layers (``moe_layers`` /
    ``interleave_moe_layer_step``), ``router_aux_loss_coef`` (default 0.001), the NoPE
    layers (``no_rope_layers``) and ``attention_chunk_size`` on the rotary layers
    (``Llama4TextAttention``: chunked attention where rotary, global where NoPE).
    transformers scales the routed expert's input by its weight; the program weights its
    output (the same ops and costs)."""
    n = layers if isinstance(layers, int) and not isinstance(layers, bool) else 0
    out = _experts(raw, name, "num_local_experts", "intermediate_size")
    chunk = raw.get("attention_chunk_size")
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ModelConfigError(f"{name}: 'attention_chunk_size' must be a positive int or null, got {chunk!r}")
    out.update(_llama4_moe_layers(raw, name, n), shared_expert_ffn_hidden_size=out["moe_ffn_hidden_size"],
               shared_expert_gate=False, router_score="sigmoid", norm_topk_prob=False,
               router_aux_loss_coef=_aux(raw, name, "router_aux_loss_coef", 0.001),
               nope_layers=_llama4_nope(raw, name, n), attention_chunk=chunk)
    return out
