"""Completer properties (hypothesis): completing twice changes nothing, annotations are
never changed, every completed attr is valid for its mesh and consistent with its producer,
and all-replicated annotations complete to all-replicated with no Partial anywhere."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from completion.annotate import annotate
from completion.backward import append_backward
from completion.completer import Completer
from completion.mesh import ProcessMesh
from completion.models import build_mlp, build_model
from completion.optimizer import apply_optimizer

MESHES = [ProcessMesh.of(2), ProcessMesh.of(4), ProcessMesh.of(2, 2), ProcessMesh.of(2, 1, 2)]


def make(kind: str):
    if kind == "mlp":
        p = build_mlp()
        append_backward(p)
        apply_optimizer(p, "sgd")
    else:
        p = build_model(kind, 4, 16, num_layers=1)
        append_backward(p)
        apply_optimizer(p, "adamw")
    return p


def sources(p):
    return [op.results[0] for op in p.ops
            if op.type in ("parameter", "data") and op.results and op.results[0] is not None]


@st.composite
def annotated(draw):
    kind = draw(st.sampled_from(["mlp", "llama2-7b", "gpt3-175b"]))
    mesh = draw(st.sampled_from(MESHES))
    p = make(kind)
    vals = sources(p)
    picks = draw(st.lists(st.integers(0, len(vals) - 1), min_size=1, max_size=8, unique=True))
    for i in picks:
        v = vals[i]
        free = list(range(mesh.ndim))
        dm = []
        for _ in range(v.ndim):
            m = draw(st.sampled_from([-1] + free))
            dm.append(m)
            if m >= 0:
                free.remove(m)
        annotate(p, v.id if v.name is None else v.name, mesh, dm)
    return p


def snapshot(p):
    return ([v.dist_attr for v in p.values()], [op.dist_attr for op in p.ops])


def check_valid(p):
    for op in p.ops:
        d = op.dist_attr
        assert d is not None, op.label()
        for v, a in zip(op.operands, d.operands, strict=False):
            if v is not None and a is not None:
                a.check_shape(v.shape, op.label())
                assert a.process_mesh == d.process_mesh
        for j, r in enumerate(op.results):
            if r is None:
                continue
            assert r.dist_attr is not None, r.label()
            r.dist_attr.check_shape(r.shape, r.label())
            assert r.dist_attr == d.results[j], r.label()


@settings(max_examples=25, deadline=None)
@given(p=annotated())
def test_complete_is_idempotent_keeps_annotations_and_is_valid(p):
    ann = {id(v): v.dist_attr for v in p.values() if v.dist_attr is not None}
    Completer(p).complete()
    check_valid(p)
    for v in p.values():
        if id(v) in ann:
            assert v.dist_attr == ann[id(v)], v.label()
    first = snapshot(p)
    Completer(p).complete()
    assert snapshot(p) == first


@settings(max_examples=10, deadline=None)
@given(kind=st.sampled_from(["mlp", "llama2-7b", "gpt3-175b"]), mesh=st.sampled_from(MESHES))
def test_all_replicated_annotations_complete_replicated(kind, mesh):
    p = make(kind)
    for v in sources(p):
        annotate(p, v.id if v.name is None else v.name, mesh)
    Completer(p).complete()
    check_valid(p)
    for op in p.ops:
        for a in op.dist_attr.operands + op.dist_attr.results:
            assert a is None or a.is_replicated(), op.label()
