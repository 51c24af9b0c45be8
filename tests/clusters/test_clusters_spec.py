"""Cluster specs: the catalog, provenance of every number, and one-line spec errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import clusters
from clusters import (
    CATALOG_DIR,
    ClusterError,
    ClusterSpecError,
    UnknownClusterError,
    list_catalog,
    load_cluster,
)
from experiments.measured_runs import FITS

CATALOG = [
    "cpu-local",
    "dgx-a100-40g",
    "dgx-a100-80g",
    "dgx-h100",
    "grand-teton-h100-96g",
    "hgx-h200",
    "selene",
    "zb-paper-a100",
]


def _base() -> dict:
    return yaml.safe_load((CATALOG_DIR / "dgx-a100-80g.yaml").read_text())


def _write(tmp_path: Path, data: object, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_catalog_names_every_entry():
    assert list_catalog() == CATALOG


@pytest.mark.parametrize("name", CATALOG)
def test_every_number_carries_provenance(name):
    data = yaml.safe_load((CATALOG_DIR / f"{name}.yaml").read_text())
    seen = []

    def walk(node, path):
        if isinstance(node, dict):
            if "value" in node:
                assert set(node) == {"value", "provenance"}, path
                assert isinstance(node["provenance"], str) and len(node["provenance"]) > 10, path
                seen.append(path)
                return
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        else:
            # a bare number anywhere else is a number without provenance
            assert not isinstance(node, (int, float)) or isinstance(node, bool), path

    walk(data, name)
    # device: >= 2 dtypes + memory + bw + 3 efficiencies; node: 5; cluster: 2
    assert len(seen) >= 2 + 2 + 3 + 5 + 2
    assert data["name"] == name


def test_dgx_a100_numbers_match_reference():
    # hardware_and_models.md: A100 SXM 80GB 312 TFLOP/s bf16, 80 GB, 2.0 TB/s; DGX A100
    # achieved busbw ~230 GB/s, 8 x 200 Gb/s HDR, 24 GB/s each in NCCL (NVIDIA/nccl issue 812:
    # 192 GB/s all_reduce busbw); formulas.md: Paddle 3.4 us / 9.6 us (NCCL 2.7); the A100
    # datasheet's 2,039 GB/s HBM2e; the GEMM plateau is the fit of experiments.measured_runs.FITS.
    c = load_cluster("dgx-a100-80g")
    d, n = c.device, c.node
    # issue 15: an "80 GB" A100 carries 80 GiB of HBM; the driver keeps 871 MiB of it
    assert d.peak("bf16") == 312e12 and d.memory_bytes.value == 80 * 2**30
    assert d.usable_bytes == 80 * 2**30 - 871 * 2**20
    assert d.memory_bandwidth.value == 2.039e12
    (fit,) = [f for f in FITS if f.device == "A100" and f.constant == "device.efficiency.gemm"]
    assert d.efficiency.gemm.value == fit.value
    assert d.efficiency.gemm.provenance.startswith("FITTED")
    assert n.intra_bandwidth.value == 230e9 and n.nic_bandwidth.value == 192e9 / 8
    assert n.nic_count.value == 8 and n.devices_per_node.value == 8
    assert n.intra_latency.value == 3.4e-6 and c.spec.cluster.inter_latency.value == 9.6e-6
    assert c.num_nodes == 1 and c.world_size == 8


def test_h100_h200_and_paper_clusters():
    h100, h200 = load_cluster("dgx-h100"), load_cluster("hgx-h200")
    assert h100.device.peak("bf16") == 989e12 and h100.device.memory_bandwidth.value == 3.35e12
    assert h200.device.memory_bytes.value == 141e9 and h200.device.memory_bandwidth.value == 4.8e12
    # NDR NICs achieve 48.5 GB/s (NVIDIA/nccl-tests issue 267); the NCCL ring on 8 H100 360
    # GB/s (nccl-tests issue 326), NVLS all_reduce 275 GB/s algbw (issue 212); NCCL 2.18+'s
    # 14 us network hop
    assert h100.node.nic_bandwidth.value == 48.5e9
    assert h100.node.intra_bandwidth.value == 360e9 and h100.node.nvls_algbw.value == 275e9
    assert h100.spec.cluster.inter_latency.value == 14e-6
    assert h100.node.collective_model.value == "nccl"
    assert load_cluster("zb-paper-a100").num_nodes == 4
    assert load_cluster("dgx-a100-40g").device.memory_bytes.value == 40 * 2**30
    assert load_cluster("dgx-a100-40g").device.usable_bytes == 42298834944  # deviceQuery total
    assert h100.device.usable_bytes == 81559 * 2**20  # nvidia-smi total of an H100 80GB


def test_load_by_path_and_num_nodes_override(tmp_path):
    p = _write(tmp_path, _base())
    c = load_cluster(str(p), num_nodes=3)
    assert (c.name, c.num_nodes, c.world_size) == ("dgx-a100-80g", 3, 24)
    assert load_cluster(p).num_nodes == 1


def test_efficiency_fields_readable():
    eff = load_cluster("dgx-a100-80g").device.efficiency
    assert eff.memory_bandwidth.value == 0.8 and eff.kernel_overhead_s.value == 5e-6
    from experiments.fit_constants import FIT_ROWS

    rows = "rows " + ",".join(map(str, FIT_ROWS["A100"]))
    assert "FITTED" in eff.gemm.provenance and rows in eff.gemm.provenance
    assert eff.gemm_half_flops is None


def test_optional_gemm_half_flops(tmp_path):
    data = _base()
    data["device"]["efficiency"]["gemm_half_flops"] = {"value": 1e9, "provenance": "calibrated"}
    c = load_cluster(_write(tmp_path, data))
    assert c.device.efficiency.gemm_half_flops.value == 1e9


def _err(tmp_path, data) -> str:
    with pytest.raises(ClusterSpecError) as ei:
        load_cluster(_write(tmp_path, data))
    msg = str(ei.value)
    assert "\n" not in msg
    return msg


def test_missing_field(tmp_path):
    data = _base()
    del data["node"]["nic_bandwidth"]
    assert "missing field 'node.nic_bandwidth'" in _err(tmp_path, data)


def test_missing_provenance(tmp_path):
    data = _base()
    del data["node"]["intra_bandwidth"]["provenance"]
    assert "missing field 'node.intra_bandwidth.provenance'" in _err(tmp_path, data)


@pytest.mark.parametrize("bad", [-5.0, 0])
def test_non_positive_bandwidth(tmp_path, bad):
    data = _base()
    data["node"]["intra_bandwidth"]["value"] = bad
    msg = _err(tmp_path, data)
    assert "node.intra_bandwidth.value" in msg and "greater than 0" in msg and f"{bad!r}" in msg


def test_zero_nic_and_memory_bandwidth(tmp_path):
    data = _base()
    data["node"]["nic_bandwidth"]["value"] = 0
    assert "node.nic_bandwidth.value" in _err(tmp_path, data)
    data = _base()
    data["device"]["memory_bandwidth"]["value"] = -1
    assert "device.memory_bandwidth.value" in _err(tmp_path, data)


def test_unknown_field_and_bad_efficiency(tmp_path):
    data = _base()
    data["node"]["nic_bw"] = {"value": 1, "provenance": "x"}
    assert "unknown field 'node.nic_bw'" in _err(tmp_path, data)
    data = _base()
    data["device"]["efficiency"]["gemm"]["value"] = 1.5
    assert "device.efficiency.gemm.value" in _err(tmp_path, data)


def test_bad_yaml_and_not_mapping(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nnode: [1, 2\n")
    with pytest.raises(ClusterSpecError, match="invalid YAML"):
        load_cluster(p)
    with pytest.raises(ClusterSpecError, match="must be a mapping, got list"):
        load_cluster(_write(tmp_path, [1, 2]))


def test_unknown_catalog_name_and_missing_file():
    with pytest.raises(UnknownClusterError, match="unknown cluster 'dgx-z9'.*dgx-a100-80g"):
        load_cluster("dgx-z9")
    with pytest.raises(ClusterSpecError, match="cluster file not found: nowhere/x.yaml"):
        load_cluster("nowhere/x.yaml")


def test_a_directory_is_not_a_cluster_file(tmp_path, monkeypatch):
    """A path to a folder is named as one; a catalog name is the catalog's even where the
    working directory holds a folder of that name."""
    with pytest.raises(ClusterSpecError, match=f"cluster file {tmp_path} is a directory"):
        load_cluster(tmp_path)
    (tmp_path / "dgx-h100").mkdir()
    monkeypatch.chdir(tmp_path)
    assert load_cluster("dgx-h100").name == "dgx-h100"


def test_bad_num_nodes_and_dtype():
    with pytest.raises(ClusterError, match="num_nodes must be an int >= 1, got 0"):
        load_cluster("dgx-h100", num_nodes=0)
    with pytest.raises(ClusterSpecError, match="no peak_flops for dtype 'fp8'"):
        load_cluster("dgx-a100-80g").device.peak("fp8")  # A100: no FP8 tensor cores
    assert load_cluster("dgx-h100").device.peak("fp8") == 1.979e15  # H100 SXM dense FP8


def test_errors_are_value_errors():
    assert issubclass(clusters.ClusterError, ValueError)
    assert issubclass(clusters.CollectiveError, ValueError)


@pytest.mark.parametrize("path, raw, expect", [
    # YAML 1.1 reads an exponent without a dot or a sign as a string: 1e9 is "1e9"
    (("device", "peak_flops", "bf16"), "1e9", "device.peak_flops.bf16.value': must be a YAML number, "
                                              "not a string (YAML 1.1 reads an exponent as a number "
                                              "only with a dot and a sign: write 1.0e+9)"),
    (("device", "peak_flops", "bf16"), "9.89e14", "must be a YAML number, not a string (YAML 1.1 "
                                                  "reads an exponent as a number only with a dot and a "
                                                  "sign: write 9.89e+14)"),
    (("device", "memory_bytes"), "'8.0e+10'", "device.memory_bytes.value': must be a YAML number, "
                                             "not a string (write the number without quotes)"),
    (("node", "intra_bandwidth"), "true", "node.intra_bandwidth.value': must be a YAML number, not a boolean"),
    # YAML 1.1's yes/no/on/off booleans are refused by the loader itself (issue 43)
    (("device", "efficiency", "gemm"), "yes", "invalid YAML: 'yes' reads as True in YAML 1.1"),
    (("cluster", "inter_latency"), "null", "cluster.inter_latency.value': must be a YAML number, not NoneType"),
    (("node", "devices_per_node"), "8.0", "node.devices_per_node.value': must be a YAML integer, not a float"),
    (("node", "nic_count"), "'8'", "node.nic_count.value': must be a YAML number, not a string"),
    (("cluster", "num_nodes"), "true", "cluster.num_nodes.value': must be a YAML number, not a boolean"),
    (("device", "efficiency", "kernel_overhead_s"), ".nan", "kernel_overhead_s.value"),
    (("device", "memory_bandwidth"), ".inf", "device.memory_bandwidth.value': Input should be a finite number"),
])
def test_numbers_are_strict_yaml_numbers(tmp_path, path, raw, expect):
    """Issue 16 item 7: a FLOP rate given as the string "1e9", a bandwidth given as
    ``true``, a count given as 8.0 are refused with the field path; pydantic used to
    coerce them."""
    data = _base()
    node = data
    for k in path:
        node = node[k]
    node["value"] = "@@RAW@@"
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data).replace("'@@RAW@@'", raw))
    with pytest.raises(ClusterSpecError) as e:
        clusters.load_spec_file(p)
    msg = str(e.value)
    assert expect in msg and str(p) in msg and "\n" not in msg


def test_numbers_that_are_numbers_still_load(tmp_path):
    data = _base()
    data["device"]["peak_flops"]["bf16"]["value"] = 312000000000000  # an int is a number
    data["device"]["efficiency"]["gemm"]["value"] = 1
    spec = clusters.load_spec_file(_write(tmp_path, data))
    assert spec.device.peak_flops["bf16"].value == 3.12e14 and spec.device.efficiency.gemm.value == 1.0


@pytest.mark.parametrize("data, expect", [
    (("a: " + "[" * 5000 + "]" * 5000).encode(), "nested too deeply"),
    (b"name: x\ndevice: &x {name: d, peak_flops: {bf16: *x}}\n", "device"),
    (b"\xff\xfe\x00", "not UTF-8"),
    (b"a: 1\n" * 300000, "larger than a cluster spec can be"),
])
def test_hostile_yaml_is_a_one_line_error(tmp_path, data, expect):
    """Deep nesting, a self-referencing alias, bytes that are not text, a huge file: one
    line naming the file, never a RecursionError or a traceback."""
    p = tmp_path / "c.yaml"
    p.write_bytes(data)
    with pytest.raises(ClusterSpecError) as e:
        clusters.load_spec_file(p)
    assert expect in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("path", [("device", "peak_flops", "bf16"), ("device", "efficiency", "gemm"),
                                  ("node", "intra_bandwidth")])
def test_tiny_rates_are_refused(tmp_path, path):
    """An efficiency or rate of 1e-300 made the cost model's step times overflow a float
    (OverflowError in the engine); values below MIN_POSITIVE are typos."""
    data = _base()
    node = data
    for k in path:
        node = node[k]
    node["value"] = 1e-300
    msg = _err(tmp_path, data)
    assert f"{'.'.join(path)}.value': must be at least 1e-06" in msg


@pytest.mark.parametrize("edit, field, unit", [
    (("node", "nic_bandwidth", 400), "node.nic_bandwidth.value", "bytes/s"),  # meant 400 Gb/s
    (("device", "memory_bandwidth", 2.4), "device.memory_bandwidth.value", "bytes/s"),  # 2.4 TB/s
    (("node", "intra_latency", 3.4), "node.intra_latency.value", "seconds"),  # meant 3.4 us
    (("device", "memory_bytes", 80), "device.memory_bytes.value", "bytes"),  # meant 80 GiB
    # no ceiling let tune search to the end and crash writing its history (int64 columns)
    (("device", "memory_bytes", 1e20), "device.memory_bytes.value", "bytes"),
])
def test_a_unit_slip_in_a_cluster_yaml_is_refused_naming_the_field(tmp_path, edit, field, unit):
    """A figure off by a unit prefix would cost every transfer (or fit every plan) a
    factor of 1e9 wrong without a word; it is refused with the field and its unit."""
    import yaml

    from clusters import load_cluster

    doc = yaml.safe_load((Path(clusters.__file__).parent / "catalog" / "dgx-h100.yaml").read_text())
    section, key, value = edit
    doc[section][key]["value"] = value
    p = tmp_path / "slip.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(Exception) as e:
        load_cluster(str(p))
    msg = str(e.value)
    assert field in msg and f"is in {unit}" in msg and "\n" not in msg.strip()


def test_a_peak_rate_typed_in_tflops_is_refused(tmp_path):
    import yaml

    from clusters import load_cluster

    doc = yaml.safe_load((Path(clusters.__file__).parent / "catalog" / "dgx-h100.yaml").read_text())
    doc["device"]["peak_flops"]["bf16"]["value"] = 989
    p = tmp_path / "slip.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(Exception, match=r"device\.peak_flops\.bf16\.value.*FLOP/s"):
        load_cluster(str(p))


def test_a_slow_calibrated_cpu_rate_is_a_rate_not_a_slip(tmp_path):
    """``meshplan calibrate`` on a loaded 2-core VM measured bf16 GEMMs at 0.95 GFLOP/s
    (emulated bf16); the old 1 GFLOP/s floor refused the calibrated YAML. A rate of 1 MFLOP/s
    or more loads; 989 (TFLOP/s typed as FLOP/s) is still refused."""
    import yaml

    from clusters import load_cluster

    doc = yaml.safe_load((Path(clusters.__file__).parent / "catalog" / "cpu-local.yaml").read_text())
    doc["device"]["peak_flops"]["bf16"] = {"value": 954071377.0, "provenance": "measured"}
    p = tmp_path / "slow.yaml"
    p.write_text(yaml.safe_dump(doc))
    assert load_cluster(str(p)).device.peak_flops["bf16"].value == 954071377.0
    doc["device"]["peak_flops"]["bf16"]["value"] = 989
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(Exception, match=r"must be between 1e\+06 \(1 MFLOP/s\)"):
        load_cluster(str(p))


def test_a_section_check_does_not_print_the_whole_section(tmp_path):
    """A check across a section's fields (the driver reserve above the memory) names the
    section and the two values; it used to append the whole device mapping (~3 KB)."""
    import yaml

    from clusters import load_cluster

    doc = yaml.safe_load((Path(clusters.__file__).parent / "catalog" / "dgx-h100.yaml").read_text())
    doc["device"]["memory_bytes"]["value"] = 8e7
    p = tmp_path / "small.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(Exception) as e:
        load_cluster(str(p))
    msg = str(e.value)
    assert "field 'device'" in msg and "memory_reserved_bytes" in msg and "{" not in msg
    assert len(msg) < 300


def test_a_gemm_half_flops_beyond_any_gemm_is_refused(tmp_path):
    """1e300 made every GEMM crawl: a 300-digit step time in milliseconds (a bad-input
    hunt); the ceiling is MAX_HALF_FLOPS, 1e15 (a 65536^3 GEMM is 5.6e14 FLOPs)."""
    import yaml

    from clusters import load_cluster

    doc = yaml.safe_load((Path(clusters.__file__).parent / "catalog" / "dgx-h100.yaml").read_text())
    doc["device"]["efficiency"]["gemm_half_flops"] = {"value": 1e300, "provenance": "x"}
    p = tmp_path / "half.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(Exception, match=r"device.efficiency.gemm_half_flops.value.*at most 1e\+15"):
        load_cluster(str(p))
    doc["device"]["efficiency"]["gemm_half_flops"]["value"] = 1e10
    p.write_text(yaml.safe_dump(doc))
    assert load_cluster(str(p)).spec.device.efficiency.gemm_half_flops.value == 1e10


def test_a_yaml_key_given_twice_is_refused(tmp_path):
    """PyYAML keeps the last of two equal keys: a second `name:` renamed the cluster."""
    from clusters import load_cluster

    text = (Path(clusters.__file__).parent / "catalog" / "dgx-h100.yaml").read_text()
    p = tmp_path / "twice.yaml"
    p.write_text(text.replace("\nname:", "\nname: first\nname:", 1))
    with pytest.raises(Exception, match=r"twice.yaml: line \d+ invalid YAML: key 'name' appears twice"):
        load_cluster(str(p))


def test_a_cached_spec_is_a_copy_and_a_rewritten_file_is_read_again(tmp_path):
    """load_spec_file keeps validated specs by (path, bytes): a second load is an equal,
    separate object, and rewriting the file with the same size (one digit) is seen at once."""
    from clusters.catalog import CATALOG_DIR
    from clusters.spec import load_spec_file

    text = (CATALOG_DIR / "dgx-h100.yaml").read_text()
    f = tmp_path / "c.yaml"
    f.write_text(text)
    a, b = load_spec_file(f), load_spec_file(f)
    assert a == b and a is not b and a.device.peak_flops is not b.device.peak_flops
    assert "nic_count: {value: 8," in text
    f.write_text(text.replace("nic_count: {value: 8,", "nic_count: {value: 4,"))
    assert load_spec_file(f).node.nic_count.value == 4


def test_a_bare_number_for_a_quantity_says_to_write_its_source():
    """Found by a bad-input hunt: ``bf16: 9.89e14`` (no value / provenance mapping) said
    "Input should be a valid dictionary or instance of FlopRate"."""
    from clusters.spec import parse_spec

    raw = _base()
    raw["device"]["peak_flops"]["bf16"] = "9.89e14"
    with pytest.raises(ClusterSpecError) as e:
        parse_spec(raw, "x.yaml")
    assert str(e.value) == ("x.yaml: field 'device.peak_flops.bf16': must be a mapping {value: ..., "
                            "provenance: \"...\"} (every number of a cluster YAML carries its source) "
                            "(got '9.89e14')")


def test_a_scalar_for_a_section_says_it_is_a_section():
    """The review: ``node: 4`` was told to be a {value, provenance} mapping."""
    from clusters.spec import parse_spec

    raw = _base()
    raw["node"] = 4
    with pytest.raises(ClusterSpecError) as e:
        parse_spec(raw, "x.yaml")
    assert str(e.value) == "x.yaml: field 'node': must be a section: a mapping of its fields (got 4)"
