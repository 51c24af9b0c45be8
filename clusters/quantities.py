"""The ``{value, provenance}`` quantities of the cluster YAML (``clusters.spec``,
``clusters.goodput_spec``): every number carries where it comes from, is a YAML number
(never a string or a boolean) and, for a rate, size or latency, lies within a unit-slip
guard (a figure typed in the wrong unit is refused, naming the unit). Units: bytes,
bytes/second, FLOP/second, seconds.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_STRICT = ConfigDict(extra="forbid", frozen=True)


class Quantity(BaseModel):
    """A number (or flag) with its provenance: the base of every quantity below."""

    model_config = _STRICT
    provenance: str = Field(min_length=1)


def _yaml_float(text: str) -> str:
    """``text`` (a number with an exponent that YAML 1.1 left a string: ``1e9``, ``9.89e14``)
    spelled as YAML 1.1 reads a float: a dot in the mantissa, a signed exponent
    (``1.0e+9``, ``9.89e+14``)."""
    mantissa, _, exp = text.strip().lower().partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    if exp[:1] not in ("+", "-"):
        exp = "+" + exp
    return f"{mantissa}e{exp}"


def _yaml_number(v: Any) -> Any:
    """Refuse what pydantic would coerce to a number: a string (YAML 1.1 reads ``1e9``,
    without a dot, as the string "1e9"), a boolean (``true`` would count as 1), null."""
    if isinstance(v, bool):
        raise ValueError("must be a YAML number, not a boolean")
    if isinstance(v, str):
        try:
            float(v)
        except ValueError:
            raise ValueError("must be a YAML number, not a string") from None
        hint = (f"YAML 1.1 reads an exponent as a number only with a dot and a sign: write "
                f"{_yaml_float(v)}" if "e" in v.lower() and _yaml_float(v) != v.strip().lower()
                else "write the number without quotes")
        raise ValueError(f"must be a YAML number, not a string ({hint})")
    if not isinstance(v, (int, float)):
        raise ValueError(f"must be a YAML number, not {type(v).__name__}")
    return v


#: Smallest positive rate, size or efficiency a spec may give (a FLOP rate of 1e-6
#: FLOP/s, an efficiency of 1e-6): anything smaller is a typo, and would make step times
#: overflow a float (``1e-300`` as an efficiency gives times beyond 1e299 s).
MIN_POSITIVE = 1e-6
#: unit-slip guards (:class:`Bandwidth`, :class:`FlopRate`, :class:`ByteSize`,
#: :class:`Latency`): far below any real device, far above a figure typed in the wrong unit
#: (989 meant as TFLOP/s, 2.4 as TB/s). The FLOP-rate floor is 1 MFLOP/s: ``meshplan
#: calibrate`` measured a bf16 GEMM at 0.95 GFLOP/s on a loaded 2-core VM (CPUs without
#: bf16 units emulate it), a real rate a 1 GFLOP/s floor refused
MIN_BANDWIDTH = 1e6
MIN_FLOP_RATE = 1e6
MIN_MEMORY_BYTES = 2**20
MAX_LATENCY_S = 1.0
#: the other side of the guard: a thousand times today's fastest (HBM3e 4.8e12 B/s; FP8
#: dense 1.98e15 FLOP/s): a larger figure is a slip or a calibration from a broken trace
MAX_BANDWIDTH = 1e16
MAX_FLOP_RATE = 1e19
#: a thousand times today's largest device memory (H200: 141 GB), far below where a byte
#: count stops fitting an int64 column of tune's history (9.2e18)
MAX_MEMORY_BYTES = 2**50
#: ``efficiency.gemm_half_flops``: a GEMM's FLOPs at half its plateau; today's fits are
#: 1e9-1e11, and a 65536 x 65536 x 65536 GEMM is 5.6e14 FLOPs
MAX_HALF_FLOPS = 1e15


class _Number(Quantity):
    @field_validator("value", mode="before", check_fields=False)
    @classmethod
    def _strict(cls, v: Any) -> Any:
        return _yaml_number(v)

    #: unit-slip guard of a subclass (:class:`Bandwidth`, ...): the smallest and largest
    #: plausible value in its unit, and the message naming the unit and how to write it
    floor: ClassVar[float | None] = None
    ceiling: ClassVar[float | None] = None
    slip: ClassVar[str] = ""

    @field_validator("value", mode="after", check_fields=False)
    @classmethod
    def _not_tiny(cls, v: Any) -> Any:
        if not issubclass(cls, NonNegative) and 0 < v < MIN_POSITIVE:
            raise ValueError(f"must be at least {MIN_POSITIVE:g} (clusters.spec.MIN_POSITIVE)")
        if (cls.floor is not None and v < cls.floor) or (cls.ceiling is not None and v > cls.ceiling):
            raise ValueError(cls.slip)
        return v


class Positive(_Number):
    """A strictly positive float (a bandwidth, a FLOP rate, a size) with its provenance; a
    YAML number (int or float), never a string or a boolean; at least
    :data:`MIN_POSITIVE`."""

    value: float = Field(gt=0, allow_inf_nan=False)


class NonNegative(_Number):
    """A float >= 0 (a latency, an overhead in seconds) with its provenance; a YAML number."""

    value: float = Field(ge=0, allow_inf_nan=False)


class Fraction(_Number):
    """An efficiency factor in [:data:`MIN_POSITIVE`, 1] with its provenance; a YAML number."""

    value: float = Field(gt=0, le=1, allow_inf_nan=False)


class Bandwidth(Positive):
    """A bandwidth in bytes per second, at least :data:`MIN_BANDWIDTH` (1 MB/s): a smaller
    figure is a unit slip (``400`` meant as 400 Gb/s, ``2.4`` as 2.4 TB/s), which would
    otherwise cost every transfer a million times too long; at most :data:`MAX_BANDWIDTH`."""

    floor, ceiling = MIN_BANDWIDTH, MAX_BANDWIDTH
    slip = (f"is in bytes/s and must be between {MIN_BANDWIDTH:.0e} (1 MB/s) and {MAX_BANDWIDTH:.0e}: "
            f"write e.g. 50 GB/s as 5.0e+10")


class FlopRate(Positive):
    """A peak rate in FLOP/s, at least :data:`MIN_FLOP_RATE` (1 MFLOP/s): a smaller figure
    is a unit slip (``989`` meant as 989 TFLOP/s); at most :data:`MAX_FLOP_RATE`."""

    floor, ceiling = MIN_FLOP_RATE, MAX_FLOP_RATE
    slip = (f"is in FLOP/s and must be between {MIN_FLOP_RATE:.0e} (1 MFLOP/s) and {MAX_FLOP_RATE:.0e}: "
            f"write e.g. 989 TFLOP/s as 9.89e+14")


class ByteSize(Positive):
    """A memory size in bytes, at least :data:`MIN_MEMORY_BYTES` (1 MiB): a smaller figure
    is a unit slip (``80`` meant as 80 GiB); at most :data:`MAX_MEMORY_BYTES` (1 PiB)."""

    floor, ceiling = MIN_MEMORY_BYTES, MAX_MEMORY_BYTES
    slip = (f"is in bytes and must be between {MIN_MEMORY_BYTES} (1 MiB) and {MAX_MEMORY_BYTES:.3e} "
            f"(1 PiB): write e.g. 80 GiB as 8.589934592e+10")


class FlopCount(Positive):
    """The FLOPs of one GEMM at which it reaches half its plateau efficiency, at most
    :data:`MAX_HALF_FLOPS`: a larger one makes every GEMM of a model run at a vanishing
    fraction of the peak (1e300 gave a step of 1.5e300 ms)."""

    ceiling = MAX_HALF_FLOPS
    slip = (f"is a GEMM's FLOPs at half efficiency and must be at most {MAX_HALF_FLOPS:.0e} "
            f"(a 65536^3 GEMM is 5.6e14)")


class Latency(NonNegative):
    """A latency or overhead in seconds, at most :data:`MAX_LATENCY_S` (1 s): a larger
    figure is a unit slip (``3.4`` meant as 3.4 us)."""

    ceiling = MAX_LATENCY_S
    slip = f"is in seconds and must be at most {MAX_LATENCY_S:g}: write e.g. 3.4 us as 3.4e-06"


class Count(Quantity):
    """An integer >= 1 (devices, NICs, nodes) with its provenance; a YAML integer (not a
    string, a boolean or a float such as 8.0)."""

    value: int = Field(ge=1, strict=True)

    @field_validator("value", mode="before")
    @classmethod
    def _no_bool(cls, v: Any) -> Any:
        v = _yaml_number(v)
        if isinstance(v, float):
            raise ValueError("must be a YAML integer, not a float")
        return v


class CollectiveModel(Quantity):
    """Which collective cost model a node's library follows: ``nccl`` or ``alpha-beta``
    (``clusters.nccl.MODELS``), with its provenance."""

    value: Literal["nccl", "alpha-beta"]


class Flag(Quantity):
    """A yes/no fact with its provenance: a YAML boolean (``true``/``false``), never a
    string or a number."""

    value: bool = Field(strict=True)
