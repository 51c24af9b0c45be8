"""Hugging Face ``config.json`` loading: :func:`load_hf_config` (a file) and
:func:`config_from_hf_dict` (its parsed object) build a :class:`ModelConfig`, read per
``model_type`` as :mod:`completion.models.hf_types` says; a key that is known but not
modelled warns (:class:`ModelConfigWarning`), a near-miss spelling of a key read warns, bad
content raises ModelConfigError naming the file and key.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import re
import warnings
from typing import Any

from completion.json_keys import unique_keys
from completion.models.config import (
    HF_ATTENTION,
    ModelConfig,
    ModelConfigError,
    ModelConfigWarning,
    ModelFileNotFoundError,
)
from completion.models.hf_keys import bool_key as _bool_key
from completion.models.hf_keys import float_key as _float_key
from completion.models.hf_keys import get_key as _key
from completion.models.hf_keys import int_key as _int_key
from completion.models.hf_types import (
    GATED,
    HF_ACTIVATIONS,
    MODEL_TYPES,
    REFUSED_MODEL_TYPES,
    HFModelType,
)
from completion.nesting import json_depth, too_deep


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
    ``sliding_window`` (with ``use_sliding_window``) -> ``sliding_window``, on the layers
    that ``layer_types`` marks ``sliding_attention`` (else Qwen's layers from
    ``max_window_layers`` on, Gemma 2's every other layer, or every layer);
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
    st = p.stat()
    key = (str(p), str(p.resolve()), st.st_mtime_ns, st.st_size)
    hit = _LOADED.get(key)
    if hit is None:  # parse once per file version; its warnings are kept and replayed
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cfg = _load_hf_config(p)
        hit = _LOADED[key] = (cfg, [(w.message, w.category) for w in caught])
    for message, category in hit[1]:
        warnings.warn(message, category, stacklevel=2)
    return hit[0]


#: configs read by :func:`load_hf_config`, by (path, resolved path, mtime, size): a search
#: builds an Engine per candidate and each resolves the model (a ModelConfig is immutable)
_LOADED: dict[tuple, tuple[ModelConfig, list[tuple[Any, Any]]]] = {}


def _load_hf_config(p: pathlib.Path) -> ModelConfig:
    """:func:`load_hf_config`'s parse of an existing file (no memo)."""
    try:
        text = p.read_text(encoding="utf-8")
        deep = too_deep(json_depth(text), str(p))
        if deep:
            raise ModelConfigError(deep)
        raw = json.loads(text, object_pairs_hook=unique_keys)
    except ModelConfigError:
        raise
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{p}: not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
    except UnicodeDecodeError as e:
        raise ModelConfigError(f"{p}: not UTF-8 text (byte {e.start})") from None
    except (ValueError, RecursionError) as e:  # an integer of > 4300 digits, deep nesting
        raise ModelConfigError(f"{p}: not a usable JSON document: {str(e).split(';')[0]}") from None
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{p}: expected a JSON object at the top level")
    return config_from_hf_dict(raw, name=str(p))


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
        shown = "{...}" if isinstance(v, dict) else repr(v)
        warnings.warn(f"{name}: {u.key}={shown} (model_type {mt!r}) is not modelled: {u.why}",
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
    """``sliding_window`` when the architecture reads it and ``use_sliding_window`` is true
    (absent: the architecture's default, ``HFModelType.sliding_switch_default``); an absent
    ``sliding_window`` is ``HFModelType.window_default`` (transformers' config default, with a
    warning), a null one no window; None otherwise."""
    if not spec.sliding or not _bool_key(raw, name, "use_sliding_window", spec.sliding_switch_default):
        return None
    if "sliding_window" not in raw and spec.window_default is not None:
        warnings.warn(f"{name}: 'sliding_window' is absent: transformers' default for this "
                      f"model_type, {spec.window_default}, applies (write sliding_window: null for "
                      "none)", ModelConfigWarning, stacklevel=3)
        return spec.window_default
    v = raw.get("sliding_window")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ModelConfigError(f"{name}: 'sliding_window' must be a positive int or null, got {v!r}")
    return v


#: ``layer_types`` entries (transformers' per-layer attention kinds) -> windowed or not
LAYER_TYPES = {"sliding_attention": True, "full_attention": False}


def _window_layers(raw: dict[str, Any], name: str, spec: HFModelType, layers: int,
                   window: int | None) -> tuple[int, ...] | None:
    """The decoder layers that use the sliding window (``ModelConfig.sliding_window_layers``):
    a ``layer_types`` list when the config has one (transformers' per-layer kinds,
    :data:`LAYER_TYPES`), else the layers from ``spec.window_from_key`` on (Qwen2: from
    ``max_window_layers``, default ``spec.window_from_default``); None: the
    ``sliding_every`` pattern (or no window at all). Raises ModelConfigError naming the key
    for a list of the wrong length or an unknown kind, or a bad ``max_window_layers``."""
    if window is None:
        return None
    kinds = raw.get("layer_types")
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) != layers:
            got = f"{len(kinds)} entries" if isinstance(kinds, list) else type(kinds).__name__
            raise ModelConfigError(f"{name}: 'layer_types' must be a list of {layers} entries (one "
                                   f"per layer, num_hidden_layers), got {got}")
        bad = sorted({str(k) for k in kinds if k not in LAYER_TYPES})
        if bad:
            raise ModelConfigError(f"{name}: 'layer_types' has {bad}; known kinds: {sorted(LAYER_TYPES)}")
        return tuple(i for i, k in enumerate(kinds) if LAYER_TYPES[k])
    if spec.window_from_key is None:
        return None
    start = raw.get(spec.window_from_key, spec.window_from_default)
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ModelConfigError(f"{name}: {spec.window_from_key!r} must be an int >= 0, got {start!r}")
    return tuple(range(start, layers))


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
        if v is None or isinstance(v, bool) or v in (0, 1, "0", "1"):  # 0.0 == 0, 1.0 == 1
            continue  # absent, off, or one expert: a dense MLP
        if not isinstance(v, int):  # "8", 8.0: a count in another type would pass as dense
            raise ModelConfigError(f"{name}: {k} = {v!r} must be an integer (the experts' count)")
        if v > 1:
            raise ModelConfigError(f"{name}: {k} = {v}: mixture-of-experts models are not "
                                   f"modelled under model_type {mt!r} (costing it as a dense model "
                                   f"would be wrong); experts are modelled for {moe_types}")


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
    elif m.shared_key is not None and m.shared_key not in raw:  # 0 / null say "none" in words
        warnings.warn(f"{name}: {m.shared_key!r} is absent: costed without a shared expert "
                      f"(transformers' own default would build one; write {m.shared_key}: 0 "
                      "to say there is none, or its width)", ModelConfigWarning, stacklevel=3)
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
    if "model_type" not in raw and "strategy" in raw and "model" in raw:
        raise ModelConfigError(f"{name}: a meshplan plan file, not a model config.json: give its "
                               f"model ({raw.get('model')!r}) here; `meshplan cost PLAN.json` "
                               f"re-costs a plan")
    raw = _Lookups(raw)
    mt = raw.get("model_type")
    if isinstance(mt, str) and mt in REFUSED_MODEL_TYPES:
        field, why = REFUSED_MODEL_TYPES[mt]
        raise ModelConfigError(f"{name}: model_type {mt!r} is refused: {field} = {raw.get(field)!r}: {why}")
    if not isinstance(mt, str) or mt not in MODEL_TYPES:
        raise ModelConfigError(f"{name}: model_type {mt!r} is not one of {sorted(MODEL_TYPES)}")
    spec = MODEL_TYPES[mt]
    if spec.nested is not None:
        return _text_model(raw, name, mt, spec)
    if spec.moe is None and spec.reader is None:
        _refuse_moe(raw, name, mt)
    family = spec.family
    layers = _key(raw, name, *spec.layer_keys)
    moe = spec.reader(raw, name, layers) if spec.reader else _moe_fields(raw, name, spec, layers)
    hidden = _key(raw, name, *spec.hidden_keys)
    heads = _key(raw, name, *spec.heads_keys)
    kv = _key(raw, name, "num_key_value_heads", default=heads)
    if family == "gpt" and not isinstance(hidden, bool) and isinstance(hidden, int):
        ffn = _key(raw, name, *spec.ffn_keys, default=4 * hidden)
    else:
        ffn = _key(raw, name, *spec.ffn_keys)
    head_dim = raw.get(spec.head_dim_key) if spec.head_dim_key else None
    if spec.head_dim_key and spec.head_dim_key not in raw and spec.head_dim_default is not None:
        head_dim = spec.head_dim_default
        warnings.warn(f"{name}: {spec.head_dim_key!r} is absent: transformers' default for this "
                      f"model_type, {head_dim}, applies (not hidden_size / num_attention_heads)",
                      ModelConfigWarning, stacklevel=2)
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and head_dim == hidden // heads \
            and hidden % heads == 0:
        head_dim = None  # the default, stated
    _warn_unmodelled(raw, name, mt, spec)
    window = _sliding_window(raw, name, spec)
    with _in_config_words(raw, spec):
        cfg = _model_config(name, family, layers, hidden, heads, kv, ffn, head_dim, window, moe,
                            raw, spec)
    _warn_near_misses(raw, name)
    return cfg


