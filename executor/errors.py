"""Errors raised by the executor package. All derive from :class:`ExecutorError`; bad input
(a plan, a schedule, a group the plan does not fit) is also a ``ValueError``, a failure of
a run (a rank that died or hung, a kernel that failed) a ``RuntimeError``. The root is
``MeshplanError`` (``completion.errors``), so every executor error is also a ``ValueError``;
the CLI tells a failed run (a ``RuntimeError`` too) from bad input by that second base."""

from completion.errors import MeshplanError


class ExecutorError(MeshplanError):
    """Base class of every error the executor raises; names the rank, op or field at fault."""
