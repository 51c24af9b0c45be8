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
      sm_count: {value: 108, provenance: ...}              # optional: GEMM waves by SM
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

from clusters import strict_yaml
from clusters.errors import ClusterSpecError
from clusters.goodput_spec import JitterSpec, ReliabilitySpec, StorageSpec
from clusters.quantities import (  # noqa: F401  (re-exported: clusters.spec names them too)
    MAX_BANDWIDTH,
    MAX_FLOP_RATE,
    MAX_HALF_FLOPS,
    MAX_LATENCY_S,
    MAX_MEMORY_BYTES,
    MIN_BANDWIDTH,
    MIN_FLOP_RATE,
    MIN_MEMORY_BYTES,
    MIN_POSITIVE,
    Bandwidth,
    ByteSize,
    CollectiveModel,
    Count,
    Flag,
    FlopCount,
    FlopRate,
    Fraction,
    Latency,
    NonNegative,
    Positive,
    Quantity,
)

_STRICT = ConfigDict(extra="forbid", frozen=True)

#: Most ranks (num_nodes * devices_per_node) a cluster may have: 2**20, about ten times the
#: largest GPU clusters built so far; larger numbers are typos, and would make rank tables
#: (``meshplan clusters show``) run out of memory.
MAX_WORLD_SIZE = 2**20
#: Largest cluster YAML file read (bytes); the catalog's are about 3 KiB.
MAX_SPEC_BYTES = 2**20




#: dtype names a ``device.peak_flops`` key may have: the spellings ``simulator.roofline``
#: looks up (its ``_DTYPE_ALIASES``; tests/clusters/test_cluster_spec_keys.py keeps the two equal)
#: and int8 (integer GEMMs); any other key would never be read
PEAK_FLOPS_DTYPES = ("bf16", "bfloat16", "fp16", "float16", "f16", "fp32", "float32", "tf32", "f32",
                     "fp8", "float8", "int8")
def _fp8_not_below_bf16(peaks: dict[str, Any]) -> None:
    """Refuse an FP8 peak below the BF16 one: a tensor core runs FP8 at twice the BF16 rate
    (NVIDIA H100 datasheet: 989 vs 1,979 dense TFLOP/s; the same 2x on H200 and B200), and an
    FP8 plan costed on a slower FP8 peak is a typo's result (its MFU, measured against the
    BF16 peak, exceeded 1 the other way). Raises ValueError naming both values."""
    fp8 = next((peaks[k] for k in ("fp8", "float8") if k in peaks), None)
    bf16 = next((peaks[k] for k in ("bf16", "bfloat16") if k in peaks), None)
    if fp8 is not None and bf16 is not None and fp8.value < bf16.value:
        raise ValueError(f"the fp8 peak ({fp8.value:g} FLOP/s) is below the bf16 peak "
                         f"({bf16.value:g} FLOP/s); FP8 tensor cores run at least as fast "
                         f"(twice on H100, H200, B200)")


#: attention kernel implementations a ``device.efficiency.attention_kernels`` key may name:
#: the ones a framework profile's ``kernels.attention_kernel`` can select
#: (``simulator.profiles.spec.AttentionKernel``; the test above keeps them equal)
ATTENTION_KERNELS = ("flash2", "cudnn", "triton", "flash3")
#: phases of a ``device.efficiency.by_op`` key ``op:phase`` (``simulator.op_cost``)
BY_OP_PHASES = ("F", "B", "W", "O")


def _keys_in(v: dict[str, Any] | None, known: tuple[str, ...], what: str) -> None:
    bad = sorted(k for k in (v or {}) if k not in known)
    if bad:
        raise ValueError(f"unknown {what} {', '.join(map(repr, bad))}; known: {', '.join(known)} "
                         f"(an unknown key would never be read)")



