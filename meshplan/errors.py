"""Errors raised by the meshplan facade. All derive from :class:`MeshplanError`, a
``ValueError`` (the CLI prints them as one ``error: ...`` line)."""


class MeshplanError(ValueError):
    """Base class of every error the facade raises on bad input; names the field at fault."""


def click_exceptions():
    """click's exceptions module (``UsageError``, ``BadParameter``, ``Abort``, ...): typer
    >= 0.2x vendors click as ``typer._click``; older typer depends on the click
    distribution."""
    try:
        from typer._click import exceptions
    except ImportError:
        from click import exceptions  # type: ignore[no-redef]
    return exceptions
