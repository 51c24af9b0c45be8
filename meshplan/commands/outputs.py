"""Output files of the commands: checked by kind and suffix before any work, and never
replaced or appended to in silence.

Every file option that a command writes (``cost --trace / --plot / --memory-png``,
``simulate --trace / --plot``, ``compare --plot``, ``export -o``, ``calibrate -o``,
``validate --csv``) goes through :func:`check_output` before the command computes
anything: the path must not be empty or a directory, its folder must exist and be
writable (:func:`meshplan.commands.options.writable_file`), its suffix must be one of its
kind's (:data:`SUFFIXES`), an existing path must be a regular file (not ``/dev/null``, a
FIFO), and an existing file is refused unless ``--force`` (replace it) or, for a file meant
to grow (``validate --csv``), ``--append`` (add to it; its header must be the command's).
"""

from __future__ import annotations

import os
import stat

import typer

from meshplan.errors import MeshplanError

#: output kind -> the file suffixes it may have (lower case); ``image`` is matplotlib's list
SUFFIXES: dict[str, tuple[str, ...]] = {
    "trace": (".json",),  # Chrome trace JSON (simulator.chrome_trace.write)
    "csv": (".csv",),
    "cluster": (".yaml", ".yml"),  # a cluster YAML (clusters.load_cluster reads these)
    "megatron": (".sh", ".txt", ".args"),  # Megatron-LM arguments, commented
    "torchtitan": (".toml",),
    "deepspeed": (".json",),
    "launch": (".sh",),  # a bash launch script (meshplan.frameworks.launch_script)
}

FORCE = typer.Option(False, "--force", help="Replace output files that already exist.")
APPEND = typer.Option(False, "--append", help="Add a row to a CSV that already exists "
                                               "(one this command wrote: same columns).")


class OutputError(MeshplanError):
    """An output path the command must not write (exists, wrong kind or suffix); names the
    option and the path."""


def _suffixes(kind: str) -> tuple[str, ...]:
    if kind == "image":
        from matplotlib.backend_bases import FigureCanvasBase

        return tuple(sorted("." + s for s in FigureCanvasBase.get_supported_filetypes()))
    return SUFFIXES[kind]


def check_output(flag: str, path: str | None, kind: str, force: bool = False,
                 append: bool = False, new_folder: bool = False) -> None:
    """Refuse, before any work, an output ``path`` of option ``flag`` that the command must
    not write: empty, a directory, in a missing (unless ``new_folder``: the command creates
    it) or unwritable folder, with a suffix not of ``kind`` (a key of :data:`SUFFIXES`, or
    ``image``), an existing non-regular file, or an existing file without ``force``
    (replace) or ``append`` (add to it; the caller checks its contents). None passes.
    Raises :class:`OutputError` naming the flag and the path."""
    if path is None:
        return
    from meshplan.commands import options as opt

    folder = os.path.dirname(os.path.abspath(path)) if path.strip() else ""
    if new_folder and folder and not os.path.isdir(folder):
        _check_new_folder(flag, path, folder)
    else:
        try:
            opt.writable_file(flag, path)
        except ValueError as e:
            raise OutputError(str(e)) from None
    exists = os.path.exists(path)
    if exists and not stat.S_ISREG(os.stat(path).st_mode):
        raise OutputError(f"{flag} {path!r} is not a regular file (a device, FIFO or socket); "
                          f"give a file name")
    known = _suffixes(kind)
    name = os.path.basename(path).lower()
    if not name.endswith(known):
        got = os.path.splitext(name)[1] or "no suffix"
        raise OutputError(f"{flag} {path!r}: the file name must end in {', '.join(known)} "
                          f"(got {got})")
    if not exists or force or append:
        return
    how = "--append to add to it, --force to replace it" if kind == "csv" else "--force to replace it"
    raise OutputError(f"{flag} {path!r} exists; give a new name, or {how}")


def _check_new_folder(flag: str, path: str, folder: str) -> None:
    """A folder the command will create for ``path``: its nearest existing ancestor must be
    a folder this user can write (not a file in the way). Raises OutputError."""
    up = folder
    while not os.path.exists(up):
        up = os.path.dirname(up)
    if not os.path.isdir(up):
        raise OutputError(f"{flag} {path!r}: a file is in the way of the folder it needs ({up})")
    if not os.access(up, os.W_OK):
        raise OutputError(f"{flag} {path!r}: this user cannot create a folder in {up}")


def check_csv_header(flag: str, path: str, header: list[str]) -> None:
    """With ``--append``: refuse a CSV whose first line is not ``header`` (another file's
    rows would be mixed with this command's). Raises OutputError naming the flag."""
    import csv

    try:
        with open(path, newline="") as f:
            first = next(csv.reader(f), None)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise OutputError(f"{flag} {path!r}: cannot read its header to append: {e}") from None
    if first is not None and first != header:
        raise OutputError(f"{flag} {path!r}: its columns are not this command's "
                          f"({', '.join(header[:4])}, ...): --append adds only to a CSV it wrote; "
                          f"give another file, or --force to replace it")


def check_outputs(outputs: dict[str, tuple[str | None, str]], force: bool = False) -> None:
    """:func:`check_output` for each ``flag -> (path, kind)`` of ``outputs`` (None paths
    pass), with the command's ``--force``."""
    for flag, (path, kind) in outputs.items():
        check_output(flag, path, kind, force)


#: the files ``meshplan tune --output DIR`` writes (``sizes.csv`` with ``--gpus``)
TUNE_RESULTS = ("plan.json", "history.csv", "report.txt", "sizes.csv")


def _report_studies(out: os.PathLike[str] | str) -> set[str]:
    """The studies whose results a tune output folder holds: the study its ``report.txt``
    names on its first line (``study NAME (...)``), and for a ``--gpus`` search the study of
    each size folder ``g<N>`` less its ``-g<N>`` suffix."""
    from pathlib import Path

    out = Path(out)
    names = set()
    for rep in [out / "report.txt", *sorted(out.glob("g*/report.txt"))]:
        try:
            with open(rep, errors="replace") as f:
                first = f.readline()
        except OSError:
            continue
        if first.startswith("study "):
            name = first.split(" ", 2)[1]
            if rep.parent != out:
                name = name.removesuffix(f"-{rep.parent.name}")
            names.add(name)
    return names


def check_tune_output(flag: str, out: os.PathLike[str] | str, study: str, force: bool) -> None:
    """Refuse a ``tune --output`` folder that holds another search's results
    (:data:`TUNE_RESULTS`: a rerun would replace its plan.json and history.csv) unless
    ``force``. The folder of the same study passes: rerunning a command resumes its study
    there. Raises OutputError naming the folder, the files and the study that wrote them."""
    from pathlib import Path

    out = Path(out)
    found = [n for n in TUNE_RESULTS if (out / n).exists()]
    if not found or force:
        return
    owners = _report_studies(out)
    if study in owners:
        return
    whose = f"study {', '.join(sorted(owners))}" if owners else "no study this command knows"
    raise OutputError(f"{flag} {str(out)!r} holds the results of {whose} ({', '.join(found)}), "
                      f"not of this command line's study {study}: give another folder, or --force "
                      f"to replace them")
