"""The per-action host overhead (``device.efficiency.action_overhead_s``): how it enters
T_F / T_B / T_W and the step time, and that calibration measures it."""

from __future__ import annotations

import pytest
import yaml

from clusters import load_cluster
from meshplan.engine import Engine
from meshplan.strategy import Strategy
from simulator.roofline import Roofline

H = 1e-3  # 1 ms per pass: far above the roundoff of the step times compared


def _cluster_file(tmp_path, overhead: float | None):
    spec = load_cluster("dgx-a100-80g").spec.model_dump()
    eff = spec["device"]["efficiency"]
    eff.pop("action_overhead_s", None)
    if overhead is not None:
        eff["action_overhead_s"] = {"value": overhead, "provenance": "test"}
    path = tmp_path / f"c{overhead}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def _step(tmp_path, overhead, strat):
    model = Engine("megatron-1.7b", _cluster_file(tmp_path, overhead), strat, nodes=1).step_model()
    return model, model.run()


def test_spec_field_is_optional_and_zero_in_the_gpu_catalog():
    assert Roofline.from_device(load_cluster("cpu-local").spec.device).action_overhead == 0.0
    dev = load_cluster("dgx-a100-80g").spec.device
    assert dev.efficiency.action_overhead_s.value == 0.0
    assert Roofline.from_device(dev).action_overhead == 0.0


def test_overhead_adds_once_per_pass_to_each_stage_phase(tmp_path):
    strat = Strategy(global_batch_size=4, micro_batch_size=1)
    base, _ = _step(tmp_path, None, strat)
    with_h, _ = _step(tmp_path, H, strat)
    t0, p0 = base.stage_time(0)
    t1, p1 = with_h.stage_time(0)
    for ph in ("F", "B", "W"):
        assert t1[ph] == pytest.approx(t0[ph] + H, rel=1e-12)
    assert p1["compute"] == pytest.approx(p0["compute"] + 3 * H, rel=1e-12)


def test_one_stage_step_grows_by_three_passes_per_microbatch(tmp_path):
    # pp=1, m=4: every micro-batch runs F then BW (B + W): 3 passes, 4 x 3 x 1 ms = 12 ms
    strat = Strategy(global_batch_size=4, micro_batch_size=1)
    _, r0 = _step(tmp_path, None, strat)
    _, r1 = _step(tmp_path, H, strat)
    assert r1.step_time - r0.step_time == pytest.approx(12 * H, rel=1e-6)


def test_pipeline_critical_path_pays_it_per_action(tmp_path):
    # pp=2, 1F1B, m=4, every T_F, T_B, T_W raised by h on both stages: the 1F1B critical
    # path (stage 0's warm-up F's, the last stage's steady state, stage 0's cool-down)
    # holds (m + p - 1) F and (m + p - 1) BW actions: (m + p - 1) x 3h = 15 ms
    strat = Strategy(pp=2, global_batch_size=4, micro_batch_size=1)
    m0, r0 = _step(tmp_path, None, strat)
    _, r1 = _step(tmp_path, H, strat)
    assert m0.cfg.schedule == "1F1B" and m0.cfg.num_microbatches == 4
    assert r1.step_time - r0.step_time == pytest.approx(15 * H, rel=1e-3)
