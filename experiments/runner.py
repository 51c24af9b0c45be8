"""Run registered experiments and write their outputs.

Per experiment ``<name>.csv`` (the DataFrame, full precision), ``<name>.md`` (Markdown
table with the description and notes) and any PNG the experiment wrote; a combined
``README.md`` for the whole run.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from experiments.base import EXPERIMENTS, ExperimentError, ExperimentResult
from experiments.tables import to_markdown


@dataclass
class RunRecord:
    """Outcome of one experiment: its result, or the error that stopped it."""

    name: str
    title: str
    seconds: float
    result: ExperimentResult | None = None
    error: str | None = None
    files: list[Path] = field(default_factory=list)


def select(only: list[str] | None = None) -> list[str]:
    """Registered names to run (all, in registry order, or ``only`` in the given order).

    Raises:
        ExperimentError: an unknown name (the message lists the known ones).
    """
    if not only:
        return list(EXPERIMENTS)
    unknown = [n for n in only if n not in EXPERIMENTS]
    if unknown:
        raise ExperimentError(
            f"unknown experiment(s) {', '.join(unknown)}; known: {', '.join(EXPERIMENTS)}")
    return list(dict.fromkeys(only))


def experiment_markdown(res: ExperimentResult, heading: str = "#") -> str:
    """One experiment as Markdown: heading, description, table, notes, figure links."""
    parts = [f"{heading} {res.title}", ""]
    if res.description:
        parts += [res.description, ""]
    parts += [to_markdown(res.table, res.float_format), ""]
    parts += [f"- {n}" for n in res.notes]
    if res.notes:
        parts.append("")
    parts += [f"![{res.name}]({Path(f).name})" for f in res.figures]
    return "\n".join(parts).rstrip() + "\n"


def write_outputs(res: ExperimentResult, out_dir: Path) -> list[Path]:
    """Write ``<name>.csv`` and ``<name>.md`` to ``out_dir``; return them and the figures."""
    csv = out_dir / f"{res.name}.csv"
    res.table.to_csv(csv, index=False)
    md = out_dir / f"{res.name}.md"
    md.write_text(experiment_markdown(res))
    return [csv, md, *[Path(f) for f in res.figures]]


def run_one(name: str, quick: bool, out_dir: Path) -> RunRecord:
    """Run one registered experiment; an exception becomes ``RunRecord.error`` (with the
    exception type and message, and the last frame for unexpected errors)."""
    exp = EXPERIMENTS[name]
    t0 = time.perf_counter()
    try:
        res = exp.fn(quick, out_dir)
        if res.name != name:
            raise ExperimentError(f"experiment {name!r} returned a result named {res.name!r}")
        files = write_outputs(res, out_dir)
    except ExperimentError as e:
        return RunRecord(name, exp.title, time.perf_counter() - t0, error=str(e))
    except Exception as e:  # an experiment bug: report it loudly with where it happened
        where = traceback.extract_tb(e.__traceback__)[-1]
        msg = f"{type(e).__name__}: {e} (at {Path(where.filename).name}:{where.lineno})"
        return RunRecord(name, exp.title, time.perf_counter() - t0, error=msg)
    return RunRecord(name, exp.title, time.perf_counter() - t0, res, files=files)


def run_experiments(out_dir: str | Path, quick: bool = False, only: list[str] | None = None,
                    on_done=None) -> list[RunRecord]:
    """Run the selected experiments into ``out_dir`` (created) and write ``README.md``.

    ``on_done(record)`` is called after each experiment (for printing). Failures do not
    stop the others; they are recorded and listed in the README.

    Raises:
        ExperimentError: unknown name in ``only``.
    """
    names = select(only)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for name in names:
        rec = run_one(name, quick, out)
        records.append(rec)
        if on_done is not None:
            on_done(rec)
    write_readme(records, out, quick, earlier=only is not None)
    return records


def _earlier_section(name: str, out_dir: Path) -> str | None:
    """The README section of experiment ``name`` from an earlier run in ``out_dir`` (its
    ``<name>.md``, heading demoted one level), or None when there is none."""
    md = out_dir / f"{name}.md"
    if not md.is_file():
        return None
    text = md.read_text()
    if text.startswith("# "):
        text = "#" + text
    return text.rstrip() + f"\n_{name}: from an earlier run into this folder (`{md.name}`)_\n"


def write_readme(records: list[RunRecord], out_dir: Path, quick: bool, earlier: bool = False) -> Path:
    """Combined report: every experiment's section, then any failures. ``earlier`` (a run of
    some experiments, ``--only``): the sections of other registered experiments that an
    earlier run left in ``out_dir`` stay, in registry order, marked as such."""
    from meshplan import __version__

    mode = "quick (small sizes)" if quick else "full"
    lines = [
        "# meshplan experiment report",
        "",
        f"Generated by `meshplan report{' --quick' if quick else ''}` (meshplan {__version__}, "
        f"{mode} mode). One CSV (full precision) and one Markdown table per experiment sit "
        "beside this file.",
        "",
    ]
    ran = {rec.name: rec for rec in records}
    order = list(EXPERIMENTS) + [n for n in ran if n not in EXPERIMENTS]
    for name in order:
        rec = ran.get(name)
        if rec is not None and rec.result is not None:
            lines.append(experiment_markdown(rec.result, heading="##"))
            lines.append(f"_{rec.name}: {rec.seconds:.1f} s; files: "
                         + ", ".join(f"`{f.name}`" for f in rec.files) + "_\n")
        elif rec is None and earlier and (section := _earlier_section(name, out_dir)) is not None:
            lines.append(section)
    failed = [r for r in records if r.error]
    if failed:
        lines += ["## Failed experiments", ""]
        lines += [f"- **{r.name}**: {r.error}" for r in failed]
        lines.append("")
    path = out_dir / "README.md"
    path.write_text("\n".join(lines))
    return path
