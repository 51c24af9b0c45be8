"""Errors raised by the completion package. All derive from ``ValueError``."""


class CompletionError(ValueError):
    """Base class for every error the completion package raises on bad input."""


class DistAttrError(CompletionError):
    """An invalid process mesh, dims_mapping, partial status or placement."""
