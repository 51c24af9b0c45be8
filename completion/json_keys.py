"""A ``json.loads`` hook that refuses an object naming one key twice: JSON parsers keep the
last value in silence (``{"dp": 1, "dp": 2}`` ran dp 2), so a plan file or a config.json
edited by hand could say two things and mean one."""

from __future__ import annotations

from typing import Any

from completion.errors import CompletionError


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for ``json.loads``: the object as a dict; raises ValueError
    naming the first key given twice."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise CompletionError(f"key {k!r} appears twice in one object")
        out[k] = v
    return out
