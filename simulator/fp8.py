"""FP8 training: what an FP8 linear costs beyond its GEMMs (the recipes of
``completion.strategy.FP8_RECIPES``; which GEMMs run in FP8: ``completion.fp8``).

The FP8 GEMMs themselves (``simulator.op_cost.matmul_cost`` on ops with the ``fp8``
attribute) run at the device's FP8 peak (``peak_flops.fp8`` of the cluster YAML, 1979
TFLOP/s dense on H100 SXM / H200) with the device's GEMM efficiency: the same achievable
fraction of peak as BF16, as torchao's float8 roofline model assumes (pytorch/ao 0598012
``torchao/testing/training/roofline_utils.py``: one ``pct_achievable_gemm_tops`` applied to
``bf16_peak_tops`` and ``fp8_peak_tops``), reading their FP8 operands at 1 byte per element
and writing BF16.

Around each FP8 linear, memory-bound cast kernels move, per element of the tensor cast
(bytes read + written, :data:`RECIPES`):

- ``te-delayed`` (Transformer Engine ``DelayedScaling``; NVIDIA TransformerEngine v1.x
  ``cast_transpose`` kernels on Hopper, whose FP8 GEMMs take TN operands only): the input
  and the output gradient are each cast once into FP8 and its FP8 transpose in one kernel
  that also records the tensor's amax (read 2 + write 1 + 1 = 4 bytes per element); the
  scale comes from the amax *history* (delayed), so no pass precedes the cast. The weight's
  FP8 copy and transpose are made once per step and reused by every micro-batch where the
  framework caches them (``fp8_weight_cache``, ``completion.fp8``: Megatron-Core passes
  ``is_first_microbatch`` to TE modules): a once-per-step kernel (phase ``"O"``) and
  :func:`fp8_state_bytes` of memory (1 + 1 bytes per weight element); elsewhere
  (Composer) a cast in every forward. The amax histories (3 tensors x ``amax_history_len``
  float32 per GEMM) are persistent too, with a once-per-step update kernel;
  ``amax_history_len`` 1024: TE's ``DelayedScaling``
  default, which NeMo's recipes keep (``fp8_amax_history_len: 1024``).
- ``tensorwise`` / ``rowwise`` (torchao ``Float8Linear`` dynamic scaling): the kernels of
  ``get_tensor_memory_traffic_ovhd_s`` in pytorch/ao 0598012 ``roofline_utils.py`` for each
  of input, weight and output gradient, per micro-batch (dynamic scaling casts the weight in
  every forward). With torch.compile (the ``fsdp2`` profile, ``kernels.compile``) the
  first read of the input and of the output gradient fuses with the op that produced them
  (that file's ``fuse_with_prev``); the weight's never does. Tensorwise: an amax pass
  (read 2) then a cast writing row- and column-major FP8 (read 2 + write 2); the weight's
  two casts (forward, backward) write one layout each. Rowwise: per-row scales need a BF16
  transposed copy (read 2 + write 1 + 2) and a second cast (read 2 + write 1); the weight
  also a BF16 transpose (read 2 + write 2) in backward.

FLOPs of the casts are not counted (they are bandwidth-bound). Activations saved for
backward (``simulator.memory.saved_activations``): a linear's input that only FP8 weight
gradients read is kept as its FP8 copy under a recipe with ``saved_input_bytes``
(Transformer Engine, :class:`Fp8Recipe`), beside its compute-dtype self when another
backward op reads it too (e.g. the attention output, which flash attention's backward
reads in BF16); every other activation stays in the compute dtype. Not modelled: FSDP's
float8 all-gather of weights (torchao ``enable_fsdp_float8_all_gather``) gathers at BF16
size.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import SimulatorError
from simulator.op_cost import FP8_DTYPE, KernelCost
from simulator.op_signature import OpSig, TensorSig
from simulator.types import Phase

__all__ = ["AMAX_TENSORS", "FP8_DTYPE", "RECIPES", "CastKernel", "Fp8Recipe", "cast_kernels",
           "fp8_state_bytes", "recipe_of", "saved_input_bytes"]


@dataclass(frozen=True)
class CastKernel:
    """One cast (or amax) kernel over a GEMM operand.

    Attributes:
        phase: ``"F"``, ``"B"`` (per micro-batch) or ``"O"`` (once per step).
        bytes_per_elem: bytes read + written per element of the operand (eager).
        fused_bytes_per_elem: the same when its first read fuses with the producing op
            (torch.compile); None: never fuses.
    """

    phase: Phase
    bytes_per_elem: float
    fused_bytes_per_elem: float | None = None

    def nbytes(self, elems: int, compiled: bool) -> float:
        """Bytes moved over ``elems`` elements (``compiled``: the fused count if any)."""
        per = self.fused_bytes_per_elem if compiled and self.fused_bytes_per_elem is not None \
            else self.bytes_per_elem
        return per * elems


@dataclass(frozen=True)
class Fp8Recipe:
    """The cast kernels of one recipe per operand role (module docstring), the bytes per
    weight element of persistent FP8 weight copies, and the amax history length (0: no
    history, dynamic scaling)."""

    input: tuple[CastKernel, ...]
    weight: tuple[CastKernel, ...]
    grad_output: tuple[CastKernel, ...]
    weight_copy_bytes: float = 0.0
    amax_history_len: int = 0
    saved_input_bytes: float = 0.0
    """Bytes per element of the FP8 copy of a linear's input that the framework saves for
    the weight gradient instead of the compute-dtype input (0: it saves the input in the
    compute dtype). Transformer Engine 1 byte: ``_Linear.forward`` saves ``inputmat`` (the
    FP8 cast) or its FP8 transpose when ``fp8`` and wgrad is not overridden to high
    precision, ``inputmat_no_fp8`` otherwise (NVIDIA/TransformerEngine 0004dbd
    ``transformer_engine/pytorch/module/linear.py``); ``_GroupedLinear.forward`` (the MoE
    experts' grouped GEMMs) saves its ``fused_multi_quantize``d inputs (3ea1356 /
    0069563 ``module/grouped_linear.py``). torchao ``Float8Linear`` saves BF16."""


#: recipe name -> its costs (module docstring for the sources)
RECIPES: dict[str, Fp8Recipe] = {
    "te-delayed": Fp8Recipe(
        input=(CastKernel("F", 4.0),), weight=(CastKernel("O", 4.0),),
        grad_output=(CastKernel("B", 4.0),), weight_copy_bytes=2.0, amax_history_len=1024,
        saved_input_bytes=1.0),
    "tensorwise": Fp8Recipe(
        input=(CastKernel("F", 2.0, 0.0), CastKernel("F", 4.0)),
        weight=(CastKernel("F", 2.0), CastKernel("F", 3.0), CastKernel("B", 3.0)),
        grad_output=(CastKernel("B", 2.0, 0.0), CastKernel("B", 4.0))),
    "rowwise": Fp8Recipe(
        input=(CastKernel("F", 5.0, 3.0), CastKernel("F", 3.0)),
        weight=(CastKernel("F", 3.0), CastKernel("B", 4.0), CastKernel("B", 3.0)),
        grad_output=(CastKernel("B", 5.0, 3.0), CastKernel("B", 3.0))),
}

#: amax histories per FP8 GEMM: input, weight, output gradient (TE ``fp8_meta``)
AMAX_TENSORS = 3


def _elems(t: TensorSig | None) -> int:
    if t is None:
        return 0
    n = 1
    for d in t.shape:
        n *= d
    return n


def recipe_of(sig: OpSig) -> Fp8Recipe | None:
    """The recipe of an FP8 linear's op (its ``fp8`` attribute), None for other ops.
    Raises KeyError naming an unknown recipe."""
    name = sig.attr("fp8")
    if not name:
        return None
    if name not in RECIPES:
        raise SimulatorError(f"{sig.type}: fp8 recipe {name!r} is not one of {list(RECIPES)}")
    return RECIPES[name]


def _kernel(phase: Phase, nbytes: float) -> KernelCost:
    return KernelCost(phase, 0.0, 0.0, nbytes, "memory", "bfloat16", op="fp8_cast")


def cast_kernels(sig: OpSig, compiled: bool = False) -> list[KernelCost]:
    """The cast (and amax-history) kernels an FP8 linear's op adds (module docstring):
    on a forward ``matmul``, the input's (when its ``fp8_cast_x`` attribute is true) and
    the weight's forward (or per-step) casts, plus, with an amax history, its once-per-step
    update (read + write of the histories); on a ``matmul_grad``, the output gradient's and
    the weight's backward casts. Empty for other ops. ``compiled``: torch.compile fuses the
    first read of inputs and output gradients (:class:`CastKernel`)."""
    rec = recipe_of(sig)
    if rec is None:
        return []
    out: list[KernelCost] = []
    if sig.type == "matmul":
        x, w = sig.ins[0], sig.ins[1]
        if sig.attr("fp8_cast_x", True):
            out += [_kernel(c.phase, c.nbytes(_elems(x), compiled)) for c in rec.input]
        cache = bool(sig.attr("fp8_weight_cache", False))
        out += [_kernel(c.phase if cache else "F", c.nbytes(_elems(w), False))
                for c in rec.weight if c.phase != "B"]
        if rec.amax_history_len:
            out.append(_kernel("O", 2.0 * AMAX_TENSORS * rec.amax_history_len * 4))
    elif sig.type == "matmul_grad":
        w, dout = sig.ins[1], sig.ins[2]
        out += [_kernel(c.phase, c.nbytes(_elems(dout), compiled)) for c in rec.grad_output]
        out += [_kernel(c.phase, c.nbytes(_elems(w), False)) for c in rec.weight if c.phase == "B"]
    return out


def fp8_state_bytes(sig: OpSig) -> float:
    """Persistent bytes an FP8 linear's forward op keeps (module docstring): the recipe's
    FP8 weight copies (``weight_copy_bytes`` per local weight element, where the framework
    caches them: ``fp8_weight_cache``, and the weight is not itself an FP8 parameter,
    ``fp8_param``: then its 1 + 1 FP8 bytes are the parameter, counted as the 16-bit
    weight's 2 in the model states, ``completion.fp8``) and amax histories
    (:data:`AMAX_TENSORS` x ``amax_history_len`` float32, plus a scale and its inverse per
    tensor). 0 for other ops and for backward ops."""
    rec = recipe_of(sig)
    if rec is None or sig.type != "matmul":
        return 0.0
    hist = AMAX_TENSORS * (rec.amax_history_len + 2) * 4 if rec.amax_history_len else 0
    cached = sig.attr("fp8_weight_cache", False) and not sig.attr("fp8_param", False)
    copies = rec.weight_copy_bytes * _elems(sig.ins[1]) if cached else 0.0
    return copies + hist


def saved_input_bytes(op: object) -> float:
    """Bytes per element at which FP8 weight-gradient op ``op`` (a ``matmul_grad`` with an
    ``fp8`` attribute) holds its saved input x (:attr:`Fp8Recipe.saved_input_bytes`); 0 for
    any other op, an unknown recipe or a recipe that saves the compute dtype."""
    if getattr(op, "type", None) != "matmul_grad":
        return 0.0
    rec = RECIPES.get(str((getattr(op, "attrs", None) or {}).get("fp8") or ""))
    return rec.saved_input_bytes if rec is not None else 0.0
