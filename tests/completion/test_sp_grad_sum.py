"""Partial gradients are summed before their one reduction (sequence parallelism's
reduce_scatter, a data-parallel reduce): ``completion.spmd.core`` step 1.

Megatron-LM's sequence parallelism runs per layer 4 collectives forward (all_gather
before the attention and MLP column-parallel GEMMs, reduce_scatter after the row-parallel
ones) and 6 backward: the input gradients of the q/k/v (gate/up) projections are summed
(one fused column-parallel GEMM) before one reduce_scatter each, the all_gather of the
sequence-sharded input is redone for the weight gradient, and the forward reduce_scatters'
gradients are all_gathered (reference/fidelity_notes.md; Korthikanti et al. 2022, fig. 5).
Before, a consumer's hint sharded the sum's sequence dim, so every projection's Partial
gradient was reduce_scattered on its own: 9 backward collectives per Llama layer, not 6."""

from __future__ import annotations

import pytest

import completion.ops  # noqa: F401  (registers the ops)
from completion.dist_attr import TensorDistAttr
from completion.mesh import ProcessMesh
from completion.spmd import DistTensor, get_spmd_rule

M12 = ProcessMesh.of(1, 2)


def _t(dm, partial=None, priority=0):
    return DistTensor((1, 8, 4), TensorDistAttr(M12, dm, partial), priority)


def test_a_sum_of_partials_stays_partial_against_a_consumers_shard_hint():
    rule = get_spmd_rule("add_n")
    grads = [_t([-1, -1, -1], {1: "sum"}) for _ in range(3)]
    hint = _t([-1, 1, -1], priority=-1)  # the consumer wants the sequence sharded over mp
    res = rule.infer(grads, [hint], {})
    assert [(list(a.dims_mapping), a.partial_dims) for a in res.operands] == [([-1, -1, -1], {1: "sum"})] * 3
    assert (list(res.results[0].dims_mapping), res.results[0].partial_dims) == ([-1, -1, -1], {1: "sum"})
    # an annotated result (priority >= 0) is a fact: its layout still wins
    fixed = rule.infer(grads, [_t([-1, 1, -1], priority=1)], {})
    assert list(fixed.results[0].dims_mapping) == [-1, 1, -1]
    # operands that are not all Partial alike: the hint applies as before
    mixed = rule.infer([grads[0], _t([-1, 1, -1])], [hint], {})
    assert list(mixed.results[0].dims_mapping) == [-1, 1, -1]


@pytest.mark.parametrize(("sp", "forward", "backward"), [(False, 2, 2), (True, 4, 6)])
def test_tensor_parallel_collectives_of_a_llama_layer_by_hand(sp, forward, backward):
    """Llama 2 7B, tp 2, one middle layer: without SP 2 all_reduces each way (Shoeybi et al.
    2019); with SP 4 forward and 6 backward reduce_scatters / all_gathers of the [4096,
    4096] bf16 activation, each one cluster.collective_time on ranks (0, 1)."""
    from meshplan import Engine, Strategy

    s = Strategy(tp=2, micro_batch_size=1, global_batch_size=1, sequence_parallel=sp,
                 framework="megatron-2021")
    e = Engine("llama2-7b", "dgx-a100-80g", s, num_layers=3)
    blk = e.program_costs().layers[1]
    assert (blk.comm_count["F"], blk.comm_count["B"]) == (forward, backward)
    nbytes = 4096 * 4096 * 2
    if sp:
        one = e.cluster.collective_time("reduce_scatter", nbytes, [0, 1])
        assert one == pytest.approx(e.cluster.collective_time("all_gather", nbytes, [0, 1]), rel=1e-9)
    else:
        one = e.cluster.collective_time("all_reduce", nbytes, [0, 1])
    assert blk.comm["F"] == pytest.approx(forward * one, rel=1e-6)
    assert blk.comm["B"] == pytest.approx(backward * one, rel=1e-6)