#: keys of a multimodal config's top level that the text model reads (Llama 4 states
#: ``tie_word_embeddings`` beside its ``text_config``)
OUTER_KEYS = ("tie_word_embeddings", "attn_implementation", "_attn_implementation")


def _text_model(raw: dict[str, Any], name: str, mt: str, spec: HFModelType) -> ModelConfig:
    """The text model of a multimodal config (``HFModelType.nested``): its ``text_config``
    (model_type defaulting to the text type) with the top level's :data:`OUTER_KEYS`; the
    top level's unmodelled keys warn. Raises ModelConfigError naming the missing key."""
    assert spec.nested is not None
    key, text_type = spec.nested
    inner = raw.get(key)
    if not isinstance(inner, dict):
        raise ModelConfigError(f"{name}: model_type {mt!r} keeps its text model in {key!r}, which "
                               f"is {'missing' if inner is None else 'not an object'}")
    _warn_unmodelled(raw, name, mt, spec)
    merged = {k: raw[k] for k in OUTER_KEYS if k in raw}
    merged.update(inner)
    merged.setdefault("model_type", text_type)
    return config_from_hf_dict(merged, f"{name} ({key})")


def _config_keys(raw: dict[str, Any], spec: HFModelType) -> dict[str, str]:
    """ModelConfig field -> the config.json key it is read from (the first of the
    architecture's keys the config has), where the two names differ."""
    def first(keys: tuple[str, ...]) -> str:
        return next((k for k in keys if k in raw), keys[0])
    words = {"num_layers": first(spec.layer_keys), "hidden_size": first(spec.hidden_keys),
             "num_heads": first(spec.heads_keys), "num_kv_heads": "num_key_value_heads",
             "ffn_hidden_size": first(spec.ffn_keys), "kv_channels": spec.head_dim_key or "head_dim",
             "seq_len": first(spec.positions_keys)}
    return {f: k for f, k in words.items() if f != k}


@contextlib.contextmanager
def _in_config_words(raw: dict[str, Any], spec: HFModelType) -> Any:
    """Re-raise a ModelConfigError with each ModelConfig field it names spelled as the
    config.json key (``kv_channels`` -> ``'head_dim'``): the user wrote the keys."""
    try:
        yield
    except ModelConfigError as e:
        msg = str(e)
        for f, k in _config_keys(raw, spec).items():
            msg = re.sub(rf"\b{f}\b", repr(k), msg)
        if msg == str(e):
            raise
        raise ModelConfigError(msg) from None


def _model_config(name: str, family: str, layers: Any, hidden: Any, heads: Any, kv: Any, ffn: Any,
                  head_dim: Any, window: Any, moe: dict[str, Any], raw: dict[str, Any],
                  spec: HFModelType) -> ModelConfig:
    """The ModelConfig of the sizes read (:func:`config_from_hf_dict`) and the config's other
    keys. Raises ModelConfigError naming the field."""
    qkv_bias, o_bias, mlp_bias = _biases(raw, name, spec)
    return ModelConfig(
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
        sliding_window=window,
        sliding_window_every=spec.sliding_every,
        sliding_window_layers=_window_layers(raw, name, spec, layers, window),
        **moe,
    )