class Efficiency(BaseModel):
    """Achieved fractions of peak, read by the op cost model (simulator): GEMM time is
    ``flops / (gemm * peak_flops[dtype])``, memory time ``bytes / (memory_bandwidth *
    device.memory_bandwidth)``, plus ``kernel_overhead_s`` per kernel. The 0.65 default
    follows Paddle's auto-parallel cost model (formulas.md); calibration replaces them."""

    model_config = _STRICT
    gemm: Fraction
    memory_bandwidth: Fraction
    kernel_overhead_s: Latency
    gemm_half_flops: FlopCount | None = None
    """Optional: FLOPs of one GEMM at which it reaches half of ``gemm`` (read by
    ``simulator.roofline``; its documented default applies when absent), at most
    :data:`MAX_HALF_FLOPS`."""
    attention_kernels: dict[str, Fraction] | None = None
    """Optional: per attention kernel implementation (``flash2``: FlashAttention-2 and
    PyTorch SDPA's flash backend; ``cudnn``: cuDNN / Transformer Engine fused attention;
    ``triton``: the Triton FlashAttention of llm-foundry; ``flash3``), the achieved fraction
    of ``peak_flops`` of its forward + backward on executed FLOPs on this device. A framework
    profile names its kernel (``kernels.attention_kernel``); absent here: ``attention``."""
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
    @field_validator("attention_kernels")
    @classmethod
    def _known_kernels(cls, v: dict[str, Fraction] | None) -> dict[str, Fraction] | None:
        _keys_in(v, ATTENTION_KERNELS, "attention kernel(s)")
        return v

    @field_validator("by_op")
    @classmethod
    def _op_phase_keys(cls, v: dict[str, Positive] | None) -> dict[str, Positive] | None:
        """Keys ``op`` or ``op:phase`` (phase F, B, W or O); whether ``op`` is an op type is
        checked where the op registry is known (``simulator.roofline.Roofline.from_device``)."""
        for k in v or {}:
            op, sep, phase = k.partition(":")
            if not op or (sep and phase not in BY_OP_PHASES):
                raise ValueError(f"key {k!r} must be 'op' or 'op:phase' with phase one of "
                                 f"{', '.join(BY_OP_PHASES)}")
        return v

    action_overhead_s: Latency | None = None
    """Optional: seconds of host work per pipeline action pass (F, B or W; a fused BW
    pays it twice, once per pass) outside its kernels -- the framework's per-action
    dispatch (unit loop, micro-batch bookkeeping, p2p posting). ``simulator.step`` adds it
    to each of T_F, T_B, T_W; absent: 0. On GPUs this host work overlaps with kernels
    already queued asynchronously, so the catalog GPU specs set 0; on CPU (the executor
    with gloo) it is serial and ``meshplan calibrate`` measures it."""


#: fraction of a device's usable memory a plan leaves free by default (``--memory-headroom``):
#: the predicted peak is a model; 5% covers the spread of the measured rows'
#: peak-memory errors (experiments.measured_runs, memory table: mean |error| under 5%)
DEFAULT_MEMORY_HEADROOM = 0.05


