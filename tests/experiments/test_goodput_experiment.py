"""The ``goodput`` experiment (issue 41): the Llama 3 405B run's effective training time
from its interruption counts and a stated checkpoint setup."""

from __future__ import annotations

import pytest

from experiments.goodput import llama3_rows


def test_llama3_effective_training_time_is_above_90_percent():
    df, notes = llama3_rows()
    # the report: 466 interruptions in 54 days on 16,384 H100
    assert df.interruptions_54d.to_list() == pytest.approx([466] * len(df), abs=0.01)
    at5 = df.loc[df.relaunch_s == 300.0].iloc[0]
    # "higher than 90% effective training time": goodput at a 5-minute relaunch
    assert 0.90 < at5.goodput < 0.97
    # the optimal interval is Young's sqrt(2 delta M) to within a step: delta the stall, M the MTBF
    young_steps = (2 * at5.save_stall_s * at5.mtbf_h * 3600) ** 0.5 / at5.step_s
    assert at5.interval_steps == pytest.approx(young_steps, abs=1.5)
    assert list(df.goodput) == sorted(df.goodput, reverse=True)  # a longer relaunch costs more
    assert "relaunch up to" in notes[1]
