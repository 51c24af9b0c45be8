"""Speed of Engine.cost() (target from issue 7): llama2-70b on 64 nodes of dgx-h100,
dp=8, tp=8, pp=8, vpp=2 (VPP), micro-batch 1, global batch 128, full recompute; the whole
path (build, backward, optimizer, Megatron annotation, completion, partition, block costs,
SimPy pipeline) from a fresh Engine each call."""

from __future__ import annotations

from benchmarks.harness import BenchResult, measure
from meshplan.engine import Engine
from meshplan.strategy import Strategy

STRATEGY = Strategy(dp=8, tp=8, pp=8, vpp=2, schedule="VPP", micro_batch_size=1,
                    global_batch_size=128, recompute="full")


def _cost() -> tuple[float, int]:
    return Engine("llama2-70b", "dgx-h100", STRATEGY, nodes=64).cost()


def run() -> list[BenchResult]:
    """One timed entry; ``extra`` records the predicted step time and peak memory."""
    t_ms, peak = _cost()
    return [measure("Engine.cost llama2-70b 64x dgx-h100 dp8 mp8 pp8 vpp2", _cost, 2.0,
                    extra=f"step {t_ms:.1f} ms, peak {peak / 2**30:.2f} GiB")]
