"""Strategy-search speed: pattern-based trials per second on llama2-7b, 4 x dgx-a100-80g
(32 GPUs), global batch 512, sequence 4096 — completion, partition, cost and simulation
included (``meshplan.tuning.make_scorer`` runs ``Engine.simulate()`` per plan).

Target (issue 8): at least 10 trials/s, i.e. 100 TPE trials in under 10 s. Two figures are
recorded: the search as run (repeats of a plan are served from the cache, as in a real
search) and the uncached scoring rate over distinct legal plans (every plan simulated)."""

from __future__ import annotations

import random
import time

import optuna

from benchmarks.harness import BenchResult, measure
from meshplan.tuning import SCORER_FACTORY, make_scorer, search_problem, template_kinds
from tuner.space import SearchSpace
from tuner.study import TuneConfig, open_study, optimize
from tuner.suggest import enumerate_candidates

SC = {"model": "llama2-7b", "cluster": "dgx-a100-80g", "nodes": 4, "global_batch_size": 512,
      "seq_len": 4096}
N = 100


def _search(scorer) -> int:
    prob = search_problem("llama2-7b", "dgx-a100-80g", 4, 512, 4096)
    cfg = TuneConfig(SearchSpace(prob), mode="pattern-based",
                     template_kinds=template_kinds("llama2-7b", 4096), seed=0,
                     scorer_factory=SCORER_FACTORY, scorer_config=SC)
    study, cfg = open_study(cfg, "bench", None, None)
    optimize(study, cfg, scorer, N)
    return sum(1 for t in study.trials if t.user_attrs.get("cached"))


def run() -> list[BenchResult]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    scorer = make_scorer(SC)
    cached = _search(scorer)  # warm-up, and the cache-hit count of this seeded search
    prob = search_problem("llama2-7b", "dgx-a100-80g", 4, 512, 4096)
    cands = enumerate_candidates(SearchSpace(prob), "pattern-based",
                                 template_kinds("llama2-7b", 4096))
    sample = random.Random(0).sample(cands, 50)
    t0 = time.perf_counter()
    for c in sample:
        scorer(c)
    uncached = len(sample) / (time.perf_counter() - t0)
    res = measure(f"tune pattern-based llama2-7b 32 GPUs, {N} TPE trials", lambda: _search(scorer),
                  N / 10.0, repeat=3)
    res.extra = (f"{N / res.seconds:.1f} trials/s ({cached} of {N} cache hits); uncached "
                 f"{uncached:.1f} plans/s over 50 distinct plans of {len(cands)}")
    return [res]
