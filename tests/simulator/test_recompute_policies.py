"""Recompute policies (simulator/recompute.py) and eager implementations of one-op kernels
(simulator/eager_ops.py), against hand-derived op lists, bytes and times.

Sources: torchtitan 9dec370 ``parallelize_llama._apply_ac_to_transformer_block`` (the op
policy saves every other ``aten.mm``, counted from the block's first, and SDPA outputs);
``torchtitan/models/norms.py`` ``RMSNorm`` and ``models/llama/model.py`` ``apply_rotary_emb``
(eager: one kernel per tensor op, fp32 upcasts). The roofline has bandwidth 1e9 B/s at
efficiency 1, 1 us per kernel, peak far above every FLOP count.
"""

from __future__ import annotations

import math

import pytest
import yaml

from completion import append_backward, build_model
from completion.dtypes import DTYPE_BYTES
from completion.models import ModelConfig
from simulator.blocks import assign_blocks
from simulator.eager_ops import EAGER_IMPLS, eager_kernels, impl_for
from simulator.memory import saved_activations
from simulator.op_cost import op_cost
from simulator.op_signature import op_signature
from simulator.profiles import CATALOG_DIR, ProfileError, load_profile, parse_profile
from simulator.recompute import RECOMPUTE_POLICIES, is_linear_mm, recomputed_ops
from simulator.roofline import Roofline
from simulator.stage_cost import StageCoster

RF = Roofline(peak_flops={"bf16": 1e18, "fp32": 1e18}, gemm_efficiency=1.0, gemm_half_flops=1.0,
              mem_bandwidth=1e9, mem_efficiency=1.0, kernel_overhead=1e-6)
# a small LLaMA: b = 2, s = 16, h = 64, 4 heads (GQA 2), ffn 128, bf16
B, S, H = 2, 16, 64
LLAMA = ModelConfig("t-llama", "llama", 2, H, 4, 2, 128, 96, S)


def _program():
    prog = build_model(LLAMA, B, seq_len=S)
    append_backward(prog)
    return prog


def _layer_ops(prog, layer=1):
    blocks = assign_blocks(prog)
    return blocks, [op for op in prog.ops if blocks.get(id(op)) == layer and op.role.name == "FORWARD"]


def test_policies_are_the_strategy_choices():
    from completion.strategy import RECOMPUTE

    assert tuple(RECOMPUTE_POLICIES) == RECOMPUTE


def test_op_sac_saves_every_other_linear_and_the_attention():
    """Forward linears of a LLaMA block in order: q, k, v, o, gate, up, down. torchtitan's
    op policy saves the 1st, 3rd, 5th, 7th (q, v, gate, down) and the flash attention
    output; k, o, up and every non-mm op (norms, rotary, SwiGLU, residual adds) are
    recomputed."""
    prog = _program()
    blocks, ops = _layer_ops(prog)
    rec = recomputed_ops(prog.ops, blocks, "selective-op")
    linears = [op.struct_name.rsplit(".", 1)[-1] for op in ops if is_linear_mm(op)]
    assert linears == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    saved = {op.struct_name.rsplit(".", 1)[-1] for op in ops if is_linear_mm(op) and id(op) not in rec}
    assert saved == {"q_proj", "v_proj", "gate_proj", "down_proj"}
    kinds = {op.type for op in ops if id(op) in rec and op.type != "parameter"}
    assert kinds == {"rms_norm", "matmul", "reshape", "fused_rotary_position_embedding", "add", "swiglu"}
    assert all(id(op) not in rec for op in ops if op.type == "flash_attention")
    # the embedding and the head are never recomputed; "full" takes every layer op
    assert rec <= {id(op) for op in prog.ops if isinstance(blocks.get(id(op)), int)}
    assert {id(op) for op in ops} <= recomputed_ops(prog.ops, blocks, "full")


def test_op_sac_time_is_the_forward_of_the_recomputed_ops():
    """BlockCost.recompute_f["selective-op"] = the sum of the F kernel times of the ops the
    policy recomputes (no fusion under the eager profile); "full" reruns the whole F."""
    prog = _program()
    blocks, ops = _layer_ops(prog)
    rec = recomputed_ops(prog.ops, blocks, "selective-op")
    names = frozenset(p.name for p in prog.parameters() if p.name)
    want = sum(RF.kernel_time(k) for op in ops if id(op) in rec
               for k in op_cost(op_signature(op, 0, names)) if k.phase == "F")
    bc = StageCoster(prog, None, RF, profile=load_profile("eager")).block_costs()[1]
    assert bc.recompute_time("selective-op") == pytest.approx(want, rel=1e-12)
    assert 0 < want < bc.compute["F"]
    assert bc.recompute_time("full") == pytest.approx(bc.time("F"))
    assert bc.recompute_time("none") == 0.0


