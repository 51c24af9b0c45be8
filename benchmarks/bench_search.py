"""Speed to a proof (issue 36 item 5): ``tune --sampler exhaustive`` on the issue's cases,
run in this process through the CLI (``meshplan.cli.main``) as a user runs it, each from
cold caches. Targets (seconds on 2 cores, checked here on this process's CPU seconds, which
other jobs on a shared machine inflate far less than the wall clock; the wall seconds and
the load are in the notes):

* Llama-3.1-70B (``benchmarks/models/l70``), 8 x dgx-h100, sequence 8192, global batch 512:
  proven in <= 20 s, the pattern-based space (every tensor-parallel pattern variant) and the
  Megatron slice (``--mode semi-auto``: the Megatron annotation only);
* Llama-3.1-405B (``l405``), 32 x dgx-h100, sequence 8192, global batch 1024, FP8 and cp
  searched too (``--search-fp8 --search-cp``): <= 120 s;
* Mixtral-8x22B and Qwen3-235B-A22B (``mixtral-8x22b``, ``qwen3-235b-a22b``: the published
  Hugging Face configs), 32 x dgx-h100, sequence 4096, global batch 1024, with expert
  parallelism: <= 120 s;
* plans decided per second (simulated or pruned by a proven bound) >= 2,000, in the notes.

Each figure is next to the reference workload's CPU seconds of the same run
(``benchmarks.harness``: the ratio column). A case that is not proven within four times its
target is stopped (``--timeout``) and reported as missed."""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re
import tempfile
import time

from benchmarks.harness import BenchResult, cpu_time_it, reference_workload

MODELS = pathlib.Path(__file__).parent / "models"

#: (name, CLI arguments, target seconds, modes)
CASES = [
    ("Llama-3.1-70B 8 x dgx-h100", ["--model", str(MODELS / "l70"), "--cluster", "dgx-h100", "--nodes", "8",
                                    "--seq-len", "8192", "--global-batch", "512"], 20.0,
     ("pattern-based", "semi-auto")),
    ("Llama-3.1-405B 32 x dgx-h100 fp8 cp", ["--model", str(MODELS / "l405"), "--cluster", "dgx-h100",
                                             "--nodes", "32", "--seq-len", "8192", "--global-batch", "1024",
                                             "--search-fp8", "--search-cp"], 120.0, ("pattern-based", "semi-auto")),
    ("Mixtral-8x22B 32 x dgx-h100", ["--model", str(MODELS / "mixtral-8x22b"), "--cluster", "dgx-h100",
                                     "--nodes", "32", "--seq-len", "4096", "--global-batch", "1024"], 120.0,
     ("pattern-based", "semi-auto")),
    ("Qwen3-235B-A22B 32 x dgx-h100", ["--model", str(MODELS / "qwen3-235b-a22b"), "--cluster", "dgx-h100",
                                       "--nodes", "32", "--seq-len", "4096", "--global-batch", "1024"], 120.0,
     ("pattern-based", "semi-auto")),
]


def _cold() -> None:
    """Forget every cost, program, schedule and play a previous case left in this process."""
    from meshplan import engine
    from simulator.pipeline_sim import clear_play_cache
    from simulator.schedules.base import clear_schedule_cache

    for cache in ("COSTS", "PROGRAMS"):  # (PROGRAMS: absent in trees before it; run against those too)
        if hasattr(engine, cache):
            getattr(engine, cache).clear()
    clear_schedule_cache()
    clear_play_cache()


def prove(args: list[str], mode: str, timeout: float) -> tuple[float, float, str]:
    """Run ``meshplan tune ARGS --sampler exhaustive --mode MODE`` in this process from cold
    caches; returns (CPU seconds, wall seconds, the exhaustive summary line of report.txt)."""
    from meshplan.cli import main

    _cold()
    with tempfile.TemporaryDirectory(prefix="bench-search-") as out:
        argv = ["tune", *args, "--sampler", "exhaustive", "--mode", mode, "--timeout", f"{timeout:g}",
                "--output", out, "--no-progress"]
        c0, w0 = time.process_time(), time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            rc = main(argv)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        report = pathlib.Path(out, "report.txt")
        text = report.read_text() if report.is_file() else ""
    start = text.find("exhaustive:")
    if start < 0:
        return cpu, wall, f"no report (exit {rc})"
    flat = " ".join(text[start:].split())  # the summary, wrapped over lines
    m = re.match(r"exhaustive:.*?decided/s\)", flat)
    return cpu, wall, m.group(0) if m else flat[:400]


def summary(line: str, cpu: float) -> tuple[bool, str]:
    """(proven, notes) from an exhaustive summary line: candidates, decided per CPU second,
    the best step time."""
    n = re.search(r"(\d+) candidates", line)
    best = re.search(r"best ([\d.]+) ms", line)
    proven = "proven optimum" in line
    cands = int(n.group(1)) if n else 0
    return proven, (f"{cands} candidates, {cands / cpu:.0f} decided per CPU s; "
                    f"best {best.group(1) if best else '-'} ms; {'proven' if proven else 'NOT proven'}")


def run() -> list[BenchResult]:
    from meshplan.cli import main

    with contextlib.redirect_stdout(io.StringIO()):  # imports and first-use costs outside the timing
        main(["tune", "--help"])
    ref = cpu_time_it(reference_workload, repeat=3)
    out = []
    for name, args, target, modes in CASES:
        for mode in modes:
            load = os.getloadavg()[0]
            cpu, wall, line = prove(args, mode, 4 * target)
            proven, notes = summary(line, cpu)
            res = BenchResult(f"prove {name} ({mode})", cpu, ref, target,
                              f"{notes}; wall {wall:.1f} s at load {load:.1f}")
            if not proven:  # a case stopped unproven misses its target whatever its seconds
                res.target_seconds = 0.0
            out.append(res)
    return out
