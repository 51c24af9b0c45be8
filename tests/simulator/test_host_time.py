"""Host dispatch time (``simulator.host_time``): the asynchronous launch queue by hand, its
composition, and where the step model applies it (``simulator.stage_timing``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.host_time import Dispatch, host_seconds
from simulator.profiles import load_profile
from simulator.stage_cost import BlockCost


def replay(kernels: list[tuple[float, float]]) -> float:
    """The recursion itself: kernel k launched at H_k (cumulative host time), started at
    max(H_k, end of k-1), ended g_k later."""
    launched = end = 0.0
    for h, g in kernels:
        launched += h
        end = max(launched, end) + g
    return end


def test_three_kernels_by_hand():
    # host 10 us per launch; a 5 us, a 50 us and a 5 us kernel: launched at 10, 20, 30;
    # the first runs 10-15, the second 20-70, the third waits for it: 70-75
    d = Dispatch.chain(Dispatch.kernel(10e-6, g) for g in (5e-6, 50e-6, 5e-6))
    assert d.host == pytest.approx(30e-6) and d.device == pytest.approx(60e-6)
    assert d.finish == pytest.approx(75e-6)
    assert d.exposed == pytest.approx(15e-6)  # the first launch and the idle 15-20


def test_host_bound_and_device_bound_by_hand():
    # ten 5 us kernels each launched after 40 us: the GPU waits for every launch
    host_bound = Dispatch.chain([Dispatch.kernel(40e-6, 5e-6)] * 10)
    assert host_bound.finish == pytest.approx(10 * 40e-6 + 5e-6)
    assert host_bound.exposed == pytest.approx(10 * 40e-6 + 5e-6 - 50e-6)
    # three 100 us kernels launched 1 us apart: only the first launch shows
    device_bound = Dispatch.chain([Dispatch.kernel(1e-6, 100e-6)] * 3)
    assert device_bound.finish == pytest.approx(1e-6 + 300e-6)
    assert Dispatch().finish == 0.0 and Dispatch().exposed == 0.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e-3), st.floats(0, 1e-3)), min_size=1, max_size=12),
       st.integers(0, 12))
def test_composition_is_the_recursion(kernels, cut):
    """Any split of a sequence composes to the recursion's finish; finish lies between
    max(host, device) and host + device."""
    cut = min(cut, len(kernels))
    parts = [Dispatch.kernel(h, g) for h, g in kernels]
    whole = Dispatch.chain(parts)
    split = Dispatch.chain(parts[:cut]).then(Dispatch.chain(parts[cut:]))
    assert whole.finish == pytest.approx(replay(kernels), abs=1e-15)
    assert split.finish == pytest.approx(whole.finish, abs=1e-15)
    assert max(whole.host, whole.device) - 1e-15 <= whole.finish <= whole.host + whole.device + 1e-15


def test_bad_times_refused():
    with pytest.raises(ValueError, match="must be >= 0"):
        Dispatch.kernel(-1e-6, 1e-6)
    with pytest.raises(ValueError, match="counts must be >= 0"):
        host_seconds(load_profile("megatron-deepspeed"), -1)


def test_host_seconds_from_the_profile():
    """megatron-deepspeed states the host time per launch; profiles without a host section
    cost no dispatch (their predictions are unchanged)."""
    prof = load_profile("megatron-deepspeed")
    per = prof.host.kernel_launch_s.value
    assert 1e-6 < per < 1e-4
    assert host_seconds(prof, 7) == pytest.approx(7 * per)
    assert host_seconds(prof, 0, 3) == pytest.approx(3 * per)  # no collective_launch_s: a launch each
    assert host_seconds(load_profile("megatron-core"), 100, 10) == 0.0
    assert host_seconds(None, 5) == 0.0


def _block(f: list[float], b: list[float]) -> BlockCost:
    bc = BlockCost()
    for ph, ks in (("F", f), ("B", b)):
        for g in ks:
            bc.dispatched(ph, g)
            bc.compute[ph] += g
    return bc


def _host(kernel_s: float) -> SimpleNamespace:
    """A profile whose only fact is its host time per launch."""
    return SimpleNamespace(host=SimpleNamespace(kernel_launch_s=SimpleNamespace(value=kernel_s),
                                                collective_launch_s=None))


def test_stage_actions_compose_blocks_by_hand():
    """One virtual stage of two layers under full recompute, host 10 us per launch:
    F runs layer 0 then layer 1; B runs layer 1 (its forward again, then its backward),
    then layer 0 the same way."""
    from simulator.stage_timing import StageTimer

    l0 = _block(f=[30e-6], b=[5e-6, 5e-6])
    l1 = _block(f=[2e-6], b=[40e-6])
    from simulator.recompute import recompute_policy

    cfg = SimpleNamespace(recompute="full", recompute_policy=recompute_policy("full"), profile=_host(10e-6))
    timer = StageTimer([l0, l1], None, None, [[0, 1]], cfg, None, None)
    acts = timer.action_dispatch(0)
    # F: l0's 30 us kernel launched at 10 (ends 40); l1's launched at 20, starts at 40: 42
    assert acts["F"].finish == pytest.approx(42e-6)
    # B: l1 F again (launch 10, 10-12), l1 B (launch 20, 20-60), l0 F again (launch 30,
    # 60-90), l0 B twice (launches 40 and 50: 90-95, 95-100)
    assert acts["B"].finish == pytest.approx(100e-6)
    assert acts["B"].device == pytest.approx(82e-6)
    assert acts["BW"].finish == pytest.approx(acts["B"].finish)  # no W kernels
    assert acts["W"].finish == 0.0
    # without a host section nothing is dispatched slower than it runs
    cfg.profile = None
    assert StageTimer([l0, l1], None, None, [[0, 1]], cfg, None, None).action_dispatch(0)["B"].exposed == 0.0
