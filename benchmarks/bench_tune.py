"""Strategy-search speed on llama2-7b, 4 x dgx-a100-80g (32 GPUs), global batch 512,
sequence 4096 -- completion, partition, cost and simulation included (``make_scorer``
runs ``Engine.simulate()`` per plan). Targets from issue 36 (issue 18 asked 100 and 1,000):

* distinct plans fully simulated per second (pattern-based space; a random sample of
  distinct plans, cost and schedule caches cleared first, so shared block costs and
  schedules are reused only as a real search reuses them): >= 30 plans/s;
* ``--sampler exhaustive`` decided per second (simulated or pruned by a proven bound):
  >= 2,000 plans/s, on the tp = 1 slice of the same space (small: fixed costs weigh; the
  issue's large cases are ``bench_search``'s);
* the 100-trial TPE search as run (repeats served from the study's cache), recorded;
* the floor SimPy sets under the first target: the pipeline actions of the 100 sampled
  plans played by a bare SimPy loop (``bench_pipeline.bare_loop``: one process per rank, one
  Timeout per action, no bookkeeping), measured in the same run. The engine of record plays
  at least these events, so 100 / that time bounds the plans/s any SimPy play can reach."""

from __future__ import annotations

import contextlib
import random
import time

import optuna

from benchmarks.bench_pipeline import bare_loop
from benchmarks.harness import BenchResult, measure, reference_workload, time_it
from meshplan.engine import COSTS
from meshplan.tuning import SCORER_FACTORY, make_scorer, search_problem, template_kinds
from simulator import pipeline_sim
from simulator.pipeline_sim import clear_play_cache
from simulator.schedules.base import clear_schedule_cache
from tuner.exhaustive import run_exhaustive
from tuner.space import SearchSpace
from tuner.study import TuneConfig, open_study, optimize
from tuner.suggest import enumerate_candidates

SC = {"model": "llama2-7b", "cluster": "dgx-a100-80g", "nodes": 4, "global_batch_size": 512,
      "seq_len": 4096}
N = 100
SAMPLE = 100


def _cfg(space: SearchSpace, sampler: str | None = None) -> TuneConfig:
    return TuneConfig(space, mode="pattern-based", template_kinds=template_kinds("llama2-7b", 4096),
                      seed=0, sampler=sampler, scorer_factory=SCORER_FACTORY, scorer_config=SC)


def _search(scorer) -> int:
    prob = search_problem("llama2-7b", "dgx-a100-80g", 4, 512, 4096)
    study, cfg = open_study(_cfg(SearchSpace(prob)), "bench", None, None)
    optimize(study, cfg, scorer, N)
    return sum(1 for t in study.trials if t.user_attrs.get("cached"))


def pipeline_actions(c) -> tuple[int, int]:
    """``(ranks, actions per rank)`` of candidate ``c``'s pipeline schedule in this space
    (global batch ``SC``): m = global batch / (dp x micro-batch) micro-batches, each an F
    and a B (1F1B, FThenB, VPP) or an F, a B and a W (the ZB family) per chunk."""
    m = SC["global_batch_size"] // (c.dp * c.micro_batch_size)
    phases = 3 if c.schedule.startswith("ZB") else 2
    return c.pp, m * phases * max(c.vpp, 1)


def simpy_floor(sample) -> float:
    """Seconds a bare SimPy loop takes to play the pipeline actions of every plan in
    ``sample`` (:func:`pipeline_actions`; no waits): a floor under the engine's play."""
    shapes = [pipeline_actions(c) for c in sample]
    return time_it(lambda: [bare_loop(p, n, 0) for p, n in shapes])


@contextlib.contextmanager
def _timed_plays(total: list[float]):
    """Add the seconds spent in the engine's SimPy plays (``pipeline_sim._play``, every
    caller: the step model's and the ZB / ZB-V builders' candidate plays) to ``total[0]``."""
    orig = pipeline_sim._play

    def timed(*args):
        t0 = time.perf_counter()
        try:
            return orig(*args)
        finally:
            total[0] += time.perf_counter() - t0

    pipeline_sim._play = timed
    try:
        yield
    finally:
        pipeline_sim._play = orig


def _cold() -> None:
    COSTS.clear()
    clear_schedule_cache()
    clear_play_cache()


def run() -> list[BenchResult]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    prob = search_problem("llama2-7b", "dgx-a100-80g", 4, 512, 4096)
    kinds = template_kinds("llama2-7b", 4096)
    cands = enumerate_candidates(SearchSpace(prob), "pattern-based", kinds)
    sample = random.Random(0).sample(cands, SAMPLE)
    ref = time_it(reference_workload)
    _cold()
    scorer = make_scorer(SC)
    played = [0.0]
    t0 = time.perf_counter()
    refused = 0
    with _timed_plays(played):
        for c in sample:
            try:
                scorer(c)
            except ValueError:
                refused += 1
    sec = time.perf_counter() - t0
    out = [BenchResult(f"distinct plans fully simulated ({SAMPLE} random of {len(cands)})", sec, ref,
                       SAMPLE / 30.0, f"{SAMPLE / sec:.1f} plans/s ({refused} refused by the engine); "
                                      f"target 30 plans/s")]
    floor = simpy_floor(sample)
    actions = sum(p * n for p, n in map(pipeline_actions, sample))
    out.append(BenchResult(f"SimPy plays inside those {SAMPLE} plans", played[0], ref, None,
                           f"{played[0] / sec:.0%} of their time; with nothing else to do "
                           f"{SAMPLE / played[0]:.0f} plans/s at most"))
    out.append(BenchResult(f"SimPy floor of the same {SAMPLE} plans ({actions} pipeline actions, "
                           "bare loop)", floor, ref, None,
                           f"at most {SAMPLE / floor:.0f} plans/s for any SimPy play of these plans; "
                           f"the engine's plays take {played[0] / floor:.1f}x it (they include the "
                           "ZB / ZB-V builders' candidate plays)"))
    slice_ = SearchSpace(prob, fix={"tp": 1})
    sl = enumerate_candidates(slice_, "pattern-based", kinds)
    _cold()
    scorer = make_scorer(SC)
    study, _ = open_study(_cfg(slice_, "exhaustive"), "bench-ex", None, None)
    t0 = time.perf_counter()
    rep = run_exhaustive(study, sl, scorer, {})
    sec = time.perf_counter() - t0
    out.append(BenchResult(f"exhaustive tp=1 slice ({len(sl)} candidates)", sec, ref, len(sl) / 2000.0,
                           f"{rep.decided / sec:.0f} decided/s (target 2000); " + rep.summary()))
    res = measure(f"tune pattern-based llama2-7b 32 GPUs, {N} TPE trials", lambda: _search(scorer),
                  None, repeat=1)
    cached = _search(scorer)
    res.extra = f"{N / res.seconds:.1f} trials/s ({cached} of {N} cache hits)"
    out.append(res)
    return out
