"""PIR text front end: :func:`parse_program` and :func:`print_program` (see
:mod:`completion.pir_parse` and :mod:`completion.pir_print` for the format)."""

from __future__ import annotations

from completion.pir_lex import PirParseError
from completion.pir_parse import parse_program
from completion.pir_print import format_op, print_program

__all__ = ["PirParseError", "format_op", "parse_program", "print_program"]
