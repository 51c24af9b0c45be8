"""The built-in model catalog and name resolution.

The catalog holds every decoder-only model of ``shared/reference/hardware_and_models.md``:
LLaMA 2 (Touvron et al. 2023), GPT-3 175B (Brown et al. 2020), the Zero Bubble paper's GPT
sizes (Qi et al. 2024, Table 3), the Megatron 2021 GPT family (Narayanan et al. 2021,
Table 1) and two mixture-of-experts models (Mixtral-8x7B, Qwen3-30B-A3B). GPT-family
models tie the LM head to the token embedding, as Megatron's parameter count (eq. 2)
assumes; LLaMA models do not. :func:`get_model_config` resolves a catalog name, a
``config.json`` path (:mod:`completion.models.hf_config`) or a config.
"""

from __future__ import annotations

import pathlib

from completion.models.config import ModelConfig, ModelConfigError
from completion.models.hf_config import load_hf_config


def _gpt(name: str, l: int, h: int, a: int, ffn: int, vocab: int, seq: int) -> ModelConfig:  # noqa: E741
    return ModelConfig(name, "gpt", l, h, a, a, ffn, vocab, seq, tie_word_embeddings=True)


def _llama(name: str, l: int, h: int, a: int, kv: int, ffn: int) -> ModelConfig:  # noqa: E741
    return ModelConfig(name, "llama", l, h, a, kv, ffn, 32000, 4096, norm_eps=1e-5)


def _megatron(size: str, l: int, h: int, a: int) -> ModelConfig:  # noqa: E741
    return _gpt(f"megatron-{size}", l, h, a, 4 * h, 51200, 2048)


#: How Megatron-LM ran GPT in 2021 (Narayanan et al. 2021, the SC21 Table 1 runs; commit
#: 6985e58; shared/reference/fidelity_notes.md): no flash attention (QK^T as a batched
#: GEMM, the fused scale-mask-softmax, dropout, x V) and ``--attention-dropout 0.1``,
#: ``--hidden-dropout 0.1`` (Megatron's defaults), as Korthikanti et al. 2022 (fig. 2)
#: count the activations.
MEGATRON_2021 = {"attention": "unfused", "attention_dropout": 0.1, "hidden_dropout": 0.1}


def megatron_2021(name_or_config: str | pathlib.Path | ModelConfig) -> ModelConfig:
    """A model (catalog name, ``config.json`` path or config) with the architecture
    settings Megatron-LM 2021 ran it with (:data:`MEGATRON_2021`), e.g.
    ``megatron_2021("megatron-1.7b")`` for the SC21 Table 1 rows. Raises ModelConfigError
    as :func:`get_model_config`."""
    return get_model_config(name_or_config).replace(**MEGATRON_2021)


_CATALOG_LIST = [
    _llama("llama2-7b", 32, 4096, 32, 32, 11008),
    _llama("llama2-13b", 40, 5120, 40, 40, 13824),
    _llama("llama2-70b", 80, 8192, 64, 8, 28672),
    _gpt("gpt3-175b", 96, 12288, 96, 49152, 51200, 2048),
    _gpt("zb-gpt-1.5b", 22, 2304, 24, 9216, 50257, 1024),
    _gpt("zb-gpt-6.2b", 30, 4096, 32, 16384, 50257, 1024),
    _gpt("zb-gpt-14.6b", 46, 5120, 40, 20480, 50257, 1024),
    _gpt("zb-gpt-28.3b", 62, 6144, 48, 24576, 50257, 1024),
    _megatron("1.7b", 24, 2304, 24),
    _megatron("3.6b", 30, 3072, 32),
    _megatron("7.5b", 36, 4096, 32),
    _megatron("18.4b", 40, 6144, 48),
    _megatron("39.1b", 48, 8192, 64),
    _megatron("76.1b", 60, 10240, 80),
    _megatron("145.6b", 80, 12288, 96),
    _megatron("310.1b", 96, 16384, 128),
    _megatron("529.6b", 105, 20480, 128),
    _megatron("1t", 128, 25600, 160),
]

_CATALOG_LIST += [
    # Mixtral-8x7B (Jiang et al. 2024, "Mixtral of Experts", Table 1; its config.json:
    # rope_theta 1e6, rms_norm_eps 1e-5, 32768 positions, no sliding window), 46,702,792,704
    # parameters (tests/completion/test_models_moe.py derives them). seq_len here is the default
    # training length, 4096 (rotary: no position table; the config.json's 32768 is the
    # context window, as DEFAULT_TRAIN_SEQ caps it for config files)
    ModelConfig("mixtral-8x7b", "llama", 32, 4096, 32, 8, 14336, 32000, 4096, rope_theta=1e6,
                num_experts=8, experts_per_token=2, router_aux_loss_coef=0.02),
    # Qwen3-30B-A3B (Qwen3 technical report, Yang et al. 2025, Table 2; its config.json:
    # head_dim 128, per-head q/k rms_norm, 128 experts of width 768, top-8 renormalised)
    ModelConfig("qwen3-30b-a3b", "llama", 48, 2048, 32, 4, 6144, 151936, 4096, norm_eps=1e-6,
                rope_theta=1e6, kv_channels=128, qk_norm="head", num_experts=128,
                experts_per_token=8, moe_ffn_hidden_size=768, router_aux_loss_coef=0.001),
]

#: Built-in models by name.
MODEL_CATALOG: dict[str, ModelConfig] = {c.name: c for c in _CATALOG_LIST}



def model_names() -> list[str]:
    """Names of the built-in models, in catalog order."""
    return list(MODEL_CATALOG)


def catalog_name(key: str) -> str | None:
    """The catalog name ``key`` spells (as written, else lower-cased), or None: a catalog
    name wins over a file or folder of the same name."""
    if key in MODEL_CATALOG:
        return key
    return key.lower() if key.lower() in MODEL_CATALOG else None


def get_model_config(name_or_config: str | pathlib.Path | ModelConfig) -> ModelConfig:
    """Resolve a catalog name, a path to a ``config.json`` (or a folder holding one, as a
    Hugging Face model folder), or a ModelConfig.

    Raises ModelConfigError naming the model when the name is neither in the catalog nor an
    existing file."""
    if isinstance(name_or_config, ModelConfig):
        return name_or_config
    key = str(name_or_config)
    if not key.strip():
        raise ModelConfigError("model name is empty; give a built-in name or a config.json path")
    name = catalog_name(key)
    if name is not None:
        return MODEL_CATALOG[name]
    p = pathlib.Path(key)
    if p.is_dir():  # a Hugging Face model folder, as transformers' from_pretrained takes it
        if (p / "config.json").is_file():
            return load_hf_config(p / "config.json")
        raise ModelConfigError(f"model {key!r} is a directory without a config.json")
    if p.suffix == ".json" or p.is_file():
        return load_hf_config(p)
    raise ModelConfigError(f"unknown model {key!r}; built-in models: {', '.join(MODEL_CATALOG)}")
