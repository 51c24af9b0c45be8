"""experiments: reproducible experiments and report builders.

Each experiment is one module exposing a function registered with
``@register_experiment(name, title)``: ``fn(quick: bool, out_dir: Path) ->
ExperimentResult`` (a pandas DataFrame plus description, notes and figures).
``run_experiments`` (and ``meshplan report``) writes ``<name>.csv``, ``<name>.md``, the
figures and a combined ``README.md``.

Only the modules listed in ``EXPERIMENT_MODULES`` are registered. Experiments import the
pieces they measure lazily through ``experiments.base.require``, so a missing piece makes
that experiment fail with a message naming it, not the whole package.
"""

from __future__ import annotations

import importlib

from experiments.base import (
    EXPERIMENTS,
    Experiment,
    ExperimentError,
    ExperimentResult,
    register_experiment,
    require,
)
from experiments.runner import RunRecord, run_experiments, run_one, select
from experiments.tables import to_markdown

EXPERIMENT_MODULES = [
    "experiments.zb_bubbles",
    "experiments.schedule_tradeoffs",
    "experiments.zb_throughput",
    "experiments.megatron_table1",
    "experiments.search_quality",
    "experiments.search_quality_time",
    "experiments.search_quality_default",
    "experiments.local_validation",
    "experiments.measured_runs",
    "experiments.vtrain_single_node",
    "experiments.memory",
    "experiments.nccl_tests",
    "experiments.zero3_vs_ptdp",
    "experiments.goodput",
]

for _name in EXPERIMENT_MODULES:
    importlib.import_module(_name)

__all__ = [
    "EXPERIMENTS",
    "EXPERIMENT_MODULES",
    "Experiment",
    "ExperimentError",
    "ExperimentResult",
    "RunRecord",
    "register_experiment",
    "require",
    "run_experiments",
    "run_one",
    "select",
    "to_markdown",
]
