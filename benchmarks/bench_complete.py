"""Completion speed: ``Completer.complete()`` on full training programs (forward +
``append_backward`` + ``apply_optimizer("adamw")``) with the Megatron layout
(:func:`completion.shard_megatron`) on a mesh [dp=2, tp=4].

Targets (issue 4): llama2-7b (32 layers) under 1 s, llama2-70b (80 layers) under 3 s.
Only ``complete()`` is timed; the program is rebuilt and annotated outside the timing."""

from __future__ import annotations

import time

from benchmarks.harness import BenchResult, reference_workload
from completion import build_model
from completion.annotate import shard_megatron
from completion.backward import append_backward
from completion.completer import Completer
from completion.mesh import ProcessMesh
from completion.optimizer import apply_optimizer


def annotated_program(name: str):
    """``name`` (batch 4, default seq) forward + backward + AdamW, Megatron-annotated."""
    p = build_model(name, 4)
    append_backward(p)
    apply_optimizer(p, "adamw")
    mesh = ProcessMesh.of(2, 4, dim_names=("dp", "mp"))
    shard_megatron(p, mesh, "dp", "mp")
    return p


def time_complete(name: str, repeat: int = 3) -> tuple[float, int]:
    """Median seconds of ``complete()`` over ``repeat`` fresh programs, and the op count."""
    times, n = [], 0
    for _ in range(repeat):
        p = annotated_program(name)
        n = len(p)
        t0 = time.perf_counter()
        Completer(p).complete()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2], n


def run() -> list[BenchResult]:
    t0 = time.perf_counter()
    reference_workload()
    ref = time.perf_counter() - t0
    out = []
    for name, target in (("llama2-7b", 1.0), ("llama2-70b", 3.0)):
        sec, n = time_complete(name)
        out.append(BenchResult(f"complete {name} megatron dp2 x mp4", sec, ref, target, f"{n} ops"))
    return out
