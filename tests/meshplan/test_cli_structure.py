"""The shape of the CLI: every command is a documented top-level function that its module's
``register(app)`` only attaches; no library module imports the CLI; ``meshplan --help``
imports no heavy package; ``meshplan demo`` is a command."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import subprocess
import sys

import pytest
import typer

from meshplan import cli
from tests._cli import run_main

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("completion", "clusters", "simulator", "tuner", "executor", "meshplan", "experiments")
CLI_MODULES = [*cli.COMMAND_MODULES, *(m for m, _ in cli.LAZY_COMMANDS.values())]
HEAVY = ("numpy", "pandas", "pydantic", "optuna", "torch", "clusters", "simulator",
         "tuner", "executor", "experiments")
#: the modules of ``completion`` ``--help`` may load: its lazy ``__init__`` and the light modules
#: that import nothing (the error root; the registries the CLI's choices come from)
LIGHT = ("completion", "completion.errors", "completion.choices")


def _callbacks(app: typer.Typer) -> list:
    """The command functions a Typer app holds, sub-groups included."""
    out = [c.callback for c in app.registered_commands]
    for g in app.registered_groups:
        out += _callbacks(g.typer_instance)
    return out


@pytest.mark.parametrize("module", CLI_MODULES)
def test_every_command_is_a_documented_top_level_function(module):
    mod = importlib.import_module(module)
    app = typer.Typer()
    mod.register(app)
    fns = _callbacks(app)
    assert fns, f"{module}.register attached no command"
    for fn in fns:
        assert fn.__qualname__ == fn.__name__, f"{module}: {fn.__qualname__} is not top-level"
        assert getattr(mod, fn.__name__) is fn and fn.__module__ == module
        assert inspect.getdoc(fn), f"{module}.{fn.__name__} has no docstring"
    # register only attaches: running it twice on fresh apps attaches the same functions
    again = typer.Typer()
    mod.register(again)
    assert _callbacks(again) == fns


def _public_functions(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_"):
            yield node
            if isinstance(node, ast.ClassDef):
                yield from (f for f in node.body if isinstance(f, ast.FunctionDef)
                            and not f.name.startswith("_"))


def test_public_functions_of_the_cli_have_docstrings():
    files = [ROOT / "meshplan" / "cli.py", ROOT / "meshplan" / "cluster_tables.py",
             ROOT / "experiments" / "command.py", *sorted((ROOT / "meshplan" / "commands").glob("*.py")),
             *sorted((ROOT / "meshplan" / "demo").glob("*.py"))]
    missing = [f"{p.relative_to(ROOT)}:{n.lineno} {n.name}" for p in files
               for n in _public_functions(p) if ast.get_docstring(n) is None]
    assert not missing, "no docstring:\n" + "\n".join(missing)


def cli_imports(path: pathlib.Path) -> list[str]:
    """``line: module`` for every import of ``meshplan.cli`` or ``meshplan.commands`` (any
    form: ``import meshplan.cli``, ``from meshplan.commands.x import y``, ``from meshplan
    import cli``, relative imports from inside meshplan) in a source file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(ROOT).with_suffix("").parts
    pkg = list(rel[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*pkg[: len(pkg) - (node.level - 1)], *([base] if base else [])])
            mods = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        hits = [m for m in mods if m in ("meshplan.cli", "meshplan.commands")
                or m.startswith(("meshplan.cli.", "meshplan.commands."))]
        if hits:
            found.append((node.lineno, hits[0]))
    return [f"{line}: {m}" for line, m in sorted(found)]


def _is_cli(path: pathlib.Path) -> bool:
    rel = path.relative_to(ROOT)
    return (rel == pathlib.Path("meshplan/cli.py") or rel.parts[:2] == ("meshplan", "commands")
            or rel.name == "__main__.py")  # entry points: python -m meshplan[.demo]


