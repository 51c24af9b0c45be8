"""Bounded nesting for every text meshplan parses: JSON (plans, Hugging Face configs,
DeepSpeed configs), TOML (torchtitan job configs) and PIR attribute values. A document
nested hundreds of levels deep exhausted Python's recursion limit inside ``json``,
``tomllib`` or the PIR parser (a RecursionError traceback); its depth is now measured
without recursion first, and anything deeper than :data:`MAX_NESTING` is refused with a
clean error naming the source. Real inputs nest a handful of levels (a DeepSpeed config 3,
a torchtitan TOML 3, a PIR dist attr 4)."""

from __future__ import annotations

import re

#: the deepest nesting of lists / mappings an input may have
MAX_NESTING = 32

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
#: TOML strings (multi-line first) and comments; what is left holds the brackets that nest
_TOML_SKIP = re.compile(r'"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*',
                        re.S)
_NON_BRACKET = re.compile(r"[^\[\]{}]+")


def _depth(brackets: str) -> int:
    depth = worst = 0
    for ch in brackets:
        if ch in "[{":
            depth += 1
            worst = max(worst, depth)
        else:
            depth -= 1
    return worst


def json_depth(text: str) -> int:
    """Deepest nesting of ``[`` / ``{`` in JSON ``text`` outside strings (no recursion)."""
    return _depth(_NON_BRACKET.sub("", _JSON_STRING.sub("", text)))


def toml_depth(text: str) -> int:
    """Deepest nesting of arrays and inline tables in TOML ``text`` outside strings and
    comments (no recursion; a ``[table]`` header counts 1, ``[[array.of.tables]]`` 2)."""
    return _depth(_NON_BRACKET.sub("", _TOML_SKIP.sub("", text)))


def too_deep(depth: int, what: str, limit: int = MAX_NESTING) -> str | None:
    """The message for ``what`` nested ``depth`` levels when that exceeds ``limit``, else
    None (the caller raises its own error type with it)."""
    if depth <= limit:
        return None
    return (f"{what} is nested {depth} levels deep; at most {limit} are read "
            f"(completion.nesting.MAX_NESTING)")
