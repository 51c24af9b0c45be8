"""Partition + reshard speed: ``apply_partition_pass`` then ``apply_reshard_pass`` on
llama2-7b (32 layers, batch 4, forward + ``append_backward`` + ``apply_optimizer("adamw")``),
Megatron layout (:func:`completion.annotate.shard_megatron`) on a mesh [dp=2, tp=4], after
``Completer.complete()``.

Target (issue 5): under 0.5 s. Only the two passes are timed; the planner's caches are
cleared before each run so every plan is searched again."""

from __future__ import annotations

import time

from benchmarks.harness import BenchResult, reference_workload
from completion import apply_partition_pass, apply_reshard_pass, build_model
from completion.annotate import shard_megatron
from completion.backward import append_backward
from completion.completer import Completer
from completion.mesh import ProcessMesh
from completion.optimizer import apply_optimizer
from completion.reshard.planner import clear_plan_caches


def completed_program(name: str = "llama2-7b"):
    """``name`` (batch 4) forward + backward + AdamW, Megatron dp2 x mp4, completed."""
    p = build_model(name, 4)
    append_backward(p)
    apply_optimizer(p, "adamw")
    shard_megatron(p, ProcessMesh.of(2, 4, dim_names=("dp", "mp")), "dp", "mp")
    Completer(p).complete()
    return p


def time_passes(name: str = "llama2-7b", repeat: int = 3) -> tuple[float, int, int]:
    """Median seconds of partition + reshard over ``repeat`` fresh programs, the number of
    reshard ops inserted and the op count after the reshard pass."""
    times, n_rs, n_ops = [], 0, 0
    for _ in range(repeat):
        p = completed_program(name)
        clear_plan_caches()
        t0 = time.perf_counter()
        apply_partition_pass(p)
        n_rs = sum(op.type == "reshard" for op in p.ops)
        apply_reshard_pass(p)
        times.append(time.perf_counter() - t0)
        n_ops = len(p)
    times.sort()
    return times[len(times) // 2], n_rs, n_ops


def run() -> list[BenchResult]:
    t0 = time.perf_counter()
    reference_workload()
    ref = time.perf_counter() - t0
    sec, n_rs, n_ops = time_passes()
    extra = f"{n_rs} reshards -> {n_ops} ops"
    return [BenchResult("partition+reshard llama2-7b megatron dp2 x mp4", sec, ref, 0.5, extra),
            *run_scaling(ref)]


def time_pipeline(layers: int, name: str = "zb-gpt-6.2b", clock=time.perf_counter) -> tuple[float, int]:
    """Seconds of complete + partition + reshard of ``name`` with ``layers`` layers (batch
    4, forward + backward + AdamW, Megatron dp2 x mp4; the planner's cache cleared), and
    the op count after the reshard pass. ``clock``: ``time.perf_counter`` (wall) or
    ``time.process_time`` (CPU seconds of this process)."""
    p = build_model(name, 4, num_layers=layers)
    append_backward(p)
    apply_optimizer(p, "adamw")
    shard_megatron(p, ProcessMesh.of(2, 4, dim_names=("dp", "mp")), "dp", "mp")
    clear_plan_caches()
    t0 = clock()
    Completer(p).complete()
    apply_partition_pass(p)
    apply_reshard_pass(p)
    return clock() - t0, len(p)


def run_scaling(ref: float) -> list[BenchResult]:
    """Issue 18: complete + partition + reshard of zb-gpt-6.2b (32 layers) <= 0.3 s, and
    linear in layers up to 128 (the exponent of the time from 32 to 128 layers)."""
    import math

    t32, n32 = min(time_pipeline(32) for _ in range(2))
    t128, n128 = min(time_pipeline(128) for _ in range(2))
    k = math.log(t128 / t32) / math.log(4)
    c32 = min(time_pipeline(32, clock=time.process_time)[0] for _ in range(3))
    c128 = min(time_pipeline(128, clock=time.process_time)[0] for _ in range(2))
    kc = math.log(c128 / c32) / math.log(4)
    return [BenchResult("complete+partition+reshard zb-gpt-6.2b 32 layers dp2 x mp4", t32, ref, 0.3,
                        f"{n32} ops; 128 layers: {t128:.3f} s ({n128} ops), exponent {k:.2f} "
                        f"(1 = linear); CPU {c32:.3f} s, 128 layers {c128:.3f} s, exponent {kc:.2f}")]
