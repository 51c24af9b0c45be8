"""Memory of one pipeline rank at its peak (bytes): model states by ZeRO stage, the
activations in flight as the simulated schedule plays them, the transient of recomputing
one layer, and the largest single op's working set.

Model states: ``simulator.memory.zero_model_states`` (ZeRO paper, sec. 5). Activations:
``simulator.memory.timeline_activation_peaks`` over the SimPy timeline (+M_B at each F,
-(M_B - M_W) at each B, -M_W at each W, per (rank, chunk)). Recompute (Korthikanti et al.
2022): the bytes one layer drops and re-materialises in its backward, the largest over the
rank's layers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from simulator.memory import StageActivations, zero_model_states
from simulator.stage_cost import BlockCost


def vstage_activation_bytes(acts: StageActivations, table: str, layer_keys: list[Any],
                            layers: Iterable[int], first: bool, last: bool) -> float:
    """Bytes of ``acts``'s table (``by_block`` or ``w_by_block``) for the model layers
    ``layers`` of a virtual stage, plus "pre" on the first and "post" on the last."""
    d = getattr(acts, table)
    total = sum(d.get(layer_keys[i], 0) for i in layers)
    if first:
        total += d.get("pre", 0)
    if last:
        total += d.get("post", 0)
    return float(total)


def rank_memory(cfg: Any, params: int, act_peak: float, acts: StageActivations,
                layer_keys: list[Any], rank_layers: Iterable[int],
                blocks: Iterable[BlockCost]) -> dict[str, int]:
    """The memory breakdown of one pipeline rank (bytes; ``total`` is the sum).

    Args:
        params: local parameter elements of the rank; act_peak: its peak activation bytes
            from the timeline; acts / layer_keys: the activation tables and each model
            layer's block key; rank_layers: the rank's model layers; blocks: every block it
            runs (for the workspace term)."""
    states = zero_model_states(params, cfg.dp, cfg.zero, cfg.param_bytes, cfg.grad_bytes,
                               cfg.optimizer_bytes)
    workspace = max((b.workspace for b in blocks), default=0)
    recompute = 0
    if cfg.recompute != "none":
        recompute = max((acts.dropped_by_block.get(layer_keys[i], 0) for i in rank_layers), default=0)
    memory = {"params": states.params, "grads": states.grads, "optimizer": states.optimizer,
              "activations": int(act_peak), "recompute": int(recompute),
              "workspace": int(workspace)}
    memory["total"] = sum(memory.values())
    return memory
