"""Capture a torch module as a Program: ``torch.export`` on meta tensors, then ATen -> ops.

``from_torch(module, example_inputs)`` exports the module (``torch.export.export``; the
example inputs are moved to the meta device when the module's parameters live there, so no
weight or activation memory is allocated), then walks the exported graph: every placeholder
becomes a ``builtin.parameter`` (parameters, named by their fully qualified name) or a
``pd_op.data`` (user inputs, buffers, constants), and every ATen call is translated by the
converter registered for it in :data:`completion.frontends.aten_ops.ATEN_CONVERTERS`. An ATen
op without a converter (or whose converter rejects its arguments) becomes an ``opaque`` op
with the recorded result shapes, and a ``warnings.warn`` names it: capture never fails on an
unknown op. Struct names come from ``nn_module_stack`` (``layers.0.mlp.up_proj``).

torch is optional: it is imported when ``from_torch`` is called; a clear ImportError says how
to install it when it is missing.
"""

from __future__ import annotations

import warnings
from typing import Any

from completion.errors import CompletionError
from completion.frontends.aten_ops import ATEN_CONVERTERS, Ctx, aten_key, dtype_name, opaque
from completion.ir import OpRole, Program, Value
from completion.models.builder import ProgramBuilder


class TorchCaptureError(CompletionError):
    """``torch.export`` could not trace the module (the message carries torch's reason)."""


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "from_torch needs PyTorch: install it with `pip install meshplan[torch]` "
            "(or `pip install torch`)"
        ) from e
    return torch


def _to_meta(torch: Any, module: Any, example_inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    params = list(module.parameters()) + list(module.buffers())
    if params and all(p.device.type == "meta" for p in params):
        return tuple(t.to("meta") if isinstance(t, torch.Tensor) else t for t in example_inputs)
    return example_inputs


def _struct_of(node: Any) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return str(path).replace("L['self'].", "").replace("L__self___", "")


def _placeholders(ctx: Ctx, ep: Any) -> None:
    """Parameters -> builtin.parameter, everything else -> pd_op.data (stop_gradient)."""
    kinds = {spec.arg.name: spec for spec in ep.graph_signature.input_specs if hasattr(spec.arg, "name")}
    for node in ep.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        spec = kinds.get(node.name)
        kind = spec.kind.name if spec is not None else "USER_INPUT"
        if not hasattr(val, "shape"):
            continue  # a non-tensor input (int, None): converters see its Python value
        shape, dt = [int(s) for s in val.shape], dtype_name(val.dtype)
        if kind == "PARAMETER":
            fqn = str(spec.target)
            struct, _, leaf = fqn.rpartition(".")
            ctx.env[node.name] = ctx.pb.param(struct, leaf, shape, dt)
        else:
            name = str(spec.target) if kind in ("BUFFER", "CONSTANT_TENSOR") and spec.target else node.name
            ctx.env[node.name] = ctx.pb.data(name, shape, dt, persistable=kind != "USER_INPUT")


def _convert_call(ctx: Ctx, node: Any) -> None:
    ctx.struct = _struct_of(node)
    key = aten_key(node.target)
    conv = ATEN_CONVERTERS.get(key)
    if conv is not None:
        n_ops = len(ctx.pb.program.ops)
        try:
            ctx.env[node.name] = conv(ctx, node)
            return
        except (CompletionError, TypeError, IndexError) as e:
            # roll back a partial translation, then record the op opaquely
            for op in list(reversed(ctx.pb.program.ops[n_ops:])):
                ctx.pb.program.remove(op)
            warnings.warn(f"from_torch: {key} at {node.name!r} could not be converted ({e}); "
                          "recorded as an opaque op", stacklevel=4)
    else:
        warnings.warn(f"from_torch: no converter for {key} ({node.name!r}); recorded as an opaque op "
                      "with its shapes", stacklevel=4)
    ctx.env[node.name] = opaque(ctx, node, key)


def _outputs(ctx: Ctx, node: Any) -> None:
    outs = node.args[0]
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    values = [ctx.value(o) for o in outs if getattr(o, "name", None) in ctx.env]
    values = [v for v in values if isinstance(v, Value)]
    single_loss = len(values) == 1 and values[0].ndim == 0
    for i, v in enumerate(values):
        name = "loss_0" if single_loss else f"output_{i}"
        role = OpRole.LOSS if single_loss else OpRole.FORWARD
        ctx.pb.op("shadow_output", [v], {"output_name": name}, "", role)


def from_torch(module: Any, example_inputs: tuple[Any, ...] | list[Any]) -> Program:
    """Capture ``module(*example_inputs)`` as a forward Program.

    Args:
        module: a ``torch.nn.Module``; build it under ``torch.device("meta")`` so that no
            weights are allocated (a module with real weights works too: export traces it
            with fake tensors).
        example_inputs: positional inputs (tensors of the intended shapes and dtypes).

    Returns the program: parameters named by their fully qualified names
    (``layers.0.mlp.up_proj.weight``), user inputs as ``pd_op.data`` named after the
    forward arguments, and one ``shadow_output`` per tensor output (``loss_0``, role LOSS,
    when the module returns a single scalar). ``program.num_parameters()`` equals
    ``sum(p.numel() for p in module.parameters())``.

    Raises ImportError when torch is missing, TorchCaptureError when torch.export cannot
    trace the module. Unknown ATen ops never raise: they become ``opaque`` ops and warn;
    an opaque op has no grad op, so gradients do not flow back through it.
    """
    torch = _import_torch()
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"from_torch expects a torch.nn.Module, got {type(module).__name__}")
    args = tuple(example_inputs)
    args = _to_meta(torch, module, args)
    try:
        ep = torch.export.export(module, args)
    except Exception as e:  # torch raises many types; report one with its reason
        raise TorchCaptureError(f"torch.export failed for {type(module).__name__}: {e}") from e
    ctx = Ctx(ProgramBuilder(dtype="float32"))
    _placeholders(ctx, ep)
    for node in ep.graph.nodes:
        if node.op == "call_function":
            _convert_call(ctx, node)
        elif node.op == "output":
            _outputs(ctx, node)
    ctx.pb.program.renumber()
    return ctx.pb.program
