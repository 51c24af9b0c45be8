"""Shared test helpers. ``shared/`` (reference docs, seed data) sits beside the repo."""

from __future__ import annotations

import pathlib

import pytest

SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture
def shared_dir() -> pathlib.Path:
    """Path to the shared/ directory (data/programs/*.pir, reference/*.md)."""
    return SHARED
