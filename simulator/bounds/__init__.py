"""Lower bounds on a plan's simulated step time and peak memory, proven against the engine's
model: :mod:`simulator.bounds.step` from a layout's block costs (``Engine.lower_bound``),
:mod:`simulator.bounds.tier0` from the unsharded one-rank program (no completion). Their
feeders over a search space: :mod:`meshplan.bounds`."""
