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
import warnings
from dataclasses import dataclass
from typing import Any

from completion.errors import CompletionError
from completion.models.hf_types import (
    GATED,
    HF_ACTIVATIONS,
    MODEL_TYPES,
    REFUSED_MODEL_TYPES,
    HFModelType,
)


@dataclass(frozen=True)
class Family:
    """A family's defaults: what ``ModelConfig`` fields left None resolve to (norm, MLP
    activation, biases on every linear, positions)."""

    norm: str
    activation: str
    bias: bool
    positions: str


#: family name -> its defaults: gpt (GPT-2 / Megatron GPT: layer_norm, GeLU, biases,
#: learned positions), llama (rms_norm, SwiGLU, no biases, rotary)
FAMILIES: dict[str, Family] = {
    "gpt": Family("layer_norm", "gelu", True, "learned"),
    "llama": Family("rms_norm", "swiglu", False, "rope"),
}
#: MLP activations (``ModelConfig.activation``) -> (the unary op applied to the up (or
#: gate) projection, gated). A gated MLP (GLU, Shazeer 2020 "GLU Variants Improve
#: Transformer", eq. 5-6) has a gate and an up projection, ``act(x W_gate) * (x W_up)``;
#: a plain one ``act(x W_up)``. ``swiglu`` is Swish/SiLU-gated (LLaMA, Mistral, Qwen),
#: ``geglu`` / ``geglu_tanh`` GeLU-gated (Gemma: ``gelu_pytorch_tanh``), ``relu2`` the
#: squared ReLU of So et al. 2021 ("Primer", sec. 3: ``relu(x)^2``; Nemotron-4),
#: ``gelu_tanh`` the tanh approximation (Hugging Face ``gelu_new``, GPT-2).
ACTIVATIONS: dict[str, tuple[str, bool]] = {
    "gelu": ("gelu", False), "gelu_tanh": ("gelu_tanh", False), "relu": ("relu", False),
    "relu2": ("relu2", False), "silu": ("silu", False), "swiglu": ("silu", True),
    "geglu": ("gelu", True), "geglu_tanh": ("gelu_tanh", True), "reglu": ("relu", True),
}
#: where a layer's norms sit: ``pre`` (GPT-2, LLaMA: ``x + f(norm(x))``), ``post``
#: (OLMo 2: ``x + norm(f(x))``), ``sandwich`` (Gemma 2: ``x + norm(f(norm(x)))``, four
#: norms per layer)
NORM_PLACEMENTS = ("pre", "post", "sandwich")
NORMS = ("layer_norm", "rms_norm")
POSITIONS = ("learned", "rope")
#: query/key normalisation: ``head`` (Qwen3: rms_norm over each head's d, weight [d]) or
#: ``full`` (OLMo 2: rms_norm over all q (k) channels, weight [heads * d])
QK_NORMS = ("head", "full")
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
#: Most routed experts per MoE layer (DeepSeek-V3 has 256, Qwen3-MoE 128)
MAX_EXPERTS = 2**12


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
        activation: the MLP activation (:data:`ACTIVATIONS`); None: the family's
            (gpt ``gelu``, llama ``swiglu``).
        kv_channels: per-head size d when it is not ``hidden_size / num_heads``
            (Megatron-LM ``--kv-channels``, Hugging Face ``head_dim``: Gemma 256, Qwen3 128);
            None: h / a.
        qkv_bias, o_bias, mlp_bias: biases on the q/k/v projections, the output projection
            and the MLP linears; None: the family's (gpt all, llama none). Qwen2: qkv only.
        norm: ``layer_norm`` (weight and bias) or ``rms_norm`` (:data:`NORMS`); None: the
            family's. norm_placement: :data:`NORM_PLACEMENTS`.
        positions: ``learned`` (a position table of seq_len rows) or ``rope``
            (:data:`POSITIONS`); None: the family's.
        qk_norm: None, or how q and k are normalised before attention (:data:`QK_NORMS`).
        sliding_window: each query attends to at most this many most recent keys (itself
            included; Mistral / Gemma 2 local layers, FlashAttention-2 ``window_size``);
            None: full causal attention. ``sliding_window_every``: 1 every layer, 2 every
            other layer (Gemma 2 alternates local and global, layer 0 local).
        num_experts: routed experts of each mixture-of-experts layer (None: a dense model).
            Every MoE layer replaces the MLP by a router (``gate``: ``[h, E]``, softmax,
            top-k), ``E`` SwiGLU experts of width ``moe_ffn_hidden_size`` (or
            ``ffn_hidden_size``) and the weighted combine (Shazeer et al. 2017; Mixtral,
            Jiang et al. 2024, sec. 2.1: ``y = sum_{i in topk} softmax(x W_g)_i SwiGLU_i(x)``).
        experts_per_token: k of the top-k routing (Mixtral 2, Qwen1.5-MoE 4, Qwen3-MoE 8).
        moe_ffn_hidden_size: width of each expert (None: ``ffn_hidden_size``, as Mixtral).
        shared_expert_ffn_hidden_size: width of a shared expert every token passes through
            (Qwen2-MoE), None: none; ``shared_expert_gate``: its output is scaled by
            ``sigmoid(x W)``, ``W`` ``[h, 1]``.
        moe_layer_step, dense_layers: layer ``i`` is an MoE layer when
            ``(i + 1) % moe_layer_step == 0`` and ``i not in dense_layers`` (Qwen-MoE
            ``decoder_sparse_step`` / ``mlp_only_layers``); the others keep the dense MLP of
            width ``ffn_hidden_size``.
        router_aux_loss_coef: weight of the load-balancing loss added to the LM loss
            (Switch Transformer, Fedus et al. 2022, eq. 4-6; 0: no aux loss op).
        norm_topk_prob: the top-k routing weights are renormalised to sum to 1.
        expert_slot_factor: slots per expert per sequence over the uniform ``s * k / E``
            (the dispatch / combine ``capacity_factor``, ``completion.ops.moe``); set by the
            plan pipeline from ``Strategy.expert_slot_factor`` (capacity factor, load
            imbalance), 1 by default.

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
    activation: str | None = None
    kv_channels: int | None = None
    qkv_bias: bool | None = None
    o_bias: bool | None = None
    mlp_bias: bool | None = None
    norm: str | None = None
    norm_placement: str = "pre"
    positions: str | None = None
    qk_norm: str | None = None
    sliding_window: int | None = None
    sliding_window_every: int = 1
    num_experts: int | None = None
    experts_per_token: int | None = None
    moe_ffn_hidden_size: int | None = None
    shared_expert_ffn_hidden_size: int | None = None
    shared_expert_gate: bool = False
    moe_layer_step: int = 1
    dense_layers: tuple[int, ...] = ()
    router_aux_loss_coef: float = 0.0
    norm_topk_prob: bool = True
    expert_slot_factor: float = 1.0

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
        if self.kv_channels is None and self.hidden_size % self.num_heads:
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
        self._check_choices()
        for f, most in (("kv_channels", 2**14), ("sliding_window", MAX_MODEL_SIZES["seq_len"]),
                        ("sliding_window_every", 2)):
            v = getattr(self, f)
            if v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= most:
                raise ModelConfigError(f"model {self.name!r}: {f} must be an int in [1, {most}], got {v!r}")
        if self.resolved_positions == "rope" and self.head_dim % 2:
            raise ModelConfigError(f"model {self.name!r}: head_dim {self.head_dim} must be even for "
                                   "rotary positions")
        self._check_moe()

    def _check_moe(self) -> None:
        """The mixture-of-experts fields: all None / defaults for a dense model; else
        ``1 <= experts_per_token <= num_experts <= MAX_EXPERTS`` and positive widths."""
        def _int(f: str, lo: int, hi: int) -> None:
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ModelConfigError(f"model {self.name!r}: {f} must be an int in [{lo}, {hi}], got {v!r}")

        if self.num_experts is None:
            if self.experts_per_token is not None or self.shared_expert_ffn_hidden_size is not None:
                raise ModelConfigError(f"model {self.name!r}: experts_per_token / shared expert "
                                       "given without num_experts")
            return
        _int("num_experts", 1, MAX_EXPERTS)
        _int("experts_per_token", 1, self.num_experts)
        _int("moe_layer_step", 1, MAX_MODEL_SIZES["num_layers"])
        for f in ("moe_ffn_hidden_size", "shared_expert_ffn_hidden_size"):
            if getattr(self, f) is not None:
                _int(f, 1, MAX_MODEL_SIZES["ffn_hidden_size"])
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in self.dense_layers):
            raise ModelConfigError(f"model {self.name!r}: dense_layers must be layer indices, got "
                                   f"{self.dense_layers!r}")
        c = self.router_aux_loss_coef
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.0 <= c < 1e3:
            raise ModelConfigError(f"model {self.name!r}: router_aux_loss_coef must be a number in "
                                   f"[0, 1000), got {c!r}")
        sf = self.expert_slot_factor
        if isinstance(sf, bool) or not isinstance(sf, (int, float)) or not 0 < sf <= 64:
            raise ModelConfigError(f"model {self.name!r}: expert_slot_factor must be a number in "
                                   f"(0, 64], got {sf!r}")
        for f in ("norm_topk_prob", "shared_expert_gate"):
            if not isinstance(getattr(self, f), bool):
                raise ModelConfigError(f"model {self.name!r}: {f} must be true or false")

    def _check_choices(self) -> None:
        """Each choice field is one of its catalog's names (or None where allowed)."""
        for f, allowed, none_ok in (("activation", tuple(ACTIVATIONS), True), ("norm", NORMS, True),
                                    ("norm_placement", NORM_PLACEMENTS, False),
                                    ("positions", POSITIONS, True), ("qk_norm", QK_NORMS, True)):
            v = getattr(self, f)
            if (v is None and not none_ok) or (v is not None and v not in allowed):
                raise ModelConfigError(f"model {self.name!r}: {f} {v!r} is not one of {list(allowed)}"
                                       + (" (or None: the family's)" if none_ok else ""))
        for f in ("qkv_bias", "o_bias", "mlp_bias"):
            v = getattr(self, f)
            if v is not None and not isinstance(v, bool):
                raise ModelConfigError(f"model {self.name!r}: {f} must be true, false or None, got {v!r}")

    @property
    def head_dim(self) -> int:
        """Per-head size d: ``kv_channels`` when given, else h / a (validated to divide)."""
        return self.kv_channels if self.kv_channels is not None else self.hidden_size // self.num_heads

    @property
    def mlp_activation(self) -> str:
        """The MLP activation: ``activation``, else the family's (gpt gelu, llama swiglu)."""
        return self.activation or FAMILIES[self.family].activation

    @property
    def gated_mlp(self) -> bool:
        """True for a GLU MLP (gate and up projections, :data:`ACTIVATIONS`)."""
        return ACTIVATIONS[self.mlp_activation][1]

    @property
    def resolved_norm(self) -> str:
        """``norm``, else the family's (gpt layer_norm, llama rms_norm)."""
        return self.norm or FAMILIES[self.family].norm

    @property
    def resolved_positions(self) -> str:
        """``positions``, else the family's (gpt learned, llama rope)."""
        return self.positions or FAMILIES[self.family].positions

    def bias(self, which: str) -> bool:
        """Whether the ``qkv``, ``o`` or ``mlp`` linears carry a bias (the field, else the
        family's: gpt yes, llama no)."""
        v = getattr(self, f"{which}_bias")
        return FAMILIES[self.family].bias if v is None else v

    def window_of(self, layer: int) -> int | None:
        """The sliding window of decoder layer ``layer`` (None: full causal attention)."""
        if self.sliding_window is None or layer % self.sliding_window_every:
            return None
        return self.sliding_window

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` is a mixture-of-experts layer (``num_experts``
        set, ``(layer + 1) % moe_layer_step == 0``, not in ``dense_layers``)."""
        return (self.num_experts is not None and (layer + 1) % self.moe_layer_step == 0
                and layer not in self.dense_layers)

    @property
    def uniform_layers(self) -> bool:
        """Whether every decoder layer has the same MLP kind (all dense or all MoE): a
        representative program of the first, a middle and the last layer then stands for
        the model (``completion.plan_program``); a mixed pattern (``moe_layer_step`` > 1,
        ``dense_layers``) is costed layer by layer."""
        return len({self.is_moe_layer(i) for i in range(self.num_layers)}) == 1

    @property
    def expert_ffn_hidden_size(self) -> int:
        """Width of each routed expert: ``moe_ffn_hidden_size``, else ``ffn_hidden_size``."""
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

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

_CATALOG_LIST += [
    # Mixtral-8x7B (Jiang et al. 2024, "Mixtral of Experts", Table 1; its config.json:
    # rope_theta 1e6, rms_norm_eps 1e-5, 32768 positions, no sliding window), 46,702,792,704
    # parameters (tests/test_models_moe.py derives them). seq_len here is the default
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


def load_hf_config(path: str | pathlib.Path) -> ModelConfig:
    """Read a Hugging Face style ``config.json`` (local file; nothing is downloaded).

    Keys: ``model_type`` (one of :data:`completion.models.hf_types.MODEL_TYPES`: llama
    (3.x included), mistral, qwen2, qwen3, gemma, gemma2, phi3, olmo2, nemotron -> llama
    family defaults; gpt2, gpt, megatron-gpt, gpt_neox -> gpt family defaults; each entry
    says how its activation, norms, biases, positions, qk-norm and sliding window are
    read), ``num_hidden_layers``, ``hidden_size``,
    ``num_attention_heads``, ``num_key_value_heads`` (default: heads),
    ``intermediate_size`` (default 4 x hidden for gpt), ``vocab_size``,
    ``max_position_embeddings``, optional ``tie_word_embeddings`` (default: true for gpt,
    false for llama), ``rms_norm_eps`` / ``layer_norm_epsilon``, ``rope_theta``. GPT-2's own
    spellings (``n_layer``, ``n_embd``, ``n_head``, ``n_inner``, ``n_positions``) are accepted.
    ``attn_implementation`` (or ``_attn_implementation``): ``eager`` -> unfused attention,
    ``sdpa`` / ``flash_attention_2`` / ``flash_attention_3`` / ``flex_attention`` -> flash
    (:data:`HF_ATTENTION`; absent: the model states none). Dropout probabilities
    (:data:`ATTENTION_DROPOUT_KEYS`, :data:`HIDDEN_DROPOUT_KEYS`; absent: 0, not
    transformers' per-class defaults). ``hidden_act`` / ``activation_function`` /
    ``hidden_activation`` -> ``activation`` (gated architectures take the GLU form),
    ``head_dim`` -> ``kv_channels``, ``attention_bias`` / ``mlp_bias`` -> biases,
    ``sliding_window`` (with ``use_sliding_window``) -> ``sliding_window``;
    ``rope_scaling`` is accepted and has no cost effect. Mixture-of-experts architectures
    (``mixtral``, ``qwen2_moe``, ``qwen3_moe``; their
    :class:`~completion.models.hf_types.MoESpec`): ``num_local_experts`` / ``num_experts``,
    ``num_experts_per_tok``, ``moe_intermediate_size`` (Mixtral: ``intermediate_size``),
    ``shared_expert_intermediate_size``, ``decoder_sparse_step``, ``mlp_only_layers``,
    ``router_aux_loss_coef`` (default 0.001), ``norm_topk_prob``; experts under a dense
    model_type and ``deepseek_v2`` / ``deepseek_v3`` (MLA attention,
    :data:`~completion.models.hf_types.REFUSED_MODEL_TYPES`) are refused naming the key.

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


class ModelConfigWarning(ModelConfigError, UserWarning):
    """A config.json key meshplan knows but does not model (one line naming the key),
    issued with ``warnings.warn`` (a UserWarning in the package's error family)."""


class _Lookups(dict):  # type: ignore[type-arg]
    """A config dict that records every key the parser looks up, present or not
    (``get``, ``[]``, ``in``), for :func:`_warn_near_misses`."""

    def __init__(self, raw: dict[str, Any]) -> None:
        super().__init__(raw)
        self.asked: set[str] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self.asked.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.asked.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.asked.add(key)  # type: ignore[arg-type]
        return super().__contains__(key)


#: how alike (difflib ratio) an unread key must be to a key the parser looked for and did
#: not find to be named as its likely misspelling (num_key_value_head ~ num_key_value_heads: 0.97)
NEAR_MISS_RATIO = 0.85


def _warn_near_misses(raw: _Lookups, name: str) -> None:
    """One warning line per key the parser never read that is a near miss of a key it looked
    for and did not find (``num_key_value_head`` for ``num_key_value_heads``: the default,
    full multi-head attention, would apply without a word). Other unread keys (token ids,
    ``torch_dtype``, ``architectures`` ...) have no cost effect and pass silently."""
    import difflib

    absent = sorted(k for k in raw.asked if isinstance(k, str) and not dict.__contains__(raw, k))
    for key in sorted(k for k in dict.keys(raw) if k not in raw.asked):
        close = difflib.get_close_matches(str(key), absent, n=1, cutoff=NEAR_MISS_RATIO)
        if close:
            warnings.warn(f"{name}: key {key!r} is not read; did you mean {close[0]!r}? (absent: "
                          f"its default applies)", ModelConfigWarning, stacklevel=3)


def _warn_unmodelled(raw: dict[str, Any], name: str, mt: str, spec: HFModelType) -> None:
    """One warning line per key of ``spec.unmodelled`` present with an effect."""
    for u in spec.unmodelled:
        v = raw.get(u.key)
        if v in u.inert or (u.needs is not None and raw.get(u.needs) is not True):
            continue
        warnings.warn(f"{name}: {u.key}={v!r} (model_type {mt!r}) is not modelled: {u.why}",
                      ModelConfigWarning, stacklevel=3)


def _activation(raw: dict[str, Any], name: str, spec: HFModelType) -> str:
    """The ModelConfig activation from the first of ``spec.act_keys`` present
    (:data:`HF_ACTIVATIONS`; gated architectures take its GLU form, :data:`GATED`)."""
    key, v = next(((k, raw[k]) for k in spec.act_keys if raw.get(k) is not None),
                  (spec.act_keys[0], spec.act_default))
    if not isinstance(v, str) or v not in HF_ACTIVATIONS:
        raise ModelConfigError(f"{name}: {key!r} must be one of {sorted(HF_ACTIVATIONS)}, got {v!r}")
    act = HF_ACTIVATIONS[v]
    if spec.gated:
        if act not in GATED:
            raise ModelConfigError(f"{name}: {key!r} {v!r} has no gated (GLU) form; gated "
                                   f"activations: {sorted(GATED)}")
        act = GATED[act]
    return act


def _sliding_window(raw: dict[str, Any], name: str, spec: HFModelType) -> int | None:
    """``sliding_window`` when the architecture reads it and ``use_sliding_window`` (when
    present) is true; None otherwise."""
    if not spec.sliding or not _bool_key(raw, name, "use_sliding_window", True):
        return None
    v = raw.get("sliding_window")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ModelConfigError(f"{name}: 'sliding_window' must be a positive int or null, got {v!r}")
    return v


def _biases(raw: dict[str, Any], name: str, spec: HFModelType) -> tuple[bool | None, bool | None, bool | None]:
    """(qkv_bias, o_bias, mlp_bias): the architecture's, or its switch keys' values."""
    qkv, o, mlp = spec.qkv_bias, spec.o_bias, spec.mlp_bias
    if spec.bias_key and raw.get(spec.bias_key) is not None:
        qkv = o = _bool_key(raw, name, spec.bias_key, False)
    if spec.mlp_bias_key and raw.get(spec.mlp_bias_key) is not None:
        mlp = _bool_key(raw, name, spec.mlp_bias_key, False)
    return qkv, o, mlp


#: config.json keys of mixture-of-experts architectures (Mixtral ``num_local_experts``,
#: Qwen-MoE ``num_experts``, DeepSeek ``n_routed_experts``) and their routing
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def _refuse_moe(raw: dict[str, Any], name: str, mt: str) -> None:
    """A config of a dense architecture (no :class:`~completion.models.hf_types.MoESpec`)
    that declares more than one expert is refused: costing a mixture-of-experts model as the
    dense model of the same sizes would be silently wrong. Raises ModelConfigError naming
    the file, key, value and the model types whose experts are modelled."""
    moe_types = sorted(t for t, sp in MODEL_TYPES.items() if sp.moe is not None)
    for k in MOE_KEYS:
        v = raw.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            raise ModelConfigError(f"{name}: {k} = {v}: mixture-of-experts models are not "
                                   f"modelled under model_type {mt!r} (costing it as a dense model "
                                   f"would be wrong); experts are modelled for {moe_types}")


def _int_key(raw: dict[str, Any], name: str, key: str, lo: int, default: int | None = None) -> int:
    """``raw[key]`` as an int >= ``lo`` (``default`` when absent; absent without a default
    is an error naming the key)."""
    v = raw.get(key)
    if v is None:
        if default is None:
            raise ModelConfigError(f"{name}: missing key {key!r}")
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ModelConfigError(f"{name}: {key!r} must be an int >= {lo}, got {v!r}")
    return v


def _moe_fields(raw: dict[str, Any], name: str, spec: HFModelType, layers: Any) -> dict[str, Any]:
    """The ModelConfig MoE fields of an architecture with experts (:class:`MoESpec`; {} for
    a dense one). Raises ModelConfigError naming the key."""
    m = spec.moe
    if m is None:
        return {}
    experts = _int_key(raw, name, m.experts_key, 1)
    topk = _int_key(raw, name, m.topk_key, 1)
    if topk > experts:
        raise ModelConfigError(f"{name}: {m.topk_key!r} = {topk} exceeds {m.experts_key!r} = {experts}")
    ffn_key = next((k for k in m.expert_ffn_keys if raw.get(k) is not None), m.expert_ffn_keys[0])
    out: dict[str, Any] = {"num_experts": experts, "experts_per_token": topk,
                           "moe_ffn_hidden_size": _int_key(raw, name, ffn_key, 1)}
    if m.shared_key is not None and raw.get(m.shared_key):
        out["shared_expert_ffn_hidden_size"] = _int_key(raw, name, m.shared_key, 1)
        out["shared_expert_gate"] = True
    if m.step_key is not None:
        out["moe_layer_step"] = _int_key(raw, name, m.step_key, 1, default=1)
    if m.dense_layers_key is not None:
        dl = raw.get(m.dense_layers_key) or []
        n = layers if isinstance(layers, int) else 0
        if not isinstance(dl, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                               and 0 <= i < max(n, 1) for i in dl):
            raise ModelConfigError(f"{name}: {m.dense_layers_key!r} must be a list of layer "
                                   f"indices in [0, {n}), got {dl!r}")
        out["dense_layers"] = tuple(sorted(set(dl)))
    coef = raw.get("router_aux_loss_coef", m.aux_coef_default)
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not 0.0 <= coef < 1e3:
        raise ModelConfigError(f"{name}: 'router_aux_loss_coef' must be a number >= 0, got {coef!r}")
    out["router_aux_loss_coef"] = float(coef)
    out["norm_topk_prob"] = (m.norm_topk_default if m.norm_topk_key is None
                             else _bool_key(raw, name, m.norm_topk_key, m.norm_topk_default))
    if m.norm_topk_key is None and raw.get("norm_topk_prob") is False:
        raise ModelConfigError(f"{name}: 'norm_topk_prob' false: this architecture always "
                               "renormalises its top-k weights")
    return out


def config_from_hf_dict(raw: dict[str, Any], name: str = "config.json") -> ModelConfig:
    """Build a ModelConfig from the dict of a Hugging Face ``config.json`` (see
    :func:`load_hf_config` for the keys and :data:`MODEL_TYPES` for the architectures).

    Raises ModelConfigError naming the file and key (an unknown ``model_type`` lists the
    known ones); warns (:class:`ModelConfigWarning`, one line per key) for keys known but
    not modelled and for unread keys that are near misses of keys it looked for
    (:func:`_warn_near_misses`)."""
    raw = _Lookups(raw)
    mt = raw.get("model_type")
    if isinstance(mt, str) and mt in REFUSED_MODEL_TYPES:
        field, why = REFUSED_MODEL_TYPES[mt]
        raise ModelConfigError(f"{name}: model_type {mt!r} is refused: {field} = {raw.get(field)!r}: {why}")
    if not isinstance(mt, str) or mt not in MODEL_TYPES:
        raise ModelConfigError(f"{name}: model_type {mt!r} is not one of {sorted(MODEL_TYPES)}")
    spec = MODEL_TYPES[mt]
    if spec.moe is None:
        _refuse_moe(raw, name, mt)
    family = spec.family
    layers = _key(raw, name, *spec.layer_keys)
    moe = _moe_fields(raw, name, spec, layers)
    hidden = _key(raw, name, *spec.hidden_keys)
    heads = _key(raw, name, *spec.heads_keys)
    kv = _key(raw, name, "num_key_value_heads", default=heads)
    if family == "gpt" and not isinstance(hidden, bool) and isinstance(hidden, int):
        ffn = _key(raw, name, *spec.ffn_keys, default=4 * hidden)
    else:
        ffn = _key(raw, name, *spec.ffn_keys)
    head_dim = raw.get(spec.head_dim_key) if spec.head_dim_key else None
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and head_dim == hidden // heads \
            and hidden % heads == 0:
        head_dim = None  # the default, stated
    qkv_bias, o_bias, mlp_bias = _biases(raw, name, spec)
    _warn_unmodelled(raw, name, mt, spec)
    cfg = ModelConfig(
        name=name,
        family=family,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        ffn_hidden_size=ffn,
        vocab_size=_key(raw, name, "vocab_size"),
        seq_len=_key(raw, name, *spec.positions_keys),
        tie_word_embeddings=_bool_key(raw, name, "tie_word_embeddings", spec.tie_default),
        norm_eps=_float_key(raw, name, spec.eps_keys, 1e-5),
        rope_theta=_float_key(raw, name, ("rope_theta",), 10000.0),
        attention=_attention_key(raw, name),
        attention_dropout=_prob_key(raw, name, ATTENTION_DROPOUT_KEYS),
        hidden_dropout=_prob_key(raw, name, HIDDEN_DROPOUT_KEYS),
        activation=_activation(raw, name, spec),
        kv_channels=head_dim,
        qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=mlp_bias,
        norm=spec.norm, norm_placement=spec.norm_placement, positions=spec.positions,
        qk_norm=spec.qk_norm,
        sliding_window=_sliding_window(raw, name, spec),
        sliding_window_every=spec.sliding_every,
        **moe,
    )
    _warn_near_misses(raw, name)
    return cfg


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
