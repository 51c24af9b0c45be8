"""What interrupts a job of a plan, and what each restart costs.

Rates: each cause of the cluster's ``reliability`` section (``clusters.goodput_spec``) is a
Poisson process with a rate per GPU-hour or per node-hour (the defaults: the Llama 3 405B
run's interruption counts by cause, Dubey et al. 2024, sec. 3.3.4, Table 5); a job on G
GPUs in n nodes sees their sum, ``sum_c (g_c G + n_c n)`` per hour. The unplanned causes
interrupt the job at a random time (the work since the last durable checkpoint is lost);
the planned ones (maintenance) are announced: the job saves first and loses no work.

Restart (:func:`restart_cost`), seconds: the relaunch (detect, reschedule, start the
processes), the NCCL communicators' initialisation at the plan's scale, the checkpoint's
restore (``simulator.goodput.checkpoint``) and, for a cause that takes a node away
(``replaces_node``) when no hot spare node waits, the wait for a replacement
(``restart.replace_node_s``). With ``spares`` >= 1 spare node the job restarts on it at
once (the failed node is repaired meanwhile); the spares are billed
(``simulator.goodput.goodput``).

NCCL initialisation: each rank builds one communicator per group it belongs to (the whole
world, its tp, dp (with cp folded in) and pp groups); groups of one kind initialise at
once, kinds one after another, a group of n ranks in ``per_rank_s n + per_pair_s n^2``
(NCCL's bootstrap all-gather around a ring, one hop per rank, and its O(n^2) ring and
transport set-up loops: NVIDIA/nccl PR 1789; the coefficients are the cluster's).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from simulator.errors import SimulatorError


@dataclass(frozen=True)
class FailureModel:
    """The interruption rates a job sees (events per second).

    Attributes: rate (unplanned), planned_rate, replace_share (of the unplanned rate, the
    share whose cause takes a node away), by_cause (cause -> rate)."""

    rate: float
    planned_rate: float
    replace_share: float
    by_cause: dict[str, float]

    @classmethod
    def of(cls, reliability: Any, gpus: int, nodes: int) -> FailureModel:
        """The rates of a job on ``gpus`` GPUs in ``nodes`` nodes under a
        ``clusters.goodput_spec.ReliabilitySpec``. Raises SimulatorError for fewer than one
        GPU or node."""
        if gpus < 1 or nodes < 1:
            raise SimulatorError(f"failure model: a job needs >= 1 GPU and node, got {gpus}, {nodes}")
        by = {name: c.rate(gpus, nodes) for name, c in reliability.causes.items()}
        unplanned = {n: r for n, r in by.items() if not reliability.causes[n].planned}
        rate = sum(unplanned.values())
        replace = sum(r for n, r in unplanned.items() if reliability.causes[n].replaces_node)
        return cls(rate=rate, planned_rate=sum(by.values()) - rate,
                   replace_share=replace / rate if rate > 0 else 0.0, by_cause=by)

    @property
    def mtbf_s(self) -> float:
        """Mean seconds between unplanned interruptions (inf without any)."""
        return 1.0 / self.rate if self.rate > 0 else float("inf")


def nccl_init_s(restart: Any, group_sizes: Iterable[int]) -> float:
    """Seconds to initialise one communicator of each size in ``group_sizes`` one after
    another, a group of n ranks in ``per_rank_s n + per_pair_s n^2`` (module docstring);
    groups of one rank need none."""
    a, b = restart.nccl_init_per_rank_s.value, restart.nccl_init_per_pair_s.value
    return sum(a * n + b * n * n for n in group_sizes if n > 1)


@dataclass(frozen=True)
class RestartCost:
    """The parts of a restart (seconds): relaunch, nccl_init, restore, replace (the expected
    wait for a replacement node per unplanned interruption: share x wait, 0 with a spare);
    ``unplanned_s`` and ``planned_s`` their sums for the two kinds of interruption (a planned
    one needs no replacement)."""

    relaunch: float
    nccl_init: float
    restore: float
    replace: float

    @property
    def planned_s(self) -> float:
        """Relaunch + NCCL initialisation + restore."""
        return self.relaunch + self.nccl_init + self.restore

    @property
    def unplanned_s(self) -> float:
        """:attr:`planned_s` + the expected replacement wait."""
        return self.planned_s + self.replace

    def to_dict(self) -> dict[str, float]:
        """JSON-friendly view (seconds)."""
        return {"relaunch_s": self.relaunch, "nccl_init_s": self.nccl_init, "restore_s": self.restore,
                "replace_s": self.replace, "unplanned_s": self.unplanned_s, "planned_s": self.planned_s}


def restart_cost(restart: Any, failures: FailureModel, group_sizes: Iterable[int], restore_s: float,
                 spares: int = 0) -> RestartCost:
    """The restart of a plan (module docstring): ``restart`` a
    ``clusters.goodput_spec.RestartSpec``, ``group_sizes`` the plan's communicator sizes
    (world, tp, dp, pp), ``restore_s`` the checkpoint's read, ``spares`` hot spare nodes.
    Raises SimulatorError for negative spares or restore time."""
    if spares < 0 or restore_s < 0:
        raise SimulatorError(f"restart: spares and restore time must be >= 0, got {spares}, {restore_s}")
    replace = 0.0 if spares >= 1 else failures.replace_share * restart.replace_node_s.value
    return RestartCost(relaunch=restart.relaunch_s.value, nccl_init=nccl_init_s(restart, group_sizes),
                       restore=restore_s, replace=replace)


__all__ = ["FailureModel", "RestartCost", "nccl_init_s", "restart_cost"]
