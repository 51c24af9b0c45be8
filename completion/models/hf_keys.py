"""Readers of single ``config.json`` values, shared by :mod:`completion.models.hf_config`
and the architecture readers of :mod:`completion.models.hf_frontier`: each raises
ModelConfigError naming the file and key of a missing or bad value."""

from __future__ import annotations

import math
from typing import Any

from completion.models.config import ModelConfigError


def get_key(raw: dict[str, Any], name: str, *keys: str, default: Any = None) -> Any:
    """The value of the first of ``keys`` present and not null; ``default`` when none is
    (absent without a default: an error naming the first key)."""
    for k in keys:
        if k in raw and raw[k] is not None:
            return raw[k]
    if default is None:
        raise ModelConfigError(f"{name}: missing key {keys[0]!r}")
    return default


def float_key(raw: dict[str, Any], name: str, keys: tuple[str, ...], default: float) -> float:
    """The first of ``keys`` present as a finite number > 0 (else ``default``)."""
    v = get_key(raw, name, *keys, default=default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ModelConfigError(f"{name}: {keys[0]!r} must be a finite number > 0, got {v!r}")
    return float(v)


def bool_key(raw: dict[str, Any], name: str, key: str, default: bool) -> bool:
    v = raw.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):  # bool("false") is True: refuse strings and numbers
        raise ModelConfigError(f"{name}: {key!r} must be true or false, got {v!r}")
    return v


def int_key(raw: dict[str, Any], name: str, key: str, lo: int, default: int | None = None) -> int:
    """``raw[key]`` as an int >= ``lo`` (``default`` when absent; absent without a default
    is an error naming the key)."""
    v = raw.get(key)
    if v is None:
        if default is None:
            raise ModelConfigError(f"{name}: missing key {key!r}")
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ModelConfigError(f"{name}: {key!r} must be an int >= {lo}, got {v!r}")
    return v
