"""Pydantic models of a cluster spec (device, node, cluster) and the YAML loader.

Every number in a spec is a ``{value, provenance}`` pair: ``provenance`` says where the
value comes from (a datasheet line in ``shared/reference/hardware_and_models.md``, a
constant in ``formulas.md``, or "calibrated on <host>"). Units: bytes, bytes/second,
FLOP/second and seconds.

A spec file looks like::

    name: dgx-a100-80g
    description: ...
    device:
      name: A100-SXM-80GB
      peak_flops: {bf16: {value: 3.12e+14, provenance: ...}, ...}
      memory_bytes: {value: 8.0e+10, provenance: ...}
      memory_bandwidth: {value: 2.0e+12, provenance: ...}
      efficiency:
        gemm: {value: 0.65, provenance: ...}
        memory_bandwidth: {value: 0.8, provenance: ...}
        kernel_overhead_s: {value: 5.0e-06, provenance: ...}
    node:
      devices_per_node: {value: 8, provenance: ...}
      intra_bandwidth: {value: 2.3e+11, provenance: ...}   # per-rank bus bandwidth, one way
      intra_latency: {value: 3.4e-06, provenance: ...}     # alpha of one intra-node step
      nic_count: {value: 8, provenance: ...}
      nic_bandwidth: {value: 2.5e+10, provenance: ...}     # one NIC, one way
    cluster:
      num_nodes: {value: 1, provenance: ...}
      inter_latency: {value: 9.6e-06, provenance: ...}     # alpha of one inter-node step
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from clusters.errors import ClusterSpecError

_STRICT = ConfigDict(extra="forbid", frozen=True)

#: Most ranks (num_nodes * devices_per_node) a cluster may have: 2**20, about ten times the
#: largest GPU clusters built so far; larger numbers are typos, and would make rank tables
#: (``meshplan clusters show``) run out of memory.
MAX_WORLD_SIZE = 2**20


class _Quantity(BaseModel):
    model_config = _STRICT
    provenance: str = Field(min_length=1)


class Positive(_Quantity):
    """A strictly positive float (a bandwidth, a FLOP rate, a size) with its provenance."""

    value: float = Field(gt=0, allow_inf_nan=False)


class NonNegative(_Quantity):
    """A float >= 0 (a latency, an overhead in seconds) with its provenance."""

    value: float = Field(ge=0, allow_inf_nan=False)


class Fraction(_Quantity):
    """An efficiency factor in (0, 1] with its provenance."""

    value: float = Field(gt=0, le=1)


class Count(_Quantity):
    """An integer >= 1 (devices, NICs, nodes) with its provenance."""

    value: int = Field(ge=1)

    @field_validator("value", mode="before")
    @classmethod
    def _no_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):  # YAML `true` would otherwise count as 1
            raise ValueError("must be an integer, not a boolean")
        return v


class Efficiency(BaseModel):
    """Achieved fractions of peak, read by the op cost model (simulator): GEMM time is
    ``flops / (gemm * peak_flops[dtype])``, memory time ``bytes / (memory_bandwidth *
    device.memory_bandwidth)``, plus ``kernel_overhead_s`` per kernel. The 0.65 default
    follows Paddle's auto-parallel cost model (formulas.md); calibration replaces them."""

    model_config = _STRICT
    gemm: Fraction
    memory_bandwidth: Fraction
    kernel_overhead_s: NonNegative
    gemm_half_flops: Positive | None = None
    """Optional: FLOPs of one GEMM at which it reaches half of ``gemm`` (read by
    ``simulator.roofline``; its documented default applies when absent)."""
    attention: Fraction | None = None
    """Optional: achieved fraction of ``peak_flops`` of the attention kernel on its
    executed FLOPs (``simulator.roofline``); absent: ``gemm`` applies, as before.
    ``meshplan calibrate`` measures it on the executor's attention kernel."""
    memory_kernels: Fraction | None = None
    """Optional: achieved fraction of ``memory_bandwidth`` of memory-bound kernels
    (elementwise, norms, softmax, optimizer updates), bytes counted as operands read +
    results written (``simulator.op_cost``); absent: ``memory_bandwidth`` applies to them
    too, as before. ``meshplan calibrate`` measures it on the executor's kernels."""
    by_op: dict[str, Positive] | None = None
    """Optional: per op type, the achieved efficiency of that op's attention or
    memory-bound kernels, replacing ``attention`` / ``memory_kernels`` for it
    (``simulator.roofline``): achieved FLOP/s over ``peak_flops`` (attention) or achieved
    bytes/s over ``memory_bandwidth`` with the cost model's bytes (memory-bound). It may
    exceed 1 where the kernel moves fewer bytes than the model counts (a gradient passed
    through as a view) and is far below ``memory_kernels`` for kernels that make several
    passes over their data. ``meshplan calibrate`` measures it per op of the executor."""
    action_overhead_s: NonNegative | None = None
    """Optional: seconds of host work per pipeline action pass (F, B or W; a fused BW
    pays it twice, once per pass) outside its kernels -- the framework's per-action
    dispatch (unit loop, micro-batch bookkeeping, p2p posting). ``simulator.step`` adds it
    to each of T_F, T_B, T_W; absent: 0. On GPUs this host work overlaps with kernels
    already queued asynchronously, so the catalog GPU specs set 0; on CPU (the executor
    with gloo) it is serial and ``meshplan calibrate`` measures it."""


