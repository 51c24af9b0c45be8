"""Every command of the README runs (issue 20: "every command in it runs in a test").

The README's ```bash blocks are read in order; each block is one test, run in a fresh
directory: ``cat > FILE <<'TAG'`` here-documents are written, ``meshplan ...`` commands
run in-process (``meshplan.cli.main``) and must exit 0. Paths that exist relative to the
repository (``benchmarks/plans/dp2.json``, ``../shared/...``) are made absolute. To keep
CI short, :data:`FAST` lowers search and measurement sizes (the command is otherwise the
README's). A line that is illustrative (elided arguments ``...``, a placeholder host, a
multi-node launcher) is listed in :data:`ILLUSTRATIVE` with the test that covers it
instead; any other line this runner cannot run fails the test, so a new README command
is either run here or explicitly accounted for.
"""

from __future__ import annotations

import inspect
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from meshplan.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

#: (pattern on the command line, why it is not run here / the test that runs it)
ILLUSTRATIVE: tuple[tuple[str, str], ...] = (
    (r"\.\.\.", "elided arguments (a pattern, not a command)"),
    (r"db-host|user:pw@", "a placeholder PostgreSQL server: tests/tuner/test_tuner_postgres.py runs a real one"),
    (r"^torchrun ", "a multi-node launcher: tests/meshplan/test_torchrun.py runs two torchrun agents"),
    (r"^meshplan report\b(?!.*--quick)", "the full report takes minutes: tests/experiments/test_experiments.py "
                                         "runs `meshplan report --quick`"),
    (r"^optuna-dashboard ", "a web server: tests/docs/test_readme_optuna.py opens its journal with optuna.load_study"),
    (r"^optuna ", "Optuna's own CLI on a tune journal: tests/docs/test_readme_optuna.py runs it"),
)
#: lines that are shell set-up, not commands of ours
SHELL = (r"^\. \.venv/bin/activate", r"^pip install ", r"^make ", r"^cd ", r"^export ")
#: flag -> the value CI uses (upper bounds: a smaller value in the README stays)
FAST = {"--trials": 6, "--steps": 2, "--repeats": 1}
#: commands that get extra flags in CI: (flag, value or None), added when the line lacks the flag
EXTRA: dict[tuple[str, ...], list[tuple[str, str | None]]] = {
    ("calibrate",): [("--quick", None)],
    # the default search proves within its budget or states its gap: CI caps it at 6 plans
    ("tune",): [("--trials", "6"), ("--time-budget", "60")],
    ("validate",): [("--steps", "2"), ("--repeats", "1")],
}


def _shared_calibration(argv: list[str]) -> str | None:
    """FILE when ``argv`` is ``calibrate --nproc 2 --quick --output FILE`` (any order): the
    run's shared calibration (tests/conftest.py ``quick_calibration`` runs exactly that
    command once), whose YAML the runner copies to FILE (its ``name`` set to FILE's stem,
    as calibrate sets it); else None."""
    if argv[:1] != ["calibrate"]:
        return None
    rest, out = list(argv[1:]), None
    for flag in ("--output", "-o"):
        if flag in rest:
            k = rest.index(flag)
            out = rest[k + 1]
            del rest[k:k + 2]
    return out if out and sorted(rest) == sorted(["--nproc", "2", "--quick"]) else None


def _blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def _lines(block: str) -> list[str]:
    """Logical lines: continuations joined, comments dropped, here-documents kept whole."""
    out, lines, i = [], block.replace("\\\n", " ").splitlines(), 0
    while i < len(lines):
        line = lines[i].strip()
        m = re.match(r"cat > (\S+) <<'?(\w+)'?$", line)
        if m:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == m.group(2))
            out.append("\n".join([line, *lines[i + 1:end]]))
            i = end + 1
            continue
        if line and not line.startswith("#"):
            out.append(re.sub(r"\s+#\s.*$", "", line))
        i += 1
    return out


def _fast(args: list[str]) -> list[str]:
    args = list(args)
    for flag, cap in FAST.items():
        if flag in args:
            k = args.index(flag) + 1
            args[k] = str(min(int(args[k]), cap))
    for prefix, extra in EXTRA.items():
        if tuple(args[1:1 + len(prefix)]) == prefix:
            for flag, val in extra:
                if flag not in args:
                    args += [flag] if val is None else [flag, val]
    return args


def _absolute(arg: str) -> str:
    p = ROOT / arg
    return str(p) if not arg.startswith("-") and ("/" in arg) and p.exists() else arg


