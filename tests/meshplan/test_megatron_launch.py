"""A Megatron-LM launch line pasted into ``cost`` / ``export`` (meshplan.commands.
megatron_launch): the cost-neutral arguments are named in one note, the architecture ones
checked against --model. Before, the first ``--lr`` stopped the command ("No such option")."""

from __future__ import annotations

import json

import pytest

from meshplan.errors import MeshplanError
from meshplan.frameworks.megatron.launch import split
from tests._cli import one_line_error, run_main

BASE = ("--model", "llama2-7b", "--cluster", "dgx-h100", "--tensor-model-parallel-size", "2",
        "--dp", "4", "--global-batch-size", "64", "--micro-batch-size", "1", "--bf16")
#: the rest of a Llama-2-7B pretrain_gpt.py line (Megatron-LM examples' style)
LINE = ("--num-layers", "32", "--hidden-size", "4096", "--ffn-hidden-size", "11008",
        "--num-attention-heads", "32", "--seq-length", "4096", "--max-position-embeddings", "4096",
        "--swiglu", "--normalization", "RMSNorm", "--untie-embeddings-and-output-weights",
        "--disable-bias-linear", "--position-embedding-type", "rope", "--attention-dropout", "0",
        "--hidden-dropout", "0", "--lr", "3e-4", "--min-lr", "3e-5", "--lr-decay-style", "cosine",
        "--lr-warmup-iters", "2000", "--weight-decay", "0.1", "--clip-grad", "1.0", "--adam-beta2", "0.95",
        "--train-iters", "250000", "--data-path", "0.7", "/data/a_text_document", "0.3", "/data/b",
        "--split", "949,50,1", "--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model=/t/tok.model",
        "--save", "/ckpt", "--load", "/ckpt", "--log-interval", "10", "--eval-iters", "10",
        "--log-throughput", "--use-mcore-models")


def test_split_by_hand():
    kept, neutral, arch = split(["--tp", "2", "--lr", "3e-4", "--data-path", "1", "/a", "2", "/b", "--swiglu",
                                 "--hidden-size=4096", "--mock-data", "--seed", "7", "--", "--lr"])
    assert kept == ["--tp", "2", "--", "--lr"]
    assert neutral == ["--lr 3e-4", "--data-path 1 /a 2 /b", "--mock-data", "--seed 7"]
    assert arch == {"--swiglu": True, "--hidden-size": "4096"}
    with pytest.raises(MeshplanError, match="--lr needs a value"):
        split(["--lr", "--tp", "2"])
    with pytest.raises(MeshplanError, match="--swiglu is a switch: it takes no value"):
        split(["--swiglu=true"])


def test_a_launch_line_costs_as_its_plan_and_names_what_it_does_not_read(capsys):
    rc, out, err = run_main(capsys, "cost", *BASE, *LINE, "--json")
    assert rc == 0, err
    rc, plain, err2 = run_main(capsys, "cost", *BASE, "--json")
    assert rc == 0, err2
    got, want = json.loads(out), json.loads(plain)
    assert got["step_time_ms"] == want["step_time_ms"] and got["max_memory_bytes"] == want["max_memory_bytes"]
    note = ("Megatron-LM arguments that leave a step's cost alone, not read: --lr 3e-4, --min-lr 3e-5, --lr-decay-style cosine, --lr-warmup-iters 2000, --weight-decay "
            "0.1, --clip-grad 1.0, --adam-beta2 0.95, --train-iters 250000, --data-path 0.7 "
            "/data/a_text_document 0.3 /data/b, --split 949,50,1, --tokenizer-type Llama2Tokenizer, "
            "--tokenizer-model /t/tok.model, --save /ckpt, --load /ckpt, --log-interval 10, --eval-iters 10, "
            "--log-throughput, --use-mcore-models")
    assert note in got["warnings"]
    rc, text, err = run_main(capsys, "cost", *BASE, *LINE)
    assert rc == 0 and f"note: {note}" in text + err


@pytest.mark.parametrize("extra, words", [
    (("--hidden-size", "5120"), "--hidden-size 5120: model llama2-7b has 4096"),
    (("--ffn-hidden-size", "14336"), "--ffn-hidden-size 14336: model llama2-7b has 11008"),
    (("--squared-relu",), "--squared-relu: model llama2-7b has a swiglu MLP"),
    (("--qk-layernorm",), "--qk-layernorm: model llama2-7b has no q/k normalisation"),
    (("--group-query-attention", "--num-query-groups", "8"), "--num-query-groups 8: model llama2-7b has 32 "
                                                             "key/value heads"),
    # Megatron's default of one group under the switch
    (("--group-query-attention",), "--group-query-attention without --num-query-groups (1 key/value group): "
                                   "model llama2-7b has 32 key/value heads"),
    # a line that describes the model: what it leaves out is Megatron's default
    (("--hidden-size", "4096", "--num-attention-heads", "32"), "gives no --disable-bias-linear: Megatron-LM "
                                                               "then builds biases on every linear layer, "
                                                               "model llama2-7b has no linear biases"),
    (("--hidden-size", "4096", "--disable-bias-linear"), "gives no --swiglu: Megatron-LM then builds a gelu "
                                                         "MLP, model llama2-7b has a swiglu MLP"),
    (("--max-position-embeddings", "2048"), "--max-position-embeddings 2048 is below the sequence, 4096 "
                                            "tokens"),
    (("--normalization", "LayerNorm"), "--normalization LayerNorm: model llama2-7b has rms_norm"),
    (("--normalization", "Foo"), "--normalization 'Foo': not readable (one of LayerNorm, RMSNorm)"),
    (("--position-embedding-type", "learned_absolute"), "--position-embedding-type learned_absolute: "
                                                        "model llama2-7b has rope"),
    (("--hidden-dropout", "0.1"), "--hidden-dropout 0.1: model llama2-7b has 0.0"),
    (("--vocab-size", "50257"), "--vocab-size 50257: model llama2-7b has 32000"),
    # a Megatron-LM argument that changes the cost is not dropped: still unknown
    (("--no-masked-softmax-fusion",), "No such option: --no-masked-softmax-fusion"),
])
def test_architecture_arguments_are_checked_against_the_model(capsys, extra, words):
    line = one_line_error(*run_main(capsys, "cost", *BASE, *extra))
    assert words in line