class DeviceSpec(BaseModel):
    """One accelerator: peak FLOP/s per dtype, memory size (bytes) and HBM bandwidth (B/s)."""

    model_config = _STRICT
    name: str = Field(min_length=1)
    peak_flops: dict[str, Positive]
    memory_bytes: Positive
    memory_bandwidth: Positive
    efficiency: Efficiency

    @field_validator("peak_flops")
    @classmethod
    def _some_dtype(cls, v: dict[str, Positive]) -> dict[str, Positive]:
        if not v:
            raise ValueError("needs at least one dtype")
        return v

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``; raises ``ClusterSpecError`` naming an unknown dtype."""
        if dtype not in self.peak_flops:
            raise ClusterSpecError(
                f"device {self.name!r} has no peak_flops for dtype {dtype!r}; "
                f"known: {', '.join(sorted(self.peak_flops))}"
            )
        return self.peak_flops[dtype].value


class NodeSpec(BaseModel):
    """One node: ``devices_per_node`` ranks joined by an intra-node fabric whose per-rank
    bus bandwidth (one direction, B/s) and per-step latency (s) are given, and
    ``nic_count`` NICs of ``nic_bandwidth`` B/s each (one direction)."""

    model_config = _STRICT
    devices_per_node: Count
    intra_bandwidth: Positive
    intra_latency: NonNegative
    nic_count: Count
    nic_bandwidth: Positive


class InterconnectSpec(BaseModel):
    """The cluster level: default number of nodes and the per-step inter-node latency (s)."""

    model_config = _STRICT
    num_nodes: Count
    inter_latency: NonNegative


class ClusterSpec(BaseModel):
    """A whole cluster spec as read from YAML."""

    model_config = _STRICT
    name: str = Field(min_length=1)
    description: str = ""
    device: DeviceSpec
    node: NodeSpec
    cluster: InterconnectSpec

    @model_validator(mode="after")
    def _world_size(self) -> ClusterSpec:
        n, d = self.cluster.num_nodes.value, self.node.devices_per_node.value
        if n * d > MAX_WORLD_SIZE:
            raise ValueError(f"cluster.num_nodes {n} x node.devices_per_node {d} = {n * d} "
                             f"ranks exceeds the limit of {MAX_WORLD_SIZE}")
        return self


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "<root>"


def _one_line(err: ValidationError, source: str) -> str:
    """The first pydantic error as ``source: field 'a.b.c': message``."""
    first = err.errors()[0]
    field = _loc(first["loc"])
    if first["type"] == "missing":
        return f"{source}: missing field {field!r}"
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown field {field!r}"
    msg = first["msg"].replace("\n", " ")
    if not first["loc"]:  # a whole-spec check: the input is the whole mapping, not shown
        return f"{source}: {msg.removeprefix('Value error, ')}"
    return f"{source}: field {field!r}: {msg} (got {first.get('input')!r})"


def parse_spec(data: Any, source: str = "<spec>") -> ClusterSpec:
    """Validate a mapping (as read from YAML) into a ``ClusterSpec``.

    Raises ``ClusterSpecError`` with one line naming ``source`` and the first bad field
    (missing, unknown, non-positive bandwidth, ...)."""
    if not isinstance(data, dict):
        raise ClusterSpecError(
            f"{source}: a cluster spec must be a mapping, got {type(data).__name__}"
        )
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as e:
        raise ClusterSpecError(_one_line(e, source)) from None


def load_spec_file(path: str | Path) -> ClusterSpec:
    """Read and validate a cluster YAML file. Raises ``ClusterSpecError`` (one line) for a
    missing file, a YAML syntax error or an invalid spec."""
    p = Path(path)
    if not p.is_file():
        raise ClusterSpecError(f"cluster file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        raise ClusterSpecError(f"{p}:{line} invalid YAML: {getattr(e, 'problem', e)}") from None
    return parse_spec(data, str(p))
