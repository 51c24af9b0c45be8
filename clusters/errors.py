"""Errors raised by the clusters package. All derive from ``MeshplanError``
(``completion.errors``, the one root; a ``ValueError``) so the CLI turns them into a
one-line ``error: ...`` message with exit code 2."""

from __future__ import annotations

from completion.errors import MeshplanError


class ClusterError(MeshplanError):
    """Base class for every error the clusters package raises on bad input."""


class ClusterSpecError(ClusterError):
    """A cluster YAML that is missing a field, has a bad value, or does not parse."""


class UnknownClusterError(ClusterError):
    """A name that is neither a catalog entry nor an existing file."""


class CollectiveError(ClusterError):
    """A bad collective request: unknown kind, bad rank group, or nbytes < 0."""
