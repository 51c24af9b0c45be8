"""Model builders: the built-in catalog, Hugging Face ``config.json`` loading and the forward
programs of GPT- and LLaMA-family decoders (and the seed's small MLP).

Struct-name scheme (every op carries one; chunk segmentation matches it with a regex such as
``r"^decoder\\.layers\\.(\\d+)\\."``):

- ``embed_tokens``: input_ids data, token embedding parameter and lookup (LLaMA: also the
  embedding dropout);
- ``embed_positions``: position_ids data, learned position table, the add and the
  embedding dropout (GPT only);
- ``rotary_emb``: the sin/cos tables (LLaMA only);
- ``decoder.layers.{i}.input_layernorm`` / ``.post_attention_layernorm``: the norms of a
  pre-norm layer (post-norm, OLMo 2: ``.post_attention_layernorm`` /
  ``.post_feedforward_layernorm``; sandwich, Gemma 2: all four with
  ``.pre_feedforward_layernorm``);
- ``decoder.layers.{i}.self_attn.{q,k}_norm``: the q/k rms_norms of qk-norm models;
- ``decoder.layers.{i}.self_attn.{q,k,v,o}_proj``: projections (weight, GPT also bias);
- ``decoder.layers.{i}.self_attn``: reshapes, rotary embedding, flash_attention -- or,
  unfused, the transposes, the two batched matmuls (QK^T, x V), scale, softmax and the
  attention dropout (the attention core selective recompute drops);
- ``decoder.layers.{i}.mlp.{up,down}_proj`` (GPT) or ``.mlp.{gate,up,down}_proj``
  (LLaMA, every gated MLP), ``decoder.layers.{i}.mlp.act`` (the activation's ops: gelu,
  relu, relu + square, silu, swiglu, or a GLU's activation and multiply);
- ``decoder.layers.{i}``: the two residual adds and the hidden dropout before each;
- ``decoder.norm``: the final norm; ``lm_head``: the output projection (a tied head reads
  ``embed_tokens.weight``); ``loss``: labels data, cross_entropy_with_softmax, mean and
  shadow_output (role LOSS).

Parameters are named ``<struct name>.weight`` / ``.bias``, e.g.
``decoder.layers.3.mlp.up_proj.weight``; each parameter op sits just before its first user.
"""

from __future__ import annotations

import pathlib

from completion.ir import Program
from completion.models.catalog import (
    MEGATRON_2021,
    MODEL_CATALOG,
    get_model_config,
    megatron_2021,
    model_names,
)
from completion.models.config import (
    ATTENTIONS,
    FAMILIES,
    MAX_MODEL_SIZES,
    ModelConfig,
    ModelConfigError,
    ModelConfigWarning,
)
from completion.models.hf_config import config_from_hf_dict, load_hf_config
from completion.models.mlp import build_mlp
from completion.models.params import parameter_counts
from completion.models.transformer import build_decoder

#: Most sequences per built program (the batch dim of its inputs): 2**24, the
#: strategy's batch limit (``completion.strategy.MAX_BATCH``).
MAX_BATCH_SIZE = 2**24


def build_model(name_or_config: str | pathlib.Path | ModelConfig, batch_size: int,
                seq_len: int | None = None, dtype: str = "bfloat16",
                num_layers: int | None = None, attention: str | None = None) -> Program:
    """The forward program (with loss) of a catalog model, a ``config.json`` path or a config.

    Args:
        name_or_config: catalog name (``llama2-7b``, ``gpt3-175b``, ``megatron-1t`` ...), a
            path to a Hugging Face style ``config.json``, or a :class:`ModelConfig`.
        batch_size: sequences per step (b).
        seq_len: tokens per sequence (s); default the model's ``seq_len``. GPT models need
            ``seq_len <= `` the position table size.
        dtype: parameter and activation dtype (float32, bfloat16, float16).
        num_layers: override the layer count (small test programs).
        attention: ``"flash"`` or ``"unfused"`` (:data:`ATTENTIONS`); None: the model's own
            (``ModelConfig.attention``), else flash.

    Raises ModelConfigError (a ValueError) naming the model or argument at fault.
    """
    cfg = get_model_config(name_or_config)
    if num_layers is not None:
        cfg = cfg.replace(num_layers=num_layers)
    s = cfg.seq_len if seq_len is None else seq_len
    for nm, v in (("batch_size", batch_size), ("seq_len", s)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ModelConfigError(f"model {cfg.name!r}: {nm} must be a positive int, got {v!r}")
        most = MAX_BATCH_SIZE if nm == "batch_size" else MAX_MODEL_SIZES["seq_len"]
        if v > most:
            raise ModelConfigError(f"model {cfg.name!r}: {nm} is {v}, above the limit of {most}")
    if cfg.resolved_positions == "learned" and s > cfg.seq_len:
        raise ModelConfigError(
            f"model {cfg.name!r}: seq_len {s} exceeds the {cfg.seq_len} learned positions"
        )
    return build_decoder(cfg, batch_size, s, dtype, attention)


__all__ = [
    "ATTENTIONS",
    "FAMILIES",
    "MEGATRON_2021",
    "MODEL_CATALOG",
    "ModelConfig",
    "ModelConfigError",
    "ModelConfigWarning",
    "build_mlp",
    "build_model",
    "config_from_hf_dict",
    "get_model_config",
    "load_hf_config",
    "megatron_2021",
    "model_names",
    "parameter_counts",
]
