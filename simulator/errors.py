"""Errors raised by the simulator package. All derive from :class:`SimulatorError`, a
``ValueError`` (bad input: times, memory figures, shapes the cost rules cannot take), under
the one root ``MeshplanError`` (``completion.errors``)."""

from completion.errors import MeshplanError


class SimulatorError(MeshplanError):
    """Base class of every error the simulator raises on bad input; names the value at fault."""


class ScheduleError(SimulatorError):
    """Invalid schedule name/arguments, or a schedule whose actions cannot all run
    (re-exported by ``simulator.schedules``)."""
