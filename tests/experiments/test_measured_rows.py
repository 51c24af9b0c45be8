"""experiments.measured_rows: real rows of shared/data/measured_runs.csv parsed into a
ModelConfig, a catalog cluster and a Strategy (expectations checked by hand against the
CSV and shared/reference/*.md); refusals name the field; every row parses or is refused.
experiments.measured_runs: summaries by hand, one row's Engine failure stays that row's."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from clusters import load_cluster
from completion.models import get_model_config
from completion.strategy import Strategy
from experiments import measured_runs as mr
from experiments.measured_cells import read_vocab
from experiments.measured_rows import (
    GRAND_TETON,
    UNSUPPORTED,
    Refused,
    RunSpec,
    load_rows,
    parse_all,
    parse_row,
    read_peak_memory,
)
from meshplan.engine import Engine
from tests.conftest import SHARED

CSV = SHARED / "data" / "measured_runs.csv"


@pytest.fixture(scope="module")
def rows() -> dict[int, dict[str, str]]:
    """The CSV rows by row_id."""
    return {int(r["row_id"]): r for r in load_rows(CSV)}


def spec(rows, rid: int) -> RunSpec:
    """Row ``rid`` parsed; it must be expressible."""
    got = parse_row(rows[rid])
    assert isinstance(got, RunSpec), got
    assert got.expressible and got.row_id == rid
    return got


def test_megatron_2021_1_7b(rows):
    """Table 1 row 1.7B: GPT 24 x 2304, 24 heads, Megatron's default dropout 0.1; dp 32,
    mbs 16, gbs 512, full recompute, fp16 on Selene (4 nodes), torch DDP (pp = 1 in
    examples/sc21/run_table_1.sh); 76.1B: VPP with v = 3, Megatron's local DDP."""
    s = spec(rows, 15)
    m = s.model
    assert (m.family, m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads) == ("gpt", 24, 2304, 24, 24)
    assert (m.ffn_hidden_size, m.vocab_size, m.seq_len, m.tie_word_embeddings) == (9216, 51200, 2048, True)
    assert (m.attention_dropout, m.hidden_dropout) == (0.1, 0.1)
    st = s.strategy
    assert (st.dp, st.tp, st.pp, st.vpp, st.schedule) == (32, 1, 1, 1, "1F1B")
    assert (st.micro_batch_size, st.global_batch_size, st.recompute) == (16, 512, "full")
    assert (st.zero, st.sequence_parallel, st.dtype) == (0, False, "float16")
    assert (st.framework, st.attention) == ("megatron-2021-torch-ddp", "unfused")
    assert (s.cluster, s.nodes, s.num_gpus, s.seq_len) == ("selene", 4, 32, 2048)
    assert load_cluster(s.cluster).device.name.startswith("A100")
    assert (s.step_time_s, s.step_time_origin) == (3.528, "derived_step_time_s")
    assert s.peak_mem_bytes is None and s.approximations == ()
    assert any("run_table_1.sh" in a for a in s.assumptions)  # the row's own assumptions
    assert s.layout == "dp32 tp1 pp1 mbs16 gbs512 zero0 rc=full fp16 s2048"
    # the interleaved rows: vpp from the row, schedule VPP
    big = spec(rows, 20).strategy
    assert (big.tp, big.pp, big.vpp, big.schedule, big.micro_batch_size) == (8, 4, 3, "VPP", 2)
    assert big.framework == "megatron-2021"


def test_nemo_gpt3_175b(rows):
    """NeMo GPT-3 175B on 128 H100: padded vocab 50688, tp 4 pp 8 vpp 12, SP, distributed
    optimizer (ZeRO-1), measured 8.91 s/step."""
    s = spec(rows, 368)
    m = s.model
    assert (m.family, m.num_layers, m.hidden_size, m.num_heads, m.ffn_hidden_size) == ("gpt", 96, 12288, 96, 49152)
    assert m.vocab_size == 50688 and m.tie_word_embeddings  # "GPT2BPE 50257 padded to 50688"
    assert any("50688" in a for a in s.assumptions)
    st = s.strategy
    assert (st.dp, st.tp, st.pp, st.vpp, st.schedule) == (4, 4, 8, 12, "VPP")
    assert (st.micro_batch_size, st.global_batch_size, st.num_microbatches) == (1, 256, 64)
    assert (st.zero, st.sequence_parallel, st.recompute, st.dtype) == (1, True, "none", "bfloat16")
    assert (st.framework, st.attention) == ("nemo", "flash")  # NeMo 24.05: Apex DistributedFusedAdam
    assert (s.cluster, s.nodes) == ("dgx-h100", 16)
    assert (s.step_time_s, s.step_time_origin) == (8.91, "step_time_s")


