"""Hugging Face ``model_type`` catalog: how each architecture's ``config.json`` maps onto a
:class:`completion.models.config.ModelConfig`.

Each entry states, from the architecture's ``modeling_<type>.py`` / ``configuration_<type>.py``
in Hugging Face transformers (v4.51 or later, which has all of them): the family whose
defaults apply, where the MLP activation is read and whether the MLP is gated, the norm and
its placement, the positions, which linears carry biases (and the keys that switch them),
query/key normalisation, the epsilon keys, and the keys this project knows but does not
model (each produces one warning line naming it when present with an effect,
:func:`completion.models.hf_config.config_from_hf_dict`). Keys with no cost effect
(``rope_scaling``, ``rope_theta`` beyond the op attribute, token ids, ``torch_dtype``,
``initializer_range``, ``use_cache``, ...) are accepted silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from completion.models.hf_frontier import deepseek_fields, gpt_oss_fields, llama4_fields

#: Hugging Face activation names (``transformers.activations.ACT2FN``) -> the plain
#: activation of :data:`completion.models.config.ACTIVATIONS`; a gated MLP turns
#: ``silu`` into ``swiglu``, ``gelu`` into ``geglu``, ``gelu_tanh`` into ``geglu_tanh``,
#: ``relu`` into ``reglu`` (:data:`GATED`).
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "gelu_fast": "gelu_tanh", "silu": "silu", "swish": "silu", "relu": "relu",
                  "relu2": "relu2"}
#: plain activation -> its gated (GLU) form
GATED = {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu_tanh", "relu": "reglu"}


@dataclass(frozen=True)
class Unmodelled:
    """A config key this project knows but does not model.

    Attributes:
        key: the config.json key. inert: values that have no effect (absent counts as
            inert), e.g. ``False`` for a flag, ``None`` for a cap.
        why: what meshplan does instead (one clause).
        needs: a key that must be true for this one to have an effect (e.g. a window
            setting that matters only with ``use_sliding_window``); None: none.
    """

    key: str
    why: str
    inert: tuple[object, ...] = (None,)
    needs: str | None = None


@dataclass(frozen=True)
class MoESpec:
    """How a mixture-of-experts architecture's ``config.json`` states its experts (Hugging
    Face ``configuration_mixtral.py``, ``configuration_qwen2_moe.py``,
    ``configuration_qwen3_moe.py``, transformers v4.51).

    Attributes:
        experts_key: number of routed experts (Mixtral ``num_local_experts``, Qwen
            ``num_experts``). topk_key: experts per token (``num_experts_per_tok``).
        expert_ffn_keys: each expert's SwiGLU width, first present wins (Mixtral's experts
            use ``intermediate_size``; Qwen's ``moe_intermediate_size``, whose
            ``intermediate_size`` is the width of the dense layers).
        shared_key: the shared expert's width (Qwen2-MoE ``shared_expert_intermediate_size``;
            None: the architecture has no shared expert). A Qwen2-MoE shared expert is
            scaled by ``sigmoid(x W_g)`` with ``shared_expert_gate`` ``[h, 1]``
            (``Qwen2MoeSparseMoeBlock.forward``).
        step_key / dense_layers_key: the MoE layers are those with ``(i + 1) % step == 0``
            that are not listed in ``mlp_only_layers`` (``Qwen2MoeDecoderLayer.__init__``);
            None: every layer is an MoE layer (Mixtral).
        norm_topk_key: key of whether the top-k weights are renormalised to sum to 1;
            None: the architecture always renormalises (Mixtral, ``MixtralSparseMoeBlock``:
            ``routing_weights /= routing_weights.sum(-1)``). norm_topk_default: when absent.
        aux_coef_default: ``router_aux_loss_coef`` when absent (all three: 0.001).
    """

    experts_key: str
    expert_ffn_keys: tuple[str, ...]
    topk_key: str = "num_experts_per_tok"
    shared_key: str | None = None
    step_key: str | None = None
    dense_layers_key: str | None = None
    norm_topk_key: str | None = None
    norm_topk_default: bool = True
    aux_coef_default: float = 0.001


@dataclass(frozen=True)
class HFModelType:
    """How one ``model_type`` maps onto a ModelConfig (module docstring).

    Attributes:
        family: ``gpt`` or ``llama`` (the defaults of fields not stated here).
        act_keys: keys holding the activation, first present wins; act_default: the HF
            activation when none is present. gated: the MLP has gate and up projections.
        norm, norm_placement, positions: as ModelConfig (None: the family's).
        qkv_bias, o_bias, mlp_bias: the architecture's fixed biases (None: the family's,
            unless ``bias_key`` / ``mlp_bias_key`` give them).
        bias_key: key switching the q/k/v and output projection biases (``attention_bias``;
            Hugging Face LLaMA also applies it to o_proj). mlp_bias_key: the MLP's.
        qk_norm: ModelConfig.qk_norm of the architecture.
        eps_keys: keys of the norm epsilon. tie_default: ``tie_word_embeddings`` absent.
        head_dim_key: key of an explicit per-head size (None: h / a). head_dim_default: the
            per-head size when that key is absent (transformers' config default: 128 for
            ``Qwen3Config``, 256 for ``GemmaConfig`` / ``Gemma2Config``; None: h / a).
        sliding: reads ``sliding_window`` (``use_sliding_window`` gates it when present).
        window_default: ``sliding_window`` when the key is absent (transformers' default:
            4096 for ``MistralConfig``, ``Gemma2Config`` and the Qwen configs, where
            ``use_sliding_window`` must switch it on; None: no window).
        sliding_switch_default: ``use_sliding_window`` when the config leaves it out (False
            for the Qwen families: transformers' ``Qwen2Config`` / ``Qwen3Config`` /
            ``Qwen2MoeConfig`` / ``Qwen3MoeConfig`` default it to False, so their
            ``sliding_window`` is inert unless switched on).
        sliding_every: 2 when only every other layer is local (Gemma 2).
        window_from_key: the key of the first windowed layer, every later one windowed too
            (Qwen2 / Qwen3 and their MoE: ``max_window_layers``; transformers'
            ``Qwen2Config`` builds ``layer_types`` as sliding for ``i >=
            max_window_layers``); window_from_default: its value when absent (28 in those
            transformers configs). A ``layer_types`` list in the config wins over both this
            and ``sliding_every``.
        unmodelled: keys known but not modelled (:class:`Unmodelled`).
        layer_keys / hidden_keys / heads_keys / ffn_keys / positions_keys: the size keys.
        moe: how its experts are stated (:class:`MoESpec`); None: a dense architecture
            (a config that declares experts under it is refused) or one with a ``reader``.
        reader: ``reader(raw, name, num_layers) -> ModelConfig fields`` for the keys of an
            architecture the fields above do not cover (:mod:`completion.models.hf_frontier`:
            MLA, its experts and routing, sinks, chunked attention); it reads the experts too.
        nested: (key, model_type) of a multimodal config that keeps its text model's config
            under ``key`` (Llama 4: ``text_config`` of ``llama4_text``); the text model is
            read and costed, its ``unmodelled`` keys (the vision tower) warn.
    """

    family: str
    act_keys: tuple[str, ...] = ("hidden_act",)
    act_default: str = "silu"
    gated: bool = True
    norm: str | None = None
    norm_placement: str = "pre"
    positions: str | None = None
    qkv_bias: bool | None = None
    o_bias: bool | None = None
    mlp_bias: bool | None = None
    bias_key: str | None = None
    mlp_bias_key: str | None = None
    qk_norm: str | None = None
    eps_keys: tuple[str, ...] = ("rms_norm_eps",)
    tie_default: bool = False
    head_dim_key: str | None = None
    head_dim_default: int | None = None
    sliding: bool = False
    window_default: int | None = None
    sliding_switch_default: bool = True
    sliding_every: int = 1
    window_from_key: str | None = None
    window_from_default: int = 0
    unmodelled: tuple[Unmodelled, ...] = field(default=())
    layer_keys: tuple[str, ...] = ("num_hidden_layers",)
    hidden_keys: tuple[str, ...] = ("hidden_size",)
    heads_keys: tuple[str, ...] = ("num_attention_heads",)
    ffn_keys: tuple[str, ...] = ("intermediate_size",)
    positions_keys: tuple[str, ...] = ("max_position_embeddings",)
    moe: MoESpec | None = None
    reader: Callable[[dict[str, Any], str, Any], dict[str, Any]] | None = None
    nested: tuple[str, str] | None = None


_PRETRAINING_TP = Unmodelled("pretraining_tp", "the sliced linears of pretraining_tp > 1 cost as one",
                             (None, 1))
_LLAMA = HFModelType("llama", bias_key="attention_bias", mlp_bias_key="mlp_bias",
                     head_dim_key="head_dim", unmodelled=(_PRETRAINING_TP,))
_GPT2_KEYS = dict(layer_keys=("num_hidden_layers", "n_layer"), hidden_keys=("hidden_size", "n_embd"),
                  heads_keys=("num_attention_heads", "n_head"), ffn_keys=("intermediate_size", "n_inner"),
                  positions_keys=("max_position_embeddings", "n_positions"))
_GPT = HFModelType("gpt", act_keys=("activation_function", "hidden_act"), act_default="gelu_new",
                   gated=False, eps_keys=("layer_norm_epsilon", "layer_norm_eps"), tie_default=True,
                   unmodelled=(Unmodelled("scale_attn_by_inverse_layer_idx", "attention scaled by "
                                          "1/sqrt(d) only (no cost effect)", (None, False)),
                               Unmodelled("reorder_and_upcast_attn", "attention in the compute dtype",
                                          (None, False))),
                   **_GPT2_KEYS)  # type: ignore[arg-type]

#: the Qwen families' windowed layers: from ``max_window_layers`` on (default 28:
#: transformers ``Qwen2Config``, ``Qwen3Config``, ``Qwen2MoeConfig``, ``Qwen3MoeConfig``)
_QWEN_WINDOWS: dict[str, Any] = {"window_from_key": "max_window_layers", "window_from_default": 28,
                                  "window_default": 4096}

#: model_type -> how its config.json maps (module docstring)
MODEL_TYPES: dict[str, HFModelType] = {
    "llama": _LLAMA,
    "mistral": HFModelType("llama", head_dim_key="head_dim", sliding=True, window_default=4096),
    "qwen2": HFModelType("llama", qkv_bias=True, o_bias=False, sliding=True, sliding_switch_default=False,
                         **_QWEN_WINDOWS),
    "qwen3": HFModelType("llama", bias_key="attention_bias", qk_norm="head", head_dim_key="head_dim",
                         head_dim_default=128, sliding=True, sliding_switch_default=False, **_QWEN_WINDOWS),
    "gemma": HFModelType("llama", act_keys=("hidden_activation", "hidden_act"),
                         act_default="gelu_pytorch_tanh", bias_key="attention_bias",
                         head_dim_key="head_dim", head_dim_default=256, tie_default=True),
    "gemma2": HFModelType(
        "llama", act_keys=("hidden_activation", "hidden_act"), act_default="gelu_pytorch_tanh",
        norm_placement="sandwich", bias_key="attention_bias", head_dim_key="head_dim",
        head_dim_default=256, tie_default=True, sliding=True, sliding_every=2, window_default=4096,
        unmodelled=(Unmodelled("attn_logit_softcapping", "attention logits not soft-capped "
                               "(flash kernels cost the same; an elementwise tanh omitted)"),
                    Unmodelled("final_logit_softcapping", "LM-head logits not soft-capped "
                               "(an elementwise tanh over [b, s, V] omitted)"))),
    "phi3": HFModelType("llama", sliding=True,
                        unmodelled=(Unmodelled("partial_rotary_factor", "rotary on every head "
                                               "dim (cost difference negligible)", (None, 1, 1.0)),)),
    # mixture-of-experts (MoESpec): Mixtral attention is Mistral's; Qwen2-MoE's Qwen2's
    # (q/k/v biases); Qwen3-MoE's Qwen3's (per-head q/k rms_norm, head_dim)
    "mixtral": HFModelType("llama", head_dim_key="head_dim", sliding=True,
                           moe=MoESpec("num_local_experts", ("intermediate_size",))),
    "qwen2_moe": HFModelType(
        "llama", qkv_bias=True, o_bias=False, sliding=True, sliding_switch_default=False,
        moe=MoESpec("num_experts", ("moe_intermediate_size",), shared_key="shared_expert_intermediate_size",
                    step_key="decoder_sparse_step", dense_layers_key="mlp_only_layers",
                    norm_topk_key="norm_topk_prob", norm_topk_default=False),
        **_QWEN_WINDOWS),
    "qwen3_moe": HFModelType(
        "llama", bias_key="attention_bias", qk_norm="head", head_dim_key="head_dim", sliding=True,
        sliding_switch_default=False,
        moe=MoESpec("num_experts", ("moe_intermediate_size",), step_key="decoder_sparse_step",
                    dense_layers_key="mlp_only_layers", norm_topk_key="norm_topk_prob",
                    norm_topk_default=False),
        **_QWEN_WINDOWS),
    "olmo2": HFModelType("llama", norm_placement="post", qk_norm="full", bias_key="attention_bias"),
    "gpt2": _GPT,
    "gpt": _GPT,
    "megatron-gpt": _GPT,
    "gpt_neox": HFModelType(
        "gpt", act_default="gelu", gated=False, norm="layer_norm", positions="rope",
        eps_keys=("layer_norm_eps",), tie_default=False, bias_key="attention_bias",
        unmodelled=(Unmodelled("rotary_pct", "rotary on every head dim (cost difference "
                               "negligible)", (None, 1, 1.0)),
                    Unmodelled("use_parallel_residual", "attention and MLP in sequence (same "
                               "ops and costs; the residual order differs)", (None, False)))),
    "nemotron": HFModelType(
        "llama", act_default="relu2", gated=False, norm="layer_norm", eps_keys=("norm_eps",),
        bias_key="attention_bias", mlp_bias_key="mlp_bias", head_dim_key="head_dim",
        unmodelled=(Unmodelled("partial_rotary_factor", "rotary on every head dim (cost "
                               "difference negligible)", (None, 1, 1.0)),)),
}

#: keys of the frontier architectures known but not modelled (one warning each, present
#: with an effect)
_QUANTIZED = Unmodelled("quantization_config", "the checkpoint's storage format; weights and "
                        "GEMMs are costed in the plan's dtype (--dtype, --fp8)")
_DEEPSEEK = HFModelType(
    "llama", bias_key="attention_bias", reader=deepseek_fields,
    unmodelled=(_QUANTIZED, _PRETRAINING_TP,
                Unmodelled("seq_aux", "the load-balancing loss is the Switch form over each "
                           "micro-batch (DeepSeek's per-sequence statistics cost the same)",
                           (None, False), needs=None)))
_GPT_OSS = HFModelType(
    "llama", bias_key="attention_bias", qkv_bias=True, o_bias=True, mlp_bias=True, head_dim_key="head_dim",
    head_dim_default=64, sliding=True, sliding_every=2, window_default=128, reader=gpt_oss_fields,
    unmodelled=(_QUANTIZED,
                Unmodelled("swiglu_limit", "the experts' clamped GLU ((up + 1) * gate * "
                           "sigmoid(1.702 gate), clamped at the limit) is costed as SwiGLU, one "
                           "fused elementwise pass"),
                Unmodelled("router_jitter_noise", "no router noise", (None, 0, 0.0))))
_LLAMA4_TEXT = HFModelType(
    "llama", bias_key="attention_bias", head_dim_key="head_dim", head_dim_default=128,
    ffn_keys=("intermediate_size_mlp",), reader=llama4_fields,
    unmodelled=(Unmodelled("use_qk_norm", "the weightless L2 norm of q and k on the rotary layers "
                           "(one elementwise pass) is not costed", (None, False)),
                Unmodelled("attn_temperature_tuning", "the per-position query scale of the NoPE "
                           "layers (floor_scale, attn_scale; one elementwise pass) is not costed",
                           (None, False, 0)),
                Unmodelled("router_jitter_noise", "no router noise", (None, 0, 0.0))))
MODEL_TYPES.update({
    "deepseek_v3": _DEEPSEEK,
    "kimi_k2": _DEEPSEEK,  # Kimi-K2 ships DeepSeek-V3's classes under its own model_type
    "gpt_oss": _GPT_OSS,
    "llama4_text": _LLAMA4_TEXT,
    "llama4": HFModelType("llama", nested=("text_config", "llama4_text"),
                          unmodelled=(Unmodelled("vision_config", "the vision encoder and its "
                                                 "projector are not modelled: the text model is "
                                                 "costed"),)),
})

#: model types refused with the field that makes them unmodelled: field -> why (DeepSeek-V2:
#: its ``group_limited_greedy`` routing scores a group by its best expert, not modelled;
#: DeepSeek-V3's is, :mod:`completion.models.hf_frontier`)
REFUSED_MODEL_TYPES: dict[str, tuple[str, str]] = {
    "deepseek_v2": ("topk_method", "DeepSeek-V2 (group_limited_greedy routing) is not modelled; "
                                   "deepseek_v3 / kimi_k2 are"),
}
