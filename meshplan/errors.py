"""Errors raised by the meshplan facade. All derive from :class:`MeshplanError`, a
``ValueError`` (the CLI prints them as one ``error: ...`` line): the one root of every
package's errors, defined in ``completion.errors`` (the lowest package, so that every
package may derive from it) and re-exported here as the same class."""

from completion.errors import MeshplanError

__all__ = ["MeshplanError"]

