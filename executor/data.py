"""Deterministic global values (parameters, inputs) from one seed, and their local blocks.

Every rank generates the *global* value of a parameter or input from ``(seed, name,
global shape)`` alone and keeps the block its layout assigns it, so a distributed run and
a single-process run start from identical numbers. Rules:

- parameters: 2-D weights ~ N(0, 1/sqrt(rows)) (embeddings, named ``embed*``, ~ N(0, 1));
  a grouped expert weight laid out ``[g, E / g, in, out]`` (``ModelConfig.expert_grid``) is
  the ``[E, in, out]`` one reshaped, as its one-process reference holds it;
  1-D parameters named ``*norm*`` ~ 1 + 0.1 N(0, 1), other 1-D (biases) ~ 0.1 N(0, 1);
- inputs (``data`` ops without ``init_value``): integer ids uniform in [0, bound) where the
  bound is the vocabulary / class count the consumer implies (embedding rows,
  cross-entropy classes); ``position_ids`` the positions 0..s-1; ``rotary_emb.sin/cos`` the
  RoFormer tables (``executor.kernels.attention.rope_tables``); anything else ~ N(0, 1);
- a learning-rate ``data`` without ``init_value`` gets :data:`DEFAULT_LR`.

Inputs with a batch dim (dim 0 equal to the micro-batch size) are generated for the whole
step (``num_microbatches`` times as many rows) and micro-batch k takes rows
``[k b, (k+1) b)``, so splitting a global batch into micro-batches never changes the data.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np
import torch

from completion.ir import Value
from completion.reshard import Layout
from executor.errors import ExecutorError
from executor.kernels import torch_dtype
from executor.kernels.attention import rope_tables

DEFAULT_LR = 0.1
_INT = ("int64", "int32")


def _rng(seed: int, name: str) -> np.random.Generator:
    h = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:8], "little"))


def parameter_value(seed: int, name: str, shape: Sequence[int], dtype: str) -> torch.Tensor:
    """The global initial value of parameter ``name`` (module docstring)."""
    rng = _rng(seed, name)
    shape = tuple(int(s) for s in shape)
    if len(shape) == 4 and ".experts." in name:  # [g, E / g, in, out]: drawn as [E, in, out]
        return parameter_value(seed, name, (shape[0] * shape[1], *shape[2:]), dtype).reshape(shape)
    z = rng.standard_normal(shape)
    if len(shape) >= 2:
        std = 1.0 if "embed" in name else 1.0 / math.sqrt(max(shape[0], 1))
        arr = z * std
    elif "norm" in name:
        arr = 1.0 + 0.1 * z
    else:
        arr = 0.1 * z
    return torch.from_numpy(arr).to(torch_dtype(dtype))


def int_bound(v: Value) -> int:
    """Exclusive upper bound for integer input ``v`` from its consumers (embedding rows,
    cross-entropy classes); 2 when no consumer says."""
    for op, i in v.uses:
        if op.type == "embedding" and i == 0 and op.operands[1] is not None:
            return int(op.operands[1].shape[0])
        if op.type == "cross_entropy_with_softmax" and i == 1 and op.operands[0] is not None:
            x = op.operands[0]
            ax = int(op.attrs.get("axis", -1))
            return int(x.shape[ax])
    return 2


def input_value(seed: int, v: Value, shape: Sequence[int]) -> torch.Tensor:
    """The global value of input ``v`` with (step) shape ``shape``."""
    name = v.name or f"%{v.id}"
    shape = tuple(int(s) for s in shape)
    dt = torch_dtype(v.dtype)
    if name.startswith("rotary_emb.") and len(shape) == 4:
        sin, cos = rope_tables(shape[1], shape[3], _rope_base(v), _rope_every_two(v), dtype=dt)
        return sin if name.endswith("sin") else cos
    if name == "position_ids":
        return torch.arange(shape[-1]).expand(shape).to(dt).contiguous()
    rng = _rng(seed, name)
    if v.dtype in _INT:
        return torch.from_numpy(rng.integers(0, int_bound(v), size=shape)).to(dt)
    return torch.from_numpy(rng.standard_normal(shape)).to(dt)


def _rope_attrs(v: Value) -> dict:
    for op, _ in v.uses:
        if op.type == "fused_rotary_position_embedding":
            return op.attrs
    return {}


def _rope_base(v: Value) -> float:
    return float(_rope_attrs(v).get("rotary_emb_base", 10000.0))


def _rope_every_two(v: Value) -> bool:
    return bool(_rope_attrs(v).get("use_neox_rotary_style", True))


def is_batch_input(v: Value, batch: int) -> bool:
    """True for a per-micro-batch input: a non-persistable data value whose dim 0 is the
    micro-batch size (rotary tables excepted)."""
    name = v.name or ""
    return (not v.persistable and v.ndim > 0 and int(v.shape[0]) == batch
            and not name.startswith("rotary_emb."))


def local_block(glob: torch.Tensor, layout: Layout | None, rank: int) -> torch.Tensor:
    """The block of ``glob`` that ``rank`` holds under ``layout`` (all of it when None or the
    rank is outside the mesh). Partial layouts are refused (inputs and parameters are
    never partial)."""
    if layout is None or rank not in layout.mesh.process_ids or glob.ndim == 0:
        return glob.clone()
    if any(type(p).__name__ == "Partial" for p in layout.placements):
        raise ExecutorError(f"cannot initialise a block of a Partial layout {layout}")
    idx = tuple(slice(a, b) for a, b in layout.index_range(tuple(glob.shape), rank))
    return glob[idx].clone().contiguous()
