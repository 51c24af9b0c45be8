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
    planner._plan.cache_clear()  # the plan searched again, the checks from the memo
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
