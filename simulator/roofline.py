"""Roofline time of one kernel on one device.

    t = max(exec_flops / (peak_flops[dtype] * eff), bytes / (bandwidth * mem_eff)) + overhead

with ``eff`` the GEMM efficiency of the cluster spec (``device.efficiency.gemm``) scaled by
a size factor ``F / (F + F_half)`` (F the FLOPs of the single GEMM, so tiny GEMMs run far
below peak and large ones approach ``gemm``), ``mem_eff`` =
``device.efficiency.memory_bandwidth`` and ``overhead`` = ``device.efficiency.
kernel_overhead_s`` (launch + tail, per kernel). This is the roofline model of Williams,
Waterman and Patterson (CACM 2009) with achieved rather than peak ceilings, as in Calculon
(Isaev et al. SC'23) and Paddle's auto-parallel cost model (compute = FLOPs / (0.65 peak)).

Every constant comes from the cluster spec. ``gemm_half_flops`` (F_half) is read from
``device.efficiency.gemm_half_flops`` when the spec has that field; the current spec
schema has none, so the documented default :data:`DEFAULT_GEMM_HALF_FLOPS` is used and
reported in :attr:`Roofline.defaults_used`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simulator.op_cost import KernelCost

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
    """

    peak_flops: dict[str, float]
    gemm_efficiency: float
    gemm_half_flops: float
    mem_bandwidth: float
    mem_efficiency: float
    kernel_overhead: float
    defaults_used: tuple[str, ...] = field(default=())

    @classmethod
    def from_device(cls, device: Any, gemm_efficiency: float | None = None) -> Roofline:
        """From a ``clusters.DeviceSpec``; ``gemm_efficiency`` overrides the spec (used
        by calibration fits)."""
        eff = device.efficiency
        half = getattr(eff, "gemm_half_flops", None)
        defaults = () if half is not None else ("gemm_half_flops",)
        return cls(
            peak_flops={k: float(v.value) for k, v in device.peak_flops.items()},
            gemm_efficiency=float(eff.gemm.value if gemm_efficiency is None else gemm_efficiency),
            gemm_half_flops=float(half.value) if half is not None else DEFAULT_GEMM_HALF_FLOPS,
            mem_bandwidth=float(device.memory_bandwidth.value),
            mem_efficiency=float(eff.memory_bandwidth.value),
            kernel_overhead=float(eff.kernel_overhead_s.value),
            defaults_used=defaults,
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
            raise ValueError("roofline: the device lists no peak_flops")
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
            compute = k.exec_flops / (peak * self.gemm_efficiency)
        else:
            compute = k.exec_flops / peak
        memory = k.bytes / (self.mem_bandwidth * self.mem_efficiency)
        return max(compute, memory) + self.kernel_overhead

    def kernels_time(self, kernels: tuple[KernelCost, ...] | list[KernelCost]) -> dict[str, float]:
        """Seconds per phase (``F``, ``B``, ``W``, ``O``) of a list of kernels."""
        out: dict[str, float] = {}
        for k in kernels:
            out[k.phase] = out.get(k.phase, 0.0) + self.kernel_time(k)
        return out
