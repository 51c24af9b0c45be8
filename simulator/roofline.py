"""Roofline time of one kernel on one device.

    t = max(exec_flops / (peak_flops[dtype] * eff), bytes / (bandwidth * mem_eff)) + overhead

with ``eff`` the GEMM efficiency of the cluster spec (``device.efficiency.gemm``) scaled by
a size factor ``F / (F + F_half)`` (F the FLOPs of the single GEMM, so tiny GEMMs run far
below peak and large ones approach ``gemm``), ``mem_eff`` =
``device.efficiency.memory_bandwidth`` and ``overhead`` = ``device.efficiency.
kernel_overhead_s`` (launch + tail, per kernel). This is the roofline model of Williams,
Waterman and Patterson (CACM 2009) with achieved rather than peak ceilings, as in Calculon
(Isaev et al. SC'23) and Paddle's auto-parallel cost model (compute = FLOPs / (0.65 peak)).

Two optional spec fields refine the ceilings per kernel kind (``meshplan calibrate``
measures both on the executor's own kernels): ``device.efficiency.attention`` replaces
``gemm`` for attention kernels (their achieved rate on executed FLOPs), and
``device.efficiency.memory_kernels`` replaces ``mem_eff`` for memory-bound kernels
(elementwise, norms, softmax, optimizer updates, local reshard slices: their achieved
fraction of the bandwidth with bytes = operands + results). GEMM and attention kernels
keep ``mem_eff`` in their memory term. Absent fields fall back to ``gemm`` / ``mem_eff``.
A third, ``device.efficiency.by_op``, gives these two efficiencies per op type (kernels
tagged with their op by ``simulator.op_cost``): one calibrated number per kernel as it
really runs (e.g. a rotary embedding making several passes over its data), replacing the
kind's average for that op.

Every constant comes from the cluster spec. ``gemm_half_flops`` (F_half) is read from
``device.efficiency.gemm_half_flops`` when the spec has that field; otherwise the
documented default :data:`DEFAULT_GEMM_HALF_FLOPS` is used and reported in
:attr:`Roofline.defaults_used`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from simulator.errors import SimulatorError
from simulator.op_cost import KernelCost
from simulator.types import Phase

# F_half: GEMM FLOPs at which the achieved rate is half of the spec's gemm efficiency.
# 1e8 FLOPs (about a 370^3 GEMM) puts a 1024^3 GEMM at 95% and a 256^3 one at 25% of the
# plateau, the shape of cuBLAS's published A100 GEMM sweeps (approx.; calibration replaces).
DEFAULT_GEMM_HALF_FLOPS = 1.0e8
_DTYPE_ALIASES = {
    "bfloat16": ("bf16", "bfloat16"), "float16": ("fp16", "float16", "f16"),
    "float32": ("fp32", "float32", "tf32", "f32"), "float8_e4m3fn": ("fp8", "float8"),
    "float8_e5m2": ("fp8", "float8"),
}


@dataclass(frozen=True)
class Roofline:
    """Achieved ceilings of one device (FLOP/s, B/s, s).

    Attributes:
        peak_flops: dtype name (``bf16``/``bfloat16``...) -> peak FLOP/s.
        gemm_efficiency: plateau fraction of peak for large GEMMs and attention.
        gemm_half_flops: GEMM FLOPs at which efficiency is half the plateau.
        mem_bandwidth: HBM bytes/s (peak); mem_efficiency: achieved fraction.
        kernel_overhead: seconds added per kernel.
        defaults_used: names of constants not in the spec (documented defaults).
        attention_efficiency: fraction of peak of attention kernels (None: gemm's).
        memory_kernel_efficiency: fraction of the bandwidth memory-bound kernels achieve
            (None: ``mem_efficiency``).
        by_op: ``"op:phase"`` (or ``"op"``) -> efficiency replacing the two above for
            that op's attention or memory-bound kernels in that phase (empty: none).
        action_overhead: seconds of host work per pipeline action pass (F, B or W)
            outside its kernels (``device.efficiency.action_overhead_s``; absent: 0).
    """

    peak_flops: dict[str, float]
    gemm_efficiency: float
    gemm_half_flops: float
    mem_bandwidth: float
    mem_efficiency: float
    kernel_overhead: float
    defaults_used: tuple[str, ...] = field(default=())
    attention_efficiency: float | None = None
    memory_kernel_efficiency: float | None = None
    by_op: dict[str, float] = field(default_factory=dict)
    action_overhead: float = 0.0

    @classmethod
    def from_device(cls, device: Any, gemm_efficiency: float | None = None) -> Roofline:
        """From a ``clusters.DeviceSpec``; ``gemm_efficiency`` overrides the spec (used
        by calibration fits)."""
        eff = device.efficiency
        half = getattr(eff, "gemm_half_flops", None)
        defaults = () if half is not None else ("gemm_half_flops",)
        attn, memk = getattr(eff, "attention", None), getattr(eff, "memory_kernels", None)
        by_op = {k: float(v.value) for k, v in (getattr(eff, "by_op", None) or {}).items()}
        action = getattr(eff, "action_overhead_s", None)
        return cls(
            peak_flops={k: float(v.value) for k, v in device.peak_flops.items()},
            gemm_efficiency=float(eff.gemm.value if gemm_efficiency is None else gemm_efficiency),
            gemm_half_flops=float(half.value) if half is not None else DEFAULT_GEMM_HALF_FLOPS,
            mem_bandwidth=float(device.memory_bandwidth.value),
            mem_efficiency=float(eff.memory_bandwidth.value),
            kernel_overhead=float(eff.kernel_overhead_s.value),
            defaults_used=defaults,
            attention_efficiency=None if attn is None else float(attn.value),
            memory_kernel_efficiency=None if memk is None else float(memk.value),
            by_op=by_op,
            action_overhead=0.0 if action is None else float(action.value),
        )

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for a dtype (``bfloat16`` finds ``bf16``). Integer and unknown
        dtypes use the largest listed 16-bit rate. Raises ValueError if none is listed."""
        for alias in _DTYPE_ALIASES.get(dtype, (dtype,)):
            if alias in self.peak_flops:
                return self.peak_flops[alias]
        for alias in ("bf16", "fp16", "bfloat16", "float16"):
            if alias in self.peak_flops:
                return self.peak_flops[alias]
        if not self.peak_flops:
            raise SimulatorError("roofline: the device lists no peak_flops")
        return max(self.peak_flops.values())

    def gemm_eff(self, gemm_flops: float) -> float:
        """Achieved fraction of peak for one GEMM of ``gemm_flops`` FLOPs."""
        if gemm_flops <= 0:
            return self.gemm_efficiency
        return self.gemm_efficiency * gemm_flops / (gemm_flops + self.gemm_half_flops)

    def kernel_time(self, k: KernelCost) -> float:
        """Seconds of one kernel (roofline + overhead)."""
        peak = self.peak(k.dtype)
        if k.kind == "gemm":
            compute = k.exec_flops / (peak * self.gemm_eff(k.gemm_flops)) if k.exec_flops else 0.0
        elif k.kind == "attention":
            eff = self.gemm_efficiency if self.attention_efficiency is None else self.attention_efficiency
            compute = k.exec_flops / (peak * self.op_efficiency(k, eff))
        else:
            return max(k.exec_flops / peak, self.memory_time(k.bytes, k.op, k.phase)) + self.kernel_overhead
        memory = k.bytes / (self.mem_bandwidth * self.mem_efficiency)
        return max(compute, memory) + self.kernel_overhead

    def op_efficiency(self, k: KernelCost, default: float) -> float:
        """``by_op["<op>:<phase>"]``, else ``by_op["<op>"]``, else ``default``."""
        if not self.by_op or not k.op:
            return default
        return self.by_op.get(f"{k.op}:{k.phase}", self.by_op.get(k.op, default))

    def memory_time(self, nbytes: float, op: str = "", phase: Phase | Literal[""] = "") -> float:
        """Seconds a memory-bound kernel of op type ``op`` in ``phase`` takes to move
        ``nbytes`` (no per-kernel overhead): ``nbytes / (mem_bandwidth * e)`` with ``e`` =
        ``by_op["op:phase"]`` or ``by_op["op"]``, else ``memory_kernel_efficiency``, else
        ``mem_efficiency``."""
        eff = self.mem_efficiency if self.memory_kernel_efficiency is None else self.memory_kernel_efficiency
        if self.by_op and op:
            eff = self.by_op.get(f"{op}:{phase}", self.by_op.get(op, eff))
        return nbytes / (self.mem_bandwidth * eff)

    def kernels_time(self, kernels: tuple[KernelCost, ...] | list[KernelCost]) -> dict[Phase, float]:
        """Seconds per phase (``F``, ``B``, ``W``, ``O``) of a list of kernels."""
        out: dict[Phase, float] = {}
        for k in kernels:
            out[k.phase] = out.get(k.phase, 0.0) + self.kernel_time(k)
        return out
