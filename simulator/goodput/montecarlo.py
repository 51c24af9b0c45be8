"""A training run with interruptions played on SimPy, many times: the Monte Carlo check of
``simulator.goodput.goodput``'s closed form.

One replica is two SimPy processes. The trainer runs the steps towards the next save,
stalls for the save and, for an asynchronous save, marks the checkpoint durable
``background_s`` later (a later save first waits for a pending one); after the last step it
saves and waits until that save is durable. The interrupter draws exponential gaps of mean
1 / rate (numpy, seeded) and interrupts the trainer wherever it is: running, saving or
restarting. An interrupted trainer goes back to its last durable checkpoint and restarts
(``restart_s``, itself interruptible); the start (``startup_s``) is not interrupted. Planned interruptions are not played (the closed form
adds them outside the renewal argument). The replica's wall time includes ``startup_s``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from simulator.errors import SimulatorError
from simulator.goodput.goodput import Run


@dataclass
class _State:
    """A replica's progress: steps done, steps durable, a pending save (steps, durable at)."""

    pos: int = 0
    durable: int = 0
    pending: tuple[int, float] | None = None
    failures: int = 0

    def settle(self, now: float) -> None:
        """Mark a pending save durable once its write has finished."""
        if self.pending is not None and self.pending[1] <= now:
            self.durable, self.pending = self.pending[0], None


def _trainer(env: simpy.Environment, run: Run, k: int, st: _State):
    """The trainer process (module docstring)."""
    yield env.timeout(run.startup_s)
    while True:
        try:
            if st.pos >= run.steps and st.pending is None and st.durable >= run.steps:
                return
            if st.pos < run.steps:
                target = min(run.steps, (st.pos // k + 1) * k)
                yield env.timeout((target - st.pos) * run.step_s)
                st.pos = target
                st.settle(env.now)
                if st.pending is not None:  # the previous save is still writing: wait for it
                    yield env.timeout(st.pending[1] - env.now)
                    st.settle(env.now)
                yield env.timeout(run.stall_s)
                st.pending = (st.pos, env.now + run.background_s)
                st.settle(env.now)
            elif st.pending is not None:  # the final save is still writing
                yield env.timeout(st.pending[1] - env.now)
                st.settle(env.now)
            else:  # every step done and durable
                return
        except simpy.Interrupt:
            st.settle(env.now)
            st.pos, st.pending, st.failures = st.durable, None, st.failures + 1
            while True:
                try:
                    yield env.timeout(run.restart_s)
                    break
                except simpy.Interrupt:
                    st.failures += 1


def _interrupter(env: simpy.Environment, rate: float, rng: np.random.Generator, target, after: float):
    """Interrupt ``target`` at exponential gaps of mean 1 / ``rate`` from ``after`` seconds on
    (the start, which the closed form counts once, is not interrupted) while it lives."""
    yield env.timeout(after)
    while True:
        yield env.timeout(float(rng.exponential(1.0 / rate)))
        if not target.is_alive:
            return
        target.interrupt("failure")


@dataclass(frozen=True)
class MonteCarlo:
    """Replica wall times (seconds) and interruption counts of :func:`simulate_runs`."""

    times: np.ndarray
    failures: np.ndarray

    @property
    def mean_s(self) -> float:
        """Mean wall time of the replicas."""
        return float(self.times.mean())

    @property
    def stderr_s(self) -> float:
        """Standard error of :attr:`mean_s`."""
        return float(self.times.std(ddof=1) / np.sqrt(len(self.times))) if len(self.times) > 1 else 0.0


def simulate_runs(run: Run, interval: int, replicas: int = 200, seed: int = 0) -> MonteCarlo:
    """Play ``replicas`` runs of ``run`` with a save every ``interval`` steps (module
    docstring), each on its own SimPy environment, interruptions drawn from one numpy
    generator seeded with ``seed``. Raises SimulatorError for interval or replicas < 1."""
    if interval < 1 or replicas < 1:
        raise SimulatorError(f"Monte Carlo needs interval >= 1 and replicas >= 1, got {interval}, {replicas}")
    rng = np.random.default_rng(seed)
    times, fails = np.empty(replicas), np.empty(replicas, dtype=np.int64)
    for i in range(replicas):
        env = simpy.Environment()
        st = _State()
        proc = env.process(_trainer(env, run, min(interval, run.steps), st))
        if run.rate > 0:
            env.process(_interrupter(env, run.rate, rng, proc, run.startup_s))
        env.run(until=proc)
        times[i], fails[i] = env.now, st.failures
    return MonteCarlo(times=times, failures=fails)


__all__ = ["MonteCarlo", "simulate_runs"]
