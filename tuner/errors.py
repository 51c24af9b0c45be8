"""Errors raised by the tuner package. All derive from :class:`TunerError`, a ``ValueError``
under the one root ``MeshplanError`` (``completion.errors``)."""

from completion.errors import MeshplanError


class TunerError(MeshplanError):
    """Base class of every error the tuner raises on bad input (search space, storage,
    patterns, study); names the field or option at fault."""


class StorageError(TunerError):
    """A storage URL or journal file that cannot be used; the message names it."""
