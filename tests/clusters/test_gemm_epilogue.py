"""The GEMM epilogue of the wave model: each wave also stores its output tiles when the
device's ``gemm_epilogue_exposed`` is set (``simulator.roofline``, "Epilogue").

Hand-derived on the A100-like device of tests/executor/test_gemm_model.py: peak 312 TFLOP/s bf16,
108 SMs, plateau 0.8 -> one SM computes at R = 3.12e14 / 108 * 0.8 = 2.3111e12 FLOP/s; HBM
2.0 TB/s at 0.8 -> one SM stores at W = 1.6e12 / 108 = 1.4815e10 B/s. A 128x128 bf16 tile's
store: 128 * 128 * 2 B / W = 2.2118 us.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusters import ClusterSpecError, catalog_spec, parse_spec
from simulator.roofline import DEFAULT_GEMM_HALF_FLOPS, Roofline

PEAK, SMS, PLATEAU = 3.12e14, 108, 0.8
R = PEAK / SMS * PLATEAU
W = 2.0e12 * 0.8 / SMS
#: k_0 = out_bytes * R / (2 W): the inner dimension at which the store costs as much as
#: the main loop (bf16: 2 * 2.3111e12 / (2 * 1.4815e10) = 156.0)
K0 = 2 * R / (2 * W)


def rf(exposed: bool = True, **kw) -> Roofline:
    args = dict(peak_flops={"bf16": PEAK, "fp32": PEAK / 16}, gemm_efficiency=PLATEAU,
                gemm_half_flops=DEFAULT_GEMM_HALF_FLOPS, mem_bandwidth=2.0e12,
                mem_efficiency=0.8, kernel_overhead=5e-6, sm_count=SMS, epilogue_exposed=exposed)
    args.update(kw)
    return Roofline(**args)


def test_one_full_wave_pays_one_tile_store():
    """m = 128 * 108, n = 128, k = 4096: one wave of 108 128x128 tiles (as without the
    epilogue: every tile's store is the same per output element, so the pick is unchanged):
    58.075 us of main loop + 2.2118 us of store."""
    t = rf().gemm_tiling((1, 128 * 108, 128, 4096), "bf16")
    assert (t.tile, t.tiles, t.waves) == ((128, 128), 108, 1)
    assert t.compute_s == pytest.approx(2 * 128 * 128 * 4096 / R + 128 * 128 * 2 / W)
    assert t.compute_s == pytest.approx(58.074978e-6 + 2.211840e-6)
    assert K0 == pytest.approx(156.0)


def test_without_the_flag_the_model_is_the_plain_wave_model():
    t = rf(exposed=False).gemm_tiling((1, 128 * 108, 128, 4096), "bf16")
    assert t.compute_s == pytest.approx(2 * 128 * 128 * 4096 / R)


@settings(max_examples=60, deadline=None)
@given(tiles_m=st.integers(1, 12), tiles_n=st.integers(1, 9), k=st.integers(1, 8192))
def test_an_aligned_gemm_runs_at_k_over_k_plus_k0_of_the_plain_model(tiles_m, tiles_n, k):
    """For a GEMM of whole 64x64 tiles the store adds ``K0 / k`` to every wave's main loop, so
    the time ratio to the plain model is (k + K0) / k whatever the wave count."""
    shape = (1, 64 * tiles_m, 64 * tiles_n, k)
    with_store = rf().gemm_tiling(shape, "bf16").compute_s
    plain = rf(exposed=False, gemm_tiles=((64, 64),)).gemm_tiling(shape, "bf16").compute_s
    only64 = rf(gemm_tiles=((64, 64),)).gemm_tiling(shape, "bf16").compute_s
    assert only64 == pytest.approx(plain * (k + K0) / k)
    assert with_store <= only64 * (1 + 1e-12)  # the other tiles may quantize better


def test_attention_inner_dimension_runs_at_a_fraction_of_the_plateau():
    """A batched QK^T with k = head_dim 128 runs at 128 / (128 + 156) = 45% of the plain
    model's rate, a 4096-deep projection at 96.3% (fidelity_notes.md, GEMM efficiency)."""
    for k, frac in ((128, 128 / (128 + K0)), (4096, 4096 / (4096 + K0))):
        shape = (32, 128 * 108, 128, k)
        ratio = rf(exposed=False).gemm_tiling(shape, "bf16").compute_s / rf().gemm_tiling(shape, "bf16").compute_s
        assert ratio == pytest.approx(frac)
    assert 4096 / (4096 + K0) == pytest.approx(0.9633, abs=1e-4)


def test_an_fp32_gemm_stores_four_bytes_per_element():
    t = rf().gemm_tiling((1, 128 * 108, 128, 4096), "fp32")
    assert t.compute_s == pytest.approx(2 * 128 * 128 * 4096 / (R / 16) + 128 * 128 * 4 / W)
    assert Roofline.output_bytes("float32") == 4 and Roofline.output_bytes("float8_e4m3fn") == 2


def test_catalog_gpus_expose_it_and_a_spec_without_the_field_does_not():
    for name in ("dgx-a100-80g", "dgx-a100-40g", "selene", "zb-paper-a100", "dgx-h100",
                 "hgx-h200", "grand-teton-h100-96g"):
        dev = catalog_spec(name).device
        assert dev.gemm_epilogue_exposed.value is True and dev.gemm_epilogue_exposed.provenance
        assert Roofline.from_device(dev).epilogue_exposed
    data = copy.deepcopy(catalog_spec("selene").model_dump(exclude_none=True))
    del data["device"]["gemm_epilogue_exposed"]
    assert not Roofline.from_device(parse_spec(data, "old").device).epilogue_exposed


def test_spec_refuses_a_flag_that_is_not_a_yaml_boolean():
    data = copy.deepcopy(catalog_spec("selene").model_dump(exclude_none=True))
    for bad in ("yes", 1, None):
        data["device"]["gemm_epilogue_exposed"] = {"value": bad, "provenance": "x"}
        with pytest.raises(ClusterSpecError, match="gemm_epilogue_exposed"):
            parse_spec(data, "bad")
