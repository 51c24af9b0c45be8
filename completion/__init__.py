"""completion: program IR, process meshes, dist attrs, SPMD rules, Completer, partition and
reshard passes. Knows nothing about time or hardware (see docs/design.md).

The package's names are imported lazily (PEP 562), so that ``completion.errors`` and
``completion.choices`` (no numpy, no pydantic) load alone: the CLI's ``--help`` imports them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from completion.annotate import annotate, shard_megatron
    from completion.backward import BackwardError, append_backward
    from completion.completer import Completer
    from completion.dist_attr import (
        OperatorDistAttr,
        Partial,
        Replicate,
        Shard,
        TensorDistAttr,
        local_shape,
        max_local_shape,
        shard_range,
    )
    from completion.errors import CompletionError, DistAttrError
    from completion.frontends import from_torch
    from completion.ir import Operation, OpRole, Program, Value
    from completion.mesh import ProcessMesh
    from completion.models import ModelConfig, build_mlp, build_model, get_model_config
    from completion.ops.registry import OpError, TensorType
    from completion.optimizer import OptimizerError, apply_optimizer
    from completion.passes.partition import apply_partition_pass
    from completion.passes.reshard import RankOp, apply_reshard_pass, rank_program
    from completion.pir import PirParseError, parse_program, print_program
    from completion.reshard import ReshardError, ReshardPlan, plan_reshard
    from completion.spmd import DistTensor, SpmdResult, get_spmd_rule

#: public name -> the module that defines it (imported on first use)
_LAZY = {
    "annotate": "completion.annotate",
    "shard_megatron": "completion.annotate",
    "BackwardError": "completion.backward",
    "append_backward": "completion.backward",
    "Completer": "completion.completer",
    "OperatorDistAttr": "completion.dist_attr",
    "Partial": "completion.dist_attr",
    "Replicate": "completion.dist_attr",
    "Shard": "completion.dist_attr",
    "TensorDistAttr": "completion.dist_attr",
    "local_shape": "completion.dist_attr",
    "max_local_shape": "completion.dist_attr",
    "shard_range": "completion.dist_attr",
    "CompletionError": "completion.errors",
    "DistAttrError": "completion.errors",
    "from_torch": "completion.frontends",
    "Operation": "completion.ir",
    "OpRole": "completion.ir",
    "Program": "completion.ir",
    "Value": "completion.ir",
    "ProcessMesh": "completion.mesh",
    "ModelConfig": "completion.models",
    "build_mlp": "completion.models",
    "build_model": "completion.models",
    "get_model_config": "completion.models",
    "OpError": "completion.ops.registry",
    "TensorType": "completion.ops.registry",
    "OptimizerError": "completion.optimizer",
    "apply_optimizer": "completion.optimizer",
    "apply_partition_pass": "completion.passes.partition",
    "RankOp": "completion.passes.reshard",
    "apply_reshard_pass": "completion.passes.reshard",
    "rank_program": "completion.passes.reshard",
    "PirParseError": "completion.pir",
    "parse_program": "completion.pir",
    "print_program": "completion.pir",
    "ReshardError": "completion.reshard",
    "ReshardPlan": "completion.reshard",
    "plan_reshard": "completion.reshard",
    "DistTensor": "completion.spmd",
    "SpmdResult": "completion.spmd",
    "get_spmd_rule": "completion.spmd",
}

__all__ = [
    "Completer",
    "DistTensor",
    "SpmdResult",
    "annotate",
    "get_spmd_rule",
    "shard_megatron",
    "RankOp",
    "ReshardError",
    "ReshardPlan",
    "apply_partition_pass",
    "apply_reshard_pass",
    "plan_reshard",
    "rank_program",
    "ModelConfig",
    "build_mlp",
    "build_model",
    "from_torch",
    "get_model_config",
    "CompletionError",
    "DistAttrError",
    "OperatorDistAttr",
    "Partial",
    "ProcessMesh",
    "Replicate",
    "Shard",
    "TensorDistAttr",
    "OpError",
    "OpRole",
    "Operation",
    "PirParseError",
    "Program",
    "TensorType",
    "Value",
    "BackwardError",
    "OptimizerError",
    "append_backward",
    "apply_optimizer",
    "parse_program",
    "print_program",
    "local_shape",
    "max_local_shape",
    "shard_range",
]


def __getattr__(name: str) -> Any:
    """``completion.Completer`` and friends, imported on first access (PEP 562)."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'completion' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(globals()))
