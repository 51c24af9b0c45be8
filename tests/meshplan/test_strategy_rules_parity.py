"""Every strategy rule lives in ``Strategy`` (issue 38 item 3): the same inputs through the
Python API and through ``meshplan cost`` are accepted or refused alike, with the same
message (the CLI's names the flag the user typed where the Strategy's names its field).

Each case gives the Strategy's keyword arguments, the flags that say the same, and either
the fields the strategy then holds, or the Strategy's message and the CLI's, written out."""

from __future__ import annotations

import pytest

from meshplan import Strategy, StrategyError
from tests._cli import one_line_error, run_main

BASE = ["cost", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80g", "--nodes", "1"]

ACCEPTED = [
    # an interleaved schedule without vpp runs 2 chunks per rank (was a CLI-only rule)
    ({"pp": 4, "schedule": "VPP", "global_batch_size": 16},
     ["--pp", "4", "--schedule", "VPP", "--global-batch", "16"], {"vpp": 2, "schedule": "VPP"}),
    ({"pp": 2, "schedule": "interleaved", "global_batch_size": 16},
     ["--pp", "2", "--schedule", "interleaved", "--global-batch", "16"], {"vpp": 2, "schedule": "VPP"}),
    ({"pp": 2, "schedule": "ZB-V", "global_batch_size": 16},
     ["--pp", "2", "--schedule", "ZB-V", "--global-batch", "16"], {"vpp": 2, "schedule": "ZBVPP"}),
    ({"pp": 2, "schedule": "VPP", "vpp": 4, "global_batch_size": 16},
     ["--pp", "2", "--schedule", "VPP", "--vpp", "4", "--global-batch", "16"], {"vpp": 4}),
    ({"pp": 2, "global_batch_size": 16}, ["--pp", "2", "--global-batch", "16"], {"vpp": 1}),
    ({"dp": 2, "cp": 2, "cp_comm": "allgather", "global_batch_size": 4},
     ["--dp", "2", "--cp", "2", "--cp-comm-type", "allgather", "--global-batch", "4"],
     {"cp_comm": "all_gather"}),
    ({"dtype": "fp8-tensorwise", "framework": "fsdp2", "global_batch_size": 8},
     ["--dtype", "fp8-tensorwise", "--framework", "fsdp2", "--global-batch", "8"],
     {"dtype": "bfloat16", "fp8": "tensorwise"}),
]

REFUSED = [
    ({"pp": 2, "schedule": "VPP", "vpp": 1, "global_batch_size": 16},
     ["--pp", "2", "--schedule", "VPP", "--vpp", "1", "--global-batch", "16"],
     "strategy field 'vpp' 1 with schedule VPP runs one model chunk per pipeline rank, which is "
     "1F1B: give vpp 2 or more (or leave it out), or schedule 1F1B",
     "--vpp 1 with schedule VPP runs one model chunk per pipeline rank, which is 1F1B: give --vpp "
     "2 or more (or leave it out), or schedule 1F1B"),
    ({"cp_comm": "all_gather", "global_batch_size": 8},
     ["--cp-comm", "all_gather", "--global-batch", "8"],
     "strategy field 'cp_comm' all_gather needs cp > 1: without context parallelism there is no "
     "K/V exchange",
     "--cp-comm all_gather needs --cp > 1: without context parallelism there is no K/V exchange"),
    ({"dtype": "fp8-delayed", "framework": "fsdp2", "global_batch_size": 8},
     ["--dtype", "fp8-delayed", "--framework", "fsdp2", "--global-batch", "8"],
     "strategy field 'dtype' fp8-delayed runs under strategy field 'framework' megatron-core, "
     "megatron-bridge, nemo or llm-foundry, not fsdp2: give one of them",
     "--dtype fp8-delayed runs under --framework megatron-core, megatron-bridge, nemo or "
     "llm-foundry, not fsdp2: give one of them"),
    ({"schedule": "ZBH1", "global_batch_size": 8}, ["--schedule", "ZBH1", "--global-batch", "8"],
     "strategy field 'schedule' ZBH1 orders the micro-batches of a pipeline, and pp 1 has none: "
     "give pp > 1, or schedule 1F1B (the default)",
     "--schedule ZBH1 orders the micro-batches of a pipeline, and --pp 1 has none: give --pp > 1, "
     "or schedule 1F1B (the default)"),
    ({"pp": 2, "schedule": "ZBVPP", "vpp": 3, "global_batch_size": 16},
     ["--pp", "2", "--schedule", "ZBVPP", "--vpp", "3", "--global-batch", "16"],
     "strategy field 'vpp' must be 2 for ZBVPP (two chunks per rank in a V), got 3",
     "--vpp must be 2 for ZBVPP (two chunks per rank in a V), got 3"),
]


@pytest.mark.parametrize("kwargs, flags, fields", ACCEPTED)
def test_accepted_alike(capsys, strategies, kwargs, flags, fields):
    py = Strategy(**kwargs)
    rc, _, err = run_main(capsys, *BASE, *flags)
    assert rc == 2 and "stopped before simulating" in err, err  # the stand-in Engine stops it
    cli = strategies[-1]
    assert {k: getattr(py, k) for k in fields} == fields
    assert {k: getattr(cli, k) for k in fields} == fields
    assert cli == py


@pytest.mark.parametrize("kwargs, flags, py_msg, cli_msg", REFUSED)
def test_refused_alike_with_the_same_message(capsys, kwargs, flags, py_msg, cli_msg):
    with pytest.raises(StrategyError) as info:
        Strategy(**kwargs)
    assert str(info.value) == py_msg
    assert info.value.field in kwargs  # the field at fault, which the CLI maps to its flag
    line = one_line_error(*run_main(capsys, *BASE, *flags))
    assert line == f"error: {cli_msg}"


def test_the_cli_names_the_alias_the_user_typed():
    """The error's ``.field`` names the flag; the CLI writes it as typed (an alias)."""
    from meshplan.commands.options import flag_error

    class Ctx:
        meta = {"meshplan.command_args": ("--num-virtual-stages-per-pipeline-rank", "1")}

    with pytest.raises(StrategyError) as info:
        Strategy(pp=2, schedule="VPP", vpp=1, global_batch_size=16)
    assert info.value.field == "vpp"
    out = flag_error(Ctx(), info.value)
    assert str(out).startswith("--num-virtual-stages-per-pipeline-rank 1 with schedule VPP")
    assert isinstance(out, StrategyError) and out.field == "vpp"