def test_mpt_rows(rows):
    """MPT: GPT family with tied embeddings and vocab 50368, FSDP FULL_SHARD -> ZeRO-3,
    SHARD_GRAD_OP -> 2, the A100 40/80 GB and H100 catalog entries."""
    s = spec(rows, 92)  # MPT-70b, 512 H100
    m = s.model
    assert (m.family, m.num_layers, m.hidden_size, m.num_heads, m.ffn_hidden_size) == ("gpt", 80, 8192, 64, 32768)
    assert (m.vocab_size, m.seq_len, m.tie_word_embeddings) == (50368, 2048, True)
    st = s.strategy
    assert (st.dp, st.tp, st.pp, st.zero, st.recompute) == (512, 1, 1, 3, "full")
    assert (st.micro_batch_size, st.global_batch_size) == (8, 4096)
    assert (st.framework, st.attention, st.dtype) == ("llm-foundry", "flash", "bfloat16")
    assert (s.cluster, s.nodes, s.step_time_s) == ("dgx-h100", 64, 16.268)
    assert any("SXM assumed" in a for a in s.assumptions)
    assert any("gpus_per_node 8 assumed" in a for a in s.assumptions)
    assert spec(rows, 104).strategy.zero == 2  # SHARD_GRAD_OP
    a40 = spec(rows, 296)  # A100 40GB, 1600 Gbps RoCE
    assert (a40.cluster, a40.nodes, a40.model.num_layers, a40.model.hidden_size) == ("dgx-a100-40g", 1, 24, 1024)
    assert any("RoCE" in a for a in a40.approximations)
    assert spec(rows, 170).cluster == "dgx-a100-80g"


def test_torchtitan_fsdp2_row(rows):
    """torchtitan Table 1 FSDP row: Llama 3.1 8B (GQA 8), seq 8192 assumed, FSDP2 ->
    ZeRO-3, Grand Teton cluster, 82.4 GiB reserved."""
    s = spec(rows, 60)
    m = s.model
    assert (m.family, m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads) == ("llama", 32, 4096, 32, 8)
    assert (m.ffn_hidden_size, m.vocab_size, m.tie_word_embeddings) == (14336, 128256, False)
    assert s.seq_len == m.seq_len == 8192
    assert any("seq_len 8192 assumed" in a for a in s.assumptions)
    st = s.strategy
    # "selective (op-level SAC)": torchtitan's op policy, not Megatron's attention core
    assert (st.dp, st.tp, st.pp, st.zero, st.recompute) == (8, 1, 1, 3, "selective-op")
    # torch.compile=no in the row: the eager FSDP2 profile
    assert (st.micro_batch_size, st.global_batch_size, st.framework) == (2, 16, "fsdp2-eager")
    assert spec(rows, 61).strategy.framework == "fsdp2"
    assert (s.cluster, s.nodes) == (GRAND_TETON, 1)
    spec_c = load_cluster(GRAND_TETON)
    assert spec_c.device.memory_bytes.value == 96e9
    assert spec_c.device.memory_bandwidth.value == 2.4e12
    assert s.peak_mem_bytes == pytest.approx(82.4 * 2**30)
    assert s.peak_mem_convention == "GiB, reserved, max over GPUs"
    assert s.step_time_s == 2.843
    assert spec(rows, 61).approximations[-1].startswith("torch.compile")


