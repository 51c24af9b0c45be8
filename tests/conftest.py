"""Shared test helpers. ``shared/`` (reference docs, seed data) sits beside the repo."""

from __future__ import annotations

import pathlib

import pytest

SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture
def shared_dir() -> pathlib.Path:
    """Path to the shared/ directory (data/programs/*.pir, reference/*.md)."""
    return SHARED


@pytest.fixture
def strategies(monkeypatch):
    """The Strategy every command passes to ``meshplan.engine.Engine``, which then stops the
    command (``tests._cli.Stopped``: "stopped before simulating")."""
    import meshplan.engine
    from tests._cli import Stopped

    got = []

    def engine(model, cluster, strategy, **kw):
        got.append(strategy)
        raise Stopped("stopped before simulating")

    monkeypatch.setattr(meshplan.engine, "Engine", engine)
    return got
