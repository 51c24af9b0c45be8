"""completion: program IR, process meshes, dist attrs, SPMD rules, Completer, partition and
reshard passes. Knows nothing about time or hardware (see docs/design.md)."""

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
