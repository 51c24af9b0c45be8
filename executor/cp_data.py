"""Inputs of a context-parallel plan program (``completion.context_parallel``).

The program of a cp plan holds ``dp * cp`` data-parallel replicas of ``seq_len / cp``-token
sequences; replica ``d * cp + c`` is cp rank c of data-parallel replica d. So that a run
computes what one process computes on the same data, every per-micro-batch input with a
sequence dim (token ids, labels, GPT position ids) is generated at the one-process shape
``[N, seq_len, ...]`` (the same values, :mod:`executor.data`) and folded
(:func:`fold_sequences`): micro-batch k's rows ``(d * cp + c) * mbs + j`` are the tokens
``rank_positions(seq_len, cp, c)`` of sequence ``k * dp * mbs + d * mbs + j``. Rotary tables
(no batch dim, shared by the replicas) are this rank's: the RoFormer tables at its cp rank's
positions (:func:`cp_input`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from completion.context_parallel import cp_group, rank_positions
from completion.ir import Value
from executor.data import input_value
from executor.errors import ExecutorError


class ContextParallelDataError(ExecutorError, ValueError):
    """An input of a cp program that cannot be folded; names it."""


def unfolded_shape(shape: Sequence[int], cp: int, name: str = "input") -> tuple[int, ...]:
    """The one-process shape of a folded input: ``[rows / cp, seq * cp, ...]``. Raises
    ContextParallelDataError when cp does not divide the rows or the input has no seq dim."""
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2 or shape[0] % cp:
        raise ContextParallelDataError(f"input {name!r} of shape {list(shape)}: a cp = {cp} program "
                                       f"needs [rows divisible by {cp}, seq, ...]")
    return (shape[0] // cp, shape[1] * cp, *shape[2:])


def fold_sequences(t: torch.Tensor, cp: int, mbs: int) -> torch.Tensor:
    """``t`` [N, S, ...] (N = micro-batches * dp * mbs sequences of S tokens, in one-process
    order) -> [N * cp, S / cp, ...] (module docstring). Raises ContextParallelDataError
    when mbs does not divide N or 2cp does not divide S."""
    n, s = int(t.shape[0]), int(t.shape[1])
    if n % mbs or s % (2 * cp):
        raise ContextParallelDataError(f"cannot fold {list(t.shape)} over cp = {cp} with "
                                       f"micro-batch size {mbs}")
    rest = tuple(t.shape[2:])
    blocks = n // mbs  # (micro-batch, data-parallel replica) pairs
    x = t.reshape(blocks, mbs, s, *rest)
    parts = [x[:, :, rank_positions(s, cp, c)] for c in range(cp)]  # each [blocks, mbs, s/cp, ...]
    return torch.stack(parts, dim=1).reshape(n * cp, s // cp, *rest).contiguous()


def cp_index(rank: int, cp: int, tp: int) -> int:
    """This rank's cp rank (0..cp-1) in the layout rank = (d * cp + c) * tp + t."""
    return cp_group(rank, cp, tp).index(rank)


def cp_input(seed: int, v: Value, shape: Sequence[int], batched: bool, rank: int, cp: int,
             mbs: int, tp: int) -> torch.Tensor:
    """The global (step) value of input ``v`` of a cp program as ``rank`` sees it (module
    docstring): a per-micro-batch input generated at its one-process shape and folded;
    a rotary table at this rank's positions; anything else as :func:`executor.data.input_value`.
    Raises ContextParallelDataError for a per-micro-batch input without a sequence dim."""
    name = v.name or f"%{v.id}"
    shape = tuple(int(x) for x in shape)
    if batched:
        return fold_sequences(input_value(seed, v, unfolded_shape(shape, cp, name)), cp, mbs)
    if name.startswith("rotary_emb.") and len(shape) == 4:
        seq = shape[1] * cp
        full = input_value(seed, v, (shape[0], seq, *shape[2:]))
        return full[:, rank_positions(seq, cp, cp_index(rank, cp, tp))].contiguous()
    return input_value(seed, v, shape)


__all__ = ["ContextParallelDataError", "cp_index", "cp_input", "fold_sequences", "unfolded_shape"]
