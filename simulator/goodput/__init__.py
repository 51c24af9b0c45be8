"""Time to train and what it costs: checkpoints, interruptions, stragglers and prices
(issue 41).

- :mod:`simulator.goodput.checkpoint`: the bytes each GPU saves, the write, the stall of a
  synchronous or asynchronous save, the restore;
- :mod:`simulator.goodput.failures`: interruption rates by cause, the restart's parts;
- :mod:`simulator.goodput.goodput`: the exact expected time to train and its breakdown,
  the optimal checkpoint interval (Young 1974, Daly 2006);
- :mod:`simulator.goodput.montecarlo`: the same run played on SimPy with interruptions;
- :mod:`simulator.goodput.jitter`: per-rank, per-kernel and per-collective slowdowns
  sampled on the SimPy pipeline engine: step-time percentiles and straggler sensitivity;
- :mod:`simulator.goodput.plan`: all of it for one simulated plan;
- :mod:`simulator.goodput.objectives`: what a search minimises, and its lower bound.
"""
