"""Issue 18: ``plan_reshard`` memoises the checks of its (frozen) layout specs; a cached
check answers what the cold one answers and a failing spec is never cached (every call
raises, naming the value it was given)."""

from __future__ import annotations

import pytest

from completion import ProcessMesh, TensorDistAttr
from completion.reshard import ReshardError, plan_reshard, planner

MESH = ProcessMesh.of(2, 4, dim_names=("dp", "mp"))


def test_cached_checks_give_the_cold_plan():
    src, dst = TensorDistAttr(MESH, (0, 1)), TensorDistAttr(MESH, (0, -1))
    planner.clear_plan_caches()
    cold = plan_reshard(src, dst, (8, 16), "bfloat16")
    assert (src, dst, (8, 16), "bfloat16") in planner._CHECKED
    planner._plan.cache_clear()  # the checks (and the plan for this cost) from the memo
    warm = plan_reshard(TensorDistAttr(MESH, (0, 1)), TensorDistAttr(MESH, (0, -1)), [8, 16], "bfloat16")
    assert warm == cold and [s.kind for s in warm.steps] == ["all_gather"]
    # the same specs on another shape are checked again: a 1-d tensor cannot take (0, 1)
    with pytest.raises(ReshardError, match="cannot reshard w of shape \\[8\\]"):
        plan_reshard(src, dst, (8,), value="w")


def test_a_failing_spec_is_not_cached():
    src, dst = TensorDistAttr(MESH, (0, 1, -1)), TensorDistAttr(MESH, (-1, -1, -1))
    planner.clear_plan_caches()
    for name in ("a", "b"):
        with pytest.raises(ReshardError, match=f"cannot reshard {name} of shape"):
            plan_reshard(src, dst, (8, 16), value=name)
    assert not planner._CHECKED


def test_the_memo_keeps_one_plan_per_step_cost():
    """The plan kept beside a checked spec is the search's answer for that cost: the
    default cost of all_gather over mp (4 ranks) of a (8, 16) bfloat16 tensor split (dp, mp)
    is 3/4 of the gathered 4 x (4 x 4) x 2 = 128 bytes plus the 65,536-byte step overhead;
    a unit cost per step gets its own entry (cost 1.0), and clear_plan_caches forgets both."""
    src, dst = TensorDistAttr(MESH, (0, 1)), TensorDistAttr(MESH, (0, -1))
    planner.clear_plan_caches()
    first = plan_reshard(src, dst, (8, 16), "bfloat16")
    assert first.cost == 0.75 * 128 + 65536.0 and [s.kind for s in first.steps] == ["all_gather"]
    assert plan_reshard(src, dst, (8, 16), "bfloat16") is first

    def unit(step):
        return 1.0

    other = plan_reshard(src, dst, (8, 16), "bfloat16", cost=unit)
    assert other.cost == 1.0 and other is not first
    assert plan_reshard(src, dst, (8, 16), "bfloat16") is first
    planner.clear_plan_caches()
    again = plan_reshard(src, dst, (8, 16), "bfloat16")
    assert again == first and again is not first
