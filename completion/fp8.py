"""Which GEMMs of a program run in FP8 under an FP8 training recipe
(``completion.strategy.FP8_RECIPES``).

Transformer Engine (``te.Linear`` / ``LayerNormLinear`` inside ``fp8_autocast``, as
Megatron-Core builds its ``TransformerLayer`` with the TE spec) and torchao
(``convert_to_float8_training``, which torchtitan applies to every ``nn.Linear`` but the
``output`` head: torchtitan 9dec370 ``float8.py`` ``filter_fqns``) both put the decoder
layers' linears in FP8: their three GEMMs (forward ``y = x W``, input gradient ``dx = dy
W^T``, weight gradient ``dW = x^T dy``). Everything else stays in the compute dtype: the
attention core (no weights), the embedding, and the LM head (Megatron's ``output_layer`` is
a plain ``ColumnParallelLinear``, torchtitan filters ``output``); under Transformer Engine
also a MoE layer's router GEMM (:data:`BF16_ROUTER_RECIPES`: Megatron-Core's router is a
torch matmul, not a TE module).

:func:`mark_fp8_linears` records the choice on the program as op attributes, so that the
cost model (``simulator.fp8``) and any printer see it:

- ``fp8``: the recipe name, on each such ``matmul`` and ``matmul_grad``;
- ``fp8_weight_cache``: on a forward ``matmul``, whether the framework keeps the FP8
  weight across the micro-batches of a step (Megatron-Core passes ``is_first_microbatch``
  to Transformer Engine modules, which then cast the weight on the first micro-batch only:
  the profile's ``fp8.weight_cache``, :class:`FP8Weights` ``cache``) or casts it in every forward (Composer's ``amp_fp8``
  calls TE modules without it; torchao's dynamic scaling always does);
- ``fp8_param``: on a forward ``matmul``, whether the weight itself is an FP8 parameter
  (Megatron ``--fp8-param-gather``, which Megatron-Bridge 7af9601's
  ``bf16_with_fp8_current_scaling_mixed`` sets: ``fp8_param_gather = True``): Megatron-LM
  d98e8a64 ``megatron/core/distributed/param_and_grad_buffer.py`` stores such parameters
  as ``torch.uint8`` (1 byte) and ``megatron/core/fp8_utils.py``
  ``post_all_gather_processing`` makes their transposed (columnwise) copy after the
  distributed optimizer's all-gather (tensorwise scaling on Hopper): 1 + 1 bytes per weight
  element that replace the 16-bit weight, with no FP8 cache beside it
  (the profile's ``fp8.params``, :class:`FP8Weights` ``params``; the once-per-step cast is the optimizer's, of the updated
  master weights). NeMo 24.x does the same with ``model.fp8_params`` (NVIDIA
  dgxc-benchmarking 35a9aecc ``configure.sh`` sets it with FP8; NeMo v2.0.0
  ``megatron_gpt_model.py`` builds the model under Transformer Engine's ``fp8_model_init``
  and passes ``fp8_param_gather``);
- ``fp8_cast_x``: on a forward ``matmul``, whether it casts its input itself (True) or
  reads the cast another FP8 linear of the same input made (False). Transformer Engine
  runs q/k/v as one fused ``linear_qkv`` GEMM (and the MLP's gate and up as one ``fc1``)
  on one cast of the shared input; torchao's separate ``Float8Linear`` modules each cast
  it (torchtitan's ``wq``, ``wk``, ``wv`` and ``w1``, ``w3``) -- except under tensor
  parallelism, where torchtitan 9dec370 ``parallelize_llama.py`` wraps the attention and
  MLP inputs in torchao's ``PrepareFloat8ModuleInput``, which casts the shared input once,
  before its sequence-parallel all-gather, for every FP8 user
  (``torchao/float8/float8_tensor_parallel.py``: "if there are multiple float8 users of the
  input activation, we perform fp8 allgather only once").

The executor runs these ops in the compute dtype (FP8 numerics are not emulated).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from completion.chunks import DEFAULT_SEG_METHOD
from completion.errors import CompletionError
from completion.ir import OpRole, Program
from completion.strategy import FP8_RECIPES

_LAYER = re.compile(DEFAULT_SEG_METHOD)
#: recipes whose framework casts a shared input once for the GEMMs reading it
SHARED_INPUT_CAST = ("te-delayed",)
#: recipes whose tensor-parallel wrappers cast before the sequence-parallel all-gather
#: (torchao ``Float8ColwiseParallel`` / ``Float8RowwiseParallel`` /
#: ``PrepareFloat8ModuleInput``, tensorwise dynamic scaling only: "This currently assumes
#: tensorwise scaling"), so those all-gathers move FP8 (``simulator.fp8``)
TP_FLOAT8_GATHER = ("tensorwise",)


@dataclass(frozen=True)
class FP8Weights:
    """How a framework holds the weights of its FP8 linears (module docstring): ``cache``,
    each weight's FP8 copy is cast once per step and kept across micro-batches
    (``fp8_weight_cache``); ``params``, the weights are FP8 parameters (``fp8_param``).
    The framework profile states both (``simulator.profiles.spec.Fp8``,
    ``ProfileSpec.fp8_weights``); the default (neither) is a framework that casts every
    weight in every forward."""

    cache: bool = False
    params: bool = False


#: struct name of a MoE layer's router GEMM (``completion.models.moe.moe_mlp``: ``...mlp.gate``)
_ROUTER = re.compile(r"\.mlp\.gate$")
#: recipes whose framework runs the MoE router GEMM outside FP8: Megatron-LM d98e8a64
#: ``megatron/core/transformer/moe/router.py`` ``TopKRouter.gating`` calls
#: ``router_gating_linear`` (``moe_utils.py``: a torch matmul in a custom autograd
#: function, not a Transformer Engine module), so ``fp8_autocast`` does not quantise it and
#: its backward keeps its 16-bit input
BF16_ROUTER_RECIPES = ("te-delayed",)


def is_router(op) -> bool:
    """True for a MoE router's GEMM (struct name ``...mlp.gate``)."""
    return bool(op.struct_name and _ROUTER.search(op.struct_name))


