"""One error root (issue 38 item 5): ``except meshplan.MeshplanError`` catches every error
meshplan raises on bad input, through the Python API and through the CLI; an error that is
not one (a bare ValueError from a bug) shows as a bug, not as bad input."""

from __future__ import annotations

import importlib
import json
import pathlib

import pytest

import meshplan
from completion.errors import MeshplanError as Root
from tests._cli import one_line_error, run_main

PACKAGES = ("completion", "clusters", "simulator", "tuner", "executor", "meshplan", "experiments")


def test_the_root_is_one_class_under_every_name():
    from meshplan.errors import MeshplanError
    from tuner.errors import TunerError
    from tuner.study import TuneError

    assert meshplan.MeshplanError is MeshplanError is Root
    assert issubclass(Root, ValueError)
    assert TuneError is TunerError
    assert Root("x", field="tp").field == "tp" and Root("x").field is None


def _error_classes() -> list[type]:
    """Every exception class defined in a module of our packages (every ``*.py`` under
    them, namespace folders such as ``meshplan/commands`` included)."""
    root = pathlib.Path(__file__).resolve().parents[2]
    out = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if name.endswith("__main__") or name == "experiments.command":
                continue
            mod = importlib.import_module(name)
            out += [o for o in vars(mod).values() if isinstance(o, type) and issubclass(o, BaseException)
                    and o.__module__ == name]
    return out


def test_every_error_class_of_every_package_is_under_the_root():
    classes = _error_classes()
    names = {c.__name__ for c in classes}
    # the walk found the packages' errors (a walk that finds nothing would pass)
    assert {"StrategyError", "UnknownClusterError", "ClusterSpecError", "ModelConfigError",
            "PirParseError", "PlanError", "SpaceError", "LaunchError", "ProfileError",
            "ExperimentError", "OutputError", "ExportError", "UnusedOptionError"} <= names
    stray = sorted(f"{c.__module__}.{c.__name__}" for c in classes if not issubclass(c, Root))
    assert not stray, f"errors not derived from MeshplanError: {stray}"


def _bad_inputs(tmp_path):
    """(what, callable) pairs: each is bad input to the public API."""
    from clusters import load_cluster, parse_spec
    from completion.models import get_model_config
    from completion.pir import parse_program
    from meshplan import Plan, Strategy
    from tuner.space import ModelDims, SearchProblem

    bad_yaml = tmp_path / "c.yaml"
    bad_yaml.write_text("name: x\nnode: {devices_per_node: -1}\n")
    bad_plan = tmp_path / "plan.json"
    bad_plan.write_text(json.dumps({"version": 2, "strategy": {"tp": 0}}))
    dims = ModelDims("m", 2, 64, 4, 4, 256, 1000)
    return [
        ("unknown cluster", lambda: load_cluster("no-such-cluster")),
        ("bad cluster YAML file", lambda: load_cluster(str(bad_yaml))),
        ("bad cluster spec", lambda: parse_spec({"name": "x"})),
        ("unknown model", lambda: get_model_config("no-such-model")),
        ("bad Strategy", lambda: Strategy(tp=0)),
        ("Strategy rule", lambda: Strategy(pp=1, schedule="ZBH1")),
        ("bad plan.json", lambda: Plan.load(bad_plan)),
        ("missing plan.json", lambda: Plan.load(tmp_path / "absent.json")),
        ("not JSON", lambda: Plan.from_json("{")),
        ("bad PIR text", lambda: parse_program("this is not a program")),
        ("tuner bad problem", lambda: SearchProblem(dims, 0, 8, 8, 128)),
    ]


def test_the_public_api_raises_only_meshplan_errors_on_bad_input(tmp_path):
    for what, call in _bad_inputs(tmp_path):
        with pytest.raises(meshplan.MeshplanError):
            call()
        try:
            call()
        except meshplan.MeshplanError as e:
            assert str(e), what
    with pytest.raises(meshplan.StrategyError):  # the exported subclass
        meshplan.Strategy(dp=2, global_batch_size=3)


@pytest.mark.parametrize("argv", [
    ["cost", "--model", "no-such-model", "--cluster", "dgx-a100-80g", "--global-batch", "8"],
    ["cost", "--model", "gpt3-1.3b", "--cluster", "no-such-cluster", "--global-batch", "8"],
    ["cost", "--model", "gpt3-1.3b", "--cluster", "dgx-a100-80g", "--global-batch", "3", "--dp", "2"],
    ["cost", "--model", "gpt3-1.3b", "--cluster", "dgx-a100-80g", "--global-batch", "8", "--tp", "0"],
    ["clusters", "show", "no-such-cluster"],
])
def test_the_cli_prints_bad_input_as_one_line_with_exit_2(capsys, argv):
    line = one_line_error(*run_main(capsys, *argv))
    assert "Traceback" not in line


def test_a_bare_value_error_in_a_command_is_a_bug_not_bad_input(capsys, monkeypatch):
    """A ValueError or KeyError that is not a MeshplanError comes from a bug: the CLI does not
    print it as ``error:`` with exit 2, it raises it (the console script shows the traceback
    and exits 1)."""
    import clusters.report

    for exc in (ValueError("a bug"), KeyError("a bug")):
        def broken(*a, exc=exc, **k):
            raise exc

        monkeypatch.setattr(clusters.report, "catalog_rows", broken)
        with pytest.raises(type(exc), match="a bug"):
            run_main(capsys, "clusters", "list", "--json")
        assert "error:" not in capsys.readouterr().err
