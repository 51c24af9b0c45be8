"""Dependencies (issue 20 item 1): constraints.txt pins every requirement of the dev install
to one exact version that pyproject.toml's specifiers allow (torch stays 2.13.0), the Makefile
installs with it, and PostgreSQL URLs name the psycopg 3 driver (the ``postgres`` extra)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from tuner.storage import rdb_url

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+
requirements = pytest.importorskip("packaging.requirements")


def _name(n: str) -> str:
    return re.sub(r"[-_.]+", "-", n).lower()


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and version and " " not in version, f"not an exact pin: {line!r}"
        assert _name(name) not in pins, f"{name} pinned twice"
        pins[_name(name)] = version
    return pins


def test_constraints_pin_every_requirement_within_its_specifier():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    reqs = project["dependencies"] + extras["dev"] + extras["postgres"]
    pins = _pins()
    for text in reqs:
        req = requirements.Requirement(text)
        if _name(req.name) == "meshplan":  # the dev extra pulls another extra: its requirements
            reqs += [r for extra in req.extras for r in extras[extra]]
            continue
        name = _name(req.name)
        assert name in pins, f"{req.name} is not in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (text, pins[name])
        for extra in req.extras:  # psycopg[binary] pulls psycopg-binary
            assert f"{name}-{extra}" in pins, f"{req.name}[{extra}] is not pinned"
    assert pins["torch"] == "2.13.0"
    assert "psycopg2-binary" not in pins and "psycopg2" not in pins


def test_the_makefile_installs_with_the_constraints():
    text = (ROOT / "Makefile").read_text()
    installs = [ln for ln in text.splitlines() if "$(PY) $(PIP_INSTALL)" in ln]
    assert len(installs) == 3  # pip itself, the base and the dev install
    assert "PIP_INSTALL = -m pip install --quiet -c $(CONSTRAINTS)" in text
    assert "CONSTRAINTS := constraints.txt" in text and "\nconstraints:" in text
    assert "make constraints" in (ROOT / "constraints.txt").read_text()


@pytest.mark.parametrize("url,want", [
    ("postgresql://u:pw@db/meshplan", "postgresql+psycopg://u:pw@db/meshplan"),
    ("postgres://u@db:5433/m", "postgresql+psycopg://u@db:5433/m"),
    ("postgresql+psycopg2://u@db/m", "postgresql+psycopg2://u@db/m"),  # a driver named: kept
    ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
])
def test_postgres_urls_name_psycopg3(monkeypatch, url, want):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: object() if n == "psycopg" else real(n, *a))
    assert rdb_url(url) == want


def test_psycopg2_alone_is_still_used(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: (
        None if n == "psycopg" else object() if n == "psycopg2" else real(n, *a)))
    assert rdb_url("postgresql://u@db/m") == "postgresql+psycopg2://u@db/m"
