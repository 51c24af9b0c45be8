"""Multi-head latent attention (MLA): the q, k, v projections of DeepSeek-V2 / V3 and Kimi-K2
(``ModelConfig.mla``).

Liu et al. 2024, "DeepSeek-V2", sec. 2.1.2-2.1.3, eq. 9-19 (DeepSeek-V3 report, sec. 2.1.1,
eq. 1-11, the same attention), as Hugging Face transformers ``DeepseekV3Attention`` lays it
out (parameter names and biases) and Megatron-Core ``MLASelfAttention`` runs it. With H
heads, hidden h, nope / rope / value head sizes d_n, d_r, d_v and latent ranks r_q, r_kv:

- queries: ``q_a_proj`` ``[h, r_q]`` (bias when ``attention_bias``), ``q_a_layernorm``
  (rms_norm over r_q), ``q_b_proj`` ``[r_q, H (d_n + d_r)]``; without ``q_lora_rank`` one
  ``q_proj`` ``[h, H (d_n + d_r)]`` (no bias, as transformers);
- keys and values: ``kv_a_proj_with_mqa`` ``[h, r_kv + d_r]`` (bias when
  ``attention_bias``) split into the latent c ``[r_kv]`` and one rotary key k_r ``[d_r]``
  shared by every head; ``kv_a_layernorm`` on c; ``kv_b_proj`` ``[r_kv, H (d_n + d_v)]``
  split per head into k_n ``[d_n]`` and v ``[d_v]``;
- rotary positions on q's last d_r channels and on k_r (one ``fused_rotary_position_embedding``
  each; the ``rotary_emb`` tables are d_r wide), k_r expanded to the H heads (``expand``);
  q = [q_n, q_r], k = [k_n, k_r] (``concat``), so each head's q and k are d_n + d_r wide and
  its v d_v wide: one ``flash_attention`` whose v has its own head size (scale
  1/sqrt(d_n + d_r));
- ``o_proj`` ``[H d_v, h]`` (bias when ``attention_bias``).

Per layer the parameters are ``h r_q + r_q + r_q H (d_n + d_r) + h (r_kv + d_r) + r_kv +
r_kv H (d_n + d_v) + H d_v h`` (DeepSeek-V3: 187,107,328; ``tests/completion/test_models_frontier.py``).
Under the Megatron layout (:mod:`completion.annotate`) the up-projections ``q_b_proj`` /
``kv_b_proj`` are column-parallel over the heads and ``o_proj`` row-parallel, while the
down-projections and their norms are replicated on every tensor-parallel rank
(Megatron-Core ``linear_q_down_proj`` / ``linear_kv_down_proj`` are ``duplicated``
linears), so the latents are computed whole on each rank; with sequence parallelism the
latents are gathered over the sequence before the up-projections.
"""

from __future__ import annotations

from completion.ir import Value
from completion.models.builder import ProgramBuilder
from completion.models.config import ModelConfig


def _rms(pb: ProgramBuilder, cfg: ModelConfig, x: Value, width: int, struct: str) -> Value:
    w = pb.param(struct, "weight", [width])
    return pb.op1("rms_norm", [x, w], {"epsilon": cfg.norm_eps, "begin_norm_axis": x.ndim - 1}, struct)


def _split(pb: ProgramBuilder, x: Value, sizes: list[int], struct: str) -> list[Value]:
    parts = pb.op("split", [x], {"axis": -1, "num_or_sections": sizes}, struct)
    assert all(p is not None for p in parts)
    return parts  # type: ignore[return-value]


def _rotate(pb: ProgramBuilder, cfg: ModelConfig, t: Value, rope: tuple[Value, Value], struct: str) -> Value:
    sin, cos = rope
    attrs = {"use_neox_rotary_style": True, "time_major": False, "rotary_emb_base": cfg.rope_theta}
    out = pb.op("fused_rotary_position_embedding", [t, None, None, sin, cos, None], attrs, struct)[0]
    assert out is not None
    return out


def mla_qkv(pb: ProgramBuilder, cfg: ModelConfig, x: Value, pre: str, b: int, s: int,
            rope: tuple[Value, Value] | None) -> tuple[Value, Value, Value]:
    """q, k ``[b, s, H, d_n + d_r]`` and v ``[b, s, H, d_v]`` of one MLA layer on
    ``x [b, s, h]`` (module docstring); ``pre`` is the layer's ``decoder.layers.{i}.self_attn``,
    ``rope`` the sin / cos tables (None: a layer without rotary positions)."""
    h, heads = cfg.hidden_size, cfg.num_heads
    dn, dr, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    r_kv = cfg.kv_lora_rank
    assert dn is not None and dr is not None and dv is not None and r_kv is not None
    bias = cfg.bias("qkv")
    if cfg.q_lora_rank is not None:
        cq = pb.linear(x, h, cfg.q_lora_rank, f"{pre}.q_a_proj", bias)
        cq = _rms(pb, cfg, cq, cfg.q_lora_rank, f"{pre}.q_a_layernorm")
        q = pb.linear(cq, cfg.q_lora_rank, heads * (dn + dr), f"{pre}.q_b_proj", False)
    else:
        q = pb.linear(x, h, heads * (dn + dr), f"{pre}.q_proj", False)
    q_nope, q_rot = _split(pb, pb.reshape(q, [b, s, heads, dn + dr], pre), [dn, dr], pre)
    ckv = pb.linear(x, h, r_kv + dr, f"{pre}.kv_a_proj_with_mqa", bias)
    c, k_rot = _split(pb, ckv, [r_kv, dr], pre)
    kv = pb.linear(_rms(pb, cfg, c, r_kv, f"{pre}.kv_a_layernorm"), r_kv, heads * (dn + dv),
                   f"{pre}.kv_b_proj", False)
    k_nope, v = _split(pb, pb.reshape(kv, [b, s, heads, dn + dv], pre), [dn, dv], pre)
    k_rot = pb.reshape(k_rot, [b, s, 1, dr], pre)
    if rope is not None:
        q_rot, k_rot = _rotate(pb, cfg, q_rot, rope, pre), _rotate(pb, cfg, k_rot, rope, pre)
    k_rot = pb.op1("expand", [k_rot], {"shape": [b, s, heads, dr]}, pre)
    q = pb.op1("concat", [q_nope, q_rot], {"axis": -1}, pre)
    k = pb.op1("concat", [k_nope, k_rot], {"axis": -1}, pre)
    return q, k, v