@pytest.mark.parametrize("rid, keys, field", [
    (72, ("unreadable micro_batch_size",), "micro_batch_size"),  # 405B NeMo: not stated
])
def test_only_unstated_rows_are_refused(rows, rid, keys, field):
    """FP8, squared-ReLU and cp > 1 rows are all expressible now (issue 17); a row is
    refused only when a figure the model needs is not stated, the reason naming the column."""
    assert UNSUPPORTED == ()
    got = parse_row(rows[rid])
    assert isinstance(got, Refused) and not got.expressible
    assert got.reasons == keys and got.row_id == rid
    assert got.why.startswith(f"{field}: ") and "not stated" in got.why and "\n" not in got.why


def test_squared_relu_rows_are_expressible(rows):
    """Nemotron-4 (squared-ReLU, non-gated, RoPE, GQA, layernorm1p without linear biases):
    a relu2 MLP on the llama positions with a layer_norm (issue 17)."""
    s = spec(rows, 342)
    m = s.model
    assert (m.mlp_activation, m.gated_mlp, m.resolved_norm, m.resolved_positions) == ("relu2", False, "layer_norm", "rope")
    assert (m.bias("qkv"), m.bias("mlp"), m.num_kv_heads) == (False, False, 8)
    assert any("layer_norm with weight and bias" in a for a in s.approximations)
    assert spec(rows, 350).strategy.fp8 == "te-delayed"  # FP8 + squared ReLU


@pytest.mark.parametrize("rid, recipe, framework", [
    (62, "tensorwise", "fsdp2"),       # torchtitan "torchao Float8, dynamic tensorwise"
    (70, "tensorwise", "fsdp2"),       # "torchao Float8": the default recipe (an assumption)
    (162, "te-delayed", "llm-foundry"),  # Composer amp_fp8 = TE delayed scaling
    (374, "te-delayed", "nemo"),  # NeMo FP8 hybrid
])
def test_fp8_rows_carry_their_recipe(rows, rid, recipe, framework):
    s = spec(rows, rid)
    assert (s.strategy.fp8, s.strategy.dtype, s.strategy.framework) == (recipe, "bfloat16", framework)
    assert f"fp8-{recipe}" in s.layout
    implicit = rid in (70, 162)
    assert any("Float8 recipe not stated" in a or "amp_fp8" in a for a in s.assumptions) == implicit


def test_fp8_row_predicted_within_the_target(rows):
    """torchtitan Llama 3.1 70B FP8 (row 70: 256 H100, tp 8 with sequence parallelism,
    FSDP2 over 32, torchao tensorwise, compile): within 15 % with no fitted FP8 constant."""
    s = spec(rows, 70)
    got = Engine(s.model, s.cluster, s.strategy, nodes=s.nodes, seq_len=s.seq_len).simulate().step_time
    assert abs(got / s.step_time_s - 1) <= 0.15


def test_context_parallel_rows(rows):
    """NeMo 24.09 rows with cp 2 (issue 17): Llama 3.1 8B dp 4 x cp 2 on 8 GPUs, and
    Llama 3.1 70B tp 4 pp 4 vpp 5 cp 2 with sequence parallelism on 64 GPUs (dp 2): the cp
    degree is the row's, and the GPUs are dp * cp * tp * pp."""
    s = spec(rows, 308)
    assert (s.strategy.dp, s.strategy.cp, s.strategy.tp, s.strategy.pp) == (4, 2, 1, 1)
    assert s.num_gpus == 8 and s.strategy.world_size == 8 and "cp2" in s.layout
    s = spec(rows, 318)
    st = s.strategy
    assert (st.dp, st.cp, st.tp, st.pp, st.vpp, st.sequence_parallel) == (2, 2, 4, 4, 5, True)
    assert s.num_gpus == 64 == st.world_size and s.seq_len == 8192 and st.cp_comm == "p2p"
    # torchtitan all-gathers K/V (its rotate method's default at 9dec370)
    t = spec(rows, 64)
    assert (t.strategy.cp, t.strategy.cp_comm) == (2, "all_gather")
    assert any("rotate_method" in a for a in t.assumptions)


