"""Errors in the user's words (issue 20 item 9): an unknown option gets click's own "No such
option ... Possible options" from the command's real option list, aliases included; ``tune
--help`` says that models and clusters may be files; (messages that name the flag typed:
tests/meshplan/test_cli_options.py and tests/meshplan/test_cli_megatron_names.py)."""

from __future__ import annotations

import pytest

from meshplan.commands import options as opt
from tests._cli import run_main

COST = ["cost", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80g", "--global-batch", "8"]
TUNE = ["tune", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--global-batch", "8"]
EXPORT = ["export", "--to", "megatron"]


def _no_such_option(capsys, argv: list[str], typo: str) -> str:
    rc, out, err = run_main(capsys, *argv, typo, "2")
    assert rc == 2 and "Traceback" not in out + err
    assert f"No such option: {typo}" in err, err
    # one `error:` line, as every other bad input (it was click's four: Usage, Try, Error)
    assert err.startswith(f"error: No such option: {typo}") and err.count("\n") == 1, err
    assert err.rstrip().endswith(f" {argv[0]} --help'") and "; see '" in err, err
    return err


@pytest.mark.parametrize("argv", [COST, TUNE, EXPORT], ids=["cost", "tune", "export"])
@pytest.mark.parametrize("typo,meant", [
    ("--tensor-model-paralel-size", "--tensor-model-parallel-size"),
    ("--pipeline-model-parallel-sizes", "--pipeline-model-parallel-size"),
    ("--num-layers-per-virtual-stage", "--num-layers-per-virtual-pipeline-stage"),
    ("--use-distributed-optimiser", "--use-distributed-optimizer"),
    ("--micro-batch", "--micro-batch-size"),
    ("--recompute-granularty", "--recompute-granularity"),
    ("--context-paralel-size", "--context-parallel-size"),
])
def test_unknown_options_suggest_the_real_ones(capsys, argv, typo, meant):
    err = _no_such_option(capsys, argv, typo)
    assert "Possible options:" in err and meant in err, err


def test_every_strategy_alias_is_suggested_for_its_typo(capsys):
    """Each spelling of :data:`FLAGS` (aliases too) is an option of cost, and click suggests
    it for a one-letter typo."""
    for flags in opt.FLAGS.values():
        for flag in flags:
            if len(flag) < 7:  # --dp, --tp: too short for a close match
                continue
            typo = flag[:-1] + ("x" if flag[-1] != "x" else "y")
            err = _no_such_option(capsys, COST, typo)
            assert flag in err.split("Possible options:")[1], (flag, err)


def test_tune_help_says_models_and_clusters_may_be_files(capsys):
    rc, out, _ = run_main(capsys, "tune", "--help")
    assert rc == 0
    text = " ".join(out.replace("│", " ").split())
    assert "config.json file" in text and "cluster YAML file" in text
    assert "Hugging Face config.json" in text  # --model's own help
    assert "Megatron-LM" in text  # the strategy options take its spellings (names cut at 80 columns)


@pytest.mark.parametrize("flag", ["--global-batch", "--global-batch-size"])
def test_a_bad_search_problem_is_named_by_the_flag_typed(capsys, flag, tmp_path):
    """tune's search problem used to say `search problem field 'global_batch_size'`."""
    from tests._cli import one_line_error

    line = one_line_error(*run_main(capsys, "tune", "--model", "llama2-7b", "--cluster", "dgx-h100",
                                    flag, "0", "--trials", "2", "--output", str(tmp_path / "r")))
    assert line == f"error: {flag} must be an integer >= 1, got 0"
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv", [[], ["clusters"]])
def test_no_arguments_print_the_help_only(capsys, argv):
    """The reviewer found `meshplan` alone ending in `error: str` after its help."""
    rc, out, err = run_main(capsys, *argv)
    assert rc == 2 and "error:" not in out + err and "Usage" in out + err
