"""Memory of the Megatron-Bridge MoE rows (issue 21; rows 1001-1003 of
``experiments/data/measured_runs_moe.csv``: Qwen3-30B-A3B, 16 DGX-H100, tp 1, pp 2, vpp 24,
ep 8 = dp 8, FP8, mbs 2) against what Megatron-Core allocates for that layout, term by term
(the ``megatron-bridge`` profile, ``simulator/profiles/catalog/megatron-bridge.yaml``):

- gradients: the perf recipe sets ``grad_reduce_in_fp32 = False``, so the DDP buffer is
  bf16 (state model ``megatron-ddp``): 2 bytes per parameter, not 4;
- FP8 weights: ``fp8_param_gather = True`` keeps the FP8 linears' weights as FP8 parameters
  (1 byte + a 1-byte transpose), no FP8 cache beside a bf16 weight;
- MoE: the router probs multiply the SwiGLU output (``weighted_bias_swiglu``), the combine
  is an unpermute that saves nothing; the router GEMM is a torch matmul (bf16 input saved);
- loss: Transformer Engine's cross entropy saves the bf16 logits (2 bytes), no fp32 copy;
- layers: Megatron-Core's even split over pp x vpp (one layer a virtual stage here);
- in flight: Megatron's interleaved warm-up, 2 (p - r - 1) + (v - 1) p forwards, + 1.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from completion.fp8 import mark_fp8_linears
from completion.models.source import resolve_model
from completion.plan_program import build_plan_program
from experiments.measured_rows import parse_measured
from meshplan import Engine
from simulator.errors import SimulatorError
from simulator.fp8 import AMAX_TENSORS, fp8_state_bytes
from simulator.memory import MOE_PROBS, moe_unsaved
from simulator.model_states import StateInputs, model_states
from simulator.op_signature import op_signature
from simulator.profiles import load_profile

T = 2 * 4096  # tokens per micro-batch (mbs 2 x seq 4096)
H, E_LOCAL, K, F = 2048, 16, 8, 768
COPIES = T * K  # (token, choice) pairs a rank's experts get under uniform routing: 65,536


@pytest.fixture(scope="module")
def specs():
    return {p.row_id: p for p in parse_measured() if p.row_id in (1001, 1002, 1003)}


@pytest.fixture(scope="module")
def run1001(specs):
    s = specs[1001]
    eng = Engine(s.model, s.cluster, s.strategy, nodes=s.nodes, seq_len=s.seq_len)
    model = eng.step_model()
    return model, model.run()


# -- model states ---------------------------------------------------------------------------

@given(p=st.integers(0, 10**9), n=st.integers(1, 64), zero=st.integers(0, 3),
       g=st.sampled_from([2, 4]))
@settings(max_examples=60, deadline=None)
def test_megatron_ddp_states_are_2_plus_g_plus_12_over_n(p, n, zero, g):
    """(2 + g + 12/N) P with the distributed optimizer (zero 1), g the buffer's bytes;
    zero 0 keeps the 12 unsharded, zero 2 shards g too, zero 3 also the weights."""
    got = model_states("megatron-ddp", StateInputs(params=p, dp=n, zero=zero, reduce_bytes=g))
    shard = -(-p // n)
    assert got.params == (shard if zero == 3 else p) * 2
    assert got.grads == (shard if zero >= 2 else p) * g
    assert got.optimizer == (shard if zero >= 1 else p) * 12


def test_megatron_ddp_by_hand_and_megatron_unchanged():
    """1000 parameters over 8 ranks, zero 1: bf16 buffer 2,000 bytes, Adam 125 * 12 = 1,500;
    the ``megatron`` model keeps its fp32 main gradients (4,000) whatever the reduce dtype."""
    x = StateInputs(params=1000, dp=8, zero=1, reduce_bytes=2)
    got = model_states("megatron-ddp", x)
    assert (got.params, got.grads, got.optimizer) == (2000, 2000, 1500)
    assert model_states("megatron", x).grads == 4000


def test_bridge_profile_states_the_recipe_facts():
    """The values of megatron-bridge's deltas over megatron-core (that they are its only
    differences: tests/simulator/test_profile_extends.py CATALOG_DELTAS)."""
    p = load_profile("megatron-bridge")
    assert (p.memory.model_states.value, p.gradients.main_grad.value, p.gradients.reduce_dtype.value,
            p.memory.loss_saved_bytes.value, p.memory.loss_temp_bytes.value,
            p.kernels.moe_probs.value) == ("megatron-ddp", "same", "same", 2.0, 0.0, "activation")


# -- MoE probs ------------------------------------------------------------------------------

def test_moe_unsaved_registry_and_errors():
    assert moe_unsaved(None) == frozenset() == MOE_PROBS["combine"]
    assert moe_unsaved(load_profile("megatron-core")) == frozenset()
    assert moe_unsaved(load_profile("megatron-bridge")) == {("moe_combine_grad", 0)}
    bogus = SimpleNamespace(kernels=SimpleNamespace(moe_probs=SimpleNamespace(value="router")))
    with pytest.raises(SimulatorError, match="kernels.moe_probs"):
        moe_unsaved(bogus)


def _layer_bytes(spec, framework):
    s = spec.strategy.replace(pp=1, vpp=1, schedule="1F1B", global_batch_size=16,
                              layers_per_stage=None, framework=framework)
    eng = Engine(spec.model.replace(num_layers=1), spec.cluster, s, nodes=spec.nodes,
                 seq_len=spec.seq_len)
    return eng.program_costs().activations.by_block[0]


def test_probs_in_the_activation_drop_the_combines_input(specs):
    """One Qwen3 MoE layer, mbs 2: under megatron-core's program the combine's backward
    keeps the experts' outputs after the return all_to_all, [E 128, 2 x 256 slots, 2048]
    bf16 = 268,435,456 bytes; Megatron-Core's unpermute keeps none of it."""
    core, bridge = _layer_bytes(specs[1001], "megatron-core"), _layer_bytes(specs[1001], "megatron-bridge")
    assert core - bridge == 128 * 512 * 2048 * 2 == 268_435_456


