"""The collective cost model against published nccl-tests figures
(``experiments/data/nccl_tests_published.csv``, each row with its source URL and quote):
every measured or expected figure within ``experiments.nccl_tests.TOLERANCE`` (15%),
except the known gaps, which stay documented and are checked to stay what they are."""

from __future__ import annotations

import pytest

from experiments.nccl_tests import KNOWN_GAPS, TOLERANCE, load_published, predict


@pytest.fixture(scope="module")
def table():
    return predict(load_published())


def test_every_collective_kind_and_network_is_covered(table):
    checked = table[table["checked"]]
    assert {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"} <= set(checked["kind"])
    assert set(checked["nodes"]) >= {1, 2, 3, 4, 16, 64, 128}
    assert any(str(c).endswith("a100-4x-hdr.yaml") for c in checked["cluster"])
    assert len(checked) >= 14


def test_checked_figures_within_tolerance(table):
    for r in table[table["checked"]].itertuples():
        assert abs(r.error_pct) <= 100 * TOLERANCE, (r.id, r.busbw_GBps, r.predicted_GBps)


def test_ring_busbw_falls_with_node_count_as_published(table):
    # NVIDIA/nccl issue 1229: reduce_scatter busbw 360 -> 260 GB/s from 4 to 128 H100 nodes;
    # the flat ring's (n-1) steps give the model 355 -> 283 GB/s (at the 4 GiB taken)
    rs = table[table["id"].str.startswith("h100-rs-") & table["id"].str.endswith("nodes")]
    rs = rs.sort_values("nodes")
    assert list(rs["nodes"]) == [4, 16, 64, 128]
    assert rs["predicted_GBps"].is_monotonic_decreasing
    drop_model = rs["predicted_GBps"].iloc[-1] / rs["predicted_GBps"].iloc[0]
    drop_published = rs["busbw_GBps"].iloc[-1] / rs["busbw_GBps"].iloc[0]
    assert drop_model == pytest.approx(drop_published, abs=0.12)


def test_known_gaps_are_what_they_are(table):
    gaps = table.set_index("id").loc[list(KNOWN_GAPS)]
    # 32 H100 nodes, all_gather of 2 GiB, run with 16 channels and one QP: the model (NCCL
    # defaults) is 52% above the 200 GB/s published
    assert gaps.loc["h100-ag-32nodes", "error_pct"] == pytest.approx(52.3, abs=1.0)


def test_roce_figure_is_the_input_it_comes_from(table):
    row = table.set_index("id").loc["a100-ar-8x100g-roce"]
    assert row["figure"] == "input" and not row["checked"]
    assert row["predicted_GBps"] == pytest.approx(75, rel=0.02)


def test_prediction_follows_the_network_a_yaml_describes():
    # 128 nodes (1,024 A100), 1 GiB all_reduce, NIC-bound rings: busbw follows the node's
    # NIC goodput -- 4 x 9.375 (4 x 100 Gb RoCE), 8 x 9.375 (8 x 100 Gb RoCE), 4 x 24 (4 x
    # HDR), 8 x 24 GB/s (DGX A100, 8 x HDR) -- less the ring's latency and tree choice
    from clusters import load_cluster
    from experiments.nccl_tests import REPO

    gib = 1 << 30
    got = {}
    for name, node_nic in (("experiments/data/clusters/a100-4x100g-roce.yaml", 37.5e9),
                           ("experiments/data/clusters/a100-8x100g-roce.yaml", 75e9),
                           ("experiments/data/clusters/a100-4x-hdr.yaml", 96e9),
                           ("dgx-a100-80g", 192e9)):
        c = load_cluster(str(REPO / name) if name.endswith(".yaml") else name, num_nodes=128)
        bw = c.busbw("all_reduce", gib, range(1024))
        assert 0.85 * node_nic < bw <= node_nic, name
        got[name] = bw
    assert list(got.values()) == sorted(got.values())
