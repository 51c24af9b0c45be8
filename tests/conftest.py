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


def once_per_run(tmp_path_factory, name: str, make) -> pathlib.Path:
    """``make(folder)`` run once per test run, its folder shared by the xdist workers: the
    first worker to ask makes it under the run's temporary root (``pytest-N``, above each
    worker's ``popen-gwK``) while holding a lock; the others wait and reuse it (the
    pattern of pytest-xdist's docs, with ``fcntl``). A ``make`` that fails leaves a
    ``.failed`` mark, so the other workers fail at once instead of repeating it. Without
    xdist (no worker id, or a temporary folder that is not the worker's ``popen-gwK``):
    made in the process's own temporary folder, never shared with another run."""
    import fcntl
    import os

    base, worker = tmp_path_factory.getbasetemp(), os.environ.get("PYTEST_XDIST_WORKER")
    if not worker or base.name != f"popen-{worker}":
        folder = tmp_path_factory.mktemp(name)
        make(folder)
        return folder
    root = base.parent
    folder, done, failed = root / name, root / f"{name}.done", root / f"{name}.failed"
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if failed.exists():
            pytest.fail(f"{name} failed in another worker: {failed.read_text()}")
        if not done.exists():
            folder.mkdir(exist_ok=True)
            try:
                make(folder)
            except BaseException as e:
                failed.write_text(f"{type(e).__name__}: {e}"[:2000])
                raise
            done.write_text("")
    return folder


@pytest.fixture(scope="session")
def quick_calibration(tmp_path_factory) -> tuple[pathlib.Path, str]:
    """One ``meshplan calibrate --nproc 2 --quick`` per test run (about 20 s of two gloo
    ranks; :func:`once_per_run`), shared by the tests that need a calibrated cluster of
    this machine: the YAML's path and what the command printed."""
    import contextlib
    import io

    from meshplan.cli import main

    def make(folder: pathlib.Path) -> None:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            rc = main(["calibrate", "--nproc", "2", "--quick", "--output", str(folder / "here.yaml")])
        assert rc == 0, printed.getvalue()
        (folder / "printed.txt").write_text(printed.getvalue())

    folder = once_per_run(tmp_path_factory, "quick_calibration", make)
    return folder / "here.yaml", (folder / "printed.txt").read_text()
