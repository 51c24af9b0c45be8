"""Eager (unfused) implementations of ops the builders emit as one op.

The program builders emit ``rms_norm``, ``fused_rotary_position_embedding``, ``swiglu`` and
``cross_entropy_with_softmax`` as single ops, costed as one fused kernel each
(``simulator.op_cost``). A framework that runs them as Python code in eager PyTorch launches
one kernel per tensor operation instead, each reading and writing its operands in HBM, in
fp32 where the code upcasts. A framework profile names the implementation it runs per
fusion group (``kernels.eager``: group -> implementation); an op in no fused group
(``simulator.fusion``) whose group the profile maps costs as that implementation's kernels
(:func:`eager_kernels`).

An implementation (:class:`EagerImpl`) is a list of kernels per phase, each a pass over the
op's main tensor (the elements of the results named by ``results``: the normalised output,
the rotated q and k, the SwiGLU output, the logits; for the grad op the matching input
gradients): per element, how many activation-dtype and fp32 values it reads and writes.
Reductions to one value per row, broadcasts of small tables and scalar ops move a
negligible share and are kernels of 0 bytes (they still pay the launch overhead).

Registered (each from the framework's code at the named commit):

- ``torchtitan-rmsnorm`` -- torchtitan 9dec370 ``torchtitan/models/norms.py`` ``RMSNorm``:
  ``(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * weight``; its
  autograd backward runs the backward of each of those ops (pow, mean, rsqrt, two muls,
  two casts, the sum of the two gradients of ``x``; the weight gradient is a mul and a sum
  over tokens, W).
- ``torchtitan-rope`` -- torchtitan 9dec370 ``torchtitan/models/llama/model.py``
  ``apply_rotary_emb``: ``view_as_real(view_as_complex(x.float()) * freqs_cis).type_as(x)``
  for q and k; backward: the cast back, the conjugate multiply, the cast.
- ``torch-swiglu`` -- ``F.silu(w1(x)) * w3(x)`` (torchtitan 9dec370 ``FeedForward``):
  silu, mul; backward: the mul's two gradients (the silu output is saved), silu backward.
- ``torchtitan-cross-entropy`` -- torchtitan 9dec370 ``train.py`` ``loss_fn``:
  ``F.cross_entropy(pred.float(), labels)`` (log_softmax reading the logits twice: max and
  sum, then the output; nll_loss a gather); backward: zeros + scatter of nll_loss,
  log_softmax backward (gradient and output read), the cast back.
- ``megatron-vocab-parallel-cross-entropy`` -- Megatron-DeepSpeed f4157bea
  ``megatron/model/gpt_model.py`` (GPTModelPipe's loss:
  ``vocab_parallel_cross_entropy(output.contiguous().float(), labels)``) and
  ``megatron/core/tensor_parallel/cross_entropy.py`` ``_VocabParallelCrossEntropy``: the
  cast to fp32; forward ``max`` over the vocabulary (a read), ``logits - max`` (fp32 read
  and write), the target mask, clone, index and masked fill (small), ``exp(out=)`` (read,
  write), ``sum`` (read), ``log`` and the subtraction (small), ``div_`` by the sum (read,
  write: the softmax saved for backward); backward: an arange, the mask cast, its
  ``1 - mask`` and the indexed subtraction (small), ``mul_`` by the output gradient (read,
  write), the cast back to 16 bits. The tensor-parallel all_reduces of the max, the
  target logit and the sum are the op's own collectives (``simulator.stage_cost``).
- ``megatron-torch-softmax`` -- Megatron-DeepSpeed f4157bea ``megatron/model/fused_softmax.py``
  ``FusedScaleMaskSoftmax.forward_torch_softmax``, what runs where the fused kernel does not
  apply (``simulator.fusion.softmax_kernel_available``): with query-key layer scaling on
  (``--no-query-key-layer-scaling`` is store_false, so on by default; ``CoreAttention`` then
  sets ``attention_softmax_in_fp32``) ``input.float()``, the scale (the program's own
  ``scale`` op), ``mask_func`` (an in-place ``masked_fill_``), ``Softmax`` and ``.half()``;
  backward: the cast's gradient up, softmax backward (gradient and output read), the
  masked fill's gradient, the cast back (the scale's gradient is the program's
  ``scale_grad``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from completion.dtypes import DTYPE_BYTES
from simulator.op_cost import KernelCost
from simulator.op_signature import OpSig
from simulator.types import Phase

#: one kernel: (activation values read, fp32 values read, activation written, fp32 written)
#: per element of the op's main tensor
Pass = tuple[float, float, float, float]
_TINY: Pass = (0, 0, 0, 0)


@dataclass(frozen=True)
class EagerImpl:
    """An op's eager implementation (module docstring).

    Attributes:
        name: the registry key (``kernels.eager`` values of a profile).
        group: the fusion group it is the unfused form of (``simulator.profiles.FUSION_GROUPS``).
        op_type: the forward op type; its grad op is ``op_type + "_grad"``.
        results: indices of the results whose elements are the main tensor (forward op:
            its outputs; grad op: the matching input gradients).
        forward / backward / weight: the kernels of F, B (input gradients) and W (weight
            gradient).
        source: where the code is.
    """

    name: str
    group: str
    op_type: str
    results: tuple[int, ...]
    forward: tuple[Pass, ...]
    backward: tuple[Pass, ...]
    weight: tuple[Pass, ...]
    source: str

    def passes(self, phase: Phase) -> tuple[Pass, ...]:
        """The kernels of ``phase`` (F, B or W)."""
        return {"F": self.forward, "B": self.backward, "W": self.weight}.get(phase, ())


EAGER_IMPLS: dict[str, EagerImpl] = {i.name: i for i in (
    EagerImpl("torchtitan-rmsnorm", "norm", "rms_norm", (0,),
              forward=((1, 0, 0, 1), (0, 1, 0, 1), (0, 1, 0, 0), _TINY, _TINY, (0, 1, 0, 1),
                       (0, 1, 1, 0), (1, 0, 1, 0)),
              backward=((1, 0, 1, 0), (1, 0, 0, 1), (0, 1, 0, 1), (0, 2, 0, 1), (0, 1, 0, 0),
                        _TINY, _TINY, (0, 0, 0, 1), (0, 2, 0, 1), (0, 2, 0, 1), (0, 1, 1, 0)),
              weight=((2, 0, 1, 0), (1, 0, 0, 0)),
              source="torchtitan 9dec370 torchtitan/models/norms.py RMSNorm"),
    EagerImpl("torchtitan-rope", "rope", "fused_rotary_position_embedding", (0, 1),
              forward=((1, 0, 0, 1), (0, 1, 0, 1), (0, 1, 1, 0)),
              backward=((1, 0, 0, 1), _TINY, (0, 1, 0, 1), (0, 1, 1, 0)),
              weight=(),
              source="torchtitan 9dec370 torchtitan/models/llama/model.py apply_rotary_emb"),
    EagerImpl("torch-swiglu", "swiglu", "swiglu", (0,),
              forward=((1, 0, 1, 0), (2, 0, 1, 0)),
              backward=((2, 0, 1, 0), (2, 0, 1, 0), (2, 0, 1, 0)),
              weight=(),
              source="torchtitan 9dec370 torchtitan/models/llama/model.py FeedForward"),
    EagerImpl("torchtitan-cross-entropy", "cross_entropy", "cross_entropy_with_softmax", (0,),
              forward=((1, 0, 0, 1), (0, 2, 0, 1), _TINY),
              backward=((0, 0, 0, 1), _TINY, (0, 2, 0, 1), (0, 1, 1, 0)),
              weight=(),
              source="torchtitan 9dec370 train.py loss_fn (F.cross_entropy of pred.float())"),
    EagerImpl("megatron-torch-softmax", "scale_mask_softmax", "softmax", (0,),
              forward=((1, 0, 0, 1), (0, 1, 0, 1), (0, 1, 0, 1), (0, 1, 1, 0)),
              backward=((1, 0, 0, 1), (0, 2, 0, 1), (0, 1, 0, 1), (0, 1, 1, 0)),
              weight=(),
              source="Megatron-DeepSpeed f4157bea megatron/model/fused_softmax.py "
                     "FusedScaleMaskSoftmax.forward_torch_softmax (softmax_in_fp32)"),
    EagerImpl("megatron-vocab-parallel-cross-entropy", "cross_entropy", "cross_entropy_with_softmax", (0,),
              forward=((1, 0, 0, 1), (0, 1, 0, 0), (0, 1, 0, 1), _TINY, _TINY, _TINY, _TINY, _TINY,
                       _TINY, _TINY, _TINY, _TINY, (0, 1, 0, 1), (0, 1, 0, 0), _TINY, _TINY,
                       (0, 1, 0, 1)),
              backward=(_TINY, _TINY, _TINY, _TINY, (0, 1, 0, 1), (0, 1, 1, 0)),
              weight=(),
              source="Megatron-DeepSpeed f4157bea megatron/core/tensor_parallel/cross_entropy.py "
                     "_VocabParallelCrossEntropy of the fp32 logits (megatron/model/gpt_model.py)"),
)}

#: op type (forward or grad) -> (implementation candidates by group)
_BY_OP: dict[str, list[EagerImpl]] = {}
for _impl in EAGER_IMPLS.values():
    _BY_OP.setdefault(_impl.op_type, []).append(_impl)
    _BY_OP.setdefault(_impl.op_type + "_grad", []).append(_impl)


def eager_settings(profile: Any) -> Mapping[str, str]:
    """``kernels.eager`` of a framework profile (group -> implementation name); empty for
    None or a profile without it."""
    if profile is None:
        return {}
    v = getattr(profile.kernels, "eager", None)
    return dict(getattr(v, "value", v) or {})


def impl_for(op_type: str, settings: Mapping[str, str]) -> EagerImpl | None:
    """The implementation ``settings`` (:func:`eager_settings`) runs ``op_type`` (forward
    or grad op) with, or None (the op's own fused cost applies)."""
    for impl in _BY_OP.get(op_type, ()):
        if settings.get(impl.group) == impl.name:
            return impl
    return None


def eager_kernels(sig: OpSig, impl: EagerImpl, fused: list[KernelCost]) -> list[KernelCost]:
    """The kernels of one op (forward or grad: ``sig.type``) run as ``impl``: per pass, a
    memory-bound kernel of (reads + writes) x elements bytes -- activation values at the
    main tensor's dtype size, fp32 at 4 bytes. ``fused``: the op's one-kernel costs
    (``simulator.op_cost``); their model FLOPs per phase go to the first kernel of that
    phase (the implementation changes the bytes moved, not the arithmetic)."""
    outs = [sig.outs[i] for i in impl.results if i < len(sig.outs) and sig.outs[i] is not None]
    n = 0
    for t in outs:
        e = 1
        for d in t.shape:
            e *= d
        n += e
    dtype = outs[0].dtype if outs else "bfloat16"
    act = DTYPE_BYTES.get(dtype, 2)
    phases: tuple[Phase, ...] = ("B", "W") if sig.type.endswith("_grad") else ("F",)
    out: list[KernelCost] = []
    for ph in phases:
        fl = sum(k.flops for k in fused if k.phase == ph)
        ex = sum(k.exec_flops for k in fused if k.phase == ph)
        for j, (ra, rf, wa, wf) in enumerate(impl.passes(ph)):
            nbytes = n * ((ra + wa) * act + (rf + wf) * 4)
            out.append(KernelCost(ph, fl if j == 0 else 0.0, ex if j == 0 else 0.0,
                                  float(nbytes), "memory", dtype, op=sig.type))
    return out
