"""Run every ``benchmarks/bench_*.py`` module and write ``benchmarks/RESULTS.md``.

Each module exposes ``run() -> list[BenchResult]``. Usage: ``make bench`` or
``python -m benchmarks.run [name-substring ...]``."""

from __future__ import annotations

import datetime
import importlib
import pathlib
import platform
import sys

HERE = pathlib.Path(__file__).parent


def main(argv: list[str]) -> int:
    mods = sorted(p.stem for p in HERE.glob("bench_*.py"))
    if argv:
        mods = [m for m in mods if any(a in m for a in argv)]
    rows = []
    for m in mods:
        print(f"== {m}", flush=True)
        for r in importlib.import_module(f"benchmarks.{m}").run():
            status = "ok" if r.ok else "MISSED"
            tgt = f"{r.target_seconds:g}" if r.target_seconds is not None else "-"
            print(f"  {r.name}: {r.seconds:.3f} s (x{r.ratio:.2f} reference) target {tgt} s  {status} {r.extra}")
            rows.append((m, r, tgt, status))
    out = HERE / "RESULTS.md"
    lines = [
        "# Benchmark results",
        "",
        f"Run {datetime.date.today()} on {platform.node()} ({platform.processor() or platform.machine()}).",
        "Ratio = seconds / reference workload seconds measured in the same run (benchmarks/harness.py).",
        "",
        "| module | benchmark | seconds | ratio to reference | target s | status | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, r, tgt, status in rows:
        lines.append(f"| {m} | {r.name} | {r.seconds:.3f} | {r.ratio:.2f} | {tgt} | {status} | {r.extra} |")
    if not argv:
        out.write_text("\n".join(lines) + "\n")
        print(f"wrote {out}")
    return 0 if all(s == "ok" for *_, s in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
