"""What one checkpoint of a plan costs: the bytes each GPU writes, the write, the stall it
puts on the training loop (synchronous or asynchronous save) and the restore.

Saved states: a checkpoint holds the weights and the optimizer states, not the gradients
(Megatron-LM's distributed checkpoint: the model's sharded state dict and the distributed
optimizer's fp32 master weights and Adam moments; torch DCP under FSDP: the sharded
parameters and optimizer state dict). Their bytes per GPU are the memory model's own
``params`` and ``optimizer`` lines of each pipeline stage
(``StepResult.memory_per_stage``, from ``simulator.model_states``): not derived again here.

Replication: a line the ZeRO stage leaves whole on every data-parallel rank is held alike
by ``dp`` ranks (ZeRO 0: both lines; ZeRO 1-2: the weights); a sharded line is held alike
by the ``dp / N`` replicas of its shard (HSDP shard groups of N; 1 without HSDP;
``simulator.dp_groups``). The framework profile says who writes a tensor held alike
(``checkpoint.replicas``): ``balanced`` spreads it over its holders (each writes 1 /
holders of it), ``first`` has the first holder write all of it.

Times (:func:`checkpoint_cost`), with the cluster's ``storage`` section
(``clusters.goodput_spec``):

- write: ``save_overhead_s + max(max over nodes of node bytes / node_write_bandwidth,
  total bytes / aggregate_write_bandwidth)``: every node writes at once, each as fast as
  its client, all of them as fast as the backend;
- synchronous save (``torch.save``, Megatron-LM without ``--async-save``): the loop waits
  for the whole write: stall = write;
- asynchronous save (Megatron-LM ``--async-save``, torch DCP ``async_save``, profile
  ``checkpoint.async_save``): the loop waits while each GPU copies what it writes to host
  memory, ``save_overhead_s + max GPU bytes / host_copy_bandwidth``, and the write runs in
  the background for ``background_s`` = the write less its overhead; the checkpoint is
  durable only then (``simulator.goodput.goodput`` counts that window);
- restore: every GPU reads the states it holds, ``max(max node bytes / node_read_bandwidth,
  total / aggregate_read_bandwidth) + max GPU bytes / host_copy_bandwidth`` (the copy back
  to the device at the same PCIe rate).

Rank layout: ``rank = stage * dp * tp + d * tp + t`` (``simulator.step``), nodes of
``devices_per_node`` consecutive ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.errors import SimulatorError

#: save modes: ``sync`` waits for the write; ``async`` only for the host copy
MODES = ("sync", "async")


@dataclass(frozen=True)
class StageStates:
    """The saved states of one GPU of a pipeline stage (bytes): ``replicated`` (held alike
    by all ``dp`` ranks of the stage) and ``sharded`` (held alike by the ``replicas`` copies
    of its shard)."""

    replicated: float
    sharded: float


@dataclass(frozen=True)
class Layout:
    """The plan's degrees as the checkpoint sees them: ``dp`` (context-parallel ranks folded
    in, as ``simulator.step.StepConfig`` folds them), ``tp``, ``pp``, ``shard`` (ranks a
    sharded state is split over: ``simulator.dp_groups.shard_degree``) and
    ``devices_per_node``."""

    dp: int
    tp: int
    pp: int
    shard: int
    devices_per_node: int

    @property
    def world(self) -> int:
        """GPUs of the plan: dp * tp * pp."""
        return self.dp * self.tp * self.pp


@dataclass(frozen=True)
class CheckpointCost:
    """One checkpoint of a plan (bytes, seconds).

    Attributes: mode (``sync`` / ``async``); replicas (``balanced`` / ``first``);
    total_bytes (what the storage receives); max_gpu_bytes / max_node_bytes (the largest a
    GPU / a node writes); write_s; stall_s (what the training loop waits per save);
    background_s (after the stall, until the checkpoint is durable: 0 for ``sync``);
    restore_s (read back at a restart); read_max_node_bytes."""

    mode: str
    replicas: str
    total_bytes: float
    max_gpu_bytes: float
    max_node_bytes: float
    write_s: float
    stall_s: float
    background_s: float
    restore_s: float
    read_max_node_bytes: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view (bytes and seconds)."""
        return dict(self.__dict__)