# -- FP8 ------------------------------------------------------------------------------------

def test_fp8_params_keep_no_weight_cache_and_the_router_stays_bf16(specs):
    """Under megatron-bridge every FP8 linear's weight is an FP8 parameter: the persistent
    FP8 state is the amax histories only, 3 x (1024 + 2) x 4 = 12,312 bytes a GEMM;
    megatron-core caches 2 bytes per weight element beside the bf16 weight. The router
    (``mlp.gate``) is not an FP8 GEMM under Transformer Engine."""
    spec = specs[1001]
    src = resolve_model(spec.model.replace(num_layers=1), 4096)
    prog = build_plan_program(src, spec.strategy.replace(pp=1, vpp=1, schedule="1F1B",
                                                         global_batch_size=16,
                                                         layers_per_stage=None)).program
    hist = AMAX_TENSORS * (1024 + 2) * 4
    assert hist == 12_312
    for framework, cache in (("megatron-bridge", False), ("megatron-core", True)):
        mark_fp8_linears(prog, "te-delayed", load_profile(framework).fp8_weights)
        fwd = [op for op in prog.ops if op.type == "matmul" and op.attrs.get("fp8")
               and op.role.name == "FORWARD"]
        names = sorted(op.struct_name.rsplit(".", 1)[-1] for op in fwd)
        assert names == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
        for op in fwd:
            sig = op_signature(op, 0, frozenset(p.name for p in prog.parameters() if p.name))
            w = math.prod(sig.ins[1].shape)
            assert fp8_state_bytes(sig) == pytest.approx(hist + (2 * w if cache else 0))
        router = [op for op in prog.ops if op.struct_name.endswith("mlp.gate") and op.type == "matmul"]
        assert router and not any(op.attrs.get("fp8") for op in router)


# -- rows 1001-1003 -------------------------------------------------------------------------

def test_rows_run_under_megatron_bridge_with_an_even_split(specs):
    assert {s.strategy.framework for s in specs.values()} == {"megatron-bridge"}
    assert specs[1001].strategy.layers_per_stage == (1,) * 48
    assert specs[1002].strategy.layers_per_stage == (2,) * 24


def layer_activation_bytes() -> int:
    """Per layer and micro-batch (T = 8192 tokens, 65,536 expert copies on the rank), what
    Megatron-Core + TE keep for backward, bytes:
    attention: norm input bf16 2Th, rstd fp32 4T, fp8 ln_out Th; q, k before their
    per-head RMSNorm bf16 2T*4096 + 2T*512, rstd 4T*32 + 4T*4; q, k after RoPE and v for
    the fused attention 2T*4096 + 2 * 2T*512; its output bf16 2T*4096 (flash backward)
    and fp8 T*4096 (linear_proj wgrad); softmax stats fp32 4 * 2*32*4096; rng 16.
    MoE: pre-MLP norm input 2Th, rstd 4T; router input bf16 2Th (torch GEMM); probs bf16
    2T*128; top-k weights bf16 2T*8 and indices int64 8T*8; fc1's fp8 input 65,536 h; the
    weighted SwiGLU's input (fc1 output) bf16 2 * 65,536 * 2 * 768; fc2's fp8 input
    65,536 * 768; the unpermute nothing."""
    attn = (2 * T * H + 4 * T + T * H + 2 * T * 4096 + 4 * T * 32 + 2 * T * 512 + 4 * T * 4
            + 2 * T * 4096 + 2 * 2 * T * 512 + 2 * T * 4096 + T * 4096 + 4 * 2 * 32 * 4096 + 16)
    moe = (2 * T * H + 4 * T + 2 * T * H + 2 * T * 128 + 2 * T * K + 8 * T * K
           + COPIES * H + 2 * COPIES * 2 * F + COPIES * F)
    return attn + moe


