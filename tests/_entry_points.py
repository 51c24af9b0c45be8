"""Generated plans put through every entry point that takes one (issue 43, item 5): the
Python API (``Strategy`` and ``Engine``), a plan.json (``meshplan cost PLAN.json``) and the
CLI flags (``meshplan cost -m ... --dp ...``). Each answers *accepted* (a cost) or
*refused* (one ``error:`` line, exit 2); anything else (a traceback, another exit code)
is a fault. Shared by tests/meshplan/test_one_validation_path.py (a fast slice) and
benchmarks/fuzz_entry_points.py (the recorded run)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

#: the models drawn: a rotary GQA-free llama, a learned-position GPT, a GQA MoE
MODELS = ("llama2-7b", "gpt3-175b", "qwen3-30b-a3b")


#: every knob's values, valid and not, for a mutation to draw from
KNOB_VALUES: dict[str, list[Any]] = {
    "dp": [1, 2, 3, 4, 8, 16], "tp": [1, 2, 3, 4, 8], "pp": [1, 2, 3, 4], "vpp": [1, 2, 3],
    "schedule": ["1F1B", "VPP", "ZBH1", "FThenB", "ZBVPP"], "micro_batch_size": [1, 2, 3],
    "global_batch_size": [4, 6, 8, 16, 32, 5], "zero": [0, 1, 2, 3], "sequence_parallel": [False, True],
    "recompute": ["none", "full", "selective"], "cp": [1, 2, 3], "framework": ["megatron-core", "fsdp2", "deepspeed"],
    "dtype": ["bfloat16", "fp8-delayed", "float32"],
}


@st.composite
def plans(draw: Any) -> dict[str, Any]:
    """A plan's inputs: a layout that fits the cluster (world = GPUs, whole micro-batches),
    then none, one or two knobs or sizes set to any value of :data:`KNOB_VALUES` (valid or
    not), so that both answers are drawn often."""
    nodes = draw(st.sampled_from([1, 2]))
    tp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([1, 2]))
    dp = 8 * nodes // (tp * pp)
    mbs = draw(st.sampled_from([1, 2]))
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    s = {"dp": dp, "tp": tp, "pp": pp, "vpp": vpp, "schedule": "VPP" if vpp > 1 else "1F1B",
         "micro_batch_size": mbs, "global_batch_size": dp * mbs * pp * draw(st.sampled_from([1, 2])),
         "zero": draw(st.sampled_from([0, 1])), "sequence_parallel": tp > 1 and draw(st.booleans()),
         "recompute": draw(st.sampled_from(["none", "full"])), "cp": 1, "framework": "megatron-core",
         "dtype": "bfloat16"}
    p = {"model": draw(st.sampled_from(MODELS)), "nodes": nodes, "num_layers": 4,
         "seq_len": draw(st.sampled_from([1024, 2048])), "strategy": s}
    for _ in range(draw(st.sampled_from([0, 1, 2]))):
        knob = draw(st.sampled_from([*KNOB_VALUES, "seq_len", "num_layers"]))
        if knob == "seq_len":
            p["seq_len"] = draw(st.sampled_from([3000, 4096, 100000]))
        elif knob == "num_layers":
            p["num_layers"] = draw(st.sampled_from([1, 3, 5]))
        else:
            s[knob] = draw(st.sampled_from(KNOB_VALUES[knob]))
    return p


def via_api(p: dict[str, Any]) -> str:
    """``accepted`` / ``refused`` through ``Strategy`` and ``Engine.cost``."""
    from meshplan.engine import Engine
    from meshplan.strategy import Strategy

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s = Strategy(**p["strategy"])
            Engine(p["model"], "dgx-h100", s, nodes=p["nodes"], seq_len=p["seq_len"],
                   num_layers=p["num_layers"]).cost()
    except ValueError:
        return "refused"
    return "accepted"


def _answer(rc: int, out: str, err: str) -> str:
    if rc == 0:
        return "accepted"
    lines = err.strip().splitlines()
    if rc == 2 and "Traceback" not in err + out and lines and lines[-1].startswith("error: "):
        return "refused"
    return f"fault: exit {rc}: {(err or out)[-600:]}"


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``meshplan ARGV`` in this process: (exit code, stdout, stderr); warnings muted."""
    import contextlib
    import io

    from meshplan.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            rc = main(argv)
        except BaseException:  # noqa: BLE001 - a traceback is what the fuzz looks for
            import traceback

            return 99, out.getvalue(), err.getvalue() + "Traceback\n" + traceback.format_exc()
    return rc, out.getvalue(), err.getvalue()


def via_plan_file(p: dict[str, Any], folder: Path) -> str:
    """``accepted`` / ``refused`` / ``fault: ...`` of ``meshplan cost PLAN.json``."""
    path = folder / "plan.json"
    path.write_text(json.dumps({"version": 2, "model": p["model"], "cluster": "dgx-h100",
                                "nodes": p["nodes"], "seq_len": p["seq_len"],
                                "num_layers": p["num_layers"], "strategy": p["strategy"]}))
    return _answer(*run_cli(["cost", str(path), "--json"]))


def cli_flags(p: dict[str, Any]) -> list[str]:
    """The ``meshplan cost`` command line of plan ``p`` (every knob typed)."""
    s = p["strategy"]
    argv = ["cost", "-m", p["model"], "--cluster", "dgx-h100", "--nodes", str(p["nodes"]),
            "--seq-len", str(p["seq_len"]), "--layers", str(p["num_layers"]), "--json"]
    for k in ("dp", "tp", "pp", "vpp", "schedule", "micro_batch_size", "global_batch_size",
              "zero", "recompute", "cp", "framework", "dtype"):
        argv += [f"--{k.replace('_', '-')}", str(s[k])]
    if s["sequence_parallel"]:
        argv.append("--sequence-parallel")
    return argv


def via_flags(p: dict[str, Any]) -> str:
    """``accepted`` / ``refused`` / ``fault: ...`` of ``meshplan cost`` with the knobs as flags."""
    return _answer(*run_cli(cli_flags(p)))


def as_the_cli_reads_it(p: dict[str, Any]) -> dict[str, Any]:
    """Plan ``p`` as the CLI flags mean it, for the API to answer alike: the one documented
    translation is Megatron-LM's ``--sequence-parallel`` at tp 1, which Megatron-LM turns
    off (``megatron/training/arguments.py``) and ``cost`` notes as not read; the API's
    ``Strategy(sequence_parallel=True, tp=1)`` is refused instead."""
    s = p["strategy"]
    if s["tp"] == 1 and s["sequence_parallel"]:
        return {**p, "strategy": {**s, "sequence_parallel": False}}
    return p
