"""Errors raised by the meshplan facade. All derive from :class:`MeshplanError`, a
``ValueError`` (the CLI prints them as one ``error: ...`` line)."""


class MeshplanError(ValueError):
    """Base class of every error the facade raises on bad input; names the field at fault.

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


def click_exceptions():
    """click's exceptions module (``UsageError``, ``BadParameter``, ``Abort``, ...): typer
    >= 0.2x vendors click as ``typer._click``; older typer depends on the click
    distribution."""
    try:
        from typer._click import exceptions
    except ImportError:
        from click import exceptions  # type: ignore[no-redef]
    return exceptions
