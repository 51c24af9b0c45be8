"""The attention implementation as a model option: Hugging Face ``attn_implementation``
(``eager`` = unfused QK^T / softmax / dropout / x V, ``sdpa`` / ``flash_attention_2`` =
flash), dropout probabilities from config.json, ``Strategy.attention`` overriding the
model, Megatron-LM 2021's GPT as the builder's GPT with those settings, tensor-parallel
head sharding of the unfused ops, and the executor running the unfused program."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch

from completion import append_backward, build_model
from completion.models import (
    MEGATRON_2021,
    ModelConfig,
    ModelConfigError,
    load_hf_config,
    megatron_2021,
)
from completion.models.source import resolve_model
from completion.plan_program import build_plan_program, resolve_attention
from completion.strategy import Strategy, StrategyError
from executor.kernels import KernelContext, get_kernel
from simulator.op_signature import local_tensor

LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 100,
         "max_position_embeddings": 32}


def _write(tmp_path, name, **extra):
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps({**LLAMA, **extra}))
    return p


def _types(prog):
    return Counter(op.type for op in prog.ops)


@pytest.mark.parametrize("impl,want", [("eager", "unfused"), ("sdpa", "flash"),
                                       ("flash_attention_2", "flash"), (None, None)])
def test_attn_implementation_from_config_json(tmp_path, impl, want):
    extra = {} if impl is None else {"attn_implementation": impl}
    cfg = load_hf_config(_write(tmp_path, "c", **extra))
    assert cfg.attention == want
    t = _types(build_model(cfg, 1, seq_len=8))
    if want == "unfused":
        assert t["flash_attention"] == 0 and t["softmax"] == 2 and t["scale"] == 2
        assert t["transpose"] == 2 * 4 and t["matmul"] == 2 * (7 + 2) + 1
    else:  # flash is also the builder's default when the model says nothing
        assert t["flash_attention"] == 2 and t["softmax"] == 0


def test_config_json_dropouts_and_errors(tmp_path):
    cfg = load_hf_config(_write(tmp_path, "d", _attn_implementation="eager", attention_dropout=0.1,
                                resid_pdrop=0.2))
    assert (cfg.attention, cfg.attention_dropout, cfg.hidden_dropout) == ("unfused", 0.1, 0.2)
    gpt2 = {"model_type": "gpt2", "n_layer": 1, "n_embd": 64, "n_head": 4, "vocab_size": 100,
            "n_positions": 32, "attn_pdrop": 0.1, "resid_pdrop": 0.1}
    p = tmp_path / "gpt2.json"
    p.write_text(json.dumps(gpt2))
    g = load_hf_config(p)
    assert (g.attention, g.attention_dropout, g.hidden_dropout) == (None, 0.1, 0.1)
    assert load_hf_config(_write(tmp_path, "z")).attention_dropout == 0.0  # absent: 0
    for bad, needle in (({"attn_implementation": "magic"}, "attn_implementation"),
                        ({"attention_dropout": 1.5}, "attention_dropout"),
                        ({"resid_pdrop": "0.1"}, "resid_pdrop")):
        with pytest.raises(ModelConfigError, match=needle):
            load_hf_config(_write(tmp_path, "bad", **bad))
    with pytest.raises(ModelConfigError, match="attention"):
        ModelConfig("m", "gpt", 1, 64, 4, 4, 256, 100, 32, attention="sparse")
    with pytest.raises(ModelConfigError, match="hidden_dropout"):
        ModelConfig("m", "gpt", 1, 64, 4, 4, 256, 100, 32, hidden_dropout=1.0)
    with pytest.raises(StrategyError, match="attention"):
        Strategy(attention="eager")


def test_strategy_attention_overrides_the_model(tmp_path):
    """Strategy(attention=...) > the model's attn_implementation > the caller's default
    (the Engine's framework profile) > flash."""
    flash_model = resolve_model(str(_write(tmp_path, "sdpa", attn_implementation="sdpa")), 16)
    plain = resolve_model(str(_write(tmp_path, "plain")), 16)
    s = Strategy(dtype="float32", micro_batch_size=1, global_batch_size=1)
    assert resolve_attention(s, flash_model, "unfused") == "flash"
    assert resolve_attention(s.replace(attention="unfused"), flash_model) == "unfused"
    assert resolve_attention(s, plain, "unfused") == "unfused" and resolve_attention(s, plain) == "flash"
    t = _types(build_plan_program(flash_model, s.replace(attention="unfused"), representative=True).program)
    assert t["flash_attention"] == 0 and t["softmax"] == 2 and t["softmax_grad"] == 2
    t = _types(build_plan_program(flash_model, s, representative=True).program)
    assert t["flash_attention"] == 2 and t["softmax"] == 0
    t = _types(build_plan_program(plain, s, representative=True, attention="unfused").program)
    assert t["softmax"] == 2


def test_megatron_2021_gpt_is_the_builders_gpt_with_its_settings():
    """Dropout 0.1 on the embedding output, on both residual branches and on the attention
    probabilities; the attention core under ``...self_attn``, the hidden dropouts under
    the layer's struct name (not the attention core)."""
    cfg = megatron_2021("megatron-1.7b")
    assert (cfg.attention, cfg.attention_dropout, cfg.hidden_dropout) == ("unfused", 0.1, 0.1) == tuple(
        MEGATRON_2021[k] for k in ("attention", "attention_dropout", "hidden_dropout"))
    prog = build_model(cfg, 1, seq_len=16, num_layers=2)
    drops = Counter(op.struct_name for op in prog.ops if op.type == "dropout")
    assert drops == {"embed_positions": 1, "decoder.layers.0": 2, "decoder.layers.0.self_attn": 1,
                     "decoder.layers.1": 2, "decoder.layers.1.self_attn": 1}
    assert all(op.attrs["p"] == 0.1 for op in prog.ops if op.type == "dropout")
    att = [op.type for op in prog.ops if op.struct_name == "decoder.layers.0.self_attn"]
    assert att == ["reshape"] * 3 + ["transpose"] * 3 + ["matmul", "scale", "softmax", "dropout",
                                                          "matmul", "transpose", "reshape"]
    sc = next(op for op in prog.ops if op.type == "scale")
    assert sc.attrs["scale"] == pytest.approx(1 / math.sqrt(2304 // 24))
    # same parameters as the flash GPT (dropout and attention add none)
    assert prog.num_parameters() == build_model("megatron-1.7b", 1, seq_len=16, num_layers=2).num_parameters()


@pytest.mark.parametrize("model", ["gpt", "llama-gqa"])
@pytest.mark.parametrize("sp", [False, True])
def test_tensor_parallel_shards_the_heads_of_unfused_attention(model, sp):
    """tp = 4 with the Megatron layout: q, k, v, the scores and probabilities hold a / 4
    query heads and kv / 4 key/value heads per rank (Megatron's column-parallel attention),
    and the layer's collectives are those of the flash layer."""
    if model == "gpt":
        cfg, hq, hkv = megatron_2021("megatron-1.7b"), 24, 24
    else:
        cfg, hq, hkv = ModelConfig("g", "llama", 2, 512, 16, 8, 256, 64, 64, attention="unfused"), 16, 8
    src = resolve_model(cfg, 64, num_layers=2)
    s = Strategy(tp=4, sequence_parallel=sp, micro_batch_size=1, global_batch_size=1)

    def build(attention):
        return build_plan_program(src, s.replace(attention=attention), representative=True).program

    prog = build("unfused")
    core = [op for op in prog.ops if op.struct_name == "decoder.layers.0.self_attn"
            and op.role.name == "FORWARD" and op.type in ("matmul", "softmax")]
    scores = local_tensor(core[0].results[0], 0).shape
    probs = local_tensor(core[1].results[0], 0).shape
    if hq == hkv:
        assert scores == probs == (1, hq // 4, 64, 64)
    else:  # [b, kv heads, group, s, s]
        assert scores == probs == (1, hkv // 4, hq // hkv, 64, 64)

    def colls(p):
        return Counter(op.type for op in p.ops if op.type in ("all_reduce", "all_gather", "reduce_scatter",
                                                              "all_to_all")
                       and op.struct_name.startswith("decoder.layers.0"))

    assert colls(prog) == colls(build("flash"))
    assert sum(colls(prog).values()) > 0


def _interpret(prog, seed=0):
    """Run every op of a single-process program with the executor's kernels (inputs and
    parameters random, integer ids in range); values by id."""
    gen = torch.Generator().manual_seed(seed)
    env: dict[int, torch.Tensor] = {}
    for op in prog.ops:
        if op.type in ("data", "parameter"):
            v = op.results[0]
            dt = {"float32": torch.float32, "int64": torch.int64}[v.dtype]
            if dt == torch.int64:
                hi = 32 if v.name == "position_ids" else 100
                env[id(v)] = torch.randint(0, hi, v.shape, generator=gen)
            else:
                env[id(v)] = torch.randn(v.shape, generator=gen, dtype=dt) * 0.2
            continue
        ins = [None if v is None else env[id(v)] for v in op.operands]
        ctx = KernelContext(out_types=tuple(None if r is None else r.type for r in op.results),
                            in_global=tuple(None if v is None else tuple(v.shape) for v in op.operands),
                            generator=torch.Generator().manual_seed(1))
        for r, t in zip(op.results, get_kernel(op.type)(ins, op.attrs, ctx), strict=False):
            if r is not None:
                env[id(r)] = t
    return env


@pytest.mark.parametrize("kv", [4, 2])
def test_the_executor_runs_the_unfused_program(kv):
    """Every op of the unfused LLaMA program (forward and backward, GQA when kv < heads)
    runs on the executor's kernels; its attention equals torch's non-causal
    scaled_dot_product_attention on the same q, k, v (the IR's softmax takes no mask:
    the causal mask of Megatron's fused kernel is not represented in the executor)."""
    cfg = ModelConfig("t", "llama", 1, 64, 4, kv, 96, 100, 32, attention="unfused")
    prog = build_model(cfg, 2, seq_len=8, dtype="float32")
    append_backward(prog)
    env = _interpret(prog)
    att = [op for op in prog.ops if op.struct_name == "decoder.layers.0.self_attn" and op.role.name == "FORWARD"]
    rope = next(op for op in att if op.type == "fused_rotary_position_embedding")
    q, k = env[id(rope.results[0])], env[id(rope.results[1])]
    v = env[id(next(op for op in att if op.type == "reshape" and op.results[0].shape[2] == kv
                    and op is not rope and op.operands[0].op.struct_name.endswith("v_proj")).results[0])]
    out = env[id(att[-1].results[0])]  # [b, s, hq * d]
    g = 4 // kv
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.repeat_interleave(g, 2).transpose(1, 2),
        v.repeat_interleave(g, 2).transpose(1, 2), is_causal=False).transpose(1, 2).reshape(2, 8, 64)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    grads = [r for op in prog.ops if op.role.name == "BACKWARD" for r in op.results
             if r is not None and (r.name or "").endswith("q_proj.weight@GRAD")]
    assert grads and torch.isfinite(env[id(grads[0])]).all() and env[id(grads[0])].abs().sum() > 0


def test_the_executor_runs_the_2021_gpt_with_dropout():
    """The Megatron 2021 GPT (dropout 0.1 everywhere, unfused attention) runs op by op; the
    dropout masks keep about 90% of the elements."""
    cfg = megatron_2021(ModelConfig("t", "gpt", 1, 64, 4, 4, 256, 100, 32, tie_word_embeddings=True))
    prog = build_model(cfg, 2, seq_len=16, dtype="float32")
    append_backward(prog)
    env = _interpret(prog)
    loss = next(op for op in prog.ops if op.type == "mean" and op.role.name == "LOSS")
    assert torch.isfinite(env[id(loss.results[0])])
    masks = [env[id(op.results[1])] for op in prog.ops if op.type == "dropout"]
    assert len(masks) == 4 and 0.8 < float(torch.cat([m.flatten().float() for m in masks]).mean()) < 0.97


@pytest.mark.distributed
def test_unfused_attention_verifies_under_tensor_parallelism(tmp_path):
    """An eager (unfused, GQA) LLaMA under tp = 2, with and without sequence parallelism,
    computes what one process computes (executor.verify: losses and parameters within
    1e-5, fp32): the head-sharded batched matmuls, softmax and reshapes are exact."""
    from meshplan.plan import Plan
    from meshplan.validation import verify_many

    path = str(_write(tmp_path, "eager", attn_implementation="eager"))
    plans = [Plan(path, "cpu-local", Strategy(dtype="float32", optimizer="sgd", tp=2, micro_batch_size=2,
                                              global_batch_size=4, sequence_parallel=sp), seq_len=16)
             for sp in (False, True)]
    for r in verify_many(plans, 2):
        assert r.ok, r.summary()
        assert len(r.losses) == 2 and r.losses[1] != r.losses[0]


def test_engine_costs_the_strategys_attention():
    """Engine(..., Strategy(attention="unfused")) costs the unfused program of a flash
    model: its costed program holds the softmax, its forward is slower (the s x s scores
    go through HBM), and the cost cache keeps the two apart."""
    from meshplan.engine import Engine

    s = Strategy(micro_batch_size=1, global_batch_size=8)
    flash = Engine("zb-gpt-1.5b", "dgx-a100-80g", s, nodes=1, seq_len=1024)
    unfused = Engine("zb-gpt-1.5b", "dgx-a100-80g", s.replace(attention="unfused"), nodes=1, seq_len=1024)
    assert "softmax" in _types(unfused.costed_program().program)
    assert "flash_attention" in _types(flash.costed_program().program)
    tf = flash.program_costs().layers[1].compute["F"]
    tu = unfused.program_costs().layers[1].compute["F"]
    assert tu > tf
    assert flash.program_costs().layers[1].compute["F"] == tf  # cached apart
