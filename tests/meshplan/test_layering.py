"""docs/design.md's dependency direction, checked on the import graph of every package's source
(every ``import`` / ``from ... import`` statement anywhere in a module, function-local
ones included, relative imports resolved):

    completion -> completion only          clusters -> clusters only
    simulator  -> completion, clusters     tuner    -> completion (scores come from an
    executor   -> completion, clusters        injected scorer: meshplan.tuning)
    meshplan -> anything but experiments   experiments -> anything

and every package may import the light modules of ``completion`` that import nothing:
:data:`LIGHT` (the error root ``MeshplanError``; the registries of allowed values);
inside meshplan, the framework adapters are a library: nothing under
``meshplan/frameworks`` imports typer, click or the command layer (``meshplan.commands``,
``meshplan.cli``).
"""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
OURS = ("completion", "clusters", "simulator", "tuner", "executor", "meshplan", "experiments")
ALLOWED: dict[str, set[str]] = {
    "completion": set(),
    "clusters": set(),
    "simulator": {"completion", "clusters"},
    "tuner": {"completion"},
    "executor": {"completion", "clusters"},
    "meshplan": {"completion", "clusters", "simulator", "tuner", "executor"},
    "experiments": set(OURS),
}

#: modules of ``completion`` any package may import: they import nothing of ours (nor numpy or
#: pydantic), and completion's ``__init__`` is lazy, so importing them loads nothing else
LIGHT = ("completion.errors", "completion.choices")


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
    """``file:line imports module`` for every import of ``package`` that docs/design.md forbids."""
    allowed = ALLOWED[package] | {package}
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, top, mod in imported_packages(path):
            if top in OURS and top not in allowed and mod not in LIGHT:
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


#: modules no file under meshplan/frameworks may import (the CLI's libraries and layer)
CLI_ONLY = ("typer", "click", "meshplan.commands", "meshplan.cli")


def cli_imports(folder: pathlib.Path) -> list[str]:
    """``file:line imports module`` for every import of :data:`CLI_ONLY` under ``folder``."""
    bad = []
    for path in sorted(folder.rglob("*.py")):
        for line, _, mod in sorted(imported_packages(path)):
            if any(mod == m or mod.startswith(m + ".") for m in CLI_ONLY):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    return bad


def test_the_framework_adapters_import_no_cli(tmp_path, monkeypatch):
    bad = cli_imports(ROOT / "meshplan" / "frameworks")
    assert not bad, "meshplan/frameworks is a library (no typer, click or commands):\n" + "\n".join(bad)
    pkg = tmp_path / "meshplan" / "frameworks"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text("def f():\n    from typer import echo\n    import click.core\n"
                              "from meshplan.commands import options\nimport typing\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert cli_imports(pkg) == ["meshplan/frameworks/x.py:2 imports typer",
                                "meshplan/frameworks/x.py:3 imports click.core",
                                "meshplan/frameworks/x.py:4 imports meshplan.commands"]


#: the modules of meshplan that are its command line (everything else there is the library;
#: every ``__main__.py`` is an entry point too)
CLI_MODULES = ("commands", "cli.py", "help_format.py", "__main__.py")


def test_the_meshplan_library_imports_no_cli():
    """Every module of ``meshplan`` outside its command line (:data:`CLI_MODULES`: the
    commands, their entry point and help formatting) is library a Python user can call: it
    imports neither typer, click nor the command layer (issue 38: no rule only the CLI holds)."""
    root = ROOT / "meshplan"
    bad = [hit for path in sorted(root.rglob("*.py"))
           if path.relative_to(root).parts[0] not in CLI_MODULES and path.name != "__main__.py"
           for hit in cli_imports_of(path)]
    assert not bad, "library modules of meshplan importing the CLI:\n" + "\n".join(bad)