def stage_states(memory_per_stage: list[dict[str, int]], zero: int) -> list[StageStates]:
    """The saved states of a GPU of each pipeline stage from the memory model's lines
    (``params``, ``optimizer``): ZeRO 0 replicates both, ZeRO 1-2 the weights, ZeRO 3
    neither (module docstring). Raises SimulatorError for a ZeRO stage outside 0-3 or a
    stage without the two lines."""
    if zero not in (0, 1, 2, 3):
        raise SimulatorError(f"checkpoint: ZeRO stage must be 0-3, got {zero!r}")
    out = []
    for r, mem in enumerate(memory_per_stage):
        if "params" not in mem or "optimizer" not in mem:
            raise SimulatorError(f"checkpoint: stage {r}'s memory lines lack 'params' / 'optimizer'")
        p, o = float(mem["params"]), float(mem["optimizer"])
        rep = p + o if zero == 0 else (p if zero < 3 else 0.0)
        out.append(StageStates(replicated=rep, sharded=p + o - rep))
    return out


def write_bytes(states: list[StageStates], layout: Layout, replicas: str) -> np.ndarray:
    """Bytes each GPU writes (array over ranks 0 .. world - 1) under the profile's
    ``replicas`` rule (module docstring). Raises SimulatorError for an unknown rule or a
    stage count other than pp."""
    if replicas not in ("balanced", "first"):
        raise SimulatorError(f"checkpoint: replicas must be 'balanced' or 'first', got {replicas!r}")
    if len(states) != layout.pp:
        raise SimulatorError(f"checkpoint: {len(states)} stages of states for pp = {layout.pp}")
    dp, tp, shard = layout.dp, layout.tp, layout.shard
    d = np.arange(dp)
    copies = dp // shard  # replicas of a shard (HSDP groups)
    out = []
    for s in states:
        if replicas == "balanced":
            per_d = np.full(dp, s.replicated / dp + s.sharded / copies)
        else:  # the first holder writes: dp rank 0 the replicated, shard group 0 its shards
            per_d = np.where(d == 0, s.replicated, 0.0) + np.where(d < shard, s.sharded, 0.0)
        out.append(np.repeat(per_d, tp))
    return np.concatenate(out)


def held_bytes(states: list[StageStates], layout: Layout) -> np.ndarray:
    """Bytes of saved states each GPU holds (what it reads back at a restore), per rank."""
    return np.concatenate([np.full(layout.dp * layout.tp, s.replicated + s.sharded) for s in states])


def _node_max(per_rank: np.ndarray, gpn: int) -> float:
    """The largest sum over a node's ``gpn`` consecutive ranks (the last node may be partial)."""
    pad = (-len(per_rank)) % gpn
    return float(np.pad(per_rank, (0, pad)).reshape(-1, gpn).sum(axis=1).max()) if len(per_rank) else 0.0


def _transfer(node_bytes: float, total: float, node_bw: float, aggregate_bw: float | None) -> float:
    """Seconds to move ``total`` bytes with ``node_bytes`` on the busiest node."""
    t = node_bytes / node_bw
    return max(t, total / aggregate_bw) if aggregate_bw else t


def checkpoint_cost(states: list[StageStates], layout: Layout, storage: Any, mode: str,
                    replicas: str) -> CheckpointCost:
    """The cost of one checkpoint (module docstring).

    Args:
        states: per pipeline stage (:func:`stage_states`).
        layout: the plan's degrees (:class:`Layout`).
        storage: a ``clusters.goodput_spec.StorageSpec``.
        mode: ``sync`` or ``async`` (:data:`MODES`); replicas: the profile's rule.
    Raises SimulatorError for an unknown mode or rule."""
    if mode not in MODES:
        raise SimulatorError(f"checkpoint mode must be one of {MODES}, got {mode!r}")
    w = write_bytes(states, layout, replicas)
    held = held_bytes(states, layout)
    gpn = layout.devices_per_node
    total, gpu_max, node_max = float(w.sum()), float(w.max()), _node_max(w, gpn)
    agg_w = storage.aggregate_write_bandwidth
    agg_r = storage.aggregate_read_bandwidth
    over = float(storage.save_overhead_s.value)
    moving = _transfer(node_max, total, storage.node_write_bandwidth.value, agg_w.value if agg_w else None)
    write = over + moving
    copy_bw = storage.host_copy_bandwidth.value
    if mode == "sync":
        stall, background = write, 0.0
    else:
        stall, background = over + gpu_max / copy_bw, moving
    read_node = _node_max(held, gpn)
    restore = (_transfer(read_node, float(held.sum()), storage.node_read_bandwidth.value,
                         agg_r.value if agg_r else None) + float(held.max()) / copy_bw)
    return CheckpointCost(mode=mode, replicas=replicas, total_bytes=total, max_gpu_bytes=gpu_max,
                          max_node_bytes=node_max, write_s=write, stall_s=stall,
                          background_s=background, restore_s=restore, read_max_node_bytes=read_node)


__all__ = ["MODES", "CheckpointCost", "Layout", "StageStates", "checkpoint_cost", "held_bytes",
           "stage_states", "write_bytes"]