class DeviceSpec(BaseModel):
    """One accelerator: peak FLOP/s per dtype, memory size (bytes) and HBM bandwidth (B/s)."""

    model_config = _STRICT
    name: str = Field(min_length=1)
    peak_flops: dict[str, FlopRate]
    memory_bytes: ByteSize
    """The device's memory capacity in bytes: the HBM it carries (an "80 GB" A100 or H100
    has 80 GiB = 85,899,345,920 bytes of HBM)."""
    memory_bandwidth: Bandwidth
    efficiency: Efficiency
    memory_reserved_bytes: NonNegative | None = None
    """Optional: bytes of ``memory_bytes`` a process can never allocate (what the driver and
    firmware keep: capacity minus the total ``cudaGetDeviceProperties`` /
    ``nvidia-smi`` report). Absent: 0 (a spec written before the field)."""
    sm_count: Count | None = None
    """Optional: streaming multiprocessors (SMs) of the device (A100: 108, H100 SXM and
    H200: 132). When present, ``simulator.roofline`` times a GEMM by its output tiles run
    in waves of ``sm_count`` thread blocks (wave and tile quantization, NVIDIA "Matrix
    Multiplication Background" user's guide, ch. 3); absent (CPUs, specs written before
    the field): the smooth size model ``F / (F + gemm_half_flops)``, as before.
    ``meshplan calibrate --device cuda`` reads it from the GPU."""
    gemm_epilogue_exposed: Flag | None = None
    """Optional, with ``sm_count``: whether a GEMM thread block writes its output tile
    after its main loop with the SM's tensor cores idle (true: the non-persistent
    threadblock-scoped kernels of CUTLASS 2.x / cuBLAS on Ampere and the cooperative
    kernels on Hopper), so each wave of the wave model also pays the tile's store
    (``simulator.roofline``, "epilogue"); false or absent: the store is hidden behind
    other tiles' main loops (e.g. CUTLASS's sm90 ping-pong kernels), as before."""

    @field_validator("peak_flops")
    @classmethod
    def _some_dtype(cls, v: dict[str, FlopRate]) -> dict[str, FlopRate]:
        if not v:
            raise ValueError("needs at least one dtype")
        _keys_in(v, PEAK_FLOPS_DTYPES, "dtype(s)")
        _fp8_not_below_bf16(v)
        return v

    @model_validator(mode="after")
    def _reserve_below_capacity(self) -> DeviceSpec:
        r = self.memory_reserved_bytes
        if r is not None and r.value >= self.memory_bytes.value:
            raise ValueError(f"memory_reserved_bytes ({r.value:g}) must be below "
                             f"memory_bytes ({self.memory_bytes.value:g})")
        return self

    @property
    def reserved_bytes(self) -> float:
        """Bytes the driver reserves (``memory_reserved_bytes``; 0 when absent)."""
        r = self.memory_reserved_bytes
        return float(r.value) if r is not None else 0.0

    @property
    def usable_bytes(self) -> float:
        """Memory a training process can allocate: ``memory_bytes - memory_reserved_bytes``
        (bytes). Raises ValueError when the reserve is not below the capacity."""
        usable = float(self.memory_bytes.value) - self.reserved_bytes
        if usable <= 0:
            raise ValueError(f"device {self.name!r}: memory_reserved_bytes "
                             f"({self.reserved_bytes:g}) must be below memory_bytes "
                             f"({float(self.memory_bytes.value):g})")
        return usable

    def memory_limit(self, headroom: float = DEFAULT_MEMORY_HEADROOM) -> float:
        """The most a plan's predicted peak may reach (bytes): the usable memory less a
        ``headroom`` fraction of it, ``usable_bytes * (1 - headroom)`` (peak + headroom
        <= usable). Raises ValueError for a headroom outside [0, 1)."""
        if not (isinstance(headroom, int | float) and 0 <= headroom < 1):
            raise ValueError(f"memory headroom must be a fraction in [0, 1), got {headroom!r}")
        return self.usable_bytes * (1.0 - float(headroom))

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
    intra_bandwidth: Bandwidth
    intra_latency: Latency
    nic_count: Count
    nic_bandwidth: Bandwidth
    collective_model: CollectiveModel | None = None
    """Optional: how collectives are costed (``clusters.nccl.MODELS``): ``nccl`` (NCCL's
    algorithms and LL / LL128 / Simple protocols, the fastest per call, as NCCL's tuner
    picks), or ``alpha-beta`` (one protocol with the stated hop latencies and no fixed call
    latency: a calibrated gloo host). Absent: ``alpha-beta`` (specs written before the
    field)."""
    nvls_algbw: Bandwidth | None = None
    """Optional: NVLink SHARP (NVLS) all_reduce algorithm bandwidth on one node (B/s): an
    NVSwitch node that reduces in the switch (H100, H200) runs a one-node all_reduce in
    ``25 us + S / nvls_algbw`` when that beats the ring (``clusters.collectives``).
    Absent: no NVLS."""


class InterconnectSpec(BaseModel):
    """The cluster level: default number of nodes and the per-step inter-node latency (s)."""

    model_config = _STRICT
    num_nodes: Count
    inter_latency: Latency




class ClusterSpec(BaseModel):
    """A whole cluster spec as read from YAML. ``storage``, ``reliability`` and ``jitter``
    (optional; :mod:`clusters.goodput_spec`) describe checkpoint storage, interruptions and
    step-time variation; absent, ``clusters.goodput_spec.goodput_sections`` gives the
    defaults."""

    model_config = _STRICT
    name: str = Field(min_length=1)
    description: str = ""
    device: DeviceSpec
    node: NodeSpec
    cluster: InterconnectSpec
    storage: StorageSpec | None = None
    reliability: ReliabilitySpec | None = None
    jitter: JitterSpec | None = None

    @model_validator(mode="after")
    def _world_size(self) -> ClusterSpec:
        n, d = self.cluster.num_nodes.value, self.node.devices_per_node.value
        if n * d > MAX_WORLD_SIZE:
            raise ValueError(f"cluster.num_nodes {n} x node.devices_per_node {d} = {n * d} "
                             f"ranks exceeds the limit of {MAX_WORLD_SIZE}")
        return self


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "<root>"


