"""Megatron-LM's mixture-of-experts arguments on ``meshplan cost``, so that what ``meshplan
export --to megatron`` writes for a MoE plan can be pasted back after ``cost --model M
--cluster C`` (names of ``megatron/training/arguments.py`` at NVIDIA/Megatron-LM d98e8a64).

The architecture comes from ``--model``: the model-describing arguments (``--num-experts``,
``--moe-router-topk``, ``--moe-ffn-hidden-size``, ``--moe-shared-expert-intermediate-size``,
``--moe-layer-freq``, ``--moe-aux-loss-coeff`` with ``--moe-router-load-balancing-type``) are
checked against it and a difference is an error naming the argument and both values, never a
silently different model. The run-describing ones say how Megatron-LM executes the layers:
meshplan costs grouped expert GEMMs and the all_to_all dispatcher, so
``--moe-token-dispatcher-type`` other than ``alltoall`` is refused, and MoE arguments without
``--moe-grouped-gemm`` (Megatron's default: one GEMM per local expert, ``SequentialMLP``) get
a note that the costing is of grouped GEMMs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any

from meshplan.errors import MeshplanError


class Dispatcher(str, Enum):
    """``--moe-token-dispatcher-type`` values (arguments.py)."""

    alltoall = "alltoall"
    allgather = "allgather"
    flex = "flex"


class Balancing(str, Enum):
    """``--moe-router-load-balancing-type`` values (arguments.py)."""

    aux_loss = "aux_loss"
    seq_aux_loss = "seq_aux_loss"
    sinkhorn = "sinkhorn"
    none = "none"


@dataclass(frozen=True)
class MegatronMoE:
    """The MoE arguments of one command line (None / False: not given); each field is the
    command parameter of the same name."""

    num_experts: int | None = None
    moe_router_topk: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_layer_freq: str | None = None
    moe_aux_loss_coeff: float | None = None
    moe_router_load_balancing_type: Any = None
    moe_grouped_gemm: bool = False
    moe_token_dispatcher_type: Any = None

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> MegatronMoE:
        """From a mapping of the field names (a command's parameters). Raises KeyError naming
        a missing one."""
        return cls(**{f.name: params[f.name] for f in fields(cls)})

    def given(self) -> bool:
        """True when any MoE argument was given."""
        return any(getattr(self, f.name) not in (None, False) for f in fields(self))


def _value(v: Any) -> Any:
    return v.value if isinstance(v, Enum) else v


def layer_pattern(text: str, layers: int) -> list[int]:
    """``--moe-layer-freq`` as one 0/1 per decoder layer: an int N (layer i is MoE when
    ``i % N == 0``, Megatron-Core ``get_moe_layer_freq`` semantics) or a list literal of
    ``layers`` zeros and ones. Raises MeshplanError naming the argument for anything else
    (Megatron evaluates Python expressions such as ``([1]*3+[0])*2``: write the list)."""
    t = text.strip()
    if t.lstrip("+").isdigit():
        n = int(t)
        if n < 1:
            raise MeshplanError(f"--moe-layer-freq {text}: an int must be >= 1", field="--moe-layer-freq")
        return [int(i % n == 0) for i in range(layers)]
    try:
        got = json.loads(t)
    except ValueError:
        got = None
    if not isinstance(got, list) or any(x not in (0, 1) or isinstance(x, bool) for x in got):
        raise MeshplanError(f"--moe-layer-freq {text!r}: give an int or a list of 0 and 1 per "
                            "layer, e.g. [1,0,1,0] (expressions are not evaluated)", field="--moe-layer-freq")
    if len(got) != layers:
        raise MeshplanError(f"--moe-layer-freq lists {len(got)} layers but the model has {layers}", field="--moe-layer-freq")
    return got


def check(moe: MegatronMoE, cfg: Any, layers: int) -> list[str]:
    """Check the MoE arguments against the model config ``cfg`` (a
    ``completion.models.ModelConfig``) of ``layers`` decoder layers; returns the notes to
    print (grouped GEMMs costed when ``--moe-grouped-gemm`` is absent). Raises MeshplanError
    naming the argument and both values on a difference, for a dense model, and for a
    dispatcher meshplan does not cost."""
    if not moe.given():
        return []
    experts = getattr(cfg, "num_experts", None) or 0
    if not experts:
        raise MeshplanError(f"the Megatron-LM MoE arguments describe experts, but model "
                            f"{cfg.name} is dense; --model gives the architecture")
    want = {"num_experts": ("--num-experts", experts),
            "moe_router_topk": ("--moe-router-topk", cfg.experts_per_token),
            "moe_ffn_hidden_size": ("--moe-ffn-hidden-size", cfg.expert_ffn_hidden_size),
            "moe_shared_expert_intermediate_size": ("--moe-shared-expert-intermediate-size",
                                                    cfg.shared_expert_ffn_hidden_size)}
    for f, (flag, ours) in want.items():
        given = getattr(moe, f)
        if given is not None and given != ours:
            raise MeshplanError(f"{flag} {given}: model {cfg.name} has {ours if ours else 'none'} "
                                "(the architecture comes from --model; write a config.json to change it)", field=flag)
    if moe.moe_layer_freq is not None:
        ours_pattern = [int(cfg.is_moe_layer(i)) for i in range(layers)]
        if layer_pattern(moe.moe_layer_freq, layers) != ours_pattern:
            raise MeshplanError(f"--moe-layer-freq {moe.moe_layer_freq}: model {cfg.name}'s MoE "
                                f"layers are {ours_pattern}", field="--moe-layer-freq")
    _check_balancing(moe, cfg)
    dispatcher = _value(moe.moe_token_dispatcher_type)
    if dispatcher not in (None, "alltoall"):
        raise MeshplanError(f"--moe-token-dispatcher-type {dispatcher}: meshplan costs the alltoall "
                            "dispatcher (all_to_all over the ep group) only", field="--moe-token-dispatcher-type")
    if not moe.moe_grouped_gemm:
        return ["the Megatron-LM MoE arguments lack --moe-grouped-gemm (one GEMM per local "
                "expert); meshplan costs grouped expert GEMMs"]
    return []


def _check_balancing(moe: MegatronMoE, cfg: Any) -> None:
    """``--moe-router-load-balancing-type`` / ``--moe-aux-loss-coeff`` against the model's
    ``router_aux_loss_coef`` (none: a model without one)."""
    ours = float(getattr(cfg, "router_aux_loss_coef", 0.0) or 0.0)
    kind = _value(moe.moe_router_load_balancing_type)
    if kind in ("seq_aux_loss", "sinkhorn"):
        raise MeshplanError(f"--moe-router-load-balancing-type {kind}: meshplan costs the aux_loss "
                            "router (or none)", field="--moe-router-load-balancing-type")
    if kind == "none" and ours > 0:
        raise MeshplanError(f"--moe-router-load-balancing-type none: model {cfg.name} has an aux "
                            f"loss of weight {ours:g}", field="--moe-router-load-balancing-type")
    coeff = moe.moe_aux_loss_coeff
    # the weight scales one loss term: only whether there is one changes the step's cost
    if coeff is not None and kind != "none" and (coeff > 0) != (ours > 0):
        raise MeshplanError(f"--moe-aux-loss-coeff {coeff:g}: model {cfg.name} has "
                            f"{'an aux loss' if ours > 0 else 'none'} (only whether the router has "
                            "one changes the cost, not its weight)", field="--moe-aux-loss-coeff")


__all__ = ["Balancing", "Dispatcher", "MegatronMoE", "check", "layer_pattern"]


def check_source(moe: MegatronMoE, source: Any) -> list[str]:
    """The Megatron-LM MoE arguments checked against the costed model (``source``: the
    Engine's model source; :func:`check`); their notes. Raises MeshplanError for a
    difference, or for such arguments beside a .pir program (it has no model config)."""
    if not moe.given():
        return []
    cfg = getattr(source, "config", None)
    if cfg is None:
        raise MeshplanError("the Megatron-LM MoE arguments describe a model config; a .pir program "
                            "is costed as written")
    return check(moe, cfg, source.num_layers)
