"""Megatron-LM spellings mean Megatron semantics: a command line with Megatron-LM arguments
and no ``--dp`` gets dp = the world over tp x pp x cp (Megatron-LM d98e8a64
``validate_args``: ``data_parallel_size = world_size // total_model_size``), with a note;
``--dp`` typed, or meshplan's own spellings, keep meshplan's reading."""

from __future__ import annotations

import json

import pytest

from meshplan.commands.options import FLAGS, SIZE_FLAGS
from meshplan.errors import MeshplanError
from meshplan.frameworks.given import GivenFlags
from meshplan.frameworks.megatron import strategy_from_args
from meshplan.frameworks.megatron.data_parallel import megatron_dp, megatron_spelled
from tests._cli import one_line_error, run_main

#: 2 x dgx-h100 = 16 GPUs
PLACE = ("--model", "llama2-7b", "--cluster", "dgx-h100", "--nodes", "2")
MEGATRON = ("--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "2",
            "--micro-batch-size", "1", "--global-batch-size", "64", "--use-distributed-optimizer")


def _given(*args: str) -> GivenFlags:
    return GivenFlags(args, {**FLAGS, **SIZE_FLAGS})


def test_which_flags_are_megatron_spellings():
    """Megatron's names of a field (not meshplan's own flag for it) and Megatron-only
    arguments count; ``--micro-batch-size`` (both) and architecture arguments do not."""
    g = _given("--tp", "2", "--micro-batch-size", "1", "--hidden-size", "4096", "--seq-length=4096",
               "--recompute-granularity", "full", "--tensor-model-parallel-size", "2")
    assert megatron_spelled(g) == ["--seq-length", "--recompute-granularity", "--tensor-model-parallel-size"]
    assert megatron_spelled(_given("--tp", "2", "--pp", "2", "--micro-batch-size", "2")) == []


def test_dp_is_the_world_over_tp_pp_cp():
    """16 GPUs / (tp 4 x pp 2 x cp 1) = dp 2; --dp typed, no Megatron spelling, or a derived
    dp of 1 (meshplan's default too): None."""
    dp, note = megatron_dp(_given(*MEGATRON), 4, 2, 1, 16)
    assert dp == 2 and note.startswith("dp 2 = 16 GPUs / (tp 4 x pp 2 x cp 1), as Megatron-LM derives it")
    assert megatron_dp(_given(*MEGATRON, "--dp", "1"), 4, 2, 1, 16) is None
    assert megatron_dp(_given("--tp", "4", "--pp", "2"), 4, 2, 1, 16) is None
    assert megatron_dp(_given(*MEGATRON), 4, 2, 2, 16) is None  # 16 / 16
    with pytest.raises(MeshplanError, match="--tensor-model-parallel-size 3 x --pipeline-model-parallel-size 2") as e:
        megatron_dp(_given(*MEGATRON), 3, 2, 1, 16)
    assert e.value.field == "--tensor-model-parallel-size"


def test_cost_reads_a_megatron_line_as_megatron_does(capsys):
    """cost without --dp: dp 2 with the note, every GPU used, as the Python API reads the
    same arguments; the note is in --json's warnings too."""
    rc, out, err = run_main(capsys, "cost", *PLACE, *MEGATRON, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["layout"]["dp"] == 2 and doc["gpus_used"] == 16
    assert any(w.startswith("dp 2 = 16 GPUs / (tp 4 x pp 2 x cp 1)") for w in doc["warnings"])
    api, _ = strategy_from_args(list(MEGATRON), 16, model="llama2-7b")
    assert api.dp == doc["layout"]["dp"]
    rc, out, err = run_main(capsys, "cost", *PLACE, *MEGATRON)
    assert rc == 0 and "note: dp 2 = 16 GPUs / (tp 4 x pp 2 x cp 1), as Megatron-LM derives it" in err
    assert "plan: dp=2 tp=4 pp=2" in out


def test_dp_typed_or_meshplan_spellings_keep_meshplans_reading(capsys):
    """--dp 1 typed: dp 1 (8 of 16 GPUs, the idle warning); --tp/--pp: dp 1 as before."""
    rc, out, err = run_main(capsys, "cost", *PLACE, *MEGATRON, "--dp", "1")
    assert rc == 0 and "plan: dp=1 tp=4 pp=2" in out and "Megatron-LM derives it" not in err
    rc, out, _ = run_main(capsys, "cost", *PLACE, "--tp", "4", "--pp", "2", "--global-batch", "64")
    assert rc == 0 and "plan: dp=1 tp=4 pp=2" in out and "8 stay idle" in out


def test_a_megatron_line_that_does_not_divide_the_world_is_an_error(capsys):
    line = one_line_error(*run_main(capsys, "cost", *PLACE, *MEGATRON[2:],
                                    "--tensor-model-parallel-size", "3"))
    assert line.startswith("error: --tensor-model-parallel-size 3 x --pipeline-model-parallel-size 2 x --cp 1 = 6 "
                           "does not divide the 16 GPUs")


def test_export_reads_a_megatron_line_as_megatron_does(capsys):
    rc, out, err = run_main(capsys, "export", "--to", "megatron", *PLACE, *MEGATRON)
    assert rc == 0, err
    assert "note: dp 2 = 16 GPUs / (tp 4 x pp 2 x cp 1)" in err
    assert "16 ranks (dp 2 = 16 / (tp 4 x pp 2 x cp 1))" in out
