"""Errors raised by the meshplan facade. All derive from :class:`MeshplanError`, a
``ValueError`` (the CLI prints them as one ``error: ...`` line)."""


class MeshplanError(ValueError):
    """Base class of every error the facade raises on bad input; names the field at fault."""
