"""The one-layer template program the tuner's annotations are written against, shared by
the scorer (:mod:`meshplan.tuning`) and the cheap bound (:mod:`meshplan.bounds.tier0`)."""

from __future__ import annotations

import functools

from completion.ir import Program
from completion.models import build_model
from tuner.patterns import find_patterns


@functools.lru_cache(maxsize=8)
def template_program(model: str, seq_len: int) -> tuple[Program, tuple]:
    """The one-layer program annotations are written against (batch 2, so the batch dim of
    every data input is told apart from size-1 dims) and its patterns."""
    prog = build_model(model, 2, seq_len, num_layers=1)
    return prog, tuple(find_patterns(prog))


__all__ = ["template_program"]
