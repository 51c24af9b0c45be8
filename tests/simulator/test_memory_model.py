"""Issue 15: memory predictions a user can bet a job on.

Hand-derived values: the full-recompute bug of the issue (activations must grow by the
layer input, s*b*h*2 bytes, per layer and in-flight micro-batch), the model states of each
framework's state model (shared/reference/fidelity_notes.md "Memory by precision":
Megatron-LM's ``report_theoretical_memory`` figure and DeepSpeed's ZeRO-2/3 estimators), the
non-tensor lines of the breakdown and the fit rule peak <= usable x (1 - headroom).
"""

from __future__ import annotations

import pytest
import yaml

from clusters import load_cluster
from clusters.catalog import CATALOG_DIR
from clusters.errors import ClusterSpecError
from clusters.spec import parse_spec
from completion.models import build_model
from meshplan import Engine, Strategy
from simulator.errors import SimulatorError
from simulator.memory import ModelStates
from simulator.model_states import StateInputs, model_states
from simulator.profiles import load_profile
from simulator.step_memory import ALLOCATOR_LINES, OUTSIDE_LINES, allocator_bytes, communicators

MIB = 2**20
SEQ, HIDDEN = 4096, 4096
LAYER_INPUT = SEQ * 1 * HIDDEN * 2  # s * b * h bytes of bf16: what full recompute keeps per layer


def _acts(layers: int, **strategy) -> list[int]:
    s = Strategy(recompute="full", global_batch_size=64, **strategy)
    res = Engine("llama2-7b", "dgx-a100-80g", s, nodes=1, seq_len=SEQ,
                 num_layers=layers).step_model().run()
    return [m["activations"] for m in res.memory_per_stage]


@pytest.mark.parametrize("strategy, in_flight", [
    ({"dp": 8}, 1),                 # the issue's reproduction: mp = 1
    ({"dp": 4, "tp": 2}, 1),        # mp = 2 without sequence parallelism: input replicated
    ({"dp": 4, "pp": 2}, 2),        # 1F1B: rank 0 holds pp = 2 micro-batches of its layers
])
def test_full_recompute_activations_grow_linearly_in_layers(strategy, in_flight):
    """Full recompute keeps each layer's input per in-flight micro-batch (Korthikanti et al.
    2022, sec. 5): rank 0's activations grow by (layers it gains) x in_flight x s*b*h*2.
    The issue saw 0.309 GiB for both L = 8 and L = 32 with mp = 1."""
    pp = strategy.get("pp", 1)
    a8, a16, a32 = (_acts(L, **strategy)[0] for L in (8, 16, 32))
    step = (16 - 8) // pp * in_flight * LAYER_INPUT
    assert a16 - a8 == step and a32 - a16 == 2 * step


