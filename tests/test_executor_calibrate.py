"""``meshplan calibrate --quick`` writes a cluster YAML that load_cluster reads, with
positive, plausible measured numbers and provenance."""

from __future__ import annotations

import math

import pytest
import yaml

from clusters import load_cluster
from executor.calibrate import CalibrationError, calibrate, fit_line
from executor.calibrate_comm import link_estimates
from meshplan.cli import main


def test_fit_line_recovers_a_known_line():
    slope, icpt = fit_line([1.0, 2.0, 4.0], [3.5, 5.5, 9.5])
    assert math.isclose(slope, 2.0) and math.isclose(icpt, 1.5)


def test_link_estimates_invert_the_cluster_model():
    # ring all_reduce on n=4 with a=1e-5 s, B=1e9 B/s: alpha = 6a, beta = 6/(4B)
    a, b = link_estimates("all_reduce", 4, 6e-5, 6 / (4 * 1e9))
    assert math.isclose(a, 1e-5) and math.isclose(b, 1e9)
    a, b = link_estimates("all_gather", 4, 3e-5, 3 / (4 * 1e9))
    assert math.isclose(a, 1e-5) and math.isclose(b, 1e9)
    a, b = link_estimates("send_recv", 2, 2e-5, 1e-9)
    assert math.isclose(a, 2e-5) and math.isclose(b, 1e9)


def test_calibrate_refuses_one_rank():
    with pytest.raises(CalibrationError, match="nproc >= 2"):
        calibrate(nproc=1)


@pytest.mark.distributed
def test_calibrate_quick_writes_a_loadable_plausible_cluster(tmp_path, capsys):
    out = tmp_path / "here.yaml"
    assert main(["calibrate", "--nproc", "2", "--quick", "--output", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    c = load_cluster(out)
    d, n = c.spec.device, c.spec.node
    assert c.name == "here" and c.world_size == 2
    assert 1e8 < d.peak_flops["fp32"].value < 1e13  # 0.1 GFLOP/s .. 10 TFLOP/s per CPU rank
    assert 1e7 < d.peak_flops["bf16"].value < 1e13
    assert 1e8 < d.memory_bandwidth.value < 1e12
    assert 1e-8 < d.efficiency.kernel_overhead_s.value < 1e-2
    assert 0 <= n.intra_latency.value < 1e-2 and 1e6 < n.intra_bandwidth.value < 1e12
    assert d.peak_flops["fp32"].provenance.startswith("measured on ")
    raw = yaml.safe_load(out.read_text())
    assert "all_reduce/2 alpha=" in raw["node"]["intra_bandwidth"]["provenance"]