def test_op_sac_memory_keeps_layer_input_and_saved_outputs():
    """Per micro-batch bytes a layer keeps under the op policy: its input [b, s, h] and the
    outputs of q, v (GQA: 2 heads of 16), gate, down and the flash attention output (with
    its softmax statistics, as the no-recompute model counts them); everything else is
    dropped. bf16: 2 bytes per element."""
    prog = _program()
    blocks, ops = _layer_ops(prog)
    acts = saved_activations(prog, "selective-op")
    (key, st), = [(k, v) for k, v in acts.items() if 1 in v.by_block]
    none = saved_activations(prog, "none")[key]
    t, kv, f = B * S * H * 2, B * S * 32 * 2, B * S * 128 * 2
    flash = next(op for op in ops if op.type == "flash_attention")
    flash_out = sum(math.prod(v.shape) * DTYPE_BYTES[v.dtype] for v in flash.results if v is not None)
    assert flash_out == t + B * 4 * S * 4 + 2 * 8  # out, fp32 log-sum-exp, int64 rng state
    # layer input + q + v + gate + down + flash outputs
    assert st.by_block[1] == t + t + kv + f + t + flash_out
    assert st.by_block[1] < none.by_block[1]


def test_torchtitan_rmsnorm_eager_bytes():
    """torchtitan RMSNorm on x [b, s, h] bf16 (n elements), per element: forward x.float()
    (2 + 4), pow (4 + 4), mean (4), x * rsqrt (4 + 4), type_as (4 + 2), * weight (2 + 2) =
    36 B in 8 kernels (two scalar-per-row kernels of ~0 B); backward 68 B in 11 kernels,
    the weight gradient (g * normed, 2 + 2 + 2; the sum over tokens, 2) 8 B in 2 kernels."""
    prog = _program()
    names = frozenset(p.name for p in prog.parameters() if p.name)
    impl = EAGER_IMPLS["torchtitan-rmsnorm"]
    n = B * S * H
    fwd = next(op for op in prog.ops if op.type == "rms_norm")
    grad = next(op for op in prog.ops if op.type == "rms_norm_grad")
    ks = eager_kernels(op_signature(fwd, 0, names), impl, op_cost(op_signature(fwd, 0, names)))
    assert len(ks) == 8 and sum(k.bytes for k in ks) == 36 * n
    assert sum(k.flops for k in ks) == sum(k.flops for k in op_cost(op_signature(fwd, 0, names)))
    gk = eager_kernels(op_signature(grad, 0, names), impl, op_cost(op_signature(grad, 0, names)))
    assert [sum(k.bytes for k in gk if k.phase == ph) for ph in "BW"] == [68 * n, 8 * n]
    assert [sum(1 for k in gk if k.phase == ph) for ph in "BW"] == [11, 2]
    # the seconds: bytes / 1e9 + 1 us per kernel
    assert RF.kernels_time(ks)["F"] == pytest.approx(36 * n / 1e9 + 8e-6)


def test_torchtitan_rope_eager_bytes_count_q_and_k():
    """apply_rotary_emb on q [b, s, 4, 16] and k [b, s, 2, 16] bf16: per element
    x.float() (2 + 4), the complex multiply (4 + 4), type_as (4 + 2) = 20 B forward;
    backward the same 20 B plus a conj of the small table."""
    prog = _program()
    names = frozenset(p.name for p in prog.parameters() if p.name)
    impl = EAGER_IMPLS["torchtitan-rope"]
    n = B * S * (4 + 2) * 16
    fwd = next(op for op in prog.ops if op.type == "fused_rotary_position_embedding")
    ks = eager_kernels(op_signature(fwd, 0, names), impl, [])
    assert sum(k.bytes for k in ks) == 20 * n and len(ks) == 3


def test_profile_eager_map_selects_the_implementation_and_is_checked():
    """fsdp2-eager runs norm, rope, SwiGLU and the loss eager; fsdp2 (torch.compile of the
    blocks) only the loss; a group both fused and eager, an unknown implementation or one
    of another group are errors naming the field."""
    eager = load_profile("fsdp2-eager")
    settings = dict(eager.kernels.eager.value)
    assert impl_for("rms_norm_grad", settings).name == "torchtitan-rmsnorm"
    assert impl_for("layer_norm", settings) is None
    assert dict(load_profile("fsdp2").kernels.eager.value) == {"cross_entropy": "torchtitan-cross-entropy"}
    assert dict(load_profile("megatron-core").kernels.eager.value) == {}
    data = yaml.safe_load((CATALOG_DIR / "fsdp2-eager.yaml").read_text())
    for bad, msg in (({"norm": "nope"}, "unknown eager implementation"),
                     ({"rope": "torchtitan-rmsnorm"}, "of group 'norm'")):
        data["kernels"]["eager"]["value"] = bad
        with pytest.raises(ProfileError, match=msg):
            parse_profile(data, "bad")
    data["kernels"]["eager"]["value"] = {"norm": "torchtitan-rmsnorm"}
    data["kernels"]["fused"]["value"] = ["norm"]
    with pytest.raises(ProfileError, match="both fused and run eager"):
        parse_profile(data, "bad")


def test_eager_profile_costs_more_than_compiled_for_the_same_program():
    """The same LLaMA block under fsdp2-eager (decomposed norm / rope / SwiGLU) moves more
    bytes than with those ops as single kernels (the plain eager profile)."""
    prog = _program()
    single = StageCoster(prog, None, RF, profile=load_profile("eager")).block_costs()[1]
    decomposed = StageCoster(prog, None, RF, profile=load_profile("fsdp2-eager")).block_costs()[1]
    assert decomposed.compute["F"] > single.compute["F"]
    assert decomposed.compute["B"] > single.compute["B"]
