"""Output files of the commands: checked by kind and suffix before any work, and never
replaced or appended to in silence.

Every file option that a command writes (``cost --trace / --plot / --memory-png``,
``simulate --trace / --plot``, ``compare --plot``, ``export -o``, ``calibrate -o``,
``validate --csv``) goes through :func:`check_output` before the command computes
anything: the path must not be empty or a directory, its folder must exist and be
writable (:func:`writable_file`), its suffix must be one of its
kind's (:data:`SUFFIXES`), an existing path must be a regular file (not ``/dev/null``, a
FIFO), and an existing file is refused unless ``--force`` (replace it) or, for a file meant
to grow (``validate --csv``), ``--append`` (add to it; its header must be the command's).
"""

from __future__ import annotations

import os
import stat
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.terminal import echo

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
    folder = os.path.dirname(os.path.abspath(path)) if path.strip() else ""
    if new_folder and folder and not os.path.isdir(folder):
        _check_new_folder(flag, path, folder)
    else:
        try:
            writable_file(flag, path)
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


def writable_file(flag: str, path: str) -> None:
    """Refuse, before any work, an output file the command could not write at its end: a
    directory, a file in a folder that does not exist, or in one this user cannot write
    (ValueError naming ``flag`` and the path)."""
    import os

    if not path.strip():
        raise MeshplanError(f"{flag} is empty; give a file name")
    if os.path.isdir(path):
        raise MeshplanError(f"{flag} {path!r} is a directory; give a file name")
    if os.path.exists(path):  # rewritten in place: the file's own permission decides
        if not os.access(path, os.W_OK):
            raise MeshplanError(f"{flag} {path!r}: this user cannot write it")
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise MeshplanError(f"{flag} {path!r}: its folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise MeshplanError(f"{flag} {path!r}: this user cannot create a file in {folder}")


def distinct_outputs(paths: dict[str, str | None]) -> None:
    """Refuse, before any work, two output options (flag -> path; None not given) naming the
    same file: the second write would replace the first in silence. ValueError naming both
    flags and the path; paths are compared resolved (``a.png`` and ``./a.png`` are one)."""
    import os

    seen: dict[str, str] = {}
    for flag, path in paths.items():
        if path is None:
            continue
        key = os.path.realpath(path)
        if key in seen:
            raise MeshplanError(f"{seen[key]} and {flag} name the same file {path!r}: give each its own")
        seen[key] = flag


def input_file(path: str | None) -> str | None:
    """``path`` when it names an existing file (a --model config.json or program, a
    --cluster YAML), else None (a catalog or built-in name): the inputs
    :func:`distinct_outputs` keeps outputs off."""
    import os

    return path if path is not None and os.path.isfile(path) else None


def write_output(flag: str, path: str, write: Any) -> None:
    """Run ``write()`` (which writes ``path``), turning an OSError into a ValueError that
    names ``flag`` and the path (``--trace /proc/x.json: cannot write it: ...``)."""
    try:
        write()
    except OSError as e:
        raise MeshplanError(f"{flag} {path!r}: cannot write it: {e.strerror or e}") from None


def ensure_dir(path: Any, flag: str = "--output") -> None:
    """Create directory ``path`` (and its missing parents) when it does not exist, saying so
    in one line ``created DIR`` on stderr (stdout stays the command's output, e.g. JSON):
    commands create directories only where the user asked (an output option, ``flag``) or
    the documented default, never silently. A file in the way, or a folder that cannot be
    made, is a ValueError naming ``flag`` and the path."""
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        return
    try:
        p.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise MeshplanError(f"{flag} {str(path)!r}: a file is in the way of the folder it needs") from None
    except OSError as e:
        raise MeshplanError(f"{flag} {str(path)!r}: cannot create the folder: {e.strerror or e}") from None
    echo(f"created {p}", err=True)
