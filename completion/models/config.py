"""Model configurations: the built-in catalog and Hugging Face ``config.json`` loading.

The catalog holds every decoder-only model of ``shared/reference/hardware_and_models.md``:
LLaMA 2 (Touvron et al. 2023), GPT-3 175B (Brown et al. 2020), the Zero Bubble paper's GPT
sizes (Qi et al. 2024, Table 3) and the Megatron 2021 GPT family (Narayanan et al. 2021,
Table 1). GPT-family models tie the LM head to the token embedding, as Megatron's parameter
count (eq. 2) assumes; LLaMA models do not.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from dataclasses import dataclass
from typing import Any

from completion.errors import CompletionError

FAMILIES = ("gpt", "llama")
#: attention implementations a model may state (``ModelConfig.attention``): ``flash`` (one
#: fused kernel, FlashAttention; Hugging Face ``sdpa`` / ``flash_attention_2``) or
#: ``unfused`` (QK^T, scale, softmax, dropout, x V as separate ops; Hugging Face ``eager``,
#: Megatron-LM 2021)
ATTENTIONS = ("flash", "unfused")
#: Hugging Face ``attn_implementation`` -> ours (transformers' ``ALL_ATTENTION_FUNCTIONS``
#: and ``modeling_utils``: ``eager`` is the reference matmul-softmax-matmul, ``sdpa`` is
#: ``torch.nn.functional.scaled_dot_product_attention`` (its flash backend on GPUs),
#: ``flash_attention_2`` / ``_3`` the flash-attn package, ``flex_attention`` a fused
#: Triton kernel)
HF_ATTENTION = {"eager": "unfused", "sdpa": "flash", "flash_attention_2": "flash",
                "flash_attention_3": "flash", "flex_attention": "flash"}


class ModelConfigError(CompletionError):
    """An invalid model configuration, an unknown model name or a bad ``config.json``."""


class ModelFileNotFoundError(ModelConfigError, FileNotFoundError):
    """A ``config.json`` path that does not exist: a ModelConfigError (one-line error of
    bad input) that is also a FileNotFoundError."""


#: Largest size a model config may give each field (issue 16 item 8: sizes are bounded
#: where they enter). Far above any model built (gpt3-175b: 96 layers, hidden 12288,
#: vocabulary 51200; 1M-token contexts), small enough that no size alone makes the cost
#: model or the program builder run for minutes.
MAX_MODEL_SIZES = {"num_layers": 2**14, "hidden_size": 2**20, "num_heads": 2**14,
                   "num_kv_heads": 2**14, "ffn_hidden_size": 2**22, "vocab_size": 2**24,
                   "seq_len": 2**24}


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer.

    Attributes:
        name: catalog name (or the config file path).
        family: ``"gpt"`` (learned positions, layer_norm with bias, GeLU MLP, biases on every
            linear) or ``"llama"`` (rms_norm, rotary, SwiGLU MLP, no biases, grouped-query
            attention).
        num_layers, hidden_size, num_heads: l, h, a.
        num_kv_heads: key/value heads (GQA); ``num_heads % num_kv_heads == 0``.
        ffn_hidden_size: MLP inner size (SwiGLU: width of the gate and of the up projection).
        vocab_size: V. seq_len: maximum (and default) sequence length s.
        tie_word_embeddings: the LM head reuses the token embedding ``[V, h]``.
        norm_eps: epsilon of layer_norm / rms_norm. rope_theta: rotary base (llama).
        attention: the model's own attention implementation (:data:`ATTENTIONS`), None when
            it states none (Hugging Face ``attn_implementation``; the plan's
            ``Strategy.attention`` overrides it, a framework profile's default fills it).
        attention_dropout: dropout probability on the attention probabilities (unfused
            attention: a ``dropout`` op after the softmax; flash: the kernel's ``dropout``).
        hidden_dropout: dropout probability on the embedding output and on each residual
            branch before its add (Megatron-LM ``--hidden-dropout``, applied by
            ``embedding_dropout`` and ``bias_dropout_add``).

    Raises ModelConfigError naming the field when a value is out of range.
    """

    name: str
    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_len: int
    tie_word_embeddings: bool = False
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    attention: str | None = None
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ModelConfigError(f"model {self.name!r}: family {self.family!r} is not one of {list(FAMILIES)}")
        for f in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size", "seq_len"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ModelConfigError(f"model {self.name!r}: {f} must be a positive int, got {v!r}")
            if v > MAX_MODEL_SIZES[f]:
                raise ModelConfigError(f"model {self.name!r}: {f} is {v}, above the limit of "
                                       f"{MAX_MODEL_SIZES[f]} (completion.models.config.MAX_MODEL_SIZES)")
        if self.hidden_size % self.num_heads:
            raise ModelConfigError(
                f"model {self.name!r}: hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(
                f"model {self.name!r}: num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )
        if not self.norm_eps > 0:
            raise ModelConfigError(f"model {self.name!r}: norm_eps must be > 0, got {self.norm_eps!r}")
        if self.attention is not None and self.attention not in ATTENTIONS:
            raise ModelConfigError(f"model {self.name!r}: attention {self.attention!r} is not one of "
                                   f"{list(ATTENTIONS)} (or None: not stated)")
        for f in ("attention_dropout", "hidden_dropout"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
                raise ModelConfigError(f"model {self.name!r}: {f} must be a probability in [0, 1), got {v!r}")

    @property
    def head_dim(self) -> int:
        """Per-head size d = h / a (integer division; validated to divide evenly)."""
        return self.hidden_size // self.num_heads

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


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

#: Built-in models by name.
MODEL_CATALOG: dict[str, ModelConfig] = {c.name: c for c in _CATALOG_LIST}

_HF_FAMILY = {"llama": "llama", "mistral": "llama", "gpt2": "gpt", "gpt": "gpt", "megatron-gpt": "gpt"}


def model_names() -> list[str]:
    """Names of the built-in models, in catalog order."""
    return list(MODEL_CATALOG)


def load_hf_config(path: str | pathlib.Path) -> ModelConfig:
    """Read a Hugging Face style ``config.json`` (local file; nothing is downloaded).

    Keys: ``model_type`` (``llama``/``mistral`` -> llama family; ``gpt2``/``gpt``/
    ``megatron-gpt`` -> gpt family), ``num_hidden_layers``, ``hidden_size``,
    ``num_attention_heads``, ``num_key_value_heads`` (default: heads),
    ``intermediate_size`` (default 4 x hidden for gpt), ``vocab_size``,
    ``max_position_embeddings``, optional ``tie_word_embeddings`` (default: true for gpt,
    false for llama), ``rms_norm_eps`` / ``layer_norm_epsilon``, ``rope_theta``. GPT-2's own
    spellings (``n_layer``, ``n_embd``, ``n_head``, ``n_inner``, ``n_positions``) are accepted.
    ``attn_implementation`` (or ``_attn_implementation``): ``eager`` -> unfused attention,
    ``sdpa`` / ``flash_attention_2`` / ``flash_attention_3`` / ``flex_attention`` -> flash
    (:data:`HF_ATTENTION`; absent: the model states none). Dropout probabilities
    (:data:`ATTENTION_DROPOUT_KEYS`, :data:`HIDDEN_DROPOUT_KEYS`; absent: 0, not
    transformers' per-class defaults).

    Raises ModelFileNotFoundError (a ModelConfigError and a FileNotFoundError) when the file
    is absent and ModelConfigError naming the file and key on bad content.
    """
    p = pathlib.Path(path)
    if not p.is_file():
        raise ModelFileNotFoundError(f"model config not found: {p}")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{p}: not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
    except UnicodeDecodeError as e:
        raise ModelConfigError(f"{p}: not UTF-8 text (byte {e.start})") from None
    except (ValueError, RecursionError) as e:  # an integer of > 4300 digits, deep nesting
        raise ModelConfigError(f"{p}: not a usable JSON document: {str(e).split(';')[0]}") from None
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{p}: expected a JSON object at the top level")
    return config_from_hf_dict(raw, name=str(p))


def _key(raw: dict[str, Any], name: str, *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in raw and raw[k] is not None:
            return raw[k]
    if default is None:
        raise ModelConfigError(f"{name}: missing key {keys[0]!r}")
    return default


def _float_key(raw: dict[str, Any], name: str, keys: tuple[str, ...], default: float) -> float:
    """The first of ``keys`` present as a finite number > 0 (else ``default``)."""
    v = _key(raw, name, *keys, default=default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ModelConfigError(f"{name}: {keys[0]!r} must be a finite number > 0, got {v!r}")
    return float(v)


def _bool_key(raw: dict[str, Any], name: str, key: str, default: bool) -> bool:
    v = raw.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):  # bool("false") is True: refuse strings and numbers
        raise ModelConfigError(f"{name}: {key!r} must be true or false, got {v!r}")
    return v


def _prob_key(raw: dict[str, Any], name: str, keys: tuple[str, ...]) -> float:
    """The first of ``keys`` present as a probability in [0, 1) (absent: 0)."""
    for k in keys:
        v = raw.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
            raise ModelConfigError(f"{name}: {k!r} must be a probability in [0, 1), got {v!r}")
        return float(v)
    return 0.0


def _attention_key(raw: dict[str, Any], name: str) -> str | None:
    """``attn_implementation`` (or the ``_attn_implementation`` transformers writes) mapped
    by :data:`HF_ATTENTION`; None when absent."""
    for k in ("attn_implementation", "_attn_implementation"):
        v = raw.get(k)
        if v is None:
            continue
        if not isinstance(v, str) or v not in HF_ATTENTION:
            raise ModelConfigError(f"{name}: {k!r} must be one of {sorted(HF_ATTENTION)}, got {v!r}")
        return HF_ATTENTION[v]
    return None


#: config.json keys of the two dropout probabilities, first found wins (Hugging Face
#: LLaMA / Mistral ``attention_dropout``, GPT-2 ``attn_pdrop`` / ``resid_pdrop``, BERT-style
#: ``*_dropout_prob``, Megatron-style ``hidden_dropout``)
ATTENTION_DROPOUT_KEYS = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob")
HIDDEN_DROPOUT_KEYS = ("hidden_dropout", "resid_pdrop", "hidden_dropout_prob")


def config_from_hf_dict(raw: dict[str, Any], name: str = "config.json") -> ModelConfig:
    """Build a ModelConfig from the dict of a Hugging Face ``config.json`` (see
    :func:`load_hf_config` for the keys)."""
    mt = raw.get("model_type")
    if mt not in _HF_FAMILY:
        raise ModelConfigError(f"{name}: model_type {mt!r} is not one of {sorted(_HF_FAMILY)}")
    family = _HF_FAMILY[mt]
    layers = _key(raw, name, "num_hidden_layers", "n_layer")
    hidden = _key(raw, name, "hidden_size", "n_embd")
    heads = _key(raw, name, "num_attention_heads", "n_head")
    kv = _key(raw, name, "num_key_value_heads", default=heads)
    if family == "gpt":
        ffn = _key(raw, name, "intermediate_size", "n_inner", default=4 * hidden)
    else:
        ffn = _key(raw, name, "intermediate_size")
    eps_keys = ("rms_norm_eps",) if family == "llama" else ("layer_norm_epsilon", "layer_norm_eps")
    return ModelConfig(
        name=name,
        family=family,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        ffn_hidden_size=ffn,
        vocab_size=_key(raw, name, "vocab_size"),
        seq_len=_key(raw, name, "max_position_embeddings", "n_positions"),
        tie_word_embeddings=_bool_key(raw, name, "tie_word_embeddings", family == "gpt"),
        norm_eps=_float_key(raw, name, eps_keys, 1e-5),
        rope_theta=_float_key(raw, name, ("rope_theta",), 10000.0),
        attention=_attention_key(raw, name),
        attention_dropout=_prob_key(raw, name, ATTENTION_DROPOUT_KEYS),
        hidden_dropout=_prob_key(raw, name, HIDDEN_DROPOUT_KEYS),
    )


def get_model_config(name_or_config: str | pathlib.Path | ModelConfig) -> ModelConfig:
    """Resolve a catalog name, a path to a ``config.json``, or a ModelConfig.

    Raises ModelConfigError naming the model when the name is neither in the catalog nor an
    existing file."""
    if isinstance(name_or_config, ModelConfig):
        return name_or_config
    key = str(name_or_config)
    if key in MODEL_CATALOG:
        return MODEL_CATALOG[key]
    if key.lower() in MODEL_CATALOG:
        return MODEL_CATALOG[key.lower()]
    p = pathlib.Path(key)
    if p.suffix == ".json" or p.is_file():
        return load_hf_config(p)
    raise ModelConfigError(f"unknown model {key!r}; built-in models: {', '.join(MODEL_CATALOG)}")