def test_the_import_checker_sees_every_form(tmp_path, monkeypatch):
    pkg = tmp_path / "meshplan" / "sub"
    pkg.mkdir(parents=True)
    f = pkg / "mod.py"
    f.write_text("import meshplan.cli\nfrom meshplan import commands\nfrom .. import cli\n"
                 "def g():\n    from meshplan.commands.cost import cost_cmd\n"
                 "from meshplan import engine\nimport meshplan.client\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    got = cli_imports(f)
    assert [g.split(":")[0] for g in got] == ["1", "2", "3", "5"]


def test_no_library_module_imports_the_cli():
    bad = [f"{p.relative_to(ROOT)}:{hit}" for pkg in PACKAGES
           for p in sorted((ROOT / pkg).rglob("*.py")) if not _is_cli(p) for hit in cli_imports(p)]
    assert not bad, "library modules importing the CLI:\n" + "\n".join(bad)


def _run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, **kw)


def test_help_imports_no_heavy_package():
    code = ("import sys\nfrom meshplan.cli import main\nrc = main(['--help'])\n"
            f"print('HEAVY', rc, sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}\n"
            f"      or m.split('.')[0] == 'completion' and m not in {LIGHT!r}))")
    proc = _run("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY 0 []"
    for name in ("cost", "tune", "complete", "demo", "report", "clusters", "program"):
        assert f" {name} " in proc.stdout


def test_report_is_listed_with_its_own_help_and_runs_lazily(capsys):
    from experiments.command import report_cmd

    for name, (module, short_help) in cli.LAZY_COMMANDS.items():
        assert inspect.getdoc(getattr(importlib.import_module(module), f"{name}_cmd")) == short_help
    assert inspect.getdoc(report_cmd) == cli.LAZY_COMMANDS["report"][1]
    rc, out, _ = run_main(capsys, "report", "--help")
    assert rc == 0 and "--quick" in out and "--only" in out


def test_demo_is_a_command(capsys):
    rc, out, _ = run_main(capsys, "demo", "--help")
    assert rc == 0
    for flag in ("--trials", "--seed", "--output", "--steps", "--cluster", "--no-calibrate",
                 "--no-validate"):
        assert flag in out
    proc = _run("-m", "meshplan.demo", "--help")
    assert proc.returncode == 0 and "--no-calibrate" in proc.stdout, proc.stderr
    assert "meshplan demo" in proc.stdout


def test_demo_bad_input_is_a_one_line_error(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("x")
    proc = _run("-m", "meshplan.demo", "--output", str(foreign), "--no-validate")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "not written by the demo" in proc.stderr
    assert (foreign / "keep.txt").read_text() == "x"


def test_command_help_paragraphs_are_reflowed(capsys):
    """typer 0.29 keeps a docstring's line breaks after its first paragraph: the CLI joins
    each paragraph (``cli.reflow_help``), so help never breaks mid-sentence at the source's
    wrap (tune's said "CLUSTER a" / "catalog name" on two lines)."""
    assert cli.reflow_help("One line.\n\n    Two\n    lines.\n\n    Three.") == "One line.\n\nTwo lines.\n\nThree."
    for app_cmd in cli.app.registered_commands:
        if app_cmd.help:
            assert all("\n" not in p for p in app_cmd.help.split("\n\n")), app_cmd.name
    rc, out, _ = run_main(capsys, "tune", "--help")
    assert rc == 0
    words = " ".join(out.split())
    assert "Hugging Face config.json file or its folder; CLUSTER a catalog name" in words
    lines = [ln.strip(" │") for ln in out.splitlines()]
    assert "CLUSTER a" not in lines and not any(ln.rstrip().endswith("CLUSTER a") for ln in lines)


def test_a_warning_shows_once_per_command(tmp_path):
    """The review: compare printed a config.json warning once per plan (run as the console
    script runs: pytest's own warning capture would hide the lines in-process)."""
    cfg = tmp_path / "nohd.json"
    cfg.write_text('{"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, '
                   '"num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 8, '
                   '"vocab_size": 1024, "max_position_embeddings": 4096}')
    r = subprocess.run([sys.executable, "-m", "meshplan", "compare", "--model", str(cfg), "--cluster",
                        "dgx-h100", "--dp", "2,4", "--global-batch", "8"], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("warning: ") == 1 and "'head_dim' is absent" in r.stderr