def test_row_1001_memory_by_hand(run1001):
    """Pipeline rank 1 (layers 24..47 one per chunk, final norm, LM head, loss):
    params bf16 2 x 2,582,487,040 (24 x 94,638,336 + head 311,164,928 + norm 2,048);
    grads bf16 the same; Adam 12 x (ceil(770,547,712 dense / 8) + 24 x 75,497,472 experts:
    expert-data-parallel group 16 / (pp 2 x ep 8) = 1). Activations at its peak: Megatron's
    warm-up on rank 1 is 2 (2 - 1 - 1) + (24 - 1) 2 = 46 forwards, then the 47th (the loss
    chunk) runs before the first backward: 47 layers plus the loss chunk's post block
    (the bf16 logits 2 x 4096 x 151,936 x 2 bytes, the LM head's bf16 input 2Th, the
    final norm's rstd 4T, the bf16 loss scalar 2). Rank 0: warm-up 48 then 1F1B; its peak
    is after the first backward (which frees a chunk-23 layer) when the 50th forward, a 4th
    micro-batch of chunk 0, starts: 4 x chunk 0 + 45 layers, chunk 0 being a layer plus its
    input (the embedding output, bf16 2Th; later layers' inputs are the previous layer's
    output, counted there), the token ids and labels (int64 8T each) and RoPE's cos / sin
    tables (2 x 4096 x 128 bf16). The whole total stays under the 80 GB the vendor ran on."""
    model, res = run1001
    layer = layer_activation_bytes()
    assert layer == 768_409_616
    acts = model.costs.activations
    assert acts.by_block[1] == layer
    r1 = res.memory_per_stage[1]
    p1 = 24 * 94_638_336 + 311_164_928 + 2048
    dense1 = 24 * 19_140_864 + 311_164_928 + 2048
    assert r1["params"] == r1["grads"] == 2 * p1
    assert r1["optimizer"] == 12 * (-(-dense1 // 8) + 24 * 75_497_472)
    logits = 2 * 4096 * 151_936 * 2
    post = acts.by_block["post"]
    assert post == logits + 2 * T * H + 4 * T + 2 == 2_522_906_626
    assert r1["activations"] == 47 * layer + post
    assert r1["loss_temporaries"] == 0
    assert r1["fp8_weights"] == 24 * 7 * 12_312
    r0 = res.memory_per_stage[0]
    chunk0 = layer + 2 * T * H + 8 * T + 8 * T + 2 * 4096 * 128 * 2
    assert chunk0 == acts.by_block[0] + acts.by_block["pre"] == 804_192_272
    assert r0["activations"] == 4 * chunk0 + 45 * layer
    assert res.max_memory_bytes == max(r0["total"], r1["total"]) < 80e9


# -- bad input ------------------------------------------------------------------------------

def test_a_bad_moe_probs_value_names_the_field(tmp_path):
    from simulator.profiles.loader import load_profile_file
    from simulator.profiles.spec import ProfileError

    f = tmp_path / "mine.yaml"
    f.write_text("extends: megatron-core\nname: mine\nkernels:\n"
                 "  moe_probs: {value: router, provenance: test}\n")
    with pytest.raises(ProfileError, match="moe_probs"):
        load_profile_file(f)


def test_an_uneven_layer_count_is_a_refusal_naming_n_layers():
    from experiments.measured_rows import EXTRA_CSVS, load_rows, parse_row

    row = next(r for r in load_rows(EXTRA_CSVS[0]) if r["row_id"] == "1001")
    bad = parse_row({**row, "n_layers": "47"})
    assert not bad.expressible and bad.why.startswith("n_layers") and "pp x vpp = 48" in bad.why


def test_the_state_model_names_agree_in_the_schema_and_the_registry():
    """``simulator.profiles.spec.STATE_MODELS`` (documented names), the schema's Literal and
    ``simulator.model_states.STATE_MODELS`` (the functions) name the same state models, so a
    profile can name ``megatron-ddp`` and the docs list it."""
    from typing import get_args

    from simulator import model_states
    from simulator.profiles import spec

    literal = get_args(spec.StateModel.model_fields["value"].annotation)
    assert set(spec.STATE_MODELS) == set(literal) == set(model_states.STATE_MODELS)