def is_fp8_linear(op) -> bool:
    """True for a ``matmul`` / ``matmul_grad`` of a decoder layer (struct name
    ``...layers.<i>...``) whose second operand is a parameter: a linear layer's GEMM."""
    if op.type not in ("matmul", "matmul_grad") or len(op.operands) < 2:
        return False
    w = op.operands[1]
    return bool(w is not None and w.is_parameter and op.struct_name and _LAYER.search(op.struct_name))


def shares_input_cast(recipe: str, tp: int) -> bool:
    """True when the GEMMs reading one input share one FP8 cast of it (module docstring):
    Transformer Engine always, torchao under tensor parallelism (tp > 1)."""
    return recipe in SHARED_INPUT_CAST or (recipe in TP_FLOAT8_GATHER and tp > 1)


def mark_fp8_linears(program: Program, recipe: str, weights: FP8Weights | None = None,
                     tp: int = 1) -> int:
    """Set the ``fp8`` (and ``fp8_cast_x``, ``fp8_weight_cache``, ``fp8_param``) attributes (module
    docstring) on the FP8 linears of ``program`` (forward and, when present, backward) as a
    framework holding its weights as ``weights`` (None: :class:`FP8Weights`'s default) runs ``recipe`` with ``tp`` tensor-parallel
    ranks; returns how many forward
    GEMMs were marked. Raises CompletionError for an unknown recipe."""
    if recipe not in FP8_RECIPES:
        raise CompletionError(f"fp8 recipe {recipe!r} is not one of {list(FP8_RECIPES)}")
    weights = weights or FP8Weights()
    cast: set[int] = set()
    n = 0
    for op in program.ops:
        if not is_fp8_linear(op) or (recipe in BF16_ROUTER_RECIPES and is_router(op)):
            continue
        op.attrs["fp8"] = recipe
        if op.type == "matmul" and op.role == OpRole.FORWARD:
            x = op.operands[0]
            op.attrs["fp8_cast_x"] = not shares_input_cast(recipe, tp) or id(x) not in cast
            op.attrs["fp8_weight_cache"] = weights.cache
            op.attrs["fp8_param"] = weights.params
            cast.add(id(x))
            n += 1
    return n
