"""Issue 18: a rule that declares it ignores its op's attrs (``SpmdRule.reads_attrs``) lets
the Completer's rule cache share one answer between ops that differ only in attrs.

The claim behind the flag is checked on the rule itself (its answer does not move with the
attrs, hypothesis), and the sharing on a program: a model's ``parameter`` ops (each names
its parameter) run their rule once per distinct (shape, layout) instead of once each. The
printed programs are unchanged: tests/completion/test_sched_fastpaths.py compares the cached
completion with calling every rule.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from completion.dist_attr import TensorDistAttr
from completion.mesh import ProcessMesh
from completion.spmd import DistTensor, get_spmd_rule

MESH = ProcessMesh.of(2, 4, dim_names=("dp", "mp"))
_ATTR_VALUES = st.one_of(st.integers(-5, 5), st.text(max_size=6), st.booleans(),
                         st.lists(st.integers(0, 9), max_size=3))


def test_only_the_source_rules_ignore_attrs():
    for t in ("parameter", "data", "full"):
        assert get_spmd_rule(t).reads_attrs is False, t
    for t in ("matmul", "add", "embedding", "reshape", "softmax", "layer_norm", "reshard"):
        assert get_spmd_rule(t).reads_attrs is True, t


@settings(max_examples=40, deadline=None)
@given(op=st.sampled_from(["parameter", "data", "full"]),
       dims=st.sampled_from([(-1, -1), (0, -1), (-1, 1), (1, 0)]),
       attrs=st.dictionaries(st.sampled_from(["parameter_name", "shape", "value", "dtype", "x"]),
                             _ATTR_VALUES, max_size=4))
def test_a_source_rule_answers_alike_for_any_attrs(op, dims, attrs):
    want = DistTensor((8, 16), TensorDistAttr(MESH, dims), 1)
    rule = get_spmd_rule(op)
    assert rule.infer([], [want], attrs, MESH) == rule.infer([], [want], {}, MESH)
    hint = DistTensor((8, 16), None, -1)
    assert rule.infer([], [hint], attrs, MESH) == rule.infer([], [hint], {}, MESH)


def test_parameter_ops_share_their_rule_answers(monkeypatch):
    """zb-gpt-6.2b with 4 layers, Megatron dp2 x mp4: 4 x 12 + 4 parameter ops, but only a
    handful of distinct (shape, layout) pairs; the parameter rule runs once per pair."""
    from completion import build_model
    from completion.annotate import shard_megatron
    from completion.backward import append_backward
    from completion.completer import Completer
    from completion.optimizer import apply_optimizer
    from completion.spmd.rule import EinsumRule

    p = build_model("zb-gpt-6.2b", 4, num_layers=4)
    append_backward(p)
    apply_optimizer(p, "adamw")
    shard_megatron(p, MESH, "dp", "mp")
    params = [op for op in p.ops if op.type.endswith("parameter")]
    distinct = {(op.results[0].type.shape, op.results[0].dist_attr) for op in params}
    calls: list[str] = []
    real = EinsumRule.infer

    def counting(self, inputs, outputs, attrs, mesh=None):
        calls.append(self.op_type)
        return real(self, inputs, outputs, attrs, mesh)

    monkeypatch.setattr(EinsumRule, "infer", counting)
    Completer(p).complete()
    ran = sum(t.endswith("parameter") for t in calls)
    assert len(params) > 3 * len(distinct)  # the layers repeat their parameters' shapes
    assert ran == len(distinct)
