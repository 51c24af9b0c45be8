"""Formatting of experiment tables: Markdown (pipe tables) and cell text.

``DataFrame.to_markdown`` needs the optional ``tabulate`` package, which meshplan does not
depend on; this module writes GitHub pipe tables itself.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

import numpy as np
import pandas as pd

from experiments.base import ExperimentError

MISSING = "n/a"


def format_cell(value: Any, float_format: str = ".4f") -> str:
    """Text of one cell: NaN/None -> ``n/a``, bools -> yes/no, floats with
    ``float_format``, everything else ``str``; pipes are escaped for Markdown."""
    if value is None:
        return MISSING
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, Integral):
        return str(int(value))
    if isinstance(value, Real):
        if math.isnan(float(value)):
            return MISSING
        return format(float(value), float_format)
    if value is pd.NA or value is pd.NaT:
        return MISSING
    return str(value).replace("|", "\\|")


def _numeric(series: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)


def to_markdown(df: pd.DataFrame, float_format: str = ".4f") -> str:
    """A GitHub-flavoured Markdown pipe table of ``df`` (index dropped; numeric columns
    right-aligned). Returns the text without a trailing newline.

    Raises:
        ValueError: ``df`` has no columns.
    """
    if len(df.columns) == 0:
        raise ExperimentError("to_markdown: the DataFrame has no columns")
    header = [str(c).replace("|", "\\|") for c in df.columns]
    align = ["---:" if _numeric(df[c]) else "---" for c in df.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(format_cell(v, float_format) for v in row) + " |")
    return "\n".join(lines)
