"""``meshplan program show``: PIR text that parses back, a summary with counts, one-line errors."""

from __future__ import annotations

import json

from completion import parse_program, print_program
from completion.models import build_model
from tests._cli import one_line_error, run_main


def _split(out: str) -> tuple[str, list[str]]:
    lines = out.splitlines()
    end = lines.index("}")
    return "\n".join(lines[: end + 1]), lines[end + 1 :]


def test_show_llama_two_layers(capsys):
    rc, out, err = run_main(capsys, "program", "show", "--model", "llama2-7b", "--layers", "2",
                       "--batch-size", "2", "--seq-len", "32")
    assert rc == 0 and err == ""
    text, summary = _split(out)
    ref = build_model("llama2-7b", 2, seq_len=32, num_layers=2)
    assert text == print_program(ref).rstrip("\n")
    assert print_program(parse_program(text)).rstrip("\n") == text
    # 2 layers x 7 projections + lm_head; 2 layers x 2 norms + final; by hand:
    # 2 * (4*4096^2 + 3*4096*11008 + 2*4096) + 2*32000*4096 + 4096 = 666,914,816
    assert "//   pd_op.matmul" in "\n".join(summary)
    counts = {ln.split()[1]: int(ln.split()[2]) for ln in summary if ln.startswith("//   ")}
    assert counts["pd_op.matmul"] == 15 and counts["pd_op.rms_norm"] == 5
    assert counts["pd_op.flash_attention"] == 2 and counts["builtin.parameter"] == 2 * 9 + 3
    assert summary[-1] == "// parameters: 666,914,816 (0.667 B)"
    assert "llama2-7b (llama builder: rms_norm pre, swiglu, rope positions), 2 layers, batch 2, seq 32" in summary[0]


def test_summary_only_gpt(capsys):
    rc, out, _ = run_main(capsys, "program", "show", "-m", "gpt3-175b", "-l", "1", "-s", "64", "--summary-only")
    assert rc == 0 and "pd_op." not in out.split("// ops")[0]
    # 1 GPT-3 layer: 12h^2 + 13h; embeddings (51200 + 2048) h; two layer_norms of the
    # final norm 2h; h = 12288 -> 2,466,435,072
    assert out.strip().splitlines()[-1] == "// parameters: 2,466,435,072 (2.466 B)"
    assert "// ops: 53 (forward 50, loss 3)" in out


def test_config_json_path(capsys, tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
                             "num_attention_heads": 4, "num_key_value_heads": 2,
                             "intermediate_size": 128, "vocab_size": 100,
                             "max_position_embeddings": 16}))
    rc, out, _ = run_main(capsys, "program", "show", "--model", str(f), "--summary-only")
    assert rc == 0
    # 2 * (2*64*64 + 2*64*32 + 3*64*128 + 2*64) + 2*100*64 + 64 = 86,848
    assert out.strip().splitlines()[-1] == "// parameters: 86,848 (0.087 M)"


def test_unknown_model_is_a_one_line_error(capsys):
    line = one_line_error(*run_main(capsys, "program", "show", "--model", "llama5-3b"))
    assert "unknown model 'llama5-3b'" in line and "llama2-7b" in line


def test_bad_values_are_one_line_errors(capsys):
    line = one_line_error(*run_main(capsys, "program", "show", "--model", "gpt3-175b", "--layers", "1",
                               "--seq-len", "4096"))
    assert "seq_len 4096 exceeds the 2048 learned positions" in line
    line = one_line_error(*run_main(capsys, "program", "show", "--model", "llama2-7b", "--layers", "0"))
    assert "--layers" in line and "greater than or equal to 1" in line  # names the flag
    line = one_line_error(*run_main(capsys, "program", "show", "--model", "llama2-7b", "--batch-size", "0"))
    assert "batch_size must be a positive int, got 0" in line


def test_the_summary_names_what_sets_a_config_apart(capsys, tmp_path):
    """Found by a new-user check: every config.json summary read "(llama)" (the builder
    family), Gemma-2 included; it now names the norm and its placement, the MLP activation,
    the positions, grouped KV heads, qk-norm, a sliding window and MoE routing."""
    from pathlib import Path

    cfg = Path(__file__).resolve().parents[1] / "data" / "hf_configs" / "gemma-2-9b.json"
    rc, out, err = run_main(capsys, "program", "show", "--model", str(cfg), "--batch-size", "1",
                            "--seq-len", "16", "--summary-only")
    assert rc == 0, err
    first = out.splitlines()[0]
    assert ("(llama builder: rms_norm sandwich, geglu_tanh, rope positions, GQA 16/8 heads, "
            "sliding window 4096 on 21 of 42 layers), 42 layers") in first
    rc, out, err = run_main(capsys, "program", "show", "--model", str(cfg), "--layers", "4",
                            "--seq-len", "16", "--summary-only")  # the layers built: 0 and 2
    assert rc == 0, err
    assert "sliding window 4096 on 2 of 4 layers), 4 layers" in out.splitlines()[0]
    cfg = cfg.with_name("qwen3-30b-a3b.json")  # qk-norm and routing are named too
    rc, out, err = run_main(capsys, "program", "show", "--model", str(cfg), "--layers", "1",
                            "--batch-size", "1", "--seq-len", "16", "--summary-only")
    assert rc == 0, err
    assert "GQA 32/4 heads, qk-norm, MoE 128 experts top-8)" in out.splitlines()[0]