def _quantity_names() -> set[str]:
    """Names of the ``{value, provenance}`` quantity models (every subclass of Quantity)."""
    out, todo = set(), [Quantity]
    while todo:
        cls = todo.pop()
        out.add(cls.__name__)
        todo += cls.__subclasses__()
    return out


def _one_line(err: ValidationError, source: str) -> str:
    """The first pydantic error as ``source: field 'a.b.c': message``."""
    first = err.errors()[0]
    field = _loc(first["loc"])
    if first["type"] == "missing":
        return f"{source}: missing field {field!r}"
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown field {field!r}"
    msg = first["msg"].replace("\n", " ").removeprefix("Value error, ")
    got = first.get("input")
    if not first["loc"] or isinstance(got, dict | list):  # a check of a whole section:
        where = f"field {field!r}: " if first["loc"] else ""  # its input is not shown
        return f"{source}: {where}{msg.removeprefix('Value error, ')}"
    if first["type"] in ("model_type", "dict_type") and not isinstance(got, dict) and \
            first.get("ctx", {}).get("class_name") not in _quantity_names():
        msg = "must be a section: a mapping of its fields"
    elif first["type"] == "model_type" and first.get("ctx", {}).get("class_name") in _quantity_names():
        msg = ("must be a mapping {value: ..., provenance: \"...\"} (every number of a cluster "
               "YAML carries its source)")
    return f"{source}: field {field!r}: {msg} (got {got!r})"


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


#: Validated specs by (path as given, file bytes): a catalog YAML is read on every cost
#: call (the measured-runs experiment loads one per row) and PyYAML's pure-Python loader
#: takes ~15 ms a file; keying on the bytes, not the mtime, never serves a rewritten file.
_SPEC_CACHE: dict[tuple[str, bytes], ClusterSpec] = {}
_SPEC_CACHE_SIZE = 64


def load_spec_file(path: str | Path) -> ClusterSpec:
    """Read and validate a cluster YAML file (a deep copy of the spec validated the last
    time these bytes were read at this path). Raises ``ClusterSpecError`` (one line) for a
    missing file, a YAML syntax error or an invalid spec."""
    p = Path(path)
    if p.is_dir():
        raise ClusterSpecError(f"cluster file {p} is a directory, not a cluster YAML file")
    if not p.is_file():
        raise ClusterSpecError(f"cluster file not found: {p}")
    size = p.stat().st_size
    if size > MAX_SPEC_BYTES:
        raise ClusterSpecError(f"{p}: {size} bytes, larger than a cluster spec can be "
                               f"({MAX_SPEC_BYTES}, clusters.spec.MAX_SPEC_BYTES)")
    key = (str(p), p.read_bytes())
    hit = _SPEC_CACHE.get(key)
    if hit is None:
        hit = _read_spec(p, key[1])
        if len(_SPEC_CACHE) >= _SPEC_CACHE_SIZE:
            _SPEC_CACHE.clear()
        _SPEC_CACHE[key] = hit
    return hit.model_copy(deep=True)


def _read_spec(p: Path, raw: bytes) -> ClusterSpec:
    """Parse and validate the bytes ``raw`` of file ``p`` (errors name ``p``)."""
    try:
        data = strict_yaml.load(raw.decode("utf-8"))  # one meaning per scalar, one value per key
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        raise ClusterSpecError(f"{p}:{line} invalid YAML: {getattr(e, 'problem', e)}") from None
    except UnicodeDecodeError as e:
        raise ClusterSpecError(f"{p}: not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise ClusterSpecError(f"{p}: YAML nested too deeply") from None
    try:
        return parse_spec(data, str(p))
    except RecursionError:  # a self-referencing YAML alias
        raise ClusterSpecError(f"{p}: YAML nested too deeply (or an alias refers to itself)") from None
