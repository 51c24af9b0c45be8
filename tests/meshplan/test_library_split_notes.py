"""The rules the commands used to hold, called as a Python user calls them (no CLI): the
pipeline split words (``meshplan.pipeline_split``), Megatron-LM's even split note
(``meshplan.frameworks.megatron.notes``), tune's notes (``meshplan.tune_notes``)."""

from __future__ import annotations

import pytest

from meshplan import MeshplanError, Strategy
from meshplan.frameworks.megatron.notes import even_split_note
from meshplan.pipeline_split import split_word, with_split


def test_even_split_by_hand():
    s = Strategy(pp=4, global_batch_size=8)
    # 32 layers over 4 stages: 8 each (Megatron-LM's default split)
    assert with_split(s, "even", lambda: 32).layers_per_stage == (8, 8, 8, 8)
    assert with_split(s, " Balanced ", lambda: 32) is s  # the cost model balances it
    assert with_split(s, "5,9,9,9", lambda: 32).layers_per_stage == (5, 9, 9, 9)
    assert with_split(Strategy(global_batch_size=8), "even", lambda: 31).layers_per_stage is None
    assert split_word("EVEN") == "even" and split_word("5,3") is None


def test_split_errors_name_the_input():
    s = Strategy(pp=4, global_batch_size=8)
    with pytest.raises(MeshplanError, match=r"--layers-per-stage even: the model's 30 decoder layers "
                       r"do not divide over --pp \* --vpp = 4 \* 1 = 4 virtual stages") as e:
        with_split(s, "even", lambda: 30)
    assert e.value.field == "layers_per_stage"
    with pytest.raises(MeshplanError, match="comma-separated integers"):
        with_split(s, "5;3", lambda: 8, flag="layers_per_stage")
    with pytest.raises(MeshplanError):  # a StrategyError: 2 stages listed for 4
        with_split(s, "5,3", lambda: 8)


def test_megatron_even_split_note_by_hand():
    s = Strategy(pp=2, global_batch_size=8)
    note = even_split_note(s, lambda: (17, 15))
    assert note is not None and "[17, 15]" in note and "[16, 16]" in note
    assert even_split_note(s, lambda: (16, 16)) is None  # balanced == even
    assert even_split_note(s, lambda: (16, 15)) is None  # 31 layers: no even split
    assert even_split_note(Strategy(global_batch_size=8), lambda: 1 / 0) is None  # one stage: not asked
    assert even_split_note(s.replace(layers_per_stage=(17, 15)), lambda: 1 / 0) is None


def test_tune_notes_say_what_the_framework_does_not_run():
    from meshplan.tune_notes import unrun_cp, unrun_schedule

    assert unrun_cp(1, "fsdp2") is None and unrun_cp(None, "deepspeed") is None
    note = unrun_cp(2, "deepspeed")  # DeepSpeed runs no context parallelism (its profile)
    assert note is not None and "cp 2" in note
    assert unrun_schedule(None, "deepspeed", False) is None
    assert unrun_schedule("ZBVPP", "megatron-core", True) is None  # every schedule asked for