def _run_block(block: str, tmp: Path, monkeypatch, capsys, calibrated: Path | None = None) -> list[str]:
    monkeypatch.chdir(tmp)
    ran = []
    for line in _lines(block):
        if line.startswith("cat > "):
            head, *body = line.split("\n")
            (tmp / head.split()[2]).write_text("\n".join(body) + "\n")
            continue
        if line.startswith("mkdir -p "):  # the scratch folder a tour writes into
            for d in shlex.split(line)[2:]:
                (tmp / d).mkdir(parents=True, exist_ok=True)
            continue
        if any(re.search(p, line) for p in SHELL):
            continue
        if any(re.search(p, line) for p, _ in ILLUSTRATIVE):
            continue
        args = shlex.split(line)
        assert args[0] == "meshplan", f"README line this test cannot run: {line!r}"
        argv = [_absolute(a) for a in _fast(args)][1:]
        if calibrated is not None and _shared_calibration(argv):
            out = Path(_shared_calibration(argv))  # named after its file, as calibrate names it
            out.write_text(re.sub(r"^name: .*$", f"name: {out.stem}", calibrated.read_text(),
                                  count=1, flags=re.M))
            ran.append(line)
            continue
        rc = main(argv)
        out, err = capsys.readouterr()
        # a search whose budget this test cut (FAST) may end "no feasible plan found" (exit 1)
        cut = argv != [_absolute(a) for a in args][1:]
        assert rc == 0 or (cut and rc == 1 and "no feasible plan found" in out), \
            f"`{line}` exited {rc}:\n{err[-2000:]}"
        ran.append(line)
    return ran


BLOCKS = _blocks()


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, tmp_path, monkeypatch, capsys, request):
    calibrated = None
    if any(_shared_calibration(_fast(shlex.split(ln))[1:]) for ln in _lines(BLOCKS[index])
           if ln.startswith("meshplan calibrate")):
        calibrated = request.getfixturevalue("quick_calibration")[0]
    _run_block(BLOCKS[index], tmp_path, monkeypatch, capsys, calibrated)
    # "the tour leaves git status clean" (issue 40): every file the block wrote, relative to
    # where it ran (the checkout for a user), is one git ignores
    written = [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()]
    assert written, "the tour wrote nothing"
    assert not not_ignored(written), f"the README writes files git does not ignore: {not_ignored(written)}"


def not_ignored(paths: list[str]) -> list[str]:
    """Those of ``paths`` (relative to the repository root) that the repository's
    .gitignore does not ignore (``git check-ignore --no-index``: the patterns alone, the
    paths need not exist); skips when git or the repository is absent."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("no git checkout to ask")
    proc = subprocess.run([git, "-C", str(ROOT), "check-ignore", "--no-index", "--stdin"],
                          input="\n".join(paths) + "\n", capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    ignored = set(proc.stdout.splitlines())
    return [p for p in paths if p not in ignored]


#: options whose value is a path a command writes
OUTPUT_OPTIONS = ("--output", "-o", "--plot", "--trace", "--memory-png")


def test_readme_tour_writes_only_ignored_paths():
    """Without running anything: every path the README's commands are told to write
    (:data:`OUTPUT_OPTIONS`, ``mkdir``), where ``make demo`` writes (``meshplan demo``'s
    default ``--output``) and what the commands write by default (``validate``'s CSV,
    ``tune``'s folder without ``--output``) are ignored by git, and a file that is not
    (``zbv.png`` in the checkout's root) is caught."""
    from meshplan.commands.demo import demo_cmd
    from meshplan.validation_report import DEFAULT_CSV

    paths = []
    for ln in (ln for b in BLOCKS for ln in _lines(b)):
        args = shlex.split(ln) if not ln.startswith("cat > ") else []
        if args[:2] == ["mkdir", "-p"]:
            paths += args[2:]
        paths += [args[k + 1] for k, a in enumerate(args[:-1]) if a in OUTPUT_OPTIONS]
    assert len(paths) >= 6
    demo_out = inspect.signature(demo_cmd).parameters["output"].default.default
    paths += [demo_out + "/README.md", DEFAULT_CSV, "meshplan-runs/STUDY/history.csv", ".venv/bin/python"]
    assert not_ignored(paths) == []
    assert not_ignored(["zbv.png", "local.yaml"]) == ["zbv.png", "local.yaml"]


def test_readme_has_commands_and_every_skip_is_accounted_for():
    lines = [ln for b in BLOCKS for ln in _lines(b)]
    assert sum(ln.startswith("meshplan ") for ln in lines) >= 10
    for ln in lines:
        if ln.startswith(("meshplan ", "cat > ", "mkdir -p ")) or any(re.search(p, ln) for p in SHELL):
            continue
        assert any(re.search(p, ln) for p, _ in ILLUSTRATIVE), f"README line neither run nor listed: {ln!r}"