def test_megatron_weights_and_optimizer_figure():
    """fidelity_notes.md: Megatron-LM's report_theoretical_memory for llama2-7b, TP2 PP2 DP2
    with SP, gives 28,919 MiB of weights + optimizer (18 bytes per parameter) and 19,280 MiB
    with the distributed optimizer (6 + 12/dp). Megatron's count of the most loaded shard
    (megatron/training/theoretical_memory_usage.py): the tp-sharded layer weights / pp plus
    the embedding, over tp, plus the replicated norms (RMSNorm: h each, two per layer, and
    the final norm) / pp. The Engine's rank 0 holds the same except the final norm, which
    lives on the last stage where Megatron spreads it over the pp stages: h / pp = 2048
    parameters fewer, the whole difference (0.035 MiB; 0.023 MiB with the distributed
    optimizer)."""
    L, h, ffn, vocab, tp, pp, dp = 32, 4096, 11008, 32000, 2, 2, 2
    sharded = L * (2 * h * h * 2 + 2 * h * ffn * 3 / 2)   # attention (q,k,v,o) + SwiGLU MLP
    replicated = L * 2 * h + h                            # two RMSNorms per layer + final
    megatron_shard = (sharded / pp + h * vocab) / tp + replicated / pp
    assert megatron_shard == 1_684_670_464
    assert round(18 * megatron_shard / MIB) == 28_919
    assert round((6 + 12 / dp) * megatron_shard / MIB) == 19_280
    for zero, per_param in ((0, 18), (1, 6 + 12 // dp)):
        s = Strategy(dp=dp, tp=tp, pp=pp, zero=zero, sequence_parallel=True, global_batch_size=8)
        res = Engine("llama2-7b", "dgx-a100-80g", s, nodes=1, seq_len=4096,
                     layers_per_stage=[16, 16]).simulate()
        m = res.memory_per_stage[0]
        got = m["params"] + m["grads"] + m["optimizer"]
        assert got == per_param * (megatron_shard - h // pp)
    # the state model itself, fed Megatron's count, reproduces Megatron's bytes exactly
    x = StateInputs(params=megatron_shard, dp=dp, zero=0)
    assert model_states("megatron", x).total == 18 * megatron_shard == 30_324_068_352


@pytest.mark.parametrize("zero, gib, expect", [
    (2, 26.67, 2 * 6_738_415_616 + 18 * 6_738_415_616 // 8),
    (3, 14.61, 4 * 32000 * 4096 + 18 * 6_738_415_616 // 8),
])
def test_deepspeed_estimator_figures(zero, gib, expect):
    """fidelity_notes.md: DeepSpeed's estimators for llama2-7b (P = 6,738,415,616, largest
    layer the 32000 x 4096 embedding) on 1 x 8 GPUs: ZeRO-2 2P + 18P/N = 26.67 GiB, ZeRO-3
    4 x largest + 18P/N = 14.61 GiB, reproduced to the byte under the deepspeed profile."""
    assert build_model("llama2-7b", batch_size=1, seq_len=128).num_parameters() == 6_738_415_616
    s = Strategy(dp=8, zero=zero, framework="deepspeed", global_batch_size=8)
    m = Engine("llama2-7b", "dgx-a100-80g", s, nodes=1, seq_len=4096).simulate().memory_breakdown
    got = m["params"] + m["grads"] + m["optimizer"] + m["param_buffers"]
    assert got == expect and round(got / 2**30, 2) == gib


def test_state_models_by_hand():
    """P = 800 parameters over N = 8, 16-bit weights, 12 optimizer bytes."""
    def states(kind, zero, **kw):
        return model_states(kind, StateInputs(params=800, dp=8, zero=zero, **kw))

    assert states("plain", 1) == ModelStates(1600, 1600, 1200)
    assert states("megatron", 0) == ModelStates(1600, 3200, 9600)        # 18 P
    assert states("megatron", 1).total == 6 * 800 + 12 * 100            # distributed optimizer
    assert states("deepspeed", 1) == ModelStates(1600, 1600 + 400, 1200)
    assert states("deepspeed", 2).total == 2 * 800 + 18 * 100
    assert states("deepspeed", 3, largest_param=50) == ModelStates(200, 400, 1200, 4 * 50)
    # FSDP FULL_SHARD: fp32 sharded weights / grads / Adam, 16 P / N, plus 16-bit buffers:
    # root (30) + (prefetch 1 + 1) x block (100) gathered, the head's gradient (largest 20),
    # one block's gradient in bf16 + its fp32 reduce copy
    fs = states("fsdp", 3, largest_param=20, largest_block=100, root_params=30, prefetch=1)
    assert (fs.params, fs.grads, fs.optimizer) == (400, 400, 800)
    assert fs.buffers == 2 * (30 + 2 * 100) + 2 * 20 + (2 + 4) * 100
    assert states("fsdp", 2) == states("megatron", 2)
    with pytest.raises(SimulatorError, match="model-state model"):
        model_states("nope", StateInputs(params=1, dp=1, zero=0))
    with pytest.raises(SimulatorError, match="ZeRO stage"):
        model_states("megatron", StateInputs(params=1, dp=1, zero=4))


def test_non_tensor_lines_and_loss_temporaries():
    """megatron-core, llama2-7b on 8 A100s, tp 2 x dp 4, seq 1024: the loss keeps the fp32
    softmax of its vocab-parallel logits (1024 tokens x 32000 / 2 local, 4 bytes) and holds
    2 more bytes per logit while it runs; fragmentation is the profile's 5% of the allocator
    lines; CUDA context and cuBLAS workspace as the profile states; NCCL buffers for the
    world, tp and dp communicators."""
    prof = load_profile("megatron-core").memory
    s = Strategy(dp=4, tp=2, global_batch_size=4)
    res = Engine("llama2-7b", "dgx-a100-80g", s, nodes=1, seq_len=1024).simulate()
    m = res.memory_breakdown
    logits = 1024 * 32000 // 2
    assert m["loss_temporaries"] == 2 * logits
    assert m["cuda_context"] == prof.cuda_context_bytes.value
    assert m["library_workspace"] == prof.workspace_bytes.value
    assert m["nccl_buffers"] == 3 * prof.nccl_buffer_bytes.value
    tensors = sum(m.get(k, 0) for k in ALLOCATOR_LINES if k != "fragmentation")
    assert m["fragmentation"] == round(0.05 * tensors)
    assert m["total"] == allocator_bytes(m) + sum(m[k] for k in OUTSIDE_LINES)
    assert m["total"] == res.max_memory_bytes
    # the fp32 softmax replaces the program's bf16 one: 2 more bytes per logit saved
    eager = Engine("llama2-7b", "dgx-a100-80g", s.replace(framework="eager"), nodes=1,
                   seq_len=1024).simulate().memory_breakdown
    assert m["activations"] - eager["activations"] == 2 * logits


def test_communicators():
    assert communicators(1, 1, 1, False) == 0
    assert communicators(8, 1, 1, False) == 2       # world + dp
    assert communicators(2, 2, 2, True) == 5        # world + tp + dp + pp + embedding group
    assert communicators(1, 1, 4, False) == 2
    # a hunt: cp had no communicator (--dp 8, --dp 2 --cp 4 and --cp 8 all 0.12 GiB). dp is
    # the gradient group, dp x cp: cp 4 of 8 ranks adds the cp ring's group
    assert communicators(8, 1, 1, False, cp=4) == 3      # world + dp x cp + cp
    assert communicators(8, 1, 1, False, cp=8) == 3
    # ep 4 of dp 8: the all_to_all group and the expert-data-parallel group (8 / 4 = 2)
    assert communicators(8, 1, 1, False, ep=4) == 4
    assert communicators(8, 1, 1, False, ep=8) == 3      # ep = dp: no expert-dp group


def test_capacity_reserve_and_headroom():
    """An "80 GB" H100 has 80 GiB of HBM; nvidia-smi reports 81559 MiB of it; a plan fits
    when peak <= usable x (1 - headroom)."""
    d = load_cluster("dgx-h100").device
    assert d.memory_bytes.value == 80 * 2**30
    assert d.usable_bytes == 81559 * MIB
    assert d.memory_limit(0.05) == pytest.approx(81559 * MIB * 0.95, rel=1e-15)
    assert d.memory_limit(0.0) == d.usable_bytes
    for bad in (-0.1, 1.0, 2):
        with pytest.raises(ValueError, match="headroom"):
            d.memory_limit(bad)


def test_reserve_must_be_below_capacity():
    """A reserve at or above the capacity is refused, naming the field."""
    data = yaml.safe_load((CATALOG_DIR / "dgx-h100.yaml").read_text())
    data["device"]["memory_reserved_bytes"] = {"value": 9e10, "provenance": "x"}
    with pytest.raises(ClusterSpecError, match="memory_reserved_bytes"):
        parse_spec(data)


def test_memory_timeline_counter_track_and_png(tmp_path):
    """pp = 2, 1F1B, m = 4: each rank's counter track peaks at its breakdown's activations
    (rank 0 holds pp = 2 micro-batches of its layers at once), starts and ends at 0
    activations, and carries the bytes held all step; the PNG is written."""
    import json

    from meshplan.cli import main
    from simulator.memory import timeline_activation_peaks
    from simulator.memory_timeline import activation_curves, static_bytes

    s = Strategy(dp=1, pp=2, global_batch_size=4)
    res = Engine("megatron-1.7b", "dgx-a100-80g", s, nodes=1, seq_len=512).simulate()
    curves = activation_curves(res.sim.timeline, 2, res.activation_per_chunk)
    peaks = timeline_activation_peaks(res.sim.timeline, 2, res.activation_per_chunk)
    for r in range(2):
        assert max(b for _, b in curves[r]) == peaks[r] == res.memory_per_stage[r]["activations"]
        assert curves[r][0][0] == 0 and curves[r][-1][1] == pytest.approx(0.0, abs=1e-3)
    mb0 = res.activation_per_chunk[(0, 0)][0]
    assert peaks[0] == pytest.approx(2 * mb0, rel=1e-12)
    trace, png = tmp_path / "t.json", tmp_path / "m.png"
    args = ["cost", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80g", "--pp", "2",
            "--global-batch", "4", "--seq-len", "512", "--trace", str(trace), "--memory-png", str(png)]
    assert main(args) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    counters = [e for e in events if e["ph"] == "C" and e["name"] == "memory rank 0 (GiB)"]
    assert max(e["args"]["activations"] for e in counters) == pytest.approx(peaks[0] / 2**30)
    assert {e["args"]["held"] for e in counters} == {static_bytes(res.memory_per_stage[0]) / 2**30}
    assert any(e["ph"] == "X" for e in events)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_issue_70b_plan_is_refused_by_the_scorer():
    """The plan the issue's 70B search recommended at 74.45 of 74.51 GiB (dp64 mp1 pp2 vpp2
    ZBVPP, full recompute, ZeRO-2 on 16 DGX H100) needs more than the usable memory less
    5 % headroom: ZeRO-2 keeps the 16-bit weights of half the model (34.5e9 x 2 bytes)
    unsharded, and the fp32 main gradients and the non-tensor lines come on top. The
    tuner's scorer uses the same limit, so it scores the plan infeasible."""
    from meshplan.tuning import make_scorer
    from tuner.space import Candidate

    cfg = {"model": "llama2-70b", "cluster": "dgx-h100", "nodes": 16, "global_batch_size": 1024,
           "seq_len": 4096}
    cand = Candidate(dp=64, tp=1, pp=2, vpp=2, schedule="ZBVPP", recompute="full", zero=2)
    score = make_scorer(cfg)(cand)
    limit = load_cluster("dgx-h100").device.memory_limit(0.05)
    assert score.memory_limit_bytes == int(limit)
    assert score.memory_bytes > limit and not score.feasible
    assert make_scorer({**cfg, "memory_headroom": 0.2})(cand).memory_limit_bytes == int(
        load_cluster("dgx-h100").device.memory_limit(0.2))


def test_tune_takes_the_memory_headroom(tmp_path):
    """``meshplan tune --memory-headroom 0.5``: every scored plan is held to half the
    usable memory (history.csv's memory_limit_bytes), and the best plan fits it."""
    import pandas as pd

    from meshplan.cli import main

    out = tmp_path / "run"
    args = ["tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
            "--global-batch", "32", "--seq-len", "4096", "--layers", "4", "--no-progress",
            "--trials", "6", "--seed", "1", "--storage", "memory", "--output", str(out),
            "--memory-headroom", "0.5"]
    assert main(args) == 0
    hist = pd.read_csv(out / "history.csv")
    limit = int(load_cluster("dgx-a100-80g").device.memory_limit(0.5))
    scored = hist[hist["memory_limit_bytes"].notna()]
    assert len(scored) and (scored["memory_limit_bytes"] == limit).all()
    assert main(args[:-1] + ["1.5"]) != 0  # a headroom outside [0, 0.99] is refused


def test_fsdp_buffers_of_llama3_8b_by_hand():
    """torchtitan FSDP2 (profile fsdp2-eager, prefetch 1) of Llama 3.1 8B on 8 GPUs
    (measured_runs row 60): the root unit (embedding and head 128256 x 4096 each, final
    norm 4096) gathered in bf16 for the whole backward, two blocks of 218,112,000
    parameters (q, o 4096^2; k, v 4096 x 1024; SwiGLU 3 x 4096 x 14336; two norms) in
    flight, the head's unsharded bf16 gradient, one block's bf16 gradient with its fp32
    reduce copy; the fp32 states 16 bytes x P / 8."""
    from experiments.measured_rows import parse_all

    (spec,) = [p for p in parse_all() if p.expressible and p.row_id == 60]
    m = Engine(spec.model, spec.cluster, spec.strategy, nodes=spec.nodes,
               seq_len=spec.seq_len).simulate().memory_breakdown
    head, root = 128256 * 4096, 2 * 128256 * 4096 + 4096
    block = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert block == 218_112_000
    assert m["param_buffers"] == 2 * (root + 2 * block) + 2 * head + (2 + 4) * block
    p = root + 32 * block
    assert p == 8_030_261_248
    assert (m["params"], m["grads"], m["optimizer"]) == (4 * p // 8, 4 * p // 8, 8 * p // 8)
    # the loss: 2 x 8192 tokens x 128256 logits, fp32 log-softmax gradients 8 bytes each
    assert m["loss_temporaries"] == 8 * 2 * 8192 * 128256


def test_memory_png_curve_rises_and_falls_with_each_micro_batch_at_pp_1():
    """The PNG's curve (``activation_ramps``) draws each forward's activations building up
    and each backward's draining; the step curve charges a forward at its start, so at
    pp = 1 (each micro-batch's B ends where the next F starts) it sat flat at M_B all
    step. Both curves have the same peak, the breakdown's activations, at pp = 1 and 2;
    at pp = 1 the ramp curve reaches it once per micro-batch and returns to 0 between."""
    from simulator.memory import timeline_activation_peaks
    from simulator.memory_timeline import activation_ramps

    for pp, m in ((1, 4), (2, 4)):
        s = Strategy(dp=1, pp=pp, global_batch_size=m)
        res = Engine("megatron-1.7b", "dgx-a100-80g", s, nodes=1, seq_len=512).simulate()
        ramps = activation_ramps(res.sim.timeline, pp, res.activation_per_chunk)
        peaks = timeline_activation_peaks(res.sim.timeline, pp, res.activation_per_chunk)
        for r in range(pp):
            assert max(b for _, b in ramps[r]) == pytest.approx(peaks[r], rel=1e-12)
            assert peaks[r] == res.memory_per_stage[r]["activations"]
            assert ramps[r][-1][1] == pytest.approx(0.0, abs=1e-3)
            assert all(t1 >= t0 for (t0, _), (t1, _) in zip(ramps[r], ramps[r][1:], strict=False))
        if pp == 1:
            mb = res.activation_per_chunk[(0, 0)][0]
            tops = [b for _, b in ramps[0] if b == pytest.approx(mb, rel=1e-9)]
            lows = [b for _, b in ramps[0][1:] if abs(b) < 1e-3 * mb]
            assert len(tops) == m and len(lows) == m  # m rises to M_B, m returns to 0


def test_the_engine_counts_the_cp_and_expert_communicators():
    """The Engine path (not only the arithmetic): nccl_buffers = communicators x the
    profile's bytes per communicator, with cp's ring group (dp 2 x cp 4) and ep's two groups."""
    from meshplan import Engine, Strategy
    from simulator.profiles import load_profile

    per = load_profile("megatron-core").memory.nccl_buffer_bytes.value
    def nccl(model, **kw):
        s = Strategy(global_batch_size=8, zero=1, recompute="full", **kw)
        return Engine(model, "dgx-h100", s, seq_len=8192, num_layers=2).simulate().memory_breakdown["nccl_buffers"]
    assert nccl("llama2-7b", dp=8) == int(per * 2)            # world + dp
    assert nccl("llama2-7b", dp=2, cp=4) == int(per * 3)      # world + dp x cp + cp
    assert nccl("qwen3-30b-a3b", dp=8, ep=4) == int(per * 4)  # world + dp + ep + expert dp
