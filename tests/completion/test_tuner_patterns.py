"""Pattern detection from program structure, sharding templates and full_random annotation."""

from __future__ import annotations

from collections import Counter

import pytest

from completion.models import build_model
from completion.pir import parse_program
from tuner.patterns import (
    S0,
    S1,
    PatternError,
    R,
    apply_templates,
    find_patterns,
    megatron_templates,
    random_annotation,
    template_choices,
)


@pytest.fixture(scope="module")
def llama():
    return build_model("llama2-7b", 2, 64, num_layers=2)


@pytest.fixture(scope="module")
def gpt():
    return build_model("zb-gpt-1.5b", 2, 64, num_layers=2)


def test_llama_patterns_by_structure(llama):
    pats = find_patterns(llama)
    kinds = Counter(p.kind for p in pats)
    # per layer: two norms, one attention, one MLP; plus embedding, final norm, head, loss
    assert kinds == {"embedding": 1, "norm": 5, "attention": 2, "mlp": 2, "lm_head": 1,
                     "loss": 1}
    att = [p for p in pats if p.kind == "attention"][1]
    assert att.params["column"] == tuple(f"decoder.layers.1.self_attn.{x}_proj.weight"
                                         for x in "qkv")
    assert att.params["row"] == ("decoder.layers.1.self_attn.o_proj.weight",)
    mlp = [p for p in pats if p.kind == "mlp"][0]
    assert mlp.params["column"] == ("decoder.layers.0.mlp.gate_proj.weight",
                                    "decoder.layers.0.mlp.up_proj.weight")
    assert mlp.params["row"] == ("decoder.layers.0.mlp.down_proj.weight",)
    head = [p for p in pats if p.kind == "lm_head"][0]
    assert head.params["weight"] == ("lm_head.weight",) and not head.tied


def test_detection_ignores_names(llama):
    """Strip every struct name and rename every parameter: same patterns, same roles."""
    prog = build_model("llama2-7b", 2, 64, num_layers=2)
    rename = {}
    for i, v in enumerate(prog.parameters()):
        rename[v.name] = f"p{i}"
        v.name = f"p{i}"
    for op in prog.ops:
        op.struct_name = ""
    got = [(p.kind, p.ops, {k: tuple(n) for k, n in p.params.items()}) for p in find_patterns(prog)]
    want = [(p.kind, p.ops, {k: tuple(rename[n] for n in ns) for k, ns in p.params.items()})
            for p in find_patterns(llama)]
    assert got == want


def test_gpt_biases_positions_and_tied_head(gpt):
    pats = find_patterns(gpt)
    kinds = Counter(p.kind for p in pats)
    assert kinds["embedding"] == 2 and kinds["attention"] == 2 and kinds["mlp"] == 2
    att = [p for p in pats if p.kind == "attention"][0]
    assert att.params["column_bias"] == tuple(f"decoder.layers.0.self_attn.{x}_proj.bias"
                                              for x in "qkv")
    assert att.params["row_bias"] == ("decoder.layers.0.self_attn.o_proj.bias",)
    head = [p for p in pats if p.kind == "lm_head"][0]
    assert head.tied and head.params["weight"] == ("embed_tokens.weight",)
    assert template_choices("lm_head", pats) == ["tied"]
    assert template_choices("lm_head", find_patterns(build_model("llama2-7b", 1, 8, num_layers=1))
                            ) == ["replicated", "vocab_parallel"]


def test_seed_mlp_program(shared_dir):
    prog = parse_program((shared_dir / "data/programs/mlp_sgd_no_dist_attrs.pir").read_text())
    mlps = [p for p in find_patterns(prog) if p.kind == "mlp"]
    # relu -> matmul(parameter_0) -> relu -> matmul(parameter_1): Megatron MLP of issue 4
    assert len(mlps) == 1
    assert mlps[0].params == {"column": ("parameter_0",), "row": ("parameter_1",)}
    ann = apply_templates(prog, find_patterns(prog), {"mlp": "megatron"})
    assert ann["parameter_0"] == [R, S1] and ann["parameter_1"] == [R, S0]
    assert ann["input0"] == [S0, R] and ann["label0"] == [S0, R]


def test_megatron_templates(llama, gpt):
    ann = apply_templates(llama, find_patterns(llama), megatron_templates())
    L0 = "decoder.layers.0"
    assert ann[f"{L0}.self_attn.q_proj.weight"] == [R, S1]
    assert ann[f"{L0}.self_attn.v_proj.weight"] == [R, S1]
    assert ann[f"{L0}.self_attn.o_proj.weight"] == [R, S0]
    assert ann[f"{L0}.mlp.gate_proj.weight"] == [R, S1]
    assert ann[f"{L0}.mlp.down_proj.weight"] == [R, S0]
    assert ann["embed_tokens.weight"] == [R, S0]  # [V, h] vocab-parallel
    assert ann["lm_head.weight"] == [R, S1]  # [h, V] vocab-parallel head
    assert ann[f"{L0}.input_layernorm.weight"] == [R, R]
    assert ann["input_ids"] == [S0, R]
    assert set(ann) == {v.name for v in llama.parameters()} | {
        "input_ids", "labels", "rotary_emb.sin", "rotary_emb.cos"}
    assert ann["rotary_emb.sin"] == [R, R]  # [1, s, 1, d]: size-1 batch dim stays replicated
    g = apply_templates(gpt, find_patterns(gpt), megatron_templates())
    assert g[f"{L0}.self_attn.q_proj.bias"] == [R, S0]
    assert g[f"{L0}.self_attn.o_proj.bias"] == [R, R]
    assert g[f"{L0}.mlp.up_proj.bias"] == [R, S0]
    rep = apply_templates(llama, find_patterns(llama), {})
    assert all(pl == [R, R] for n, pl in rep.items() if n not in ("input_ids", "labels"))


def test_unknown_template(llama):
    with pytest.raises(PatternError, match="'attention': unknown template 'bogus'"):
        apply_templates(llama, find_patterns(llama), {"attention": "bogus"})
    with pytest.raises(PatternError, match="unknown pattern kind"):
        template_choices("conv")


def test_random_annotation(llama):
    a1 = random_annotation(llama, 4, seed=7)
    assert a1 == random_annotation(llama, 4, seed=7)
    assert a1 != random_annotation(llama, 4, seed=8)
    shapes = {v.name: v.shape for v in llama.parameters()}
    seen = Counter()
    for seed in range(40):
        ann = random_annotation(llama, 4, seed)
        for name, shape in shapes.items():
            dp, tp = ann[name]
            assert dp == R
            if tp != R:
                d = int(tp[len("Shard("):-1])
                assert shape[d] % 4 == 0
            seen[(len(shape), tp)] += 1
        assert ann["input_ids"] == [S0, R]
    # every legal option of a 2-d weight and a 1-d norm weight is drawn
    assert {k for k in seen if k[0] == 2} == {(2, R), (2, S0), (2, S1)}
    assert {k for k in seen if k[0] == 1} == {(1, R), (1, S0)}
    # tp = 1: nothing to shard
    assert all(pl == [R, R] for n, pl in random_annotation(llama, 1, 3).items() if n in shapes)
