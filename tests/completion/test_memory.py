"""Memory model: ZeRO model states, activations read from programs, recompute, and the
in-flight count from a simulated schedule.

References: ZeRO (Rajbhandari et al. 2020) per-GPU formulas and Korthikanti et al. 2022
s*b*h*(34 + 5as/h) bytes per layer, both in shared/reference/formulas.md; ZB paper Table 2
for the per-worker memory of ZB-H1."""

from __future__ import annotations

import pytest

from completion import append_backward, build_model
from completion.models import megatron_2021
from simulator import memory as mem
from simulator.pipeline_sim import simulate_pipeline
from simulator.schedules import build_schedule


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_zero_model_states_match_the_formulas(n):
    prog = build_model("megatron-1.7b", batch_size=1, num_layers=2)
    p = prog.num_parameters() * n  # a parameter count divisible by N: no uneven split
    opt = mem.optimizer_bytes_per_param("bfloat16", "adamw")
    assert opt == 12
    expect = {0: 16 * p, 1: (2 + 2) * p + 12 * p // n, 2: 2 * p + 14 * p // n, 3: 16 * p // n}
    for stage, total in expect.items():
        ms = mem.zero_model_states(p, n, stage, 2, 2, opt)
        assert ms.total == total
    assert mem.zero_model_states(p, n, 2).grads == 2 * p // n
    with pytest.raises(ValueError, match="ZeRO stage"):
        mem.zero_model_states(p, n, 4)


#: the layer the Korthikanti checks read: the second of two, so that its input is the
#: first layer's output (kept in block 0) and its output the final norm's input
LAYER = 1


def megatron_layer(b: int, s: int, h: int, a: int):
    """Layers of GPT as Megatron-LM 2021 ran them (the builder's GPT with
    ``megatron_2021``: unfused attention, dropout 0.1) of hidden size h and a heads, in a
    whole two-layer model (embeddings, head, loss), backward appended: block
    :data:`LAYER` is the layer checked."""
    cfg = megatron_2021("megatron-1.7b").replace(hidden_size=h, num_heads=a, num_kv_heads=a,
                                                  ffn_hidden_size=4 * h, num_layers=2)
    prog = build_model(cfg, b, seq_len=s, dtype="bfloat16")
    append_backward(prog)
    return prog


@pytest.mark.parametrize("b,s,h,a", [(1, 2048, 2304, 24), (2, 1024, 4096, 32)])
def test_megatron_layer_activations_match_korthikanti(b, s, h, a):
    prog = megatron_layer(b, s, h, a)
    sbh = s * b * h

    def layer_bytes(mode):
        (st,) = mem.saved_activations(prog, mode).values()
        return st

    none = layer_bytes("none")
    assert none.by_block[LAYER] == pytest.approx(sbh * (34 + 5 * a * s / h), rel=0.05)
    # selective recompute drops exactly the attention core's 5as/h term
    sel = layer_bytes("selective")
    assert sel.by_block[LAYER] == pytest.approx(sbh * 34, rel=0.05)
    assert sel.dropped_by_block[LAYER] == sel.recompute_peak == pytest.approx(5 * a * s * s * b, rel=0.01)
    # full recompute keeps the layer input (2sbh) and re-materialises one layer in B
    full = layer_bytes("full")
    assert full.by_block[LAYER] == 2 * sbh
    assert full.recompute_peak == none.by_block[LAYER]


@pytest.mark.parametrize("t", [2, 4])
@pytest.mark.parametrize("sp", [False, True])
def test_megatron_layer_activations_with_tensor_parallel(t, sp):
    """Korthikanti et al. 2022: with sequence parallel s*b*h*(34 + 5as/h)/t (formulas.md);
    tensor parallel alone leaves the norms, residual and dropout masks replicated:
    s*b*h*(10 + 24/t + 5as/(ht)) (their eq. 2). The layer is annotated with
    shard_megatron on mesh [1, t], completed and partitioned; bytes are per rank."""
    from completion import ProcessMesh
    from completion.annotate import shard_megatron
    from completion.completer import Completer
    from completion.passes.partition import apply_partition_pass

    b, s, h, a = 1, 2048, 2304, 24
    prog = megatron_layer(b, s, h, a)
    shard_megatron(prog, ProcessMesh((1, t), tuple(range(t)), ("dp", "mp")), 0, 1,
                   sequence_parallel=sp)
    completer = Completer(prog)
    completer.complete_forward_annotation()
    completer.complete_backward_annotation()
    apply_partition_pass(prog)
    total = sum(st.by_block[LAYER] for st in mem.saved_activations(prog).values())
    sbh = s * b * h
    expect = sbh * (34 + 5 * a * s / h) / t if sp else sbh * (10 + 24 / t + 5 * a * s / (h * t))
    assert total == pytest.approx(expect, rel=0.05)


def test_flash_attention_gpt_layer_saves_32_sbh():
    """The builder's GPT layer (flash attention, no dropout): the 34sbh of Korthikanti
    minus the two 1-byte dropout masks; no s^2 term (by hand: 2+2+6+2 attention,
    2+2+8+8 MLP)."""
    b, s, h = 1, 2048, 2304
    prog = build_model("megatron-1.7b", batch_size=b, seq_len=s, num_layers=1)
    append_backward(prog)
    (st,) = mem.saved_activations(prog).values()
    assert st.by_block[0] == pytest.approx(32 * s * b * h, rel=0.005)
    # selective recompute drops only the flash kernel's own softmax statistics (fp32
    # [b, a, s]) and its seed: no s^2 activations exist to drop
    sel = mem.saved_activations(prog, "selective")[((), 0)]
    assert st.m_b - sel.m_b == b * 24 * s * 4 + 2 * 8


def _peaks(name, p, m, mb, mw):
    sched = build_schedule(name, p, m)
    res = simulate_pipeline(sched, {"F": 1.0, "B": 1.0, "W": 1.0}, 0.0)
    chunks = {(r, 0): (mb, mw) for r in range(p)}
    return mem.timeline_activation_peaks(res.timeline, p, chunks)


def test_in_flight_count_from_the_schedule():
    p, m = 4, 8
    assert _peaks("1F1B", p, m, 10.0, 3.0) == [40.0, 30.0, 20.0, 10.0]
    # ZB-H1, worker i (1-based) holds (p-i+1) M_B + (i-1) M_W at its peak (ZB Table 2)
    got = _peaks("ZBH1", p, m, 10.0, 3.0)
    assert got == [pytest.approx((p - i + 1) * 10 + (i - 1) * 3) for i in range(1, p + 1)]


def test_workspace_is_the_largest_single_op():
    prog = build_model("megatron-1.7b", batch_size=1, seq_len=512, num_layers=1)
    append_backward(prog)
    v = 51200
    # the loss: logits [1, 512, V] in and softmax [1, 512, V] out (bf16), plus labels
    assert mem.workspace_bytes(prog) >= 2 * 2 * 512 * v
    with pytest.raises(ValueError, match="recompute"):
        mem.saved_activations(prog, "some")


def test_loss_backward_and_its_working_set_belong_to_the_post_block():
    """The ``labels`` data op (struct name ``loss``) is created before the layers; the loss
    grads (same struct name) still belong to "post", the last stage, not to "pre". Working
    sets by hand (bf16, V = 50257, h = 2304, b s = 4096 tokens): "pre" at most the tied
    embedding's add_n (two [V, h] gradients in, one out); "post" the cross-entropy grad
    (softmax and logits grad [b, s, V], labels int64 and the loss grad [b, s, 1])."""
    from completion.ir import OpRole
    from simulator.blocks import assign_blocks

    b, s, vocab, h = 4, 1024, 50257, 2304
    prog = build_model("zb-gpt-1.5b", batch_size=b, seq_len=s, num_layers=2)
    append_backward(prog)
    blocks = assign_blocks(prog)
    grads = [op for op in prog.ops if op.role == OpRole.BACKWARD and op.struct_name == "loss"]
    assert {"mean_grad", "cross_entropy_with_softmax_grad"} <= {op.type for op in grads}
    assert {blocks[id(op)] for op in grads} == {"post"}

    def work(blk):
        return mem.workspace_bytes(prog, [op for op in prog.ops if blocks.get(id(op)) == blk])

    assert work("pre") == 3 * vocab * h * 2
    assert work("post") == 2 * b * s * vocab * 2 + b * s * (8 + 2)