def test_every_row_parses_or_is_refused():
    """All 171 rows: a consistent RunSpec, or a refusal from the UNSUPPORTED table (never
    a misread cell, never an exception)."""
    parsed = parse_all(CSV)
    assert len(parsed) == 171
    table_keys = {u.key for u in UNSUPPORTED}
    for p in parsed:
        if p.expressible:
            assert isinstance(p.strategy, Strategy) and p.step_time_s > 0
            assert p.strategy.world_size == p.num_gpus <= p.nodes * 8
            assert p.model.seq_len == p.seq_len
        elif p.reasons[0].startswith("unreadable "):  # a figure the row leaves unstated
            assert "not stated" in p.why, p
        else:
            assert p.why and set(p.reasons) <= table_keys, p  # no cell the parser misread
    ok = [p for p in parsed if p.expressible]
    assert len(ok) >= 100
    assert {p.source_id for p in ok} == {"mpt_llmfoundry", "dgxc_bench_24.11",
                                         "torchtitan_2412", "narayanan2021_table1"}


def test_cell_readers_by_hand(rows):
    """Vocab and memory cells, an unreadable cell, the tokens/s fallback, ALiBi."""
    assert read_vocab("GPT2BPE 50257 padded to 50688 (128*TP4)")[0] == 50688
    assert read_vocab("128256 (HF Llama-3 tokenizer)") == (128256, None)
    assert read_peak_memory({"peak_mem_gb": "80", "peak_mem_notes": "GB allocated"}) == (80e9, "GB, allocated, per GPU")
    assert read_peak_memory({"peak_mem_gb": ""}) == (None, "")
    base = dict(rows[60])
    # an unreadable cell is a refusal naming its column, not an exception
    bad = parse_row({**base, "micro_batch_size": "not stated (local batch 8)"})
    assert isinstance(bad, Refused) and bad.why.startswith("micro_batch_size") and bad.reasons == ("unreadable micro_batch_size",)
    # no step time columns: global tokens / (tokens/s/GPU * GPUs) = 131072 / (5762 * 8)
    s = parse_row({**base, "derived_step_time_s": ""})
    assert s.step_time_s == pytest.approx(131072 / (5762 * 8))
    assert s.step_time_origin.startswith("global_batch_tokens")
    # ALiBi is modelled as the family's positions, and listed
    alibi = parse_row({**dict(rows[92]), "pos_embedding": "ALiBi"})
    assert any("ALiBi" in a and "learned" in a for a in alibi.approximations)


def test_engine_takes_a_model_config():
    """A ModelConfig object costs the same as the catalog name it came from."""
    cfg = get_model_config("llama2-7b").replace(num_layers=2)
    strat = Strategy(dp=2, tp=2, micro_batch_size=1, global_batch_size=4)
    by_cfg = Engine(cfg, "dgx-a100-80g", strat, seq_len=512).simulate()
    by_name = Engine("llama2-7b", "dgx-a100-80g", strat, seq_len=512, num_layers=2).simulate()
    assert by_cfg.step_time == pytest.approx(by_name.step_time)
    assert by_cfg.max_memory_bytes == by_name.max_memory_bytes


def test_engine_failure_is_the_rows_error(rows):
    """An exception in the Engine is recorded as the row's status, not raised."""
    s = spec(rows, 15)
    broken = RunSpec(**{**s.__dict__, "cluster": "no-such-cluster"})
    got = mr.predict(broken)
    assert math.isnan(got["predicted_s"]) and got["status"].startswith("error: ")
    assert "no-such-cluster" in got["status"]


def test_by_source_by_hand():
    """MAPE, signed error, worst row and held-out split on four hand-made rows."""
    df = pd.DataFrame({
        "row_id": [1, 2, 3, 4], "source": ["a", "a", "b", "b"],
        "error_pct": [10.0, -30.0, 5.0, math.nan], "fitted": [True, False, False, False],
        "status": ["ok", "ok", "ok", "error: X"],
    })
    t = mr.by_source(df).set_index("source")
    assert t.loc["a", "n"] == 2 and t.loc["a", "MAPE_pct"] == 20.0 and t.loc["a", "signed_pct"] == -10.0
    assert t.loc["a", "worst_row"] == 2 and t.loc["a", "worst_error_pct"] == -30.0
    assert t.loc["a", "held_out_n"] == 1 and t.loc["a", "held_out_MAPE_pct"] == 30.0
    assert t.loc["b", "n"] == 1 and t.loc["b", "failed"] == 1
    assert t.loc["all", "n"] == 3 and t.loc["all", "MAPE_pct"] == pytest.approx(15.0)
    fits = [mr.Fit("device.efficiency.gemm", "selene", 0.8, (15, 16))]
    assert mr.fitted_rows(fits) == {15, 16}


