"""Turn off the SPMD rule cache of ``completion.propagate.Propagator`` for one test, so a
test can compare completion with the cache against completion that runs every rule."""

from __future__ import annotations

from typing import Any


class NoCache(dict):
    """A cache that never stores: every visit runs the rule and rebuilds its outcome."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


def disable_rule_cache(monkeypatch: Any) -> None:
    """Make every ``Propagator`` built from now on (in this test) use a :class:`NoCache`."""
    from completion import propagate

    init = propagate.Propagator.__init__

    def no_cache_init(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        self.cache = NoCache()

    monkeypatch.setattr(propagate.Propagator, "__init__", no_cache_init)