def test_grouped_query_attention_needs_its_switch(capsys):
    """Mixtral has 8 key/value heads for 32: heads without --group-query-attention describe
    multi-head attention (Megatron-LM builds it so); with the switch and groups 8 it passes."""
    base = ("--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "8", "--tp", "8",
            "--global-batch", "64", "--layers", "2", "--swiglu", "--normalization", "RMSNorm",
            "--disable-bias-linear", "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights",
            "--attention-dropout", "0", "--hidden-dropout", "0")
    line = one_line_error(*run_main(capsys, "cost", *base, "--num-attention-heads", "32"))
    assert ("--num-attention-heads 32 without --group-query-attention: Megatron-LM builds 32 key/value "
            "heads, model mixtral-8x7b has 8 (add --group-query-attention --num-query-groups 8)") in line
    rc, _, err = run_main(capsys, "cost", *base, "--num-attention-heads", "32", "--group-query-attention",
                          "--num-query-groups", "8")
    assert rc == 0, err
    line = one_line_error(*run_main(capsys, "cost", *base, "--group-query-attention", "--num-query-groups", "4"))
    assert "--num-query-groups 4: model mixtral-8x7b has 8" in line


def test_export_notes_the_launch_line_and_other_commands_do_not_take_it(capsys):
    rc, out, err = run_main(capsys, "export", "--to", "megatron", *BASE, "--lr", "1e-4", "--kv-channels", "128")
    assert rc == 0, err
    assert "note: Megatron-LM arguments that leave a step's cost alone, not read: --lr 1e-4" in err
    line = one_line_error(*run_main(capsys, "export", "--to", "megatron", *BASE, "--hidden-size", "8192"))
    assert "--hidden-size 8192: model llama2-7b has 4096" in line
    line = one_line_error(*run_main(capsys, "compare", "--model", "llama2-7b", "--cluster", "dgx-h100",
                                    "--global-batch", "8", "--lr", "1e-4"))
    assert "No such option: --lr" in line


def test_a_program_text_has_no_architecture_to_check(capsys):
    line = one_line_error(*run_main(capsys, "cost", "--model", "../shared/data/programs/mlp_sgd_no_dist_attrs.pir",
                                    "--cluster", "dgx-h100", "--global-batch", "4", "--micro-batch-size", "4",
                                    "--hidden-size", "4096"))
    assert "--hidden-size: Megatron-LM architecture arguments describe a model config; a .pir program" in line


def test_qwen2_biases_and_gpt3_learned_positions(capsys, tmp_path):
    """The break-it pass: Megatron-LM keeps the q/k/v bias with --disable-bias-linear
    --add-qkv-bias (Qwen2's layout) -- it was refused; a learned position table has
    --max-position-embeddings rows -- 32768 against GPT-3's 2048 was accepted."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512,
                               "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                               "vocab_size": 1024, "max_position_embeddings": 2048}))
    base = ("--model", str(cfg), "--cluster", "dgx-h100", "--dp", "8", "--global-batch", "8",
            "--seq-length", "1024")
    rc, _, err = run_main(capsys, "cost", *base, "--disable-bias-linear", "--add-qkv-bias")
    assert rc == 0, err
    line = one_line_error(*run_main(capsys, "cost", *base, "--disable-bias-linear"))
    assert "--disable-bias-linear: model" in line and "has biases on qkv" in line
    gpt = ("--model", "gpt3-175b", "--cluster", "dgx-h100", "--nodes", "8", "--tp", "8", "--pp", "8",
           "--global-batch", "8", "--layers", "8")
    line = one_line_error(*run_main(capsys, "cost", *gpt, "--max-position-embeddings", "32768"))
    assert "--max-position-embeddings 32768: model gpt3-175b has a learned position table of 2048 rows" in line
    rc, _, err = run_main(capsys, "cost", *gpt, "--max-position-embeddings", "2048")
    assert rc == 0, err


def test_sequence_parallel_at_tp_1_is_turned_off_as_megatron_does(capsys):
    """Megatron-LM's own Llama 3 / Mixtral example scripts pass --sequence-parallel at tp 1,
    which it turns off with a warning (arguments.py validate_args): cost and export note it
    and cost the plan without (before: an error)."""
    rc, out, err = run_main(capsys, "cost", "--model", "llama2-7b", "--cluster", "dgx-h100", "--dp", "8",
                            "--global-batch", "8", "--sequence-parallel", "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert got["strategy"]["sequence_parallel"] is False
    assert any("--sequence-parallel (at tp 1 Megatron-LM turns it off)" in w for w in got["warnings"])
