"""Context-parallel attention implementations a framework profile may name
(``kernels.cp_attention``): how the exchange of an attention op is timed and which
memory-bound merge kernels it adds, per rank per micro-batch.

- ``transformer-engine``: Megatron-Core / Transformer Engine (``AttnFuncWithCPAndKVP2P``,
  ``AttnFuncWithCPAndKVAllGather``): ``simulator.context_parallel`` (ring sends overlapped
  with the blockwise attention, or the all-gather exposed); no separate merge kernels
  (charged within the attention kernels). The default of a profile that names none.
- ``torchtitan-sdpa``: PyTorch's experimental ring under torchtitan (``simulator.cp_torch``:
  K/V repeated to the query heads, fp32 merge and accumulation kernels, the exchange
  exposed under torch.compile).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simulator import cp_torch
from simulator.context_parallel import cp_comm_time, cp_workspace_bytes
from simulator.errors import SimulatorError
from simulator.op_signature import OpSig

#: the implementation of a profile without ``kernels.cp_attention``
DEFAULT_CP_IMPL = "transformer-engine"


@dataclass(frozen=True)
class CpImpl:
    """One implementation.

    Attributes:
        name: the registry key.
        comm_time: (sig, attention seconds, cluster, rank, offset, compiled) ->
            (exposed, alone) seconds of the op's exchange.
        merge_bytes: (sig, compiled) -> bytes of the op's merge / accumulation kernels
            (memory-bound, charged at the roofline's memory rate to the op's phase).
        workspace_bytes: sig -> extra bytes the op holds while it runs (K/V buffers,
            accumulators) beyond its operands and results.
        source: where the code is.
    """

    name: str
    comm_time: Callable[[OpSig, float, Any, int, int, bool], tuple[float, float]]
    merge_bytes: Callable[[OpSig, bool], float]
    workspace_bytes: Callable[[OpSig], int]
    source: str


def _te_comm(sig: OpSig, attention_s: float, cluster: Any, rank: int, offset: int,
             compiled: bool) -> tuple[float, float]:
    return cp_comm_time(sig, attention_s, cluster, rank, offset)


CP_IMPLS: dict[str, CpImpl] = {i.name: i for i in (
    CpImpl("transformer-engine", _te_comm, lambda sig, compiled: 0.0, cp_workspace_bytes,
           "Megatron-LM / Transformer Engine attention with context parallelism (simulator.context_parallel)"),
    CpImpl("torchtitan-sdpa", cp_torch.comm_time, cp_torch.merge_bytes, cp_torch.workspace_bytes,
           "torch 1963fc8 torch/distributed/tensor/experimental/_attention.py under torchtitan 9dec370 "
           "(simulator.cp_torch)"),
)}


def cp_impl(profile: Any) -> CpImpl:
    """The implementation a framework profile names (``kernels.cp_attention``), the
    default without a profile or field. Raises SimulatorError for an unknown name."""
    field = getattr(getattr(profile, "kernels", None), "cp_attention", None)
    name = DEFAULT_CP_IMPL if field is None else str(field.value)
    impl = CP_IMPLS.get(name)
    if impl is None:
        raise SimulatorError(f"kernels.cp_attention: {name!r} is none of {sorted(CP_IMPLS)}")
    return impl


__all__ = ["CP_IMPLS", "DEFAULT_CP_IMPL", "CpImpl", "cp_impl"]
