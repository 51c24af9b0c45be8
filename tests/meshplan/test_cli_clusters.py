"""``meshplan clusters list | show | time | validate`` and their one-line errors."""

from __future__ import annotations

import json

import pytest
import yaml

from clusters import CATALOG_DIR
from tests._cli import one_line_error, run_main
from tests.clusters.test_clusters_spec import CATALOG  # the expected catalog names


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch):
    """These tests read whole provenance strings: a wide $COLUMNS (the tables wrap to it)."""
    monkeypatch.setenv("COLUMNS", "200")

def test_list_names_every_entry(capsys):
    rc, out, _ = run_main(capsys, "clusters", "list")
    assert rc == 0
    for name in CATALOG:
        assert name in out
    rc, out, _ = run_main(capsys, "clusters", "list", "--json")
    assert [r["name"] for r in json.loads(out)] == CATALOG


def test_show_dgx_a100_4_nodes(capsys):
    rc, out, _ = run_main(capsys, "clusters", "show", "dgx-a100-80g", "--nodes", "4")
    assert rc == 0
    assert "4 nodes x 8 devices = 32 ranks" in out
    assert "230 GB/s" in out and "Paddle ring latency" in out  # device/node specs + provenance
    for title in ("2 ranks on 1 node", "8 ranks on 1 node", "32 ranks on 4 nodes, 8 per node"):
        assert title in out
    for cell in ("1 KiB", "1 GiB", "all_reduce", "reduce_scatter", "all_to_all", "send_recv"):
        assert cell in out
    # 1 GiB all_reduce on 8 ranks, ring / Simple: NCCL's 8.4 us call latency + 14 (3.4 us +
    # 2^30 / (8 * 230 GB/s)) = 8.23 ms
    assert "8.23 ms" in out


def test_show_json(capsys):
    rc, out, _ = run_main(capsys, "clusters", "show", "dgx-a100-80g", "--nodes", "2", "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["cluster"]["world_size"] == 16
    assert data["spec"]["node"]["intra_bandwidth"]["value"] == 230e9
    rows = data["collectives"]
    assert len(rows) == 3 * 6 * 11  # groups 2, 8, 16 x kinds x sizes 1 KiB..1 GiB
    row = next(
        r
        for r in rows
        if r["group_size"] == 8 and r["kind"] == "all_gather" and r["nbytes"] == 1 << 30
    )
    assert row["time_s"] == pytest.approx(8.4e-6 + 7 * (3.4e-6 + (1 << 30) / (8 * 230e9)))


def test_time_command(capsys):
    rc, out, _ = run_main(
        capsys,
        "clusters",
        "time",
        "dgx-a100-80g",
        "all_gather",
        "--nbytes",
        "1GiB",
        "--ranks",
        "0-7",
        "--json",
    )
    assert rc == 0
    data = json.loads(out)
    assert data["time_s"] == pytest.approx(8.4e-6 + 7 * (3.4e-6 + (1 << 30) / (8 * 230e9)))
    assert data["busbw_Bps"] == pytest.approx(7 / 8 * (1 << 30) / data["time_s"])
    rc, out, _ = run_main(capsys, "clusters", "time", "dgx-a100-80g", "all_reduce", "--nodes", "2")
    assert rc == 0 and "16 ranks on 2 nodes" in out and "tree/Simple" in out


def test_validate_ok(capsys, tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text((CATALOG_DIR / "dgx-h100.yaml").read_text())
    rc, out, _ = run_main(capsys, "clusters", "validate", str(p))
    assert rc == 0 and out.strip() == "ok: dgx-h100 (1 node x 8 devices = 8 ranks)"


def _bad_yaml(tmp_path, edit) -> str:
    data = yaml.safe_load((CATALOG_DIR / "dgx-a100-80g.yaml").read_text())
    edit(data)
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


def test_validate_missing_field(capsys, tmp_path):
    p = _bad_yaml(tmp_path, lambda d: d["cluster"].pop("inter_latency"))
    line = one_line_error(*run_main(capsys, "clusters", "validate", p))
    assert line == f"error: {p}: missing field 'cluster.inter_latency'"


@pytest.mark.parametrize("value", [-100.0, 0.0])
def test_validate_bad_bandwidth(capsys, tmp_path, value):
    p = _bad_yaml(tmp_path, lambda d: d["node"]["nic_bandwidth"].update(value=value))
    line = one_line_error(*run_main(capsys, "clusters", "validate", p))
    assert "field 'node.nic_bandwidth.value'" in line and "greater than 0" in line
    assert f"(got {value!r})" in line


def test_show_unknown_catalog_name(capsys):
    line = one_line_error(*run_main(capsys, "clusters", "show", "dgx-b200"))
    assert line.startswith("error: unknown cluster 'dgx-b200'") and "dgx-a100-80g" in line


def test_time_ranks_outside_cluster(capsys):
    line = one_line_error(
        *run_main(capsys, "clusters", "time", "dgx-a100-80g", "all_reduce", "--ranks", "0-8")
    )
    assert line == ("error: rank 8 is outside cluster 'dgx-a100-80g' (world_size 8, ranks 0..7)")


def test_time_negative_nbytes(capsys):
    line = one_line_error(
        *run_main(capsys, "clusters", "time", "dgx-a100-80g", "all_reduce", "--nbytes", "-1")
    )
    assert line == "error: nbytes must be >= 0, got -1.0"


def test_time_unknown_kind_and_bad_options(capsys):
    line = one_line_error(*run_main(capsys, "clusters", "time", "dgx-a100-80g", "allreduce"))
    assert "unknown collective kind 'allreduce'" in line
    line = one_line_error(
        *run_main(capsys, "clusters", "time", "dgx-a100-80g", "all_reduce", "--nbytes", "12XB")
    )
    assert "invalid --nbytes '12XB'" in line
    for bits in ("64Mb", "1Gib"):  # a lowercase b is bits: refused, never read as bytes
        line = one_line_error(
            *run_main(capsys, "clusters", "time", "dgx-a100-80g", "all_reduce", "--nbytes", bits)
        )
        assert f"invalid --nbytes '{bits}': a lowercase b means bits" in line
    line = one_line_error(
        *run_main(capsys, "clusters", "time", "dgx-a100-80g", "all_reduce", "--ranks", "a-b")
    )
    assert "invalid --ranks 'a-b'" in line
    line = one_line_error(*run_main(capsys, "clusters", "show", "dgx-h100", "--nodes", "0"))
    assert line == "error: --nodes must be >= 1, got 0"


@pytest.mark.slow
def test_demo_prints_the_catalog_first(tmp_path, capsys):
    # The demo's step 1 is the catalog table (meshplan/demo docstring); a short search
    # without the 2-rank validation keeps this fast and writes only under tmp_path.
    rc, out, _ = run_main(capsys, "demo", "--trials", "3", "--no-validate",
                          "--output", str(tmp_path / "demo"))
    assert rc == 0
    catalog = out[: out.index("search: ")]
    for name in CATALOG:
        assert name in catalog
    assert "meshplan cluster catalog" in catalog
    assert (tmp_path / "demo" / "README.md").is_file()
