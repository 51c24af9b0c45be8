"""The simulator's small vocabularies, typed once: phases, kernel kinds and block keys.

They are ``Literal`` types, so the runtime values stay the plain strings (and ints) that
code compares with (``k.phase == "W"``, ``blk == "pre"``); a type checker catches a
misspelt one.
"""

from __future__ import annotations

from typing import Literal

from completion.ops.registry import KernelKind

#: The phase a kernel or a unit of work runs in: ``"F"`` forward, ``"B"`` the
#: input-gradient part of backward, ``"W"`` the weight-gradient part (Zero Bubble paper, Qi
#: et al. 2024, section 2), ``"O"`` the optimizer step.
Phase = Literal["F", "B", "W", "O"]

#: A block of a program (``simulator.blocks``): ``"pre"`` (before the first decoder layer:
#: embeddings), the decoder layer's index, or ``"post"`` (final norm, head, loss).
BlockKey = Literal["pre", "post"] | int

__all__ = ["BlockKey", "KernelKind", "Phase"]
