"""Character cursor and attribute-value grammar for the PIR text form.

The grammar of an attribute value (what follows ``key:`` inside ``{...}``)::

    value := "(" TAG ")" bare | bare          TAG e.g. pd_op.DataType, Float, Int32
    bare  := STRING | NUMBER | "[" [value ("," value)*] "]" | "{" [item ("," item)*] "}"
           | ATOM                             ATOM: ident, optionally "(" balanced ")"
    item  := KEY ":" value | ATOM             KEY: ident, optionally "(" int ")"

Atoms ``true`` / ``false`` become bools; other atoms (``Place(cpu)``, ``partial(0,SUM)``,
``null``) become :class:`RawAttr` strings that print back unchanged. Every error is a
:class:`PirParseError` carrying the line and column and what was expected.
"""

from __future__ import annotations

import bisect
import re
from typing import Any

from completion.errors import CompletionError
from completion.nesting import MAX_NESTING

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*([eE][-+]?\d+)?|\.\d+([eE][-+]?\d+)?|inf|nan)")
_INT = re.compile(r"-?\d+")


class PirParseError(CompletionError):
    """Malformed PIR text. ``line`` and ``column`` are 1-based."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(f"line {line}, column {column}: {message}")
        self.line = line
        self.column = column


class RawAttr(str):
    """An attribute atom kept verbatim (``Place(cpu)``); prints without quotes."""


class Cursor:
    """A position in the program text with whitespace skipping and typed readers."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.nesting = 0  # lists / dicts open in the attribute value being read
        self.context = ""  # what is being read (an op and its line), for semantic errors
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]

    # -- positions and errors ----------------------------------------------------------
    def where(self, i: int | None = None) -> tuple[int, int]:
        i = self.i if i is None else i
        ln = bisect.bisect_right(self.starts, i) - 1
        return ln + 1, i - self.starts[ln] + 1

    def fail(self, expected: str, at: int | None = None) -> PirParseError:
        at = self.i if at is None else at
        line, col = self.where(at)
        rest = self.s[at:at + 20].split("\n", 1)[0]
        found = f"{rest!r}" if rest else ("end of line" if at < len(self.s) else "end of text")
        return PirParseError(f"expected {expected}, found {found}", line, col)

    def error(self, message: str, at: int | None = None) -> PirParseError:
        line, col = self.where(self.i if at is None else at)
        return PirParseError(message, line, col)

    # -- low-level readers -------------------------------------------------------------
    def ws(self) -> None:
        """Skip whitespace and ``//`` line comments (the summary lines ``meshplan complete``
        and ``program show`` print after a program, so their output reads back)."""
        s, i = self.s, self.i
        while i < len(s):
            if s[i] in " \t\r\n":
                i += 1
            elif s.startswith("//", i):
                nl = s.find("\n", i)
                i = len(s) if nl < 0 else nl + 1
            else:
                break
        self.i = i

    def at_end(self) -> bool:
        self.ws()
        return self.i >= len(self.s)

    def peek(self, lit: str) -> bool:
        self.ws()
        return self.s.startswith(lit, self.i)

    def eat(self, lit: str) -> bool:
        if self.peek(lit):
            self.i += len(lit)
            return True
        return False

    def expect(self, lit: str, what: str | None = None) -> None:
        if not self.eat(lit):
            raise self.fail(what or repr(lit))

    def regex(self, rx: re.Pattern[str], what: str) -> str:
        self.ws()
        m = rx.match(self.s, self.i)
        if not m:
            raise self.fail(what)
        self.i = m.end()
        return m.group(0)

    def ident(self, what: str = "an identifier") -> str:
        return self.regex(_IDENT, what)

    def integer(self, what: str = "an integer") -> int:
        return int(self.regex(_INT, what))

    def int_list(self, what: str = "a list of integers") -> list[int]:
        self.expect("[", what)
        out: list[int] = []
        if self.eat("]"):
            return out
        while True:
            out.append(self.integer(f"an integer in {what}"))
            if self.eat("]"):
                return out
            self.expect(",", f"',' or ']' in {what}")

    def string(self) -> str:
        self.ws()
        start = self.i
        if not self.s.startswith('"', start):
            raise self.fail("a string")
        i, out = start + 1, []
        while i < len(self.s):
            c = self.s[i]
            if c == "\\" and i + 1 < len(self.s):
                out.append({"n": "\n", "t": "\t"}.get(self.s[i + 1], self.s[i + 1]))
                i += 2
                continue
            if c == '"':
                self.i = i + 1
                return "".join(out)
            if c == "\n":
                break
            out.append(c)
            i += 1
        raise self.fail("a closing '\"'", start)

    def balanced(self, open_: str, close: str) -> str:
        """Text from an opening bracket to its matching close, inclusive."""
        self.ws()
        start, depth = self.i, 0
        for j in range(self.i, len(self.s)):
            c = self.s[j]
            if c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    self.i = j + 1
                    return self.s[start:self.i]
            elif c == "\n":
                break
        raise self.fail(f"a matching {close!r}", start)

    # -- attribute values --------------------------------------------------------------
    def value(self) -> tuple[Any, str | None]:
        """An attribute value and its type tag (None when untagged)."""
        tag = None
        if self.peek("("):
            self.i += 1
            tag = self.ident("a type tag such as (pd_op.DataType)")
            self.expect(")", "')' closing the type tag")
        return self.bare(tag), tag

    def bare(self, tag: str | None = None) -> Any:
        self.ws()
        c = self.s[self.i] if self.i < len(self.s) else ""
        if c == '"':
            return self.string()
        if c in "[{" and c:
            self.nesting += 1
            if self.nesting > MAX_NESTING:
                raise self.error(f"attribute value nested deeper than {MAX_NESTING} levels "
                                 f"(completion.nesting.MAX_NESTING)")
            try:
                return self._list() if c == "[" else self.dict_items()
            finally:
                self.nesting -= 1
        m = _NUMBER.match(self.s, self.i)
        if m and (c.isdigit() or c in "-+."):
            self.i = m.end()
            txt = m.group(0)
            if tag in ("Float", "Double"):
                return float(txt)
            return int(txt) if _INT.fullmatch(txt) else float(txt)
        return self.atom()

    def _list(self) -> list[Any]:
        """``[v, ...]`` (the cursor on its ``[``)."""
        self.i += 1
        items: list[Any] = []
        if self.eat("]"):
            return items
        while True:
            items.append(self.value()[0])
            if self.eat("]"):
                return items
            self.expect(",", "',' or ']' in a list")

    def atom(self) -> Any:
        name = self.ident("an attribute value")
        if name == "true":
            return True
        if name == "false":
            return False
        if self.s.startswith("(", self.i):
            name += self.balanced("(", ")")
        return RawAttr(name)

    def key(self) -> str:
        name = self.ident("an attribute name")
        if self.s.startswith("(", self.i):
            name += self.balanced("(", ")")
        return name

    def dict_items(self) -> dict[str, Any]:
        """``{k:v, atom, ...}``; an atom item maps to None under its own text. A key given
        twice is a PirParseError (never a silent overwrite)."""
        self.expect("{")
        out: dict[str, Any] = {}
        if self.eat("}"):
            return out
        while True:
            self.ws()
            start = self.i
            k = self.key()
            if k in out:
                pre = f"{self.context}: " if self.context else ""
                raise self.error(f"{pre}entry {k} is given twice in an attribute dict", start)
            if self.eat(":"):
                out[k] = self.value()[0]
            elif k in ("true", "false"):
                raise self.fail("an attribute name", start)
            else:
                out[k] = None
            if self.eat("}"):
                return out
            self.expect(",", "',' or '}' in an attribute dict")
