"""The mixture-of-experts measured rows (issue 21, last "Done when" item):
``experiments/data/measured_runs_moe.csv`` -- Megatron-Bridge's published Qwen3-30B-A3B
pre-training throughput on 16 DGX-H100 GPUs (tp 1, pp 2, ep 8 = dp 8) -- parse into the
row's model, layout and measured step time, and the cost model's expert-parallel terms on
that layout are the hand-derived ones (all_to_all bytes on the ep group, expert gradients
left out of the data-parallel sync, parameters per rank)."""

from __future__ import annotations

import csv
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusters import load_cluster
from completion.models import MODEL_CATALOG, build_model
from completion.models.source import resolve_model
from completion.plan_program import build_plan_program
from experiments.measured_rows import (
    EXTRA_CSVS,
    MOE_COLUMNS,
    RunSpec,
    load_rows,
    parse_all,
    parse_measured,
    parse_row,
)
from meshplan import Engine

MOE_CSV = EXTRA_CSVS[0]


@pytest.fixture(scope="module")
def rows() -> dict[int, dict[str, str]]:
    return {int(r["row_id"]): r for r in load_rows(MOE_CSV)}


@pytest.fixture(scope="module")
def row1001(rows) -> RunSpec:
    got = parse_row(rows[1001])
    assert isinstance(got, RunSpec), got
    return got


def test_rows_file_keeps_the_csv_columns_and_cites_its_source():
    """Same columns as the shared CSV, then ep and the MoE columns; every row names the
    Megatron-Bridge performance summary at a fixed commit and the table row it copies."""
    from experiments.measured_rows import DATA_CSV

    with DATA_CSV.open(newline="", encoding="utf-8") as f:
        shared = next(csv.reader(f))
    with MOE_CSV.open(newline="", encoding="utf-8") as f:
        own = next(csv.reader(f))
    assert own[: len(shared)] == shared and set(own[len(shared):]) == {"ep", *MOE_COLUMNS}
    for r in load_rows(MOE_CSV):
        assert r["source_url"].startswith("https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/")
        assert "performance-summary" in r["source_url"] and "DGX-H100" in r["locator"]
        assert r["tokens_per_s_per_gpu"] in r["locator"]  # the figure is the table's, verbatim


def test_row_1001_is_the_published_layout(row1001):
    """25.11 table row: Qwen3_30B_a3B, 16 GPUs, FP8-CS, GBS 512, MBS 2, seq 4096, TP 1,
    PP 2, VP 24, EP 8, GA 32, 5275 tokens/s/GPU. dp = 16 / (1 * 2) = 8 = ep; GA = 512 /
    (2 * 8) = 32 micro-batches; measured step = 512 * 4096 / (5275 * 16) = 24.848 s. No
    recompute and the distributed optimizer from the Megatron-Bridge v0.2.0 recipe."""
    s = row1001.strategy
    assert (s.dp, s.tp, s.pp, s.ep, s.vpp, s.schedule) == (8, 1, 2, 8, 24, "VPP")
    assert (s.micro_batch_size, s.global_batch_size, s.num_microbatches) == (2, 512, 32)
    assert (s.zero, s.recompute, s.fp8, s.framework) == (1, "none", "te-delayed", "megatron-bridge")
    assert (row1001.cluster, row1001.nodes, row1001.num_gpus) == ("dgx-h100", 2, 16)
    assert row1001.step_time_s == pytest.approx(512 * 4096 / (5275 * 16), rel=1e-12)
    assert row1001.step_time_s == pytest.approx(24.848, abs=5e-4)
    assert any("current scaling" in a for a in row1001.approximations)
    # the recipe's distributed optimizer (ZeRO-1) is stated and modelled as such with ep 8
    # (expert states over dp / ep = 1 rank, dense over dp: simulator.expert_parallel)
    assert "distributed optimizer" in load_rows(MOE_CSV)[0]["zero_fsdp"]
    assert not any("modelled as zero 0" in a for a in row1001.approximations)


