"""Entry points that run plans on clusters: ``python -m meshplan.executor.run`` under torchrun
(:mod:`meshplan.executor.run`). The executor itself is the top-level ``executor`` package;
this one composes it with the simulator's schedules and predictions, as ``meshplan`` may."""
