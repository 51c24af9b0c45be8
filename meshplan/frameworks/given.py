"""The flags a user typed, as plain data: what an adapter needs to name a flag in a message
the way the user spelled it (``--mp 4`` stays ``--mp``) and to tell a typed value from a
default, without the command-line library (no typer, no click under meshplan.frameworks).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GivenFlags:
    """The flags of one command line.

    Attributes:
        args: the command-line tokens as typed (``("--tp", "4", "--vpp=2")``); only the
            flags are read (``--f`` or ``--f=V``), values are not.
        flags: a field (a Strategy field such as ``"tp"``, or a size such as ``"seq_len"``)
            -> its flags, the canonical one first (on the CLI,
            ``meshplan.flags.FLAGS`` and ``SIZE_FLAGS``). A field missing here is
            spelled ``--`` + its name with dashes.
    """

    args: tuple[str, ...] = ()
    flags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, args: Iterable[str], flags: Mapping[str, tuple[str, ...]] | None = None) -> GivenFlags:
        """``GivenFlags(tuple(args), flags or {})``."""
        return cls(tuple(args), dict(flags or {}))

    def _aliases(self, name: str) -> tuple[str, ...]:
        return self.flags.get(name) or ("--" + name.replace("_", "-"),)

    def typed(self, *flags: str) -> list[str]:
        """The ``flags`` present on the command line, in the order asked."""
        present = {a.split("=", 1)[0] for a in self.args}
        return [f for f in flags if f in present]

    def given(self, *fields: str) -> list[str]:
        """The flags of ``fields`` the user typed, as typed (empty: none given)."""
        return self.typed(*(f for name in fields for f in self._aliases(name)))

    def flag(self, name: str) -> str:
        """The spelling of field ``name``'s flag as typed, else its canonical flag."""
        return (self.given(name) or list(self._aliases(name)))[0]
