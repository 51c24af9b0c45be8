"""Pydantic models of the cluster YAML's goodput sections: ``storage`` (where checkpoints go),
``reliability`` (what interrupts a job and what a restart costs) and ``jitter`` (how step
times vary), each optional in a cluster file.

A cluster file that leaves a section out gets the one of :data:`DEFAULTS_FILE`
(``clusters/defaults/goodput.yaml``, every number with its provenance): the published
interruption counts of the Llama 3 405B run on H100 (Dubey et al. 2024, sec. 3.3.4,
Table 5) as rates per GPU-hour and per node-hour, DGX H100-class storage and PCIe
bandwidths, and jitter distributions. :func:`goodput_sections` resolves them once, for the
library (``simulator.goodput``) and the CLI alike. Units: bytes, bytes/second, seconds,
events per hour.

Sections::

    storage:
      node_write_bandwidth: {value: 2.5e+10, provenance: ...}   # B/s one node writes
      node_read_bandwidth: {value: 2.5e+10, provenance: ...}
      aggregate_write_bandwidth: {value: 2.0e+12, provenance: ...}  # optional: the backend
      aggregate_read_bandwidth: {value: 7.0e+12, provenance: ...}   # optional
      host_copy_bandwidth: {value: 5.0e+10, provenance: ...}    # one GPU -> host (PCIe)
      save_overhead_s: {value: 1.0, provenance: ...}            # per save: plan, metadata
    reliability:
      causes:                       # one entry per interruption cause
        faulty_gpu: {per_gpu_hour: 6.97e-06, replaces_node: true, provenance: ...}
        host_maintenance: {per_node_hour: 1.2e-05, replaces_node: true, provenance: ...}
        planned_maintenance: {per_node_hour: ..., replaces_node: false, planned: true, ...}
      restart:
        relaunch_s: {value: 300.0, provenance: ...}    # detect, reschedule, start processes
        replace_node_s: {value: 3600.0, provenance: ...}   # without a hot spare
        nccl_init_per_rank_s: {value: 1.0e-05, provenance: ...}
        nccl_init_per_pair_s: {value: 1.35e-09, provenance: ...}
    jitter:
      rank: {dist: exponential, a: 0.01, provenance: ...}      # slowdown of one GPU a step
      kernel: {dist: lognormal, a: 0.005, b: 1.0, provenance: ...}
      collective: {dist: exponential, a: 0.05, provenance: ...}

A jitter distribution is that of a slowdown ``X >= 0``: the time becomes ``t (1 + X)``
(``exponential``: mean ``a``; ``lognormal``: median ``a``, log-standard deviation ``b``;
``uniform``: between ``a`` and ``b``; ``none``: 0). Slowdowns only: a jittered step is never
shorter than the deterministic one, which keeps the step-time lower bound of a search
valid for the tail objectives.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from clusters.errors import ClusterSpecError
from clusters.quantities import Bandwidth, NonNegative

_STRICT = ConfigDict(extra="forbid", frozen=True)

#: the defaults of every section (``clusters/defaults/goodput.yaml``)
DEFAULTS_FILE = Path(__file__).parent / "defaults" / "goodput.yaml"
#: jitter distribution families (module docstring)
JITTER_DISTS = ("none", "exponential", "lognormal", "uniform")


class StorageSpec(BaseModel):
    """Where checkpoints are written and read (module docstring): per node and, when the
    storage backend is shared, in aggregate (bytes/second); a GPU's device-to-host copy rate
    (an asynchronous save's snapshot) and a fixed cost per save (seconds)."""

    model_config = _STRICT
    node_write_bandwidth: Bandwidth
    node_read_bandwidth: Bandwidth
    host_copy_bandwidth: Bandwidth
    save_overhead_s: NonNegative
    aggregate_write_bandwidth: Bandwidth | None = None
    aggregate_read_bandwidth: Bandwidth | None = None


class FailureCause(BaseModel):
    """One cause of interruption: its rate per GPU-hour or per node-hour (exactly one of
    the two, events per hour), whether the job must wait for a node to replace the failed
    one (``replaces_node``; a hot spare removes the wait) and whether it is planned (a
    maintenance the job checkpoints just before: no work lost)."""

    model_config = _STRICT
    provenance: str = Field(min_length=1)
    per_gpu_hour: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    per_node_hour: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    replaces_node: bool = Field(strict=True)
    planned: bool = Field(default=False, strict=True)

    @model_validator(mode="after")
    def _one_rate(self) -> FailureCause:
        if (self.per_gpu_hour is None) == (self.per_node_hour is None):
            raise ValueError("give exactly one of per_gpu_hour and per_node_hour")
        return self

    def rate(self, gpus: int, nodes: int) -> float:
        """Events per second on ``gpus`` GPUs in ``nodes`` nodes."""
        per_hour = (self.per_gpu_hour or 0.0) * gpus + (self.per_node_hour or 0.0) * nodes
        return per_hour / 3600.0


class RestartSpec(BaseModel):
    """What a restart costs besides the checkpoint's read (``simulator.goodput.failures``):
    the relaunch (detect the failure, reschedule, start the processes, seconds), the wait for
    a replacement node when there is no hot spare (seconds) and the NCCL communicator
    initialisation per group of n ranks, ``per_rank_s * n + per_pair_s * n**2`` seconds."""

    model_config = _STRICT
    relaunch_s: NonNegative
    replace_node_s: NonNegative
    nccl_init_per_rank_s: NonNegative
    nccl_init_per_pair_s: NonNegative


class ReliabilitySpec(BaseModel):
    """The interruption causes (name -> :class:`FailureCause`) and the restart costs."""

    model_config = _STRICT
    causes: dict[str, FailureCause] = Field(min_length=1)
    restart: RestartSpec


class JitterDist(BaseModel):
    """A slowdown distribution (module docstring) with its provenance."""

    model_config = _STRICT
    dist: Literal["none", "exponential", "lognormal", "uniform"]
    provenance: str = Field(min_length=1)
    a: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    b: float = Field(default=0.0, ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _params(self) -> JitterDist:
        if self.dist == "uniform" and self.b < self.a:
            raise ValueError(f"uniform needs a <= b, got a={self.a}, b={self.b}")
        if self.dist in ("exponential", "lognormal") and self.a <= 0:
            raise ValueError(f"{self.dist} needs a > 0 (its mean / median slowdown), got {self.a}")
        return self


class JitterSpec(BaseModel):
    """Per-rank (one draw per GPU per step), per-kernel (per action) and per-collective (per
    p2p hop and per data-parallel synchronisation) slowdowns."""

    model_config = _STRICT
    rank: JitterDist
    kernel: JitterDist
    collective: JitterDist


class GoodputDefaults(BaseModel):
    """The defaults file: one of each section."""

    model_config = _STRICT
    storage: StorageSpec
    reliability: ReliabilitySpec
    jitter: JitterSpec


@dataclass(frozen=True)
class GoodputSections:
    """The sections a cluster is costed with; ``defaulted``: the names taken from
    :data:`DEFAULTS_FILE` (the cluster file gives none of them)."""

    storage: StorageSpec
    reliability: ReliabilitySpec
    jitter: JitterSpec
    defaulted: tuple[str, ...]


_DEFAULTS: list[GoodputDefaults] = []


def load_defaults() -> GoodputDefaults:
    """The validated :data:`DEFAULTS_FILE` (read once). Raises ClusterSpecError naming the
    file and field when it is malformed."""
    if not _DEFAULTS:
        data = yaml.safe_load(DEFAULTS_FILE.read_text())
        try:
            _DEFAULTS.append(GoodputDefaults.model_validate(data))
        except ValidationError as e:
            first = e.errors()[0]
            raise ClusterSpecError(f"{DEFAULTS_FILE}: field {'.'.join(map(str, first['loc']))!r}: "
                                   f"{first['msg']}") from None
    return _DEFAULTS[0]


def goodput_sections(spec: Any) -> GoodputSections:
    """The storage, reliability and jitter sections of a ``clusters.spec.ClusterSpec`` (or
    a ``clusters.Cluster``): its own where it gives them, else :func:`load_defaults`'."""
    spec = getattr(spec, "spec", spec)
    base = load_defaults()
    got = {k: getattr(spec, k, None) for k in ("storage", "reliability", "jitter")}
    return GoodputSections(
        storage=got["storage"] or base.storage, reliability=got["reliability"] or base.reliability,
        jitter=got["jitter"] or base.jitter,
        defaulted=tuple(k for k, v in got.items() if v is None))


__all__ = ["DEFAULTS_FILE", "JITTER_DISTS", "FailureCause", "GoodputDefaults", "GoodputSections",
           "JitterDist", "JitterSpec", "ReliabilitySpec", "RestartSpec", "StorageSpec",
           "goodput_sections", "load_defaults"]
