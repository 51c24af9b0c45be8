"""DESIGN.md's dependency direction, checked on the import graph of every package's source
(every ``import`` / ``from ... import`` statement anywhere in a module, function-local
ones included, relative imports resolved):

    completion -> completion only          clusters -> clusters only
    simulator  -> completion, clusters     tuner    -> simulator, completion, clusters
    executor   -> completion, clusters     meshplan -> anything but experiments
    experiments -> anything
"""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
OURS = ("completion", "clusters", "simulator", "tuner", "executor", "meshplan", "experiments")
ALLOWED: dict[str, set[str]] = {
    "completion": set(),
    "clusters": set(),
    "simulator": {"completion", "clusters"},
    "tuner": {"simulator", "completion", "clusters"},
    "executor": {"completion", "clusters"},
    "meshplan": {"completion", "clusters", "simulator", "tuner", "executor"},
    "experiments": set(OURS),
}


def _module_name(path: pathlib.Path) -> list[str]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_packages(path: pathlib.Path) -> list[tuple[int, str, str]]:
    """(line, top-level package, dotted module) of every import in a source file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = _module_name(path)
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0], a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here if is_pkg else here[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, *([node.module] if node.module else [])])
            else:
                mod = node.module or ""
            out.append((node.lineno, mod.split(".")[0], mod))
    return out


def violations(package: str) -> list[str]:
    """``file:line imports module`` for every import of ``package`` that DESIGN.md forbids."""
    allowed = ALLOWED[package] | {package}
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, top, mod in imported_packages(path):
            if top in OURS and top not in allowed:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    return bad


def test_the_checker_sees_relative_and_local_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "executor" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "executor" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .. import run\n")
    (pkg / "mod.py").write_text("def f():\n    import simulator.schedules\n"
                                "    from ..kernels import base\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    got = imported_packages(pkg / "mod.py")
    assert (2, "simulator", "simulator.schedules") in got
    assert got[-1] == (3, "executor", "executor.kernels")
    assert imported_packages(pkg / "__init__.py") == [(1, "executor", "executor")]
    assert violations("executor") == ["executor/sub/mod.py:2 imports simulator.schedules"]


@pytest.mark.parametrize("package", [p for p in OURS if p != "experiments"])
def test_package_imports_follow_the_design(package):
    bad = violations(package)
    assert not bad, f"{package} may import only {sorted(ALLOWED[package])}:\n" + "\n".join(bad)