def test_row_model_is_qwen3_30b_a3b(row1001):
    """The row's columns give the catalog's Qwen3-30B-A3B (its config.json): per layer
    attention q 2048*4096 + k, v 2 * 2048*512 + o 4096*2048 = 18,874,368, q/k norms 256,
    layer norms 4,096, router 2048*128 = 262,144, experts 128 * 3 * 2048*768 =
    603,979,776 -> 623,120,640; x 48 = 29,909,790,720; untied embedding and head 2 *
    151936*2048 = 622,329,856; final norm 2,048: 30,532,122,624 (Qwen3 report)."""
    m = row1001.model
    assert (m.num_experts, m.experts_per_token, m.moe_ffn_hidden_size) == (128, 8, 768)
    assert (m.kv_channels, m.qk_norm, m.num_kv_heads, m.tie_word_embeddings) == (128, "head", 4, False)
    per_layer = 18_874_368 + 256 + 4_096 + 262_144 + 603_979_776
    assert per_layer == 623_120_640
    total = 48 * per_layer + 2 * 151_936 * 2048 + 2048
    assert total == 30_532_122_624
    assert build_model(m.replace(num_layers=1), 1, seq_len=8).num_parameters() == per_layer + 2 * 151_936 * 2048 + 2048
    assert build_model(MODEL_CATALOG["qwen3-30b-a3b"].replace(num_layers=1), 1, seq_len=8).num_parameters() \
        == per_layer + 2 * 151_936 * 2048 + 2048


def test_all_to_all_on_the_ep_group_by_hand(row1001):
    """Per MoE layer and micro-batch a rank's expert-major tokens are [E 128, mbs 2 x C,
    h 2048] bf16 with C = ceil(4096 * 8 / 128) = 256 slots per expert per sequence:
    128 * 512 * 2048 * 2 = 268,435,456 bytes; the dispatch and combine all_to_all in
    forward and their two transposes in backward, on the ep (= dp) group of the stage:
    ranks 0..7 of the first DGX node for stage 0 (Megatron tp-cp-ep-dp-pp order). The
    layer's forward is charged twice the cluster's intra-node all_to_all of that size."""
    from simulator.roofline import Roofline
    from simulator.stage_cost import StageCoster

    s = row1001.strategy.replace(pp=1, vpp=1, schedule="1F1B", global_batch_size=16,
                                 layers_per_stage=None)
    src = resolve_model(row1001.model.replace(num_layers=1), 4096)
    prog = build_plan_program(src, s).program
    a2a = [(op.role.name, op.attrs["nbytes"], op.attrs["groups"]) for op in prog.ops if op.type == "all_to_all"]
    nbytes = 128 * (2 * math.ceil(4096 * 8 / 128)) * 2048 * 2
    assert nbytes == 268_435_456
    group = [list(range(8))]
    assert a2a == [("FORWARD", nbytes, group)] * 2 + [("BACKWARD", nbytes, group)] * 2
    cl = load_cluster("dgx-h100", 2)
    cost = build_plan_program(src, s, representative=True, resolve_reshards=False)
    layer = StageCoster(cost.program, cl, Roofline.from_device(cl.device), rank=0).block_costs()[0]
    one = cl.collective_time("all_to_all", nbytes, list(range(8)))
    assert layer.comm["F"] == pytest.approx(2 * one, rel=1e-9) and layer.comm_count["F"] == 2
    assert one == pytest.approx(cl.collective_time("all_to_all", nbytes, [8, 9, 10, 11, 12, 13, 14, 15]))


def test_params_and_gradient_sync_per_rank_by_hand(row1001):
    """ep 8: each rank holds 16 of the 128 experts, 16 * 3 * 2048*768 = 75,497,472 expert
    elements a layer, beside the 19,140,864 dense ones (attention 18,874,368, norms 4,352,
    router 262,144): 94,638,336 a layer. Pipeline rank 0 runs 24 of the 48 layers (VP 24,
    one layer a virtual stage) and the embedding 151936*2048 = 311,164,928:
    2,582,484,992 elements, bf16 5,164,969,984 bytes. Its data-parallel gradient sync
    reduces only the dense ones, 24 * 19,140,864 + 311,164,928 = 770,545,664 (the experts
    have no dp replica: Megatron-Core's expert-data-parallel group dp / ep is 1)."""
    eng = Engine(row1001.model, row1001.cluster, row1001.strategy, nodes=row1001.nodes,
                 seq_len=row1001.seq_len)
    res = eng.simulate()
    assert list(res.layers_per_vstage) == [1] * 48
    model = eng.step_model()
    rank0 = list(res.schedule.vstage[0])
    assert model.rank_params(rank0) == 24 * 94_638_336 + 311_164_928 == 2_582_484_992
    assert model.rank_params(rank0, synced=True) == 24 * 19_140_864 + 311_164_928 == 770_545_664
    assert res.memory_per_stage[0]["params"] == 2 * 2_582_484_992