def cli_imports_of(path: pathlib.Path) -> list[str]:
    """``file:line imports module`` for every import of :data:`CLI_ONLY` in ``path``."""
    return [f"{path.relative_to(ROOT)}:{line} imports {mod}"
            for line, _, mod in sorted(imported_packages(path))
            if any(mod == m or mod.startswith(m + ".") for m in CLI_ONLY)]


# -- module boundaries: private names, import cycles, error types --------------------------
def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for pkg in OURS:
        for path in (ROOT / pkg).rglob("*.py"):
            out[".".join(_module_name(path))] = path
    return out


def _own_module(name: str, mods: dict[str, pathlib.Path]) -> str | None:
    """The longest prefix of dotted ``name`` that is one of our modules."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in mods:
            return ".".join(parts[:i])
    return None


def module_imports(path: pathlib.Path, mods: dict[str, pathlib.Path]) -> tuple[set[str], list[str]]:
    """(our modules ``path`` imports, ``line: what`` for every private name it takes from
    another of our modules: ``from m import _x`` or ``alias._x`` on an imported module).
    ``from package import submodule`` depends on the submodule only. Relative imports are
    not used in this code base (absolute imports only)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = ".".join(_module_name(path))
    deps: set[str] = set()
    private: list[str] = []
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in OURS:
                    deps.add(_own_module(a.name, mods) or a.name)
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in OURS:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in mods:  # a submodule
                    deps.add(full)
                    aliases[a.asname or a.name] = full
                    continue
                deps.add(_own_module(node.module, mods) or node.module)
                if a.name.startswith("_") and not a.name.startswith("__"):
                    private.append(f"{path.relative_to(ROOT)}:{node.lineno} from {node.module} import {a.name}")
    deps.discard(me)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            private.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value.id}.{node.attr}")
    return deps, private


def test_no_module_takes_another_modules_private_names():
    mods = _modules()
    bad = [p for path in mods.values() for p in module_imports(path, mods)[1]]
    assert not bad, "private names used outside their module:\n" + "\n".join(bad)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_import_cycles_are_found_and_there_are_none():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    mods = _modules()
    graph = {name: module_imports(path, mods)[0] for name, path in mods.items()}
    cycles = import_cycles(graph)
    assert not cycles, "import cycles (function-local imports count too):\n" + "\n".join(map(str, cycles))


def _error_classes() -> dict[str, list[type]]:
    import importlib

    out: dict[str, list[type]] = {}
    for name in sorted(_modules()):
        if name.endswith("__main__") or name.split(".")[0] == "experiments" and "command" in name:
            continue
        mod = importlib.import_module(name)
        for obj in vars(mod).values():
            if isinstance(obj, type) and issubclass(obj, Exception) and obj.__module__ == name:
                out.setdefault(name.split(".")[0], []).append(obj)
    return out


def test_every_package_has_one_root_error_and_no_name_is_reused():
    """Each package's errors derive from one root of its own, and every root from the one
    ``MeshplanError`` (``completion.errors``); meshplan's own errors derive from it directly."""
    from completion.errors import InputFileNotFoundError, MeshplanError

    shared = (MeshplanError, InputFileNotFoundError)  # every package's: not completion's root
    classes = _error_classes()
    seen: dict[str, str] = {}
    for pkg, errs in classes.items():
        roots = [e for e in errs if e not in shared and not any(
            b.__module__.split(".")[0] == pkg and b not in shared for b in e.__mro__[1:])]
        if pkg == "meshplan":  # its root is MeshplanError itself (meshplan.errors re-exports it)
            roots = [r for r in roots if MeshplanError not in r.__bases__]
        assert len(roots) == (0 if pkg == "meshplan" else 1), \
            f"{pkg} has root error types {[r.__name__ for r in roots]}"
        assert all(issubclass(e, MeshplanError) for e in errs), \
            f"{pkg}: {[e.__name__ for e in errs if not issubclass(e, MeshplanError)]} not under MeshplanError"
        for e in errs:
            assert e.__name__ not in seen, f"{e.__name__} is defined in {seen[e.__name__]} and {pkg}"
            seen[e.__name__] = pkg
