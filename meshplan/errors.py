"""Errors raised by the meshplan facade. All derive from :class:`MeshplanError`, a
``ValueError`` (the CLI prints them as one ``error: ...`` line): the one root of every
package's errors, defined in ``completion.errors`` (the lowest package, so that every
package may derive from it) and re-exported here as the same class."""

from completion.errors import MeshplanError

__all__ = ["MeshplanError", "click_exceptions"]


def click_exceptions():
    """click's exceptions module (``UsageError``, ``BadParameter``, ``Abort``, ...): typer
    >= 0.2x vendors click as ``typer._click``; older typer depends on the click
    distribution."""
    try:
        from typer._click import exceptions
    except ImportError:
        from click import exceptions  # type: ignore[no-redef]
    return exceptions
