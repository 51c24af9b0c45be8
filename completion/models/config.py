"""Model configurations: :class:`ModelConfig` (the architecture of a decoder-only model),
its families, the values its fields take, their size limits and the errors a bad config
raises. The built-in catalog is :mod:`completion.models.catalog`; Hugging Face
``config.json`` loading is :mod:`completion.models.hf_config`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from completion.errors import CompletionError


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

class ModelConfigWarning(ModelConfigError, UserWarning):
    """A config.json key meshplan knows but does not model (one line naming the key),
    issued with ``warnings.warn`` (a UserWarning in the package's error family)."""


#: Largest size a model config may give each field (issue 16 item 8: sizes are bounded
#: where they enter). Far above any model built (gpt3-175b: 96 layers, hidden 12288,
#: vocabulary 51200; 1M-token contexts), small enough that no size alone makes the cost
#: model or the program builder run for minutes.
MAX_MODEL_SIZES = {"num_layers": 2**14, "hidden_size": 2**20, "num_heads": 2**14,
                   "num_kv_heads": 2**14, "ffn_hidden_size": 2**22, "vocab_size": 2**24,
                   "seq_len": 2**24}
#: Most routed experts per MoE layer (DeepSeek-V3 has 256, Qwen3-MoE 128)
MAX_EXPERTS = 2**12
#: Most multi-token prediction modules (DeepSeek-V3 trains with 1; its report, sec. 2.2,
#: describes D sequential ones)
MAX_MTP_LAYERS = 16
#: router scoring functions (``ModelConfig.router_score``): softmax over the experts
#: (Shazeer et al. 2017; Mixtral, Qwen-MoE) or an independent sigmoid per expert
#: (DeepSeek-V3, Liu et al. 2024, eq. 15; Llama 4)
ROUTER_SCORES = ("softmax", "sigmoid")


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
            ``sliding_window_layers``: the decoder layers that use the window, when they
            follow no such pattern (Hugging Face ``layer_types``; Qwen2's layers from
            ``max_window_layers`` on); None: the ``sliding_window_every`` pattern. Indices
            beyond ``num_layers`` (a smaller ``--layers`` override) are ignored, and layers a
            larger override adds are full attention (the list is the config's).
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
        q_lora_rank, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim:
            multi-head latent attention (MLA; DeepSeek-V2, Liu et al. 2024, sec. 2.1, eq. 9-19;
            DeepSeek-V3) when ``kv_lora_rank`` is set: keys and values are up-projected per
            head from a ``kv_lora_rank``-wide latent, queries from a ``q_lora_rank``-wide one
            (None: a full ``q_proj``), each head's q and k are ``qk_nope_head_dim`` +
            ``qk_rope_head_dim`` wide (the rotary part of k one head shared by all) and its v
            ``v_head_dim`` (:mod:`completion.models.mla`). All None: multi-head / GQA attention.
        attention_sinks: one learned logit per head joins each softmax denominator (GPT-OSS;
            the ``sinks`` operand of ``flash_attention``).
        attention_chunk: each query sees only the keys of its own chunk of this many
            positions, on every layer with rotary positions (Llama 4's chunked attention;
            its NoPE layers, ``nope_layers``, attend globally). None: no chunking.
        nope_layers: decoder layers without rotary positions (Llama 4: every fourth).
        router_score: ``softmax`` (Mixtral, Qwen) or ``sigmoid`` (DeepSeek-V3, Llama 4) over
            the router logits (:data:`ROUTER_SCORES`).
        router_groups, router_topk_groups: node-limited routing (DeepSeek-V3 ``n_group`` 8,
            ``topk_group`` 4): experts cut into ``router_groups`` groups, a token's top-k
            chosen among the ``router_topk_groups`` best groups (``completion.ops.moe``).
        routed_scaling_factor: the routing weights are multiplied by it (DeepSeek-V3 2.5).
        mtp_layers, mtp_loss_weight: multi-token prediction (DeepSeek-V3 sec. 2.2): that many
            sequential modules after the decoder, each predicting one token further with one
            more decoder layer, weighted ``mtp_loss_weight / mtp_layers`` in the loss
            (:func:`completion.models.transformer._mtp`).
        expert_grid: the routed experts' weights and expert-major tokens laid out as
            ``[expert_grid, E / expert_grid, ...]`` instead of ``[E, ...]`` (the same
            parameters, row-major); set by the plan pipeline when whole experts fold over
            data- and tensor-parallel ranks (``completion.plan_program.with_expert_grid``),
            None otherwise.

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
    sliding_window_layers: tuple[int, ...] | None = None
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
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    attention_sinks: bool = False
    attention_chunk: int | None = None
    nope_layers: tuple[int, ...] = ()
    router_score: str = "softmax"
    router_groups: int = 1
    router_topk_groups: int = 1
    routed_scaling_factor: float = 1.0
    mtp_layers: int = 0
    mtp_loss_weight: float = 0.1
    expert_grid: int | None = None

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
        if self.sliding_window_layers is not None:
            lay = self.sliding_window_layers
            if not isinstance(lay, tuple) or any(isinstance(i, bool) or not isinstance(i, int) or i < 0
                                                 for i in lay):
                raise ModelConfigError(f"model {self.name!r}: sliding_window_layers must be a tuple of "
                                       f"layer indices >= 0, got {lay!r}")
        if self.resolved_positions == "rope" and self.kv_lora_rank is None and self.head_dim % 2:
            raise ModelConfigError(f"model {self.name!r}: head_dim {self.head_dim} must be even for "
                                   "rotary positions")
        self._check_moe()
        self._check_mla()
        self._check_frontier()

    def _int_field(self, f: str, lo: int, hi: int, none_ok: bool = True) -> None:
        v = getattr(self, f)
        if v is None and none_ok:
            return
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise ModelConfigError(f"model {self.name!r}: {f} must be an int in [{lo}, {hi}], got {v!r}")

    def _check_mla(self) -> None:
        """Multi-head latent attention: kv_lora_rank and the three head sizes together,
        q_lora_rank only with them; rotary positions on an even rope part; one k/v head per
        query head (MLA up-projects k and v per head); no kv_channels or q/k norm beside."""
        fields = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
        given = [f for f in fields if getattr(self, f) is not None]
        if not given:
            if self.q_lora_rank is not None:
                raise ModelConfigError(f"model {self.name!r}: q_lora_rank needs kv_lora_rank "
                                       "(multi-head latent attention)")
            return
        if len(given) != len(fields):
            missing = [f for f in fields if f not in given]
            raise ModelConfigError(f"model {self.name!r}: multi-head latent attention needs "
                                   f"{missing} beside {given}")
        for f in ("q_lora_rank", *fields):
            self._int_field(f, 1, MAX_MODEL_SIZES["hidden_size"])
        for f, bad in (("kv_channels", self.kv_channels is not None), ("qk_norm", self.qk_norm is not None),
                       ("num_kv_heads", self.num_kv_heads != self.num_heads),
                       ("positions", self.resolved_positions != "rope")):
            if bad:
                raise ModelConfigError(f"model {self.name!r}: {f} {getattr(self, f)!r} does not go "
                                       "with multi-head latent attention (per-head k/v from one "
                                       "latent, rotary on qk_rope_head_dim)")
        if self.qk_rope_head_dim % 2:  # type: ignore[operator]
            raise ModelConfigError(f"model {self.name!r}: qk_rope_head_dim {self.qk_rope_head_dim} "
                                   "must be even for rotary positions")

    def _check_frontier(self) -> None:
        """Sinks, chunked attention, NoPE layers, the router's scoring and groups, the
        routed scaling and multi-token prediction (class docstring)."""
        if not isinstance(self.attention_sinks, bool):
            raise ModelConfigError(f"model {self.name!r}: attention_sinks must be true or false")
        self._int_field("attention_chunk", 1, MAX_MODEL_SIZES["seq_len"])
        if not isinstance(self.nope_layers, tuple) or any(
                isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in self.nope_layers):
            raise ModelConfigError(f"model {self.name!r}: nope_layers must be a tuple of layer "
                                   f"indices >= 0, got {self.nope_layers!r}")
        if self.router_score not in ROUTER_SCORES:
            raise ModelConfigError(f"model {self.name!r}: router_score {self.router_score!r} is not "
                                   f"one of {list(ROUTER_SCORES)}")
        self._int_field("router_groups", 1, MAX_EXPERTS, none_ok=False)
        self._int_field("router_topk_groups", 1, self.router_groups, none_ok=False)
        f = self.routed_scaling_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < 1e4:
            raise ModelConfigError(f"model {self.name!r}: routed_scaling_factor must be a number in "
                                   f"(0, 10000), got {f!r}")
        routing = (self.router_score != "softmax" or self.router_groups != 1 or f != 1.0)
        if routing and self.num_experts is None:
            raise ModelConfigError(f"model {self.name!r}: router_score / router_groups / "
                                   "routed_scaling_factor given without num_experts")
        if self.num_experts is not None and self.router_groups > 1:
            per = self.num_experts // self.router_groups
            if self.num_experts % self.router_groups or self.experts_per_token > self.router_topk_groups * per:  # type: ignore[operator]
                raise ModelConfigError(f"model {self.name!r}: router_groups {self.router_groups} must "
                                       f"divide num_experts {self.num_experts} and the "
                                       f"{self.router_topk_groups} groups a token may use hold at "
                                       f"least experts_per_token {self.experts_per_token} experts")
        self._int_field("mtp_layers", 0, MAX_MTP_LAYERS, none_ok=False)
        if self.expert_grid is not None:
            self._int_field("expert_grid", 1, MAX_EXPERTS, none_ok=False)
            if self.num_experts is None or self.num_experts % self.expert_grid:
                raise ModelConfigError(f"model {self.name!r}: expert_grid {self.expert_grid} must "
                                       f"divide num_experts {self.num_experts}")
        w = self.mtp_loss_weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w < 100:
            raise ModelConfigError(f"model {self.name!r}: mtp_loss_weight must be a number in "
                                   f"[0, 100), got {w!r}")

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
    def mla(self) -> bool:
        """Whether the attention is multi-head latent attention (``kv_lora_rank`` set)."""
        return self.kv_lora_rank is not None

    @property
    def head_dim(self) -> int:
        """Per-head size d of q and k: ``kv_channels`` when given, else h / a (validated to
        divide); under MLA ``qk_nope_head_dim + qk_rope_head_dim``."""
        if self.kv_lora_rank is not None:
            return self.qk_nope_head_dim + self.qk_rope_head_dim  # type: ignore[operator]
        return self.kv_channels if self.kv_channels is not None else self.hidden_size // self.num_heads

    @property
    def value_head_dim(self) -> int:
        """Per-head size of v (and of the attention output): ``v_head_dim`` under MLA, else
        :attr:`head_dim`."""
        return self.v_head_dim if self.v_head_dim is not None else self.head_dim

    @property
    def rope_dim(self) -> int:
        """Channels a rotary embedding turns: ``qk_rope_head_dim`` under MLA, else
        :attr:`head_dim`."""
        return self.qk_rope_head_dim if self.qk_rope_head_dim is not None else self.head_dim

    def uses_rope(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` applies rotary positions (rope positions, not in
        ``nope_layers``)."""
        return self.resolved_positions == "rope" and layer not in self.nope_layers

    def chunk_of(self, layer: int) -> int | None:
        """The attention chunk of decoder layer ``layer``: ``attention_chunk`` on the layers
        with rotary positions (Llama 4), None otherwise."""
        return self.attention_chunk if self.attention_chunk and self.uses_rope(layer) else None

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
        """The sliding window of decoder layer ``layer`` (None: full causal attention):
        ``sliding_window`` on the layers of ``sliding_window_layers`` when given, else on
        every ``sliding_window_every``-th layer from layer 0."""
        if self.sliding_window is None:
            return None
        if self.sliding_window_layers is not None:
            return self.sliding_window if layer in self.sliding_window_layers else None
        return None if layer % self.sliding_window_every else self.sliding_window

    def uniform_at(self, seq_len: int) -> bool:
        """Whether every decoder layer costs the same at ``seq_len`` tokens: one MLP kind
        (:attr:`uniform_layers`) and one attention span (a window of at least ``seq_len``
        keys masks nothing, so it is full attention there). A representative program of
        the first, a middle and the last layer then stands for the model
        (``completion.plan_program``); otherwise every layer is costed."""
        def short(n: int | None) -> int | None:
            return n if n is not None and n < seq_len else None
        spans = {(short(self.window_of(i)), short(self.chunk_of(i)), self.uses_rope(i))
                 for i in range(self.num_layers)}
        return self.uniform_layers and len(spans) == 1

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` is a mixture-of-experts layer (``num_experts``
        set, ``(layer + 1) % moe_layer_step == 0``, not in ``dense_layers``)."""
        return (self.num_experts is not None and (layer + 1) % self.moe_layer_step == 0
                and layer not in self.dense_layers)

    def has_moe_layers(self, num_layers: int | None = None) -> bool:
        """Whether any of the first ``num_layers`` decoder layers (default: all of them) is
        a mixture-of-experts layer (:meth:`is_moe_layer`): False for a dense model and for
        experts that ``dense_layers`` / ``moe_layer_step`` leave unused."""
        n = self.num_layers if num_layers is None else num_layers
        return self.num_experts is not None and any(self.is_moe_layer(i) for i in range(n))

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
