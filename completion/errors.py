"""The root of meshplan's errors, and the errors of the completion package.

:class:`MeshplanError` is the one base class of every error meshplan raises on bad input
(``except meshplan.MeshplanError`` catches them all; ``meshplan.errors.MeshplanError`` is
this class). It lives here, in the lowest package of docs/design.md's dependency order,
so that every package may derive from it (tests/meshplan/test_layering.py lets each import
``completion.errors``). This module imports nothing, so the CLI loads it on ``--help``.
"""


class MeshplanError(ValueError):
    """Base class of every error meshplan raises on bad input; names the field at fault.

    A ``ValueError``: the CLI prints it as one ``error: ...`` line and exits 2.

    Args:
        message: the one-line explanation the CLI prints after ``error:``.
        field: the input at fault, as the library spells it (a Strategy field such as
            ``"tp"``, a config key such as ``"zero_optimization.stage"``, a Megatron-LM
            argument such as ``"--num-layers"``), or None; the CLI maps a Strategy field
            to the flag the user typed.
    """

    def __init__(self, message: str = "", *args: object, field: str | None = None) -> None:
        super().__init__(message, *args)
        self.field = field


class CompletionError(MeshplanError):
    """Base class for every error the completion package raises on bad input."""


class DistAttrError(CompletionError):
    """An invalid process mesh, dims_mapping, partial status or placement."""


class InputFileNotFoundError(MeshplanError, FileNotFoundError):
    """A file the user named (a plan, a trace, a data file) that does not exist: bad input
    (a :class:`MeshplanError`) that is also a ``FileNotFoundError``."""
