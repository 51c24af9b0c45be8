"""Roofline time of one kernel on one device.

    t = max(exec_flops / (peak_flops[dtype] * eff), bytes / (bandwidth * mem_eff)) + overhead

with ``eff`` the GEMM efficiency of the cluster spec (``device.efficiency.gemm``) scaled by
a size factor ``F / (F + F_half)`` (F the FLOPs of the single GEMM, so tiny GEMMs run far
below peak and large ones approach ``gemm``) -- on devices whose spec gives ``sm_count``,
GEMMs are instead timed by their shape (tiles in waves of SMs, below) --, ``mem_eff`` =
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

GEMM time by shape (devices with ``device.sm_count``; :meth:`Roofline.gemm_tiling`).
cuBLAS splits a GEMM's output ``[batch, m, n]`` into tiles of ``tm x tn``, one thread
block each, and runs the blocks in waves of one block per SM; a wave takes as long as one
tile, whatever the number of useful rows in it. So a dimension that is not a multiple of
the tile pays for the whole edge tile (tile quantization) and a tile count just above a
multiple of the SM count pays a nearly empty last wave (wave quantization): NVIDIA,
"Matrix Multiplication Background" user's guide (DU-09799-001), ch. 2.1 (tiled outer
product) and ch. 3 (dimension quantization effects); shared/reference/fidelity_notes.md,
"GEMM efficiency". For a ``(batch, m, n, k)`` GEMM on ``S`` SMs and each candidate tile
of :data:`GEMM_TILES`::

    tiles   = batch * ceil(m / tm) * ceil(n / tn)
    waves   = ceil(tiles / S)
    compute = waves * 2 * tm * tn * k / (peak[dtype] / sm_count * gemm)

(each SM runs at ``1 / sm_count`` of the device's achieved plateau ``gemm *
peak``); the tile with the smallest compute time is taken (cuBLAS's heuristic picks a
good tile; ties go to the larger tile, listed first). The kernel time is
``max(compute, bytes / (mem_bandwidth * mem_eff)) + overhead``, bytes = A + B read + C
written as ``simulator.op_cost`` counts them. ``S`` is ``sm_count``, or fewer SMs when a
collective running beside the GEMM holds some (``sms_available``). A GEMM whose shape is
aligned to the tiles and whose tile count is a multiple of ``S`` runs at exactly ``gemm``
(no size factor); a spec without ``sm_count`` keeps the smooth size factor above.

Epilogue (devices whose spec sets ``device.gemm_epilogue_exposed``). A thread block of a
threadblock-scoped GEMM kernel runs its main loop over ``k``, then its epilogue: the
accumulators go through shared memory to the output tile in global memory (CUTLASS
``include/cutlass/epilogue/threadblock/epilogue.h``, "Epilogue for threadblock scoped
GEMMs": the result is rearranged through shared memory to the tensor layout in global
memory; ``media/docs/efficient_gemm.md``, the mainloop / epilogue structure), and the
SM's tensor cores have no other tile to work on meanwhile. Every SM of a wave stores at
once, so each gets ``1 / sm_count`` of the achieved HBM bandwidth, and a wave takes::

    wave = 2 * tm * tn * k / (peak[dtype] / sm_count * gemm)
         + tm * tn * out_bytes / (mem_bandwidth * mem_eff / sm_count)

(``out_bytes``: 4 for an fp32 GEMM, else 2: bf16/fp16 outputs, and FP8 GEMMs write bf16).
The store is a fixed cost per tile against a main loop that grows with ``k``, so a
GEMM's efficiency falls with its inner dimension as ``k / (k + k_0)``, ``k_0 = out_bytes *
per_sm_rate / (2 * per_sm_bandwidth)`` -- about 150 on an A100 and 240 on an H100 for bf16
at the catalog's constants: the inner dimension 64-128 of attention's batched GEMMs runs at
a quarter to a half of the plateau, as shared/reference/fidelity_notes.md ("GEMM
efficiency") says they reach much less, while a 4096-deep projection loses 3-6%. Kernels that overlap one tile's
epilogue with another's main loop (CUTLASS ``sm90_gemm_tma_warpspecialized_pingpong.hpp``:
two consumer warp groups alternate) leave the flag false.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from numbers import Integral
from typing import Any, Literal

from completion.ops.registry import get_opdef
from simulator.errors import SimulatorError
from simulator.op_cost import KernelCost
from simulator.types import Phase

# F_half: GEMM FLOPs at which the achieved rate is half of the spec's gemm efficiency.
# 1e8 FLOPs (about a 370^3 GEMM) puts a 1024^3 GEMM at 95% and a 256^3 one at 25% of the
# plateau, the shape of cuBLAS's published A100 GEMM sweeps (approx.; calibration replaces).
DEFAULT_GEMM_HALF_FLOPS = 1.0e8
#: Candidate output tiles (tm, tn) of the tensor-core GEMM kernels, largest first: the
#: tile sizes the NVIDIA "Matrix Multiplication Background" user's guide (ch. 2.3,
#: "Typical Tile Dimensions in cuBLAS and Performance") lists for cuBLAS -- 256x128 and
#: 128x256 (most efficient), 128x128, 256x64 and 64x256, 128x64 and 64x128, 64x64 (least
#: efficient) -- which are also CUTLASS's SM80 tensor-core threadblock shapes. Closed
#: under transposition, so a GEMM and its transpose cost the same. With one per-SM rate
#: for every tile (the model above), 64x64, which divides every other tile, never takes
#: longer than any of them: the pick always has 64x64's time, and the list's order only
#: breaks ties toward the larger tile. (Real smaller tiles run below the plateau -- less
#: operand reuse, the guide's ch. 2.3 -- which this one-rate model does not charge.)
GEMM_TILES: tuple[tuple[int, int], ...] = (
    (256, 128), (128, 256), (128, 128), (256, 64), (64, 256), (128, 64), (64, 128), (64, 64),
)
_DTYPE_ALIASES = {
    "bfloat16": ("bf16", "bfloat16"), "float16": ("fp16", "float16", "f16"),
    "float32": ("fp32", "float32", "tf32", "f32"), "float8_e4m3fn": ("fp8", "float8"),
    "float8_e5m2": ("fp8", "float8"),
}


@dataclass(frozen=True)
class GemmTiling:
    """How the wave model runs one GEMM (:meth:`Roofline.gemm_tiling`).

    Attributes:
        tile: the chosen output tile ``(tm, tn)``.
        tiles: thread blocks, ``batch * ceil(m / tm) * ceil(n / tn)``.
        waves: ``ceil(tiles / sms)``.
        sms: SMs the blocks ran on.
        compute_s: ``waves * 2 * tm * tn * k / (peak / sm_count * gemm)`` seconds, plus
            ``waves * tm * tn * out_bytes / (mem_bandwidth * mem_eff / sm_count)`` when the
            device's epilogue is exposed (module docstring, "Epilogue").
    """

    tile: tuple[int, int]
    tiles: int
    waves: int
    sms: int
    compute_s: float


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


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
        sm_count: SMs of the device (``device.sm_count``); set, GEMM kernels that carry
            a ``gemm_shape`` are timed by the wave model (module docstring); None: the
            smooth size model.
        gemm_tiles: candidate output tiles of the wave model (:data:`GEMM_TILES`).
        epilogue_exposed: each wave also stores its output tiles (module docstring,
            "Epilogue"; ``device.gemm_epilogue_exposed``; default False).
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
    sm_count: int | None = None
    gemm_tiles: tuple[tuple[int, int], ...] = GEMM_TILES
    epilogue_exposed: bool = False

    def __post_init__(self) -> None:
        if self.sm_count is not None and (isinstance(self.sm_count, bool) or self.sm_count < 1):
            raise SimulatorError(f"roofline: sm_count must be an integer >= 1, got {self.sm_count!r}")
        if not self.gemm_tiles or any(tm < 1 or tn < 1 for tm, tn in self.gemm_tiles):
            raise SimulatorError(f"roofline: gemm_tiles must be positive (tm, tn) pairs, got {self.gemm_tiles!r}")

    @classmethod
    def from_device(cls, device: Any, gemm_efficiency: float | None = None,
                    attention_kernel: str | None = None) -> Roofline:
        """From a ``clusters.DeviceSpec``; ``gemm_efficiency`` overrides the spec (used
        by calibration fits). ``attention_kernel`` (a framework profile's
        ``kernels.attention_kernel``) selects the device's efficiency for that attention
        implementation (``device.efficiency.attention_kernels``) when it lists one."""
        eff = device.efficiency
        half = getattr(eff, "gemm_half_flops", None)
        defaults = () if half is not None else ("gemm_half_flops",)
        attn, memk = getattr(eff, "attention", None), getattr(eff, "memory_kernels", None)
        kernels = getattr(eff, "attention_kernels", None) or {}
        if attention_kernel is not None and attention_kernel in kernels:
            attn = kernels[attention_kernel]
        by_op = {k: float(v.value) for k, v in (getattr(eff, "by_op", None) or {}).items()}
        unknown = sorted(k for k in by_op if get_opdef(k.partition(":")[0]) is None)
        if unknown:  # a typo would never be read: the kind's average would apply silently
            raise SimulatorError(f"device.efficiency.by_op: {', '.join(map(repr, unknown))} "
                                 f"name(s) no op type (completion.ops)")
        action = getattr(eff, "action_overhead_s", None)
        sms = getattr(device, "sm_count", None)
        epilogue = getattr(device, "gemm_epilogue_exposed", None)
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
            sm_count=None if sms is None else int(sms.value),
            epilogue_exposed=bool(epilogue is not None and epilogue.value),
        )

    def mfu_peak(self, fp8: bool = False) -> float:
        """FLOP/s that MFU divides by: the peak of the fastest precision the plan's GEMMs
        run in, so that MFU <= 1 (PaLM's MFU, Chowdhery et al. 2022 appendix B: model FLOPs
        over the hardware's peak for them). Without FP8 (``fp8`` False) the device's largest
        floating-point peak other than FP8 (int8 is not one either): its BF16 tensor-core
        peak on a GPU, a CPU's fp32 rate when it emulates bf16, also for an fp32 plan (what
        the device could do). With FP8 GEMMs the FP8 peak (twice BF16's on an H100): NeMo
        and torchtitan divide an FP8 run's FLOPs by the BF16 peak instead, which exceeds 1
        for a fast FP8 plan (1.12 at hidden 16384); that figure is :meth:`bf16_mfu_peak`'s.
        Raises SimulatorError when the needed peak is not listed."""
        base = self.bf16_mfu_peak()
        if not fp8:
            return base
        vals = [v for k, v in self.peak_flops.items() if k.startswith(("fp8", "float8"))]
        if not vals:
            raise SimulatorError(f"roofline: MFU of an FP8 plan needs the device's fp8 peak_flops; "
                                 f"it lists {', '.join(sorted(self.peak_flops))}")
        return float(max(max(vals), base))

    def bf16_mfu_peak(self) -> float:
        """The device's largest floating-point peak other than FP8 and integer ones (its
        BF16 tensor-core peak on a GPU): what NeMo and torchtitan report MFU against, an FP8
        run's too. Raises SimulatorError when none is listed."""
        vals = [v for k, v in self.peak_flops.items() if not k.startswith(("fp8", "float8", "int"))]
        if not vals:
            raise SimulatorError(f"roofline: MFU needs a floating-point peak_flops entry other than "
                                 f"FP8; the device lists {', '.join(sorted(self.peak_flops))}")
        return float(max(vals))

    def peak(self, dtype: str, gemm: bool = True) -> float:
        """Peak FLOP/s for a dtype (``bfloat16`` finds ``bf16``, ``float8_e4m3fn`` finds
        ``fp8``; bf16 and fp16 stand in for each other). Integer and unknown dtypes use the
        largest listed 16-bit rate, else the largest rate; FP8 and fp32 GEMMs never fall back
        (``gemm`` False: a memory-bound kernel's FLOP term, where a float32 kernel may take the
        16-bit rate, its time being the bytes it moves). Raises SimulatorError if none is
        listed, FP8 or an fp32 GEMM has no peak of its own (fp32 would otherwise run at the
        16-bit tensor-core rate, about 15x an H100's fp32), or a 16-bit
        float dtype finds no 16-bit peak (it would otherwise run at the fp32 rate without a
        word)."""
        for alias in _DTYPE_ALIASES.get(dtype, (dtype,)):
            if alias in self.peak_flops:
                return self.peak_flops[alias]
        if dtype.startswith("float8"):  # FP8 GEMMs never fall back to a 16-bit rate
            raise SimulatorError(f"roofline: {dtype} GEMMs need the device's fp8 peak_flops; it "
                                 f"lists {', '.join(sorted(self.peak_flops))}")
        if dtype == "float32" and gemm:  # never at the 16-bit tensor-core rate, silently
            raise SimulatorError(f"roofline: float32 GEMMs need the device's fp32 peak "
                                 f"(device.peak_flops fp32 or tf32); it lists "
                                 f"{', '.join(sorted(self.peak_flops)) or 'none'}")
        for alias in ("bf16", "fp16", "bfloat16", "float16"):
            if alias in self.peak_flops:
                return self.peak_flops[alias]
        if dtype in ("bfloat16", "float16"):  # never at another precision's rate, silently
            raise SimulatorError(f"roofline: {dtype} GEMMs need a 16-bit peak (device.peak_flops "
                                 f"bf16 or fp16); it lists {', '.join(sorted(self.peak_flops)) or 'none'}")
        if not self.peak_flops:
            raise SimulatorError("roofline: the device lists no peak_flops")
        return max(self.peak_flops.values())

    def gemm_eff(self, gemm_flops: float) -> float:
        """Achieved fraction of peak for one GEMM of ``gemm_flops`` FLOPs."""
        if gemm_flops <= 0:
            return self.gemm_efficiency
        return self.gemm_efficiency * gemm_flops / (gemm_flops + self.gemm_half_flops)

    def _check_sms(self, sms: int | None) -> int:
        if self.sm_count is None:
            raise SimulatorError("roofline: sms_available needs the device's sm_count "
                                 "(device.sm_count in the cluster spec)")
        if sms is None:
            return self.sm_count
        if isinstance(sms, bool) or not isinstance(sms, Integral) or not 1 <= sms <= self.sm_count:
            raise SimulatorError(f"roofline: sms_available must be an integer in "
                                 f"[1, {self.sm_count}] (the device's sm_count), got {sms!r}")
        return sms

    def gemm_tiling(self, shape: tuple[int, int, int, int], dtype: str,
                    sms_available: int | None = None) -> GemmTiling:
        """The wave model's best tile for a ``(batch, m, n, k)`` GEMM (module docstring):
        for each tile of :attr:`gemm_tiles`, ``waves = ceil(batch * ceil(m/tm) *
        ceil(n/tn) / S)`` and ``compute = waves * 2 tm tn k / (peak / sm_count * gemm)``
        (plus each wave's tile store when :attr:`epilogue_exposed`: module docstring)
        with ``S`` = ``sms_available`` (default ``sm_count``); the smallest compute time
        wins, ties to the earlier (larger) tile. A GEMM with a zero dimension has no
        tiles and no compute. Raises SimulatorError when the device has no
        ``sm_count``, for ``sms_available`` outside ``[1, sm_count]`` or a negative dim."""
        sms = self._check_sms(sms_available)
        batch, m, n, k = shape
        if min(shape) < 0:
            raise SimulatorError(f"roofline: GEMM shape (batch, m, n, k) must be >= 0, got {shape}")
        assert self.sm_count is not None  # _check_sms
        per_sm = self.peak(dtype) / self.sm_count * self.gemm_efficiency
        # seconds per output element of one SM's epilogue store (0: hidden)
        store = (self.output_bytes(dtype) * self.sm_count / (self.mem_bandwidth * self.mem_efficiency)
                 if self.epilogue_exposed else 0.0)
        best: GemmTiling | None = None
        for tm, tn in self.gemm_tiles:
            tiles = batch * _ceil_div(m, tm) * _ceil_div(n, tn)
            waves = _ceil_div(tiles, sms)
            t = waves * tm * tn * (2.0 * k / per_sm + store)
            if best is None or t < best.compute_s:
                best = GemmTiling((tm, tn), tiles, waves, sms, t)
        assert best is not None  # gemm_tiles is not empty (__post_init__)
        return best

    @staticmethod
    def output_bytes(dtype: str) -> int:
        """Bytes per output element of a GEMM in ``dtype``: 4 for fp32 (``float32``,
        ``tf32``...), else 2 (bf16 / fp16; FP8 GEMMs write bf16: Transformer Engine and
        torchao ``_scaled_mm`` keep a high-precision output)."""
        return 4 if dtype in _DTYPE_ALIASES["float32"] else 2

    def gemm_time(self, k: KernelCost, sms_available: int | None = None) -> float:
        """Seconds of one GEMM kernel: ``max(compute, bytes / (mem_bandwidth * mem_eff)) +
        overhead``. ``compute`` is the wave model's (:meth:`gemm_tiling`) when the device
        has ``sm_count`` and the kernel a ``gemm_shape``, on ``sms_available`` SMs (fewer
        than ``sm_count`` when a collective beside it holds some; default all); otherwise
        the smooth ``exec_flops / (peak * gemm_eff(gemm_flops))``. Raises SimulatorError
        for ``sms_available`` on a device without ``sm_count`` or out of range, or a dtype
        without its peak (:meth:`peak`), naming the kernel's op."""
        if k.kind != "gemm":
            raise SimulatorError(f"roofline: gemm_time takes a GEMM kernel, got kind {k.kind!r} ({k.op or 'no op'})")
        try:
            if self.sm_count is not None and k.gemm_shape is not None:
                compute = self.gemm_tiling(k.gemm_shape, k.dtype, sms_available).compute_s
            else:
                if sms_available is not None:
                    self._check_sms(sms_available)  # raises without sm_count; else validates
                peak = self.peak(k.dtype)
                compute = k.exec_flops / (peak * self.gemm_eff(k.gemm_flops)) if k.exec_flops else 0.0
        except SimulatorError as e:  # the op at fault named (an fp32 GEMM in a bf16 program, ...)
            if not k.op:
                raise
            raise SimulatorError(f"{e} (op {k.op})") from None
        memory = k.bytes / (self.mem_bandwidth * self.mem_efficiency)
        return max(compute, memory) + self.kernel_overhead

    def kernel_time(self, k: KernelCost, sms_available: int | None = None) -> float:
        """Seconds of one kernel (roofline + overhead). ``sms_available``: SMs left to the
        kernel by a collective running beside it (None: all). GEMMs: :meth:`gemm_time`
        (fewer SMs, more waves). Attention and memory-bound kernels: unchanged for now
        (the hook where an SM-limited model of them would go; the value is still
        validated)."""
        if k.kind == "gemm":
            return self.gemm_time(k, sms_available)
        if sms_available is not None:
            self._check_sms(sms_available)
        if k.kind == "attention":
            peak = self.peak(k.dtype)
            eff = self.gemm_efficiency if self.attention_efficiency is None else self.attention_efficiency
            compute = k.exec_flops / (peak * self.op_efficiency(k, eff))
        else:  # memory-bound: a float32 elementwise kernel beside bf16 GEMMs (a loss) is not refused
            peak = self.peak(k.dtype, gemm=False)
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

    def kernels_time(self, kernels: tuple[KernelCost, ...] | list[KernelCost],
                     sms_available: int | None = None) -> dict[Phase, float]:
        """Seconds per phase (``F``, ``B``, ``W``, ``O``) of a list of kernels, each on
        ``sms_available`` SMs (:meth:`kernel_time`; None: all)."""
        out: dict[Phase, float] = {}
        for k in kernels:
            out[k.phase] = out.get(k.phase, 0.0) + self.kernel_time(k, sms_available)
        return out
