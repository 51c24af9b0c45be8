"""Readers of one cell of ``shared/data/measured_runs.csv`` (and the rows files of
``experiments.measured_rows.EXTRA_CSVS``): numbers that may carry words
(``"8192 (config default, not stated in table)"``), the vocabulary, the ZeRO stage,
recompute, precision and FP8 recipe, framework profile and attention kernel of a row's
cells. Each raises :class:`RowError` naming the column of a cell it cannot read
(``experiments.measured_rows.parse_row`` turns it into a refusal); :class:`Notes`
collects what a reader assumed or approximated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from experiments.base import ExperimentError

Row = Mapping[str, str]


class RowError(ExperimentError):
    """A cell that cannot be read; ``field`` names the column (caught by :func:`parse_row`,
    which turns it into a :class:`Refused`)."""

    def __init__(self, field_name: str, message: str) -> None:
        """``message`` about column ``field_name``."""
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


def cell(row: Row, name: str) -> str:
    """The stripped text of column ``name`` ("" when absent or NaN)."""
    v = row.get(name)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return str(v).strip()


def leading_int(text: str, name: str) -> int:
    """The integer a cell starts with (``"8192 (config default)"`` -> 8192); RowError
    naming column ``name`` when it starts with none."""
    m = re.match(r"\s*(\d+)(?:\.0+)?\b", text)
    if not m:
        raise RowError(name, f"no number in {text!r}")
    return int(m.group(1))


def int_of(row: Row, name: str) -> int:
    """:func:`leading_int` of column ``name``."""
    return leading_int(cell(row, name), name)


def float_of(row: Row, name: str) -> float | None:
    """Column ``name`` as a float (None when empty); RowError when it is not a number."""
    text = cell(row, name)
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise RowError(name, f"not a number: {text!r}") from None


def not_stated(text: str) -> bool:
    """True when a cell says its value was not given by the source (measured_runs.md:
    "assumed", "not stated", a config "default")."""
    t = text.lower()
    return "not stated" in t or "assumed" in t or "default" in t


def read_vocab(text: str) -> tuple[int, str | None]:
    """The vocabulary size of a ``vocab_size`` cell: the padded size when the cell gives one
    (``"GPT2BPE 50257 padded to 50688 (128*TP4)"`` -> 50688), else its first number.
    Returns (size, a note when the cell was more than a number). Raises RowError."""
    m = re.search(r"padded to\s+(\d+)", text)
    if m:
        return int(m.group(1)), f"vocab_size {m.group(1)}: the padded size of {text!r}"
    m = re.search(r"\d+", text)
    if not m:
        raise RowError("vocab_size", f"no number in {text!r}")
    return int(m.group(0)), None


@dataclass
class Notes:
    """The approximations and assumptions collected while parsing one row."""

    approximations: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)


def float_text(text: str, name: str) -> float:
    """A cell as a float; RowError naming column ``name`` when it is not a number."""
    try:
        return float(text)
    except ValueError:
        raise RowError(name, f"not a number: {text!r}") from None


def zero_stage(text: str) -> int:
    """ZeRO stage of a ``zero_fsdp`` cell: FSDP FULL_SHARD / FSDP2 -> 3, SHARD_GRAD_OP -> 2,
    Megatron distributed optimizer -> 1, plain DP -> 0."""
    t = text.lower()
    if "shard_grad_op" in t:
        return 2
    if "full_shard" in t or "fsdp2" in t or "zero-3" in t:
        return 3
    if "distributed optimizer" in t or "distributed_fused_adam" in t:
        return 1
    if t.startswith("none") or "plain dp" in t:
        return 0
    raise RowError("zero_fsdp", f"unknown sharding {text!r}")


def recompute_mode(text: str) -> str:
    """none / selective / selective-op / full from an ``activation_recompute`` cell
    (torchtitan's "op-level SAC" is ``selective-op``)."""
    t = text.lower()
    if t.startswith("selective") and ("op-level" in t or "sac" in t):
        return "selective-op"
    for name in ("none", "selective", "full"):
        if t.startswith(name):
            return name
    raise RowError("activation_recompute", f"unknown recompute {text!r}")


#: FP8 ``precision`` cells (lower case; first match wins) -> (the FP8 recipe of
#: ``completion.strategy.FP8_RECIPES``, a note when the cell leaves the recipe implicit):
#: Megatron-Bridge's "FP8-CS" (Transformer Engine current scaling; no recipe of its own here,
#: see the note); NeMo's "FP8 hybrid (Transformer Engine, delayed scaling)"; Composer's ``amp_fp8``
#: (composer 0.2x ``core/precision.py``: ``te.fp8_autocast`` with a ``DelayedScaling``
#: recipe, hybrid format); torchtitan's torchao Float8 (dynamic tensorwise scaling, the
#: default ``Float8LinearConfig`` of torchao in December 2024, and the only recipe
#: torchtitan 9dec370 ``float8.py`` configured)
FP8_PRECISIONS: tuple[tuple[str, str, str | None], ...] = (
    ("current scaling", "te-delayed", "approximation: Transformer Engine FP8 current scaling "
     "(Float8CurrentScaling, per-tensor scale from this step's amax) modelled as delayed "
     "scaling (te-delayed): the extra amax pass over each cast tensor is not costed"),
    ("transformer engine", "te-delayed", None),
    ("amp_fp8", "te-delayed", "amp_fp8: Composer runs Transformer Engine fp8_autocast with "
     "DelayedScaling (te-delayed)"),
    ("tensorwise", "tensorwise", None),
    ("torchao", "tensorwise", "torchao Float8 recipe not stated: dynamic tensorwise (torchao's "
     "default in torchtitan 9dec370)"),
)


def read_precision(text: str, notes: Notes) -> tuple[str, str | None]:
    """(dtype, FP8 recipe or None) of a ``precision`` cell: bfloat16 / float16, and for FP8
    rows bfloat16 with the recipe of :data:`FP8_PRECISIONS`."""
    t = text.lower()
    if "fp8" in t:
        for needle, recipe, note in FP8_PRECISIONS:
            if needle in t:
                if note and note.startswith("approximation: "):
                    notes.approximations.append(note.removeprefix("approximation: "))
                elif note:
                    notes.assumptions.append(note)
                return "bfloat16", recipe
        raise RowError("precision", f"FP8 recipe not recognised in {text!r}")
    if "bf16" in t or "bfloat16" in t:
        return "bfloat16", None
    if "fp16" in t or "float16" in t:
        return "float16", None
    raise RowError("precision", f"unknown precision {text!r}")


def framework_profile(text: str) -> str:
    """The framework profile (``completion.strategy.FRAMEWORKS``) of a ``framework`` cell."""
    t = text.lower()
    if "megatron" in t and "2021" in t:
        return "megatron-2021"
    if "megatron-bridge" in t:
        return "megatron-bridge"
    if t.startswith("nemo"):  # NeMo 24.x: Apex DistributedFusedAdam, bf16 gradient buffer
        return "nemo"
    if "megatron-core" in t or "mcore" in t:
        return "megatron-core"
    if t.startswith("torchtitan"):
        return "fsdp2"
    if "llm-foundry" in t or "composer" in t:
        return "llm-foundry"
    raise RowError("framework", f"no framework profile for {text!r}")


def attention_impl(text: str) -> str:
    """flash / unfused from an ``attention_impl`` cell."""
    t = text.lower()
    if "unfused" in t or "no flash" in t:
        return "unfused"
    if "flash" in t or "sdpa" in t:
        return "flash"
    raise RowError("attention_impl", f"unknown attention {text!r}")