def test_recorded_fits_are_the_fit_plan_and_the_cluster_yamls():
    """Every constant in ``FITS`` was fitted on the rows ``fit_constants.FIT_PLAN`` names,
    at most two per device type, and its value is the one every catalog cluster of that
    device carries, marked FITTED in its provenance with those rows."""
    from experiments.fit_constants import DEVICES, FIT_PLAN

    plan = {(c.device, c.field): c.rows for c in FIT_PLAN}
    assert {(f.device, f.constant.removeprefix("device.efficiency.")) for f in mr.FITS} == set(plan)
    for dev in DEVICES:
        assert sum(1 for f in mr.FITS if f.device == dev) <= 2
    for f in mr.FITS:
        field = f.constant.removeprefix("device.efficiency.")
        assert f.rows == plan[(f.device, field)]
        for name in DEVICES[f.device]:
            node = load_cluster(name).device.efficiency
            for part in field.split("."):
                node = node[part] if isinstance(node, dict) else getattr(node, part)
            assert node.value == f.value, (name, field)
            assert node.provenance.startswith("FITTED")
            assert ",".join(map(str, f.rows)) in node.provenance


def test_unfitted_defaults_are_the_physical_values():
    """The "no fitted constant" check uses the GEMM plateau 0.65 and the Triton kernel at half
    the device's FlashAttention-2 efficiency (FA2 is 2x FA1; the Triton kernel is FA1-class):
    by hand A100 0.5 x 0.55 = 0.275, H100 0.5 x 0.33 = 0.165 -- never a fitted value."""
    from experiments.fit_constants import unfitted

    got = unfitted()
    assert got["A100"] == pytest.approx({"gemm": 0.65, "attention_kernels.triton": 0.275})
    assert got["H100"] == pytest.approx({"gemm": 0.65, "attention_kernels.triton": 0.165})
    fitted = {(f.device, f.constant.removeprefix("device.efficiency.")): f.value for f in mr.FITS}
    assert all(got[d][k] != v for (d, k), v in fitted.items())


def test_async_tp_rows_and_the_power_capped_peak():
    """torchtitan row 71 ("2D + AsyncTP") runs the fsdp2-async-tp profile, its twin row 70
    plain fsdp2; the Grand Teton bf16 peak is the SXM peak scaled by the measured 500 W /
    700 W ratio of one GEMM: 989 x 585.2 / 797.5 = 725.7 TFLOP/s (3 significant digits)."""
    from experiments import measured_rows as rows_mod

    rows = {r["row_id"]: r for r in rows_mod.load_rows()}
    s70, s71 = (rows_mod.parse_row(rows[k]) for k in ("70", "71"))
    assert (s70.strategy.framework, s71.strategy.framework) == ("fsdp2", "fsdp2-async-tp")
    peak = load_cluster(rows_mod.GRAND_TETON).device.peak_flops["bf16"].value
    assert peak == pytest.approx(989e12 * 585.2 / 797.5, rel=2e-3)
    st = s70.strategy.replace(global_batch_size=s70.strategy.dp * 16)
    plain = Engine(s70.model, s70.cluster, st, nodes=s70.nodes, seq_len=s70.seq_len,
                   num_layers=4).simulate()
    asyn = Engine(s70.model, s70.cluster, st.replace(framework="fsdp2-async-tp"), nodes=s70.nodes,
                  seq_len=s70.seq_len, num_layers=4).simulate()
    a, b = plain.time_breakdown, asyn.time_breakdown
    assert a["compute"] == pytest.approx(b["compute"]) and a["tp_comm"] == pytest.approx(b["tp_comm"])
    assert b["overlapped"] > a["overlapped"]  # the TP all_gather / reduce_scatter beside GEMMs
    # pp = 1: step = compute + tp_comm - overlapped + the rest, so the step shrinks by the overlap
    assert plain.step_time - asyn.step_time == pytest.approx(b["overlapped"] - a["overlapped"], rel=1e-6)
