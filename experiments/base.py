"""Experiment registry: name -> function(quick, out_dir) -> ExperimentResult.

An experiment is one module under ``experiments/`` whose function is decorated with
``@register_experiment(name, title)``. The module is registered by being listed in
``experiments.EXPERIMENT_MODULES``; a module that is not listed is never run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from completion.errors import MeshplanError


class ExperimentError(MeshplanError):
    """An experiment that cannot run (a missing prerequisite, an unknown name) or that
    failed; the message names the experiment and what is missing."""


@dataclass
class ExperimentResult:
    """What one experiment produced.

    Attributes:
        name: registry name (file stem of the CSV/Markdown outputs).
        title: one-line heading for reports.
        table: the result DataFrame (written as ``<name>.csv`` and ``<name>.md``).
        description: what was computed and how (method, inputs, sources), Markdown.
        notes: short findings (one line each), e.g. the largest error.
        figures: PNG files the experiment wrote into its ``out_dir``.
        float_format: format of float cells in Markdown and printed tables.
    """

    name: str
    title: str
    table: pd.DataFrame
    description: str = ""
    notes: list[str] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    float_format: str = ".4f"


ExperimentFn = Callable[[bool, Path], ExperimentResult]


@dataclass(frozen=True)
class Experiment:
    """A registered experiment: ``fn(quick, out_dir)`` returns an ExperimentResult."""

    name: str
    title: str
    fn: ExperimentFn


EXPERIMENTS: dict[str, Experiment] = {}


def register_experiment(name: str, title: str) -> Callable[[ExperimentFn], ExperimentFn]:
    """Decorator adding ``fn(quick: bool, out_dir: Path) -> ExperimentResult`` to
    ``EXPERIMENTS`` under ``name``. Raises ExperimentError on a duplicate name."""

    def deco(fn: ExperimentFn) -> ExperimentFn:
        if name in EXPERIMENTS and EXPERIMENTS[name].fn is not fn:
            raise ExperimentError(f"experiment {name!r} is registered twice")
        EXPERIMENTS[name] = Experiment(name, title, fn)
        return fn

    return deco


def require(experiment: str, module: str, attr: str | None = None, issue: str = "") -> Any:
    """Import ``module`` (and return ``module.attr`` when given) for ``experiment``.

    Raises:
        ExperimentError: naming the experiment, the missing module/attribute and the issue
            that delivers it, instead of a bare ImportError deep in the experiment.
    """
    where = f" (delivered by {issue})" if issue else ""
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ExperimentError(
            f"experiment {experiment!r} needs module {module}{where}, which cannot be imported: {e}"
        ) from e
    if attr is None:
        return mod
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise ExperimentError(
            f"experiment {experiment!r} needs {module}.{attr}{where}, which does not exist yet"
        ) from None


def agg_pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (experiments only write PNGs,
    and may run on machines without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Lay out ``fig``, write it as a PNG to ``path`` at ``dpi`` dots per inch and close it
    (so long experiment runs do not accumulate open figures); returns ``path``."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    agg_pyplot().close(fig)
    return path
