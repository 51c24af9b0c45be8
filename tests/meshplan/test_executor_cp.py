"""``verify`` of context-parallel plans (issue 17 item 2): a cp plan runs ring attention (or
all-gathered K/V) on gloo ranks and computes what one process computes -- the loss of every
step and every parameter after the updates within 1e-5 relative (fp32) -- for a LLaMA-style
model (GQA, rotary tables at each rank's load-balanced positions) and a GPT-2 one (learned
positions: folded position ids), alone and with dp, tp (sequence parallel), pp and ZeRO-1."""

from __future__ import annotations

import json

import pytest

from executor.cp_data import fold_sequences
from executor.program import build_program
from meshplan.plan import Plan
from meshplan.strategy import Strategy
from meshplan.validation import verify_many

LLAMA = {"model_type": "llama", "hidden_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 500,
         "max_position_embeddings": 64, "num_hidden_layers": 2}
GPT2 = {"model_type": "gpt2", "n_embd": 128, "n_head": 4, "n_layer": 2, "n_positions": 64,
        "vocab_size": 500}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("cp")
    out = {}
    for name, cfg in (("llama", LLAMA), ("gpt2", GPT2)):
        p = d / f"{name}.json"
        p.write_text(json.dumps(cfg))
        out[name] = str(p)
    return out


def _plan(model, **kw):
    kw.setdefault("optimizer", "sgd")
    return Plan(model, "cpu-local", Strategy(dtype="float32", **kw), seq_len=64)


def _check(cases, nproc):
    results = verify_many(list(cases.values()), nproc)
    bad = [f"{n}: {r.summary()}" for n, r in zip(cases, results, strict=True) if not r.ok]
    assert not bad, "\n".join(bad)
    for r in results:
        assert len(r.losses) == 2 and r.losses[1] != r.losses[0] and r.param_errors


@pytest.mark.distributed
def test_verify_cp2_on_two_ranks(models):
    cases = {
        "llama cp=2 ring": _plan(models["llama"], cp=2, micro_batch_size=1, global_batch_size=2),
        "llama cp=2 all_gather": _plan(models["llama"], cp=2, cp_comm="all_gather",
                                       micro_batch_size=2, global_batch_size=2),
        "gpt2 cp=2 ring": _plan(models["gpt2"], cp=2, micro_batch_size=1, global_batch_size=2),
    }
    _check(cases, 2)


@pytest.mark.distributed
def test_verify_cp_on_four_ranks(models):
    cases = {
        "llama cp=4 ring": _plan(models["llama"], cp=4, micro_batch_size=1, global_batch_size=2),
        "llama dp=2 x cp=2 zero1": _plan(models["llama"], dp=2, cp=2, micro_batch_size=1,
                                         global_batch_size=4, optimizer="adamw", zero=1),
        "llama cp=2 x tp=2 sp": _plan(models["llama"], cp=2, tp=2, micro_batch_size=1,
                                      global_batch_size=2, sequence_parallel=True),
        "llama pp=2 x cp=2 1F1B": _plan(models["llama"], pp=2, cp=2, micro_batch_size=1,
                                        global_batch_size=4),
    }
    _check(cases, 4)


def test_cp_program_runs_the_ring(models):
    """The verified program is really context-parallel: its attention ops are marked for
    the cp group and their q holds seq_len / cp tokens."""
    prog = build_program(_plan(models["llama"], cp=2, tp=2, micro_batch_size=1,
                               global_batch_size=2)).program
    att = [op for op in prog.ops if op.type == "flash_attention"]
    assert att and all(op.attrs["context_parallel"] == 2 and op.attrs["cp_stride"] == 2 for op in att)
    assert all(op.operands[0].shape[1] == 32 for op in att)


def test_fold_sequences_by_hand():
    """2 micro-batches x dp 1 x mbs 1 sequences of 8 tokens over cp 2 (chunks of 2): rows
    (c, sequence) hold tokens [0,1,6,7] and [2,3,4,5] of each sequence."""
    import torch

    t = torch.arange(16).reshape(2, 8)
    got = fold_sequences(t, 2, 1)
    assert got.tolist() == [[0, 1, 6, 7], [2, 3, 4, 5], [8, 9, 14, 15], [10, 11, 12, 13]]
    # mbs 2: the two sequences of a replica stay together per cp rank
    got = fold_sequences(t, 2, 2)
    assert got.tolist() == [[0, 1, 6, 7], [8, 9, 14, 15], [2, 3, 4, 5], [10, 11, 12, 13]]