def test_parse_measured_reads_the_csv_and_the_rows_files():
    """The CSV's 171 rows and the rows file's 7 (every DGX-H100 row of Qwen3_30B_a3B in
    the performance summary archive at Megatron-Bridge 067f987d), ids unique; the fits'
    parse_all is the CSV alone; the MoE rows are all expressible and form their own source."""
    got = parse_measured()
    assert len(got) == len(parse_all()) + 7 == 178
    assert len({p.row_id for p in got}) == 178
    moe = [p for p in got if p.source_id == "mbridge_perf_moe"]
    assert [p.row_id for p in moe] == list(range(1001, 1008)) and all(p.expressible for p in moe)
    assert all(p.row_id < 1000 for p in parse_all())


def test_a_csv_row_is_dense(rows):
    """A shared-CSV row has no MoE cells: a dense model with ep 1."""
    from experiments.measured_rows import DATA_CSV

    r = next(r for r in load_rows(DATA_CSV) if r["row_id"] == "15")
    got = parse_row(r)
    assert got.model.num_experts is None and got.strategy.ep == 1 and "ep" not in got.layout


def test_bad_moe_cells_are_refusals_naming_the_column(rows):
    bad = parse_row({**rows[1001], "num_experts": "many"})
    assert not bad.expressible and bad.why.startswith("num_experts") and bad.reasons == ("unreadable num_experts",)
    bad = parse_row({**rows[1001], "ep": "3"})
    assert not bad.expressible and "'ep' = 3" in bad.why
    bad = parse_row({**rows[1001], "experts_per_token": "200"})
    assert not bad.expressible and bad.reasons == ("invalid model",)


@settings(max_examples=25, deadline=None)
@given(e=st.integers(1, 256), k=st.integers(1, 16), f=st.integers(1, 4096))
def test_moe_cells_set_the_model_fields(rows, e, k, f):
    """Any expert count, top-k <= experts and width written in a row (with a trailing
    note, as cells carry) reaches the ModelConfig; top-k above the experts is refused."""
    got = parse_row({**rows[1001], "num_experts": f"{e} (routed)", "experts_per_token": str(k),
                     "moe_ffn_hidden_size": str(f), "ep": "1" if e % 8 else "8"})
    if k > e:
        assert not got.expressible and got.reasons == ("invalid model",)
    else:
        assert got.expressible, got
        assert (got.model.num_experts, got.model.experts_per_token, got.model.moe_ffn_hidden_size) == (e, k, f)


def test_ep16_rows_cross_the_nodes_and_their_all_to_all_is_the_hand_value():
    """Rows 1005-1007 (26.04, 26.04.01, 26.06): tp 1, pp 1, ep 16 = dp 16 over both DGX
    nodes, mbs 1, GA 1024 / 16 = 64. A rank's dispatch buffer per MoE layer and micro-batch
    is [E 128, C = ceil(4096 * 8 / 128) = 256, h 2048] bf16 = 134,217,728 bytes; its
    all_to_all over n = 16 ranks, k = 8 a node (clusters.collectives): 7 a_i + 8 a_n +
    max(7 S / (16 B_i), 8 S / (16 NIC(8) / 8)) = 7 * 3.4 us + 8 * 14 us + 8 S / (16 * 48.5
    GB/s) = 1.51949 ms (the NICs bound it: 1.384 ms against NVLink's 0.163). Four a layer
    (dispatch, combine and their backward), 48 layers, 64 micro-batches: 18.67 s of the
    step's exposed communication, which no profile overlaps (the recipe sets
    moe_a2a_overlap False)."""
    got = {p.row_id: p for p in parse_measured() if p.row_id in (1005, 1006, 1007)}
    for p in got.values():
        s = p.strategy
        assert (s.dp, s.tp, s.pp, s.ep, s.micro_batch_size, s.num_microbatches) == (16, 1, 1, 16, 1, 64)
        assert (p.nodes, s.fp8, s.zero) == (2, "te-delayed", 1)
    nbytes = 128 * math.ceil(4096 * 8 / 128) * 2048 * 2
    assert nbytes == 134_217_728
    one = 7 * 3.4e-6 + 8 * 14e-6 + 8 * nbytes / (16 * 48.5e9)
    assert one == pytest.approx(1.51949e-3, rel=1e-5)
    assert load_cluster("dgx-h100", 2).collective_time("all_to_all", nbytes, list(range(16))) \
        == pytest.approx(one, rel=1e-12)
    row = got[1005]
    res = Engine(row.model, row.cluster, row.strategy, nodes=row.nodes, seq_len=row.seq_len).simulate()
    a2a = 4 * 48 * 64 * one
    assert a2a == pytest.approx(18.671, abs=1e-3)
    assert a2a <= res.time_breakdown["tp_comm"] <= 1.001 * a2a
