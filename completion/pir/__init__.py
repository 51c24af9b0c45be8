"""PIR text front end: :func:`parse_program` and :func:`print_program` (see
:mod:`completion.pir.parse` and :mod:`completion.pir.printer` for the format)."""

from __future__ import annotations

from completion.pir.lex import PirParseError
from completion.pir.parse import parse_program
from completion.pir.printer import format_op, print_program

__all__ = ["PirParseError", "format_op", "parse_program", "print_program"]
