"""Error bands: how far a prediction may be from the step time a run would measure.

A step time predicted for a plan carries the error the model makes on comparable measured
runs: the residual table ``simulator/data/residuals.csv`` (written by ``python -m
experiments.residuals`` from the rows of ``measured_runs`` that no constant was fitted on:
measured step time / predicted step time, with each row's framework, GPUs, hidden size and
whether it is a mixture of experts) is read once, and a plan's band is the empirical
``(1 - coverage) / 2`` and ``(1 + coverage) / 2`` quantiles of the ratios of the rows in its
regime, applied to its prediction: ``[t * q_lo, t * q_hi]`` (seconds). No distribution is
assumed; with the default coverage of 0.8 one comparable run in ten measured below the band
and one in ten above it.

Regime (:class:`Regime`): the framework family (the profile's ``family``: Megatron, FSDP,
DeepSpeed, eager; :func:`family`), dense or mixture of experts, the scale (:data:`SCALES`: one node, up to 128 GPUs,
more) and the kernel size (:data:`SIZES`: hidden size below 4,096 or not). The band uses the
rows of the narrowest of these groupings that holds at least :data:`MIN_ROWS` rows: family,
experts, scale and size; then family, experts and scale; family and experts; experts; all
rows (:func:`band`); it says which (``Band.basis``) and how many rows (``Band.n``).

Two plans are statistically tied when their bands overlap (:func:`tied`): ``meshplan
compare`` marks every plan tied with the fastest; the tuner can call :func:`band_of` and
:func:`tied` on its best plans the same way. The bands of plans of one regime share their
width, so they overlap when the slower prediction is within ``q_hi / q_lo`` of the faster:
the model's errors on comparable runs are correlated, so this reads "the model cannot tell
them apart", not "they measure the same".
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from simulator.errors import SimulatorError

RESIDUALS = Path(__file__).resolve().parent / "data" / "residuals.csv"
#: (upper bound on GPUs, name) of the scale classes
SCALES: tuple[tuple[float, str], ...] = ((8, "node"), (128, "pod"), (math.inf, "scale"))
#: (upper bound on the hidden size, exclusive, name) of the kernel-size classes
SIZES: tuple[tuple[float, str], ...] = ((4096, "small"), (math.inf, "large"))
#: fewest comparable rows a band is read from
MIN_ROWS = 5
#: default share of comparable runs inside the band
COVERAGE = 0.8


def family(framework: str) -> str:
    """The framework family of profile ``framework`` (its ``family`` field,
    ``simulator/profiles/catalog``); a name that is no profile is a family of its own."""
    from completion.choices import FRAMEWORKS
    from simulator.profiles import load_profile

    return load_profile(framework).family.value if framework in FRAMEWORKS else framework


class ErrorBandError(SimulatorError):
    """A bad coverage, or a residual table that cannot be read."""


def _bucket(x: float, table: tuple[tuple[float, str], ...]) -> str:
    return next(name for bound, name in table if x <= bound or (bound is math.inf))


@dataclass(frozen=True)
class Regime:
    """What makes measured runs comparable: framework family, mixture of experts or not,
    scale class (GPUs) and kernel-size class (hidden size)."""

    family: str
    moe: bool
    scale: str
    size: str

    @classmethod
    def of(cls, framework: str, gpus: int, hidden: int | None, moe: bool = False) -> Regime:
        """The regime of a plan: ``framework`` (a profile name; unknown ones are their own
        family), ``gpus`` it runs on, the model's ``hidden`` size (None: a program without
        a config, taken as large)."""
        size = "large" if hidden is None else ("small" if hidden < SIZES[0][0] else "large")
        return cls(family(framework), bool(moe), _bucket(gpus, SCALES), size)


@dataclass(frozen=True)
class Band:
    """Multiplicative band of a prediction: measured / predicted between ``low`` and
    ``high`` for ``coverage`` of the ``n`` comparable runs (``basis``: the grouping they
    were taken from)."""

    low: float
    high: float
    coverage: float
    n: int
    basis: str

    def interval(self, seconds: float) -> tuple[float, float]:
        """(low, high) seconds of a prediction of ``seconds``."""
        return seconds * self.low, seconds * self.high

    def to_dict(self, seconds: float) -> dict[str, Any]:
        """The band of a prediction of ``seconds`` as plain data (ms)."""
        lo, hi = self.interval(seconds)
        return {"low_ms": lo * 1e3, "high_ms": hi * 1e3, "coverage": self.coverage,
                "comparable_runs": self.n, "basis": self.basis}


@lru_cache(maxsize=4)
def load_residuals(path: str | None = None) -> tuple[tuple[Regime, float], ...]:
    """(regime, measured / predicted) of every row of the residual table at ``path``
    (default :data:`RESIDUALS`). Raises ErrorBandError naming a missing file or column."""
    p = Path(path) if path else RESIDUALS
    try:
        with p.open(newline="") as f:
            rows = list(csv.DictReader(f))
        return tuple((Regime.of(r["framework"], int(r["gpus"]), int(r["hidden"]), r["moe"] == "True"),
                      float(r["measured_s"]) / float(r["predicted_s"])) for r in rows)
    except FileNotFoundError:
        raise ErrorBandError(f"residual table {p} is missing: run python -m experiments.residuals") from None
    except (KeyError, ValueError) as e:
        raise ErrorBandError(f"residual table {p}: bad or missing column ({e})") from None


def _quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated empirical quantile (numpy's default method) of sorted ``xs``."""
    pos = q * (len(xs) - 1)
    i = int(math.floor(pos))
    return xs[i] if i + 1 >= len(xs) else xs[i] + (pos - i) * (xs[i + 1] - xs[i])


GROUPINGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("family, experts, scale, size", ("family", "moe", "scale", "size")),
    ("family, experts, scale", ("family", "moe", "scale")),
    ("family, experts", ("family", "moe")),
    ("experts", ("moe",)),
    ("all runs", ()),
)
"""Groupings tried narrowest first: (name, the Regime fields that must match)."""


def band(regime: Regime, coverage: float = COVERAGE,
         residuals: Iterable[tuple[Regime, float]] | None = None) -> Band:
    """The band of a plan in ``regime``: the quantiles of measured / predicted over the rows
    of the narrowest grouping (:data:`GROUPINGS`) with at least :data:`MIN_ROWS` rows.
    Raises ErrorBandError for a coverage outside (0, 1) or an empty table."""
    if not 0.0 < coverage < 1.0:
        raise ErrorBandError(f"coverage must be in (0, 1), got {coverage!r}")
    rows = list(load_residuals() if residuals is None else residuals)
    if not rows:
        raise ErrorBandError("the residual table has no rows")
    for name, keys in GROUPINGS:
        xs = sorted(r for g, r in rows if all(getattr(g, k) == getattr(regime, k) for k in keys))
        if len(xs) >= MIN_ROWS or not keys:
            lo, hi = (1 - coverage) / 2, (1 + coverage) / 2
            return Band(_quantile(xs, lo), _quantile(xs, hi), coverage, len(xs), name)
    raise AssertionError("unreachable: the last grouping takes every row")


def band_of(engine: Any, coverage: float = COVERAGE) -> Band:
    """The band of a plan an ``meshplan.Engine`` costs: its framework, GPUs, hidden size and
    whether the model has experts (:class:`Regime`)."""
    cfg = getattr(engine.source, "config", None)
    s = engine.strategy
    regime = Regime.of(s.framework, s.world_size, getattr(cfg, "hidden_size", None),
                       bool(getattr(cfg, "num_experts", None)))
    return band(regime, coverage)


def tied(a: tuple[float, Band], b: tuple[float, Band]) -> bool:
    """Whether two predictions ``(seconds, band)`` are statistically tied: their intervals
    overlap."""
    (ta, ba), (tb, bb) = a, b
    lo_a, hi_a = ba.interval(ta)
    lo_b, hi_b = bb.interval(tb)
    return lo_a <= hi_b and lo_b <= hi_a
