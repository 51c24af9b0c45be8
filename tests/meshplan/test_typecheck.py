"""The type check of the public API runs in ``make test`` (CI runs only ``make test``): mypy on
the modules ``[tool.mypy] files`` names in pyproject.toml, zero errors. The cache lives in a
temp dir, so each run checks from cold (about 10 s; the heavy third-party packages are not
analysed, see the ``[[tool.mypy.overrides]]``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]


def test_public_api_type_checks(tmp_path):
    pytest.importorskip("mypy", reason="mypy missing: install meshplan[dev] (make test does)")
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"),
                        "--no-error-summary"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-1000:]


def test_the_checked_set_is_the_public_api():
    """The checked files (and packages: every module under them) exist and include the
    facade, the result types users import and the framework adapters' library."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    files = cfg["files"]
    assert all((ROOT / f).is_file() or (ROOT / f / "__init__.py").is_file() for f in files), files
    assert {"meshplan/plan.py", "meshplan/strategy.py", "meshplan/engine.py",
            "meshplan/errors.py", "tuner/result.py", "simulator/result.py",
            "completion/dtensor.py", "meshplan/frameworks"} <= set(files)
    assert cfg["follow_imports"] == "silent"
