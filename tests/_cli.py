"""Helpers for tests of the ``meshplan`` CLI entry point (``meshplan.cli.main``)."""

from __future__ import annotations

from meshplan.cli import main
from meshplan.errors import MeshplanError


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``meshplan ARGV...`` in-process; returns (exit code, stdout, stderr)."""
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc: int, out: str, err: str) -> str:
    """Assert a bad-input failure: exit code 2, no traceback, exactly one ``error: ...`` line
    on stderr; returns that line."""
    assert rc == 2
    assert "Traceback" not in err + out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    return lines[0]


class Stopped(MeshplanError):
    """Raised by a stand-in Engine or search once it has what the command built (the CLI
    prints it as a one-line error with exit code 2)."""


def with_flags(argv: list[str] | tuple[str, ...], *extra: str) -> list[str]:
    """``argv`` with the ``flag value`` pairs of ``extra`` set: a flag already there gets the
    new value in place, others are appended (an option typed twice with two values is
    refused, issue 43)."""
    out = list(argv)
    for flag, value in zip(extra[::2], extra[1::2], strict=True):
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out
